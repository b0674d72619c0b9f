"""Run pytest on untrusted scenario code: a throw-away folder, limits, no network, nothing written outside.

    run = run_pytest(files, SandboxConfig(timeout_s=20))      # files: {path: text}
    run.outcomes["tests/test_x.py::test_y"]                   # "passed" | "failed" | "error" | "skipped"
    run.timed_out, run.isolation, run.output_tail

Each run writes `files` into a fresh temporary folder and starts pytest in a subprocess with
  - a wall-clock timeout (the whole process group is killed) and rlimits on CPU seconds, address space,
    file size and open files,
  - a clean environment (PATH, HOME and TMPDIR pointing into the folder, no proxy or credential
    variables, no third-party pytest plugins),
  - isolation "namespace" (root with `unshare`, the default where it works): new mount, network, PID, IPC
    and UTS namespaces; private tmpfs over /tmp, /var/tmp and /dev/shm; the root file system remounted
    read-only; only the scenario folder writable; a network with no interface up; then the test process
    drops to the unprivileged `nobody` user with no-new-privileges. Nothing the tests write survives
    outside the scenario folder, and that folder is deleted after the run.
  - isolation "fallback" (no `unshare`, not root, or namespaces refused by the container): the same
    limits, the clean environment and, as root, the `nobody` user, plus a pytest plugin that makes every
    socket connect fail. Writes to world-writable places such as /tmp are NOT prevented. `auto` picks
    namespace when a probe run works and otherwise warns loudly (SandboxWarning + stderr) and falls back;
    `namespace` refuses to run without it (SandboxUnavailable).

Two kinds of results (see `pipeline/swebench/grading.py` for the threat model):
  - `outcomes`, per test, from a small reporting plugin writing one JSON line per test phase inside the
    folder. The code under test runs in the same interpreter and can rewrite them: they are for the agent's
    own test runs and for diagnostics, never for a reward.
  - `verdicts`, per verdict group (`run_verdicts`, `VerdictGroup`): each group is run by pytest in a fresh
    process forked from the sandbox runner (which never imports the code under test), on a copy of the tree
    the tests cannot write; it passes only when that process finished pytest, then echoed a nonce it could not
    know before, with every test of the group seen passing, and exited 0 (`_sandbox_runner.py`). The runner
    hands them to this process over a pipe that no test process holds, not through a file.
A run that times out, is killed or writes no report has every requested outcome missing and every verdict
not "passed", which graders treat as failed.
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.swebench.scenario import check_relative_path

PLUGIN_DIR = Path(__file__).resolve().parent / "_sandbox_plugins"
BOOT_SCRIPT = Path(__file__).resolve().parent / "_sandbox_boot.py"
RUNNER_SCRIPT = Path(__file__).resolve().parent / "_sandbox_runner.py"
UNSHARE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
Isolation = Literal["auto", "namespace", "fallback"]
# pytest's own plugins that scenario tests never need (less start-up per tree)
UNUSED_PLUGINS = tuple(arg for name in ("cacheprovider", "doctest", "junitxml", "pastebin", "legacypath", "setuponly",
                                        "setupplan", "stepwise", "nose", "unittest", "logging", "faulthandler",
                                        "debugging", "unraisableexception", "threadexception") for arg in ("-p", f"no:{name}"))


class SandboxUnavailable(RuntimeError):
    """isolation="namespace" was asked for and namespaces cannot be used here; the message says why."""


class SandboxWarning(UserWarning):
    """The sandbox runs without namespaces (see the module docstring for what that leaves open)."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one pytest run. Memory and file sizes in MiB."""

    timeout_s: float = 30.0
    cpu_s: int = 30
    memory_mb: int = 1024
    file_mb: int = 16
    open_files: int = 256
    tmpfs_mb: int = 64
    isolation: Isolation = "auto"
    output_chars: int = 4000  # tail of stdout+stderr kept in the result

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "file_mb", "open_files", "tmpfs_mb", "output_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"SandboxConfig.{name} must be a positive number, got {value!r}; e.g. "
                                 f"{getattr(SandboxConfig, name)}")
        if self.isolation not in ("auto", "namespace", "fallback"):
            raise ValueError(f"SandboxConfig.isolation must be 'auto', 'namespace' or 'fallback', got "
                             f"{self.isolation!r}")
        if self.memory_mb < 128:
            raise ValueError(f"SandboxConfig.memory_mb must be >= 128 (Python and pytest need it), got {self.memory_mb}")


