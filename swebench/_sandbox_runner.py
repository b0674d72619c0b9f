"""Runs inside the sandbox: pytest on several trees, pytest imported once, one forked child per pytest run.

    python -s _sandbox_runner.py SPEC.json VERDICT_FD

SPEC.json: {"trees": [{"dir", "report", "args": [...] or null, "verdict_dir", "verdict_args": [...],
"groups": [{"name", "nodes": [...], "split": bool}], "stop_after_fail": bool}], "timeout_s": float,
"init": bool (this process is PID 1 of its own PID namespace), "scratch": [folders wiped between runs]}.

For each tree, in order:
  - the report run (when "args" is given): a forked child changes into "dir", runs pytest.main(args) with
    $TRACE_SANDBOX_REPORT set; its per-test report is informational only (the code under test can write it);
  - the verdict groups: for each group a fresh forked child changes into "verdict_dir" (a copy the tests
    cannot write) and runs pytest.main(verdict_args + nodes) with a watcher plugin. The group passes only when
    the child (1) ran pytest to its end and said so on a private pipe, (2) then echoed a nonce this process
    sent it only after that, with pytest's exit code 0 and every node's setup, call and teardown seen to
    return by the watcher, and (3) exited with status 0. A group that fails with "split" is judged again
    node by node; with "stop_after_fail", the tree's later groups are not run.
The parent waits up to timeout_s per run, then kills the child's process group; as PID 1 of a private PID
namespace it also kills every other process left behind before the next run.

One JSON line per tree goes to VERDICT_FD, a pipe inherited from the grader that no forked child keeps:
{"tree", "exit", "timed_out", "seconds", "verdicts": {group name or node id: "passed" | why not}}. This
process makes itself non-dumpable first, so the tests (same user) cannot ptrace it or read its memory.
"""
import ctypes
import json
import os
import secrets
import select
import shutil
import signal
import sys
import time

PR_SET_DUMPABLE = 4
PROOF_LIMIT = 1 << 20  # bytes of proof a child may send


def _undumpable():
    """No ptrace, no /proc/PID/mem of this process (or its forked children) for processes of the same user."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        sys.stderr.write("sandbox runner: could not make the runner non-dumpable\n")


def _wait(pid, timeout):
    """(exit code or None, timed out, seconds) of child `pid`; kills its process group on timeout."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False, time.monotonic() - started
        if time.monotonic() > deadline:
            _kill(pid)
            return None, True, time.monotonic() - started
        time.sleep(0.005)


def _kill(pid):
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _child_setup(keep_out, directory):
    """In a forked child: drop the fds it must not hold, own session, into `directory`."""
    for fd in keep_out:
        try:
            os.close(fd)
        except OSError:
            pass
    os.setsid()
    os.chdir(directory)
    sys.path.insert(0, directory)


