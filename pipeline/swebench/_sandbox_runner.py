"""Runs inside the sandbox: pytest on several trees, one forked child each, pytest imported once.

    python -s _sandbox_runner.py SPEC.json

SPEC.json: {"trees": [{"dir", "report", "args": [...]}], "timeout_s": float, "status": path,
"init": bool (this process is PID 1 of its own PID namespace)}. For each tree, in order: fork; the child
starts a new session, changes into the tree, puts it first on sys.path and runs pytest.main(args) with
$TRACE_SANDBOX_REPORT set to the tree's report; the parent waits up to timeout_s, then kills the child's
process group. As PID 1 of a private PID namespace it also kills every other process left behind before
the next tree. One JSON line per tree goes to `status`: {"tree", "exit", "timed_out", "seconds"}.
"""
import json
import os
import signal
import sys
import time


def run_tree(tree, timeout):
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setsid()
            os.chdir(tree["dir"])
            sys.path.insert(0, tree["dir"])
            os.environ["TRACE_SANDBOX_REPORT"] = tree["report"]
            import pytest

            code = int(pytest.main(tree["args"]))
        except BaseException as err:  # noqa: BLE001 -- reported through the exit code, never raised further
            sys.stderr.write(f"sandbox runner: pytest crashed: {type(err).__name__}: {err}\n")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    started = time.monotonic()
    deadline = started + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False, time.monotonic() - started
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return None, True, time.monotonic() - started
        time.sleep(0.005)


def reap_all(init):
    if init:  # PID 1 of a private namespace: nothing else in it may outlive a tree
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    time.sleep(0.002)
                    continue
            except ChildProcessError:
                return


def main(spec_path):
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    import pytest  # noqa: F401 -- imported once here, shared by every forked child

    for index, tree in enumerate(spec["trees"]):
        code, timed_out, seconds = run_tree(tree, float(spec["timeout_s"]))
        reap_all(bool(spec.get("init")))
        with open(spec["status"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"tree": index, "exit": code, "timed_out": timed_out,
                                     "seconds": round(seconds, 3)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