@dataclass(frozen=True)
class VerdictGroup:
    """Tests judged together by one fresh pytest process: `name` passes only when every node passes. With
    `split`, a failed group is judged again node by node (the verdicts then also hold each node id)."""

    name: str
    nodes: tuple[str, ...]
    split: bool = False

    def __post_init__(self) -> None:
        if not self.nodes or not all(isinstance(node, str) and node and not node.startswith("-")
                                     for node in self.nodes):
            raise ValueError(f"VerdictGroup {self.name!r} needs node ids (not options), got {self.nodes!r}")


@dataclass
class TestRun:
    """What one sandboxed pytest run produced."""

    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> passed | failed | error | skipped
    exit_code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    isolation: str = ""
    output_tail: str = ""
    problem: str = ""  # why there are no results (timeout, crash, no report), else ""
    verdicts: dict[str, str] = field(default_factory=dict)  # group name or node id -> "passed" | why not

    def verdict(self, name: str) -> str:
        """The verdict of a group (or of a node of a split group): "passed", or why not ("not run" if absent)."""
        return self.verdicts.get(name, "not run")

    def outcome(self, node_id: str) -> str:
        """The node's outcome, "missing" when pytest did not report it."""
        return self.outcomes.get(node_id, "missing")

    def passed(self, node_id: str) -> bool:
        return self.outcomes.get(node_id) == "passed"


# --------------------------------------------------------------------------------------------------
# Which isolation works here
# --------------------------------------------------------------------------------------------------
def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _exposed_paths() -> list[str]:
    """Folders the sandboxed interpreter needs: its installation, the venv, the sandbox's pytest plugins."""
    paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), str(PLUGIN_DIR)}
    return sorted(os.path.realpath(p) for p in paths)


def _reachable(path: str, uid: int, gid: int) -> bool:
    """True when uid/gid can pass through every folder down to `path` (by the permission bits)."""
    current = "/"
    for part in Path(os.path.realpath(path)).parts[1:]:
        current = os.path.join(current, part)
        info = os.stat(current)
        if not os.path.isdir(current):
            break
        bit = 0o100 if info.st_uid == uid else 0o010 if info.st_gid == gid else 0o001
        if not info.st_mode & bit:
            return False
    return True


def _boot_command(uid: int, gid: int, workdir: Path | None, tmpfs_mb: int, command: list[str]) -> list[str]:
    boot = [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, sys.executable, "-I", "-S", str(BOOT_SCRIPT),
            "--uid", str(uid), "--gid", str(gid), "--tmpfs-mb", str(tmpfs_mb)]
    if workdir is not None:
        boot += ["--workdir", str(workdir)]
    for path in _exposed_paths():
        boot += ["--expose", path]
    return [*boot, "--", *command]


@functools.lru_cache(maxsize=1)
def namespace_support() -> tuple[bool, str]:
    """(True, "") when namespace isolation works on this machine, else (False, why not). Probed once."""
    if sys.platform != "linux":
        return False, f"namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "namespace isolation needs root (unshare --mount/--net and a switch to the nobody user)"
    unshare = shutil.which("unshare")
    if unshare is None:
        return False, "the `unshare` command (util-linux) is not installed"
    uid, gid = _nobody()
    probe = _boot_command(uid, gid, None, 1, [sys.executable, "-I", "-S", "-c", "print('probe ok')"])
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"probe `unshare ... --probe` failed: {err}"
    if done.returncode != 0 or "probe ok" not in done.stdout:
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return False, f"namespaces are refused here ({reason[0][:200]}); a container without CAP_SYS_ADMIN?"
    return True, ""