def report_run(tree, timeout, verdict_fd):
    """The informational run: pytest with the report plugin, in the writable tree."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            _child_setup([verdict_fd], tree["dir"])
            os.environ["TRACE_SANDBOX_REPORT"] = tree["report"]
            import pytest

            code = int(pytest.main(tree["args"]))
        except BaseException as err:  # noqa: BLE001 -- reported through the exit code, never raised further
            sys.stderr.write(f"sandbox runner: pytest crashed: {type(err).__name__}: {err}\n")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return _wait(pid, timeout)


class Watch:
    """pytest plugin of a verdict child: which phases of which requested nodes returned without raising.
    Outermost wrapper (tryfirst, registered before any conftest), so an inner hook cannot hide a raise."""

    def __init__(self, nodes):
        self.nodes = set(nodes)
        self.phases = {}

    def _mark(self, item, when, ok):
        if item.nodeid in self.nodes:
            self.phases.setdefault(item.nodeid, {})[when] = ok

    def _wrap(self, item, when):
        self._mark(item, when, False)
        result = yield
        self._mark(item, when, True)
        return result


def _watch_plugin(nodes):
    import pytest

    watch = Watch(nodes)

    class Plugin:
        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            return (yield from watch._wrap(item, "setup"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            return (yield from watch._wrap(item, "call"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item):
            return (yield from watch._wrap(item, "teardown"))

    return watch, Plugin()


def _read_until(fd, buffer, want, child, deadline):
    """Read from `fd` into `buffer` until `want(buffer)`, the child exits, or the deadline; returns
    (buffer, child's exit status or None, timed out)."""
    while not want(buffer):
        if time.monotonic() > deadline:
            return buffer, None, True
        ready, _, _ = select.select([fd], [], [], 0.005)
        if ready:
            chunk = os.read(fd, 65536)
            if chunk and len(buffer) < PROOF_LIMIT:
                buffer += chunk
                continue
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            while select.select([fd], [], [], 0)[0]:  # what it wrote before it ended
                chunk = os.read(fd, 65536)
                if not chunk or len(buffer) >= PROOF_LIMIT:
                    break
                buffer += chunk
            return buffer, os.waitstatus_to_exitcode(status), False
    return buffer, None, False


def judge(directory, args, nodes, timeout, verdict_fd):
    """One verdict group in a fresh child: "passed" or why not (see the module docstring)."""
    proof_r, proof_w = os.pipe()
    nonce_r, nonce_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        write, read, dumps, exit_now = os.write, os.read, json.dumps, os._exit
        try:
            _child_setup([verdict_fd, proof_r, nonce_w], directory)
            os.environ.pop("TRACE_SANDBOX_REPORT", None)
            import pytest

            watch, plugin = _watch_plugin(nodes)
            code = int(pytest.main([*args, *nodes], plugins=[plugin]))
            write(proof_w, b"done\n")
            nonce = b""
            while not nonce.endswith(b"\n") and len(nonce) < 256:
                piece = read(nonce_r, 256)
                if not piece:
                    break
                nonce += piece
            write(proof_w, dumps({"nonce": nonce.decode("ascii", "replace").strip(), "exit": code,
                                  "phases": watch.phases}).encode() + b"\n")
        except BaseException as err:  # noqa: BLE001 -- reported through the exit code, never raised further
            code = 3
            sys.stderr.write(f"sandbox runner: verdict run crashed: {type(err).__name__}: {err}\n")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            exit_now(code)
    os.close(proof_w)
    os.close(nonce_r)
    started = time.monotonic()
    deadline = started + timeout
    try:
        nonce = secrets.token_hex(16)  # made after the fork: never in the child's memory before it is sent
        buffer, status, timed_out = _read_until(proof_r, b"", lambda b: b"\n" in b, pid, deadline)
        if not timed_out and status is None:  # it says pytest is done: only now does it learn the nonce
            if buffer.split(b"\n", 1)[0] == b"done":
                try:
                    os.write(nonce_w, nonce.encode() + b"\n")
                except OSError:
                    pass
            # then its proof, and its exit status
            buffer, status, timed_out = _read_until(proof_r, buffer, lambda b: False, pid, deadline)
    finally:
        os.close(proof_r)
        os.close(nonce_w)
    if timed_out:
        _kill(pid)
        return "timed out"
    return _verdict(buffer, status, nonce, nodes)


def _verdict(buffer, status, nonce, nodes):
    lines = buffer.split(b"\n")
    if lines[0] != b"done" or len(lines) < 3:
        return f"no proof that pytest finished (exit status {status})"
    try:
        proof = json.loads(lines[1])
    except ValueError:
        return "unreadable proof"
    if not isinstance(proof, dict) or proof.get("nonce") != nonce:
        return "forged proof (wrong nonce)"
    phases = proof.get("phases")
    if not isinstance(phases, dict):
        return "unreadable proof"
    for node in nodes:
        seen = phases.get(node)
        if not isinstance(seen, dict) or not seen:
            return f"did not run: {node}"
        for when in ("setup", "call", "teardown"):
            if seen.get(when) is not True:
                return f"failed ({when}): {node}"
    if proof.get("exit") != 0:
        return f"pytest exit code {proof.get('exit')}"
    if status != 0:
        return f"exit status {status}"
    return "passed"


def reap_all(init, scratch):
    if init:  # PID 1 of a private namespace: nothing else in it may outlive a run
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
                break
    for folder in scratch:  # nothing a run leaves in the scratch folders reaches the next run
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def run_groups(tree, timeout, verdict_fd, reap):
    verdicts = {}
    failed = False
    for group in tree.get("groups") or []:
        if failed and tree.get("stop_after_fail"):
            verdicts[group["name"]] = "not run (an earlier group failed)"
            continue
        verdict = judge(tree["verdict_dir"], tree["verdict_args"], group["nodes"], timeout, verdict_fd)
        reap()
        verdicts[group["name"]] = verdict
        if verdict == "passed":
            continue
        failed = True
        if group.get("split") and len(group["nodes"]) > 1 and verdict != "timed out":
            for node in group["nodes"]:
                verdicts[node] = judge(tree["verdict_dir"], tree["verdict_args"], [node], timeout, verdict_fd)
                reap()
    return verdicts


def main(spec_path, verdict_fd):
    _undumpable()
    os.set_inheritable(verdict_fd, False)
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    import pytest  # noqa: F401 -- imported once here, shared by every forked child

    timeout = float(spec["timeout_s"])
    scratch = [str(p) for p in spec.get("scratch") or []]

    def reap():
        reap_all(bool(spec.get("init")), scratch)

    for index, tree in enumerate(spec["trees"]):
        code, timed_out, seconds = None, False, 0.0
        if tree.get("args") is not None:
            code, timed_out, seconds = report_run(tree, timeout, verdict_fd)
            reap()
        started = time.monotonic()
        verdicts = run_groups(tree, timeout, verdict_fd, reap)
        seconds += time.monotonic() - started
        os.write(verdict_fd, (json.dumps({"tree": index, "exit": code, "timed_out": timed_out,
                                          "seconds": round(seconds, 3), "verdicts": verdicts}) + "\n").encode())
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():  # run by hand (e.g. --help): not a command for a person
        print("swebench/_sandbox_runner.py is internal: swebench/sandbox.py starts it inside the sandbox with a "
              "spec file and a verdict pipe (see its docstring); run scenarios with python -m swebench.selftest",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