_warned = threading.Event()


def resolve_isolation(requested: Isolation) -> str:
    """The isolation a run will use: "namespace" or "fallback" (warns once, loudly, when falling back)."""
    if requested == "fallback":
        return "fallback"
    ok, why = namespace_support()
    if ok:
        return "namespace"
    if requested == "namespace":
        raise SandboxUnavailable(f"namespace isolation is not available: {why}. Run as root on Linux with "
                                 "util-linux `unshare`, or pass isolation='fallback' (--isolation fallback) to accept "
                                 "the weaker sandbox.")
    if not _warned.is_set():
        _warned.set()
        message = (f"SANDBOX FALLBACK: {why}. Scenario tests run with limits, a clean environment and blocked "
                   "sockets, but WITHOUT mount/network namespaces: they can write to world-writable places such "
                   "as /tmp. Use a root Linux machine with `unshare` for untrusted patches.")
        warnings.warn(message, SandboxWarning, stacklevel=3)
        print(f"WARNING: {message}", file=sys.stderr)
    return "fallback"


# --------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------
def _limits(config: SandboxConfig) -> None:
    """preexec_fn: rlimits for the sandboxed process tree (its own session, so it can be killed as a group)."""
    mib = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (int(config.cpu_s), int(config.cpu_s) + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config.memory_mb * mib, config.memory_mb * mib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (config.file_mb * mib, config.file_mb * mib))
    resource.setrlimit(resource.RLIMIT_NOFILE, (config.open_files, config.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _fallback_preexec(config: SandboxConfig, drop_to: tuple[int, int] | None) -> None:
    _limits(config)
    if drop_to is not None:  # drop root so the tests cannot write where root can
        os.setgroups([])
        os.setgid(drop_to[1])
        os.setuid(drop_to[0])


@functools.lru_cache(maxsize=1)
def fallback_user() -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when the fallback sandbox can run the tests as that user (we are root and nobody
    can reach the interpreter and the plugins), else None: the tests then run as the current user."""
    if os.geteuid() != 0:
        return None
    uid, gid = _nobody()
    if all(_reachable(path, uid, gid) for path in _exposed_paths()):
        return uid, gid
    print("WARNING: fallback sandbox runs the tests as root: the user nobody cannot reach the Python "
          f"installation ({', '.join(p for p in _exposed_paths() if not _reachable(p, uid, gid))})", file=sys.stderr)
    return None


def _environment(workdir: Path, isolation: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir / ".trace" / "home"),
        "TMPDIR": "/tmp" if isolation == "namespace" else str(workdir / ".trace" / "tmp"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(PLUGIN_DIR),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }


def _write_tree(workdir: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        problem = check_relative_path(path)
        if problem:
            raise ValueError(f"file path {path!r} {problem}")
        target = workdir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def _read_only_tree(root: Path) -> None:
    """Folders 0755, files 0644 (owned by us): the tests, run as another user, can read but not change them."""
    os.chmod(root, 0o755)
    for folder, dirs, names in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)


def _collect(fd: int, sink: list[bytes]) -> None:
    """Thread: everything written to the read end `fd` until every writer has closed it."""
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            sink.append(chunk)
    finally:
        os.close(fd)


def _read_report(path: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    if not path.is_file():
        return outcomes
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(item, dict) or not isinstance(item.get("nodeid"), str):
                continue
            node, when, outcome = item["nodeid"], item.get("when"), item.get("outcome")
            if outcome == "failed" and when in ("setup", "teardown"):
                outcomes[node] = "error"
            elif outcome == "failed":
                outcomes[node] = "failed" if outcomes.get(node) != "error" else "error"
            elif outcome == "skipped" and node not in outcomes:
                outcomes[node] = "skipped"
            elif outcome == "passed" and when == "call" and node not in outcomes:
                outcomes[node] = "passed"
            elif when == "collect" and outcome == "failed":
                outcomes[node] = "error"
    return outcomes


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_pytest(files: dict[str, str], config: SandboxConfig | None = None, selection: list[str] | None = None,
               base_dir: str | None = None) -> TestRun:
    """pytest on `files` (optionally only the node ids / paths in `selection`): per-test `outcomes` from the
    in-process report, which the code under test can forge (see the module docstring)."""
    return run_pytest_batch([files], config, selection, base_dir)[0]


def run_verdicts(files: dict[str, str], groups: list[VerdictGroup], config: SandboxConfig | None = None,
                 stop_after_fail: bool = True, base_dir: str | None = None) -> TestRun:
    """The `verdicts` of `groups` on `files`, in order, each group in a fresh process (no report run). With
    `stop_after_fail`, the groups after a failed one are not run (their verdict says so)."""
    return run_pytest_batch([files], config, base_dir=base_dir, groups=[groups], report=False,
                            stop_after_fail=stop_after_fail)[0]


def run_pytest_batch(trees: list[dict[str, str]], config: SandboxConfig | None = None,
                     selection: list[str] | None = None, base_dir: str | None = None,
                     groups: list[list[VerdictGroup]] | None = None, report: bool = True,
                     stop_after_fail: bool = False) -> list[TestRun]:
    """pytest on each tree, one after the other, in one sandbox start (pytest is imported once and forked per
    run; leftovers of a run are killed before the next): the report run (`report`, per-test `outcomes`), then
    the verdict groups of that tree (`groups[i]`, `verdicts`). Trees of one batch can see each other's
    folders: batch only trees of the same origin (a scenario before and after its oracle patch)."""
    if not trees:
        return []
    if groups is not None and len(groups) != len(trees):
        raise ValueError(f"groups must hold one list per tree ({len(trees)}), got {len(groups)}")
    config = config or SandboxConfig()
    isolation = resolve_isolation(config.isolation)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="trace-swe-", dir=base_dir))
    log_dir = Path(tempfile.mkdtemp(prefix="trace-swe-log-", dir=base_dir))  # outside the tree the tests can touch
    runs = [TestRun(isolation=isolation) for _ in trees]
    verdict_r, verdict_w = os.pipe()
    write_end_open = True
    received: list[bytes] = []
    reader = threading.Thread(target=_collect, args=(verdict_r, received), daemon=True)
    try:
        trace = workdir / ".trace"
        writable = [trace / "tmp", trace / "home", trace / "out"]
        for folder in writable:
            folder.mkdir(parents=True)
        (trace / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        common = ["-q", *UNUSED_PLUGINS, "-c", str(trace / "pytest.ini"), "-o", "addopts=", "--tb=short",
                  "--no-header", "-rN"]
        if isolation == "fallback":
            common += ["-p", "trace_swe_nonet"]
        spec_trees, runs_at_most = [], 0
        for index, files in enumerate(trees):
            entry: dict = {"args": None, "groups": [], "stop_after_fail": stop_after_fail}
            if report:
                tree = workdir / f"t{index}"
                tree.mkdir()
                _write_tree(tree, files)
                writable.append(tree)
                entry.update(dir=str(tree), report=str(trace / "out" / f"report{index}.jsonl"),
                             args=[*common, "-p", "trace_swe_report", "--rootdir", str(tree),
                                   *(list(selection) if selection else ["."])])
                runs_at_most += 1
            tree_groups = groups[index] if groups else []
            if tree_groups:
                verdict_dir = workdir / f"v{index}"  # the verdict copy: the tests cannot write it
                verdict_dir.mkdir()
                _write_tree(verdict_dir, files)
                _read_only_tree(verdict_dir)
                entry.update(verdict_dir=str(verdict_dir), verdict_args=[*common, "--rootdir", str(verdict_dir)],
                             groups=[{"name": g.name, "nodes": list(g.nodes), "split": g.split} for g in tree_groups])
                runs_at_most += sum(1 + (len(g.nodes) if g.split and len(g.nodes) > 1 else 0) for g in tree_groups)
            spec_trees.append(entry)
        (trace / "spec.json").write_text(json.dumps({
            "trees": spec_trees, "timeout_s": config.timeout_s, "init": isolation == "namespace",
            "scratch": [str(trace / "tmp"), str(trace / "home")]}), encoding="utf-8")
        # The runner runs from the sandbox's own folder: where the repository lives (under /tmp, say) may be
        # hidden inside the sandbox, whose /tmp is a fresh tmpfs.
        shutil.copyfile(RUNNER_SCRIPT, trace / "runner.py")
        uid, gid = _nobody()
        drop_to = (uid, gid) if isolation == "namespace" else fallback_user()
        _read_only_tree(trace)
        if drop_to is not None:  # the tests own only their scratch folders and the report trees
            for folder in writable:
                _chown_tree(folder, *drop_to)
        os.chmod(workdir, 0o711)
        runner = [sys.executable, "-s", str(trace / "runner.py"), str(trace / "spec.json"), str(verdict_w)]
        if isolation == "namespace":
            command = _boot_command(uid, gid, workdir, config.tmpfs_mb, runner)
            preexec = functools.partial(_limits, config)
        else:
            command = runner
            preexec = functools.partial(_fallback_preexec, config, drop_to)
        log_path = log_dir / "output.txt"
        outer_timeout = config.timeout_s * max(runs_at_most, 1) + 15.0
        timed_out = False
        reader.start()
        with log_path.open("wb") as log:
            try:
                process = subprocess.Popen(command, cwd=workdir, env=_environment(workdir, isolation),
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           preexec_fn=preexec, start_new_session=True, pass_fds=(verdict_w,))
            finally:
                os.close(verdict_w)  # from here on only the runner holds the write end
                write_end_open = False
            try:
                process.wait(timeout=outer_timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process)
                process.wait()
            finally:
                _kill_group(process)  # anything the tests left running in the group
        reader.join(timeout=5.0)
        output = log_path.read_bytes()[-config.output_chars * 4:].decode("utf-8", errors="replace")
        for index in range(len(trees)):  # paths as the tests see them, relative to their tree
            output = output.replace(f"{workdir}/t{index}/", "").replace(f"{workdir}/v{index}/", "")
        output = output.replace(str(workdir), "<sandbox>")
        statuses = {}
        for line in b"".join(received).decode("utf-8", errors="replace").splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(item, dict) and isinstance(item.get("tree"), int):
                statuses[item["tree"]] = item
        for index, run in enumerate(runs):
            run.output_tail = output[-config.output_chars:]
            status = statuses.get(index)
            if status is None:
                run.timed_out = timed_out
                run.problem = ("the sandbox timed out" if timed_out else
                               f"the sandbox ended before this tree ran: {output.strip().splitlines()[-1:]}")
                continue
            verdicts = status.get("verdicts")
            if isinstance(verdicts, dict):
                run.verdicts = {str(k): str(v) for k, v in verdicts.items()}
            run.exit_code = status.get("exit")
            run.seconds = float(status.get("seconds") or 0.0)
            if not report:
                continue
            if status.get("timed_out"):
                run.timed_out = True
                run.problem = f"timed out after {config.timeout_s:g} s (the process group was killed)"
                continue
            run.outcomes = _read_report(trace / "out" / f"report{index}.jsonl")
            if isinstance(run.exit_code, int) and run.exit_code < 0:
                run.problem = f"pytest was killed by signal {-run.exit_code}"
                run.outcomes = {}
            elif not run.outcomes:
                run.problem = f"pytest reported no test (exit code {run.exit_code})"
    finally:
        if write_end_open:
            os.close(verdict_w)
        if reader.ident is None:  # never started: the read end is still ours
            os.close(verdict_r)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    total = time.perf_counter() - started
    for run in runs:
        run.seconds = run.seconds or total / len(runs)
    return runs
