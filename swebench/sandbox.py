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
    and UTS namespaces; private tmpfs over /tmp, /var/tmp and /dev/shm; every mount read-only and nosuid
    except the scenario folder and those tmpfs (the root file system and the Python installation, venv and
    plugin folders bound into the sandbox, /dev, /sys, /proc and the host's other mounts included); every
    top-level folder outside SYSTEM_DIRS (the repository with its scenario files and generators, /root,
    /home, /mnt, ...) hidden under an empty tmpfs but for the exposed paths; a network with no interface up; then the test process drops to the unprivileged `nobody` user with
    no-new-privileges. Nothing the tests write survives outside the scenario folder, and that folder is
    deleted after the run.
  - isolation "fallback" (no namespaces): ONLY with the explicit opt-in `allow_unisolated=True` (the CLIs'
    `--unsafe-no-isolation`, the games' `allow_unisolated` setting, or TRACE_UNSAFE_NO_ISOLATION=1 in the
    environment for tools that start others). The same limits and clean environment, as root the `nobody`
    user when it can reach the interpreter, and a pytest plugin that makes socket connects fail. This is
    NOT a sandbox against hostile code: the socket block is bypassed through `_socket` or a child process;
    the tests run as the current user (root included) when `nobody` cannot reach the interpreter; they can
    read whatever that user can (a 0600 host file when root) and write world-writable places such as /tmp.
    Without namespaces and without the opt-in, every run raises SandboxUnavailable saying what is missing
    and how to accept the risk; with it, a SandboxWarning (and a stderr line) says what is left open.
    `auto` (the default) picks namespace when a probe run works; `namespace` never falls back.

`run_command(files, command, config)` runs one `bash -c` command the same way on a folder holding `files`
and returns its output, exit status and the folder's text files afterwards (the scenario game's bash
interface).

Two kinds of results (see `swebench/grading.py` for the threat model):
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
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from common.validation import InputError
from swebench.scenario_model import check_relative_path

PLUGIN_DIR = Path(__file__).resolve().parent / "_sandbox_plugins"
BOOT_SCRIPT = Path(__file__).resolve().parent / "_sandbox_boot.py"
RUNNER_SCRIPT = Path(__file__).resolve().parent / "_sandbox_runner.py"
UNSHARE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
Isolation = Literal["auto", "namespace", "fallback"]
UNSAFE_FLAG = "--unsafe-no-isolation"
UNSAFE_ENV = "TRACE_UNSAFE_NO_ISOLATION"  # "1": the same opt-in, for tools that start other tools
# "1": the sandbox must work here (`.ci/run`): the tests that need namespaces fail instead of skipping
REQUIRE_ENV = "TRACE_REQUIRE_SANDBOX"
# pytest's own plugins that scenario tests never need (less start-up per tree)
UNUSED_PLUGINS = tuple(arg for name in ("cacheprovider", "doctest", "junitxml", "pastebin", "legacypath", "setuponly",
                                        "setupplan", "stepwise", "nose", "unittest", "logging", "faulthandler",
                                        "debugging", "unraisableexception", "threadexception") for arg in ("-p", f"no:{name}"))


class SandboxUnavailable(RuntimeError):
    """Namespace isolation cannot be used here and the run may not fall back (isolation="namespace", or no
    opt-in to run unisolated); the message says what is missing and how to accept the risk."""


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
    allow_unisolated: bool = False  # run without namespaces when they are missing (--unsafe-no-isolation)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "file_mb", "open_files", "tmpfs_mb", "output_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InputError(f"SandboxConfig.{name} must be a positive number, got {value!r}; e.g. "
                                 f"{getattr(SandboxConfig, name)}")
        if self.isolation not in ("auto", "namespace", "fallback"):
            raise InputError(f"SandboxConfig.isolation must be 'auto', 'namespace' or 'fallback', got "
                             f"{self.isolation!r}")
        if not isinstance(self.allow_unisolated, bool):
            raise InputError(f"SandboxConfig.allow_unisolated must be true or false, got {self.allow_unisolated!r}")
        if self.memory_mb < 128:
            raise InputError(f"SandboxConfig.memory_mb must be >= 128 (Python and pytest need it), got {self.memory_mb}")


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


def sandbox_interpreter() -> str:
    """This interpreter at a path the sandbox shows: its folder resolved (a `.venv` that is a symlink to a venv
    elsewhere, a venv reached through /tmp, which the sandbox replaces by a private tmpfs), its own name kept
    (a venv's `bin/python` is itself a symlink to the base interpreter, and Python finds the venv's
    pyvenv.cfg from the unresolved name: resolving it too would lose the venv's packages)."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def sandbox_required() -> bool:
    """True where the namespace sandbox must work (REQUIRE_ENV=1, set by `.ci/run`): tests that need it fail
    rather than skip, and the test fixtures do not opt in to the unisolated fallback."""
    return os.environ.get(REQUIRE_ENV, "").strip() == "1"


def _exposed_paths() -> list[str]:
    """Folders the sandboxed interpreter needs: its installation, the venv, the folder it is run from, the
    sandbox's pytest plugins."""
    paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(sandbox_interpreter()), str(PLUGIN_DIR)}
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


# Top-level folders the sandbox keeps visible (read-only): what an interpreter and a shell need. Every other
# folder of / (the repository with its scenario files and generators, /root, /home, /mnt, /opt, ...) is hidden
# under an empty tmpfs; the exposed paths (the Python installation, the venv, the plugins) are bound back.
SYSTEM_DIRS = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys", "tmp",
                         "var"})


def _hidden_paths() -> list[str]:
    hidden = []
    for name in sorted(os.listdir("/")):
        path = os.path.join("/", name)
        if name not in SYSTEM_DIRS and os.path.isdir(path) and not os.path.islink(path):
            hidden.append(path)
    return hidden


def _boot_command(uid: int, gid: int, workdir: Path | None, tmpfs_mb: int, command: list[str]) -> list[str]:
    boot = [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, sandbox_interpreter(), "-I", "-S",
            str(BOOT_SCRIPT), "--uid", str(uid), "--gid", str(gid), "--tmpfs-mb", str(tmpfs_mb)]
    if workdir is not None:
        boot += ["--workdir", str(workdir)]
    for path in _exposed_paths():
        boot += ["--expose", path]
    for path in _hidden_paths():
        boot += ["--hide", path]
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
    interpreter = sandbox_interpreter()
    ok, why = _probe(uid, gid, [interpreter, "-I", "-S", "-c", "print('probe ok')"])
    if ok:
        return True, ""
    # Which part failed: the namespaces themselves, or this interpreter inside them (a hidden path)?
    shell_ok, _ = _probe(uid, gid, ["/bin/sh", "-c", "echo probe ok"])
    if shell_ok:
        return False, (f"the namespace sandbox starts, but this interpreter cannot run inside it ({why}): "
                       f"{interpreter} (from {sys.executable}) is not visible there, or a library it loads lies "
                       f"outside the folders the sandbox shows ({', '.join(_exposed_paths())}; every other "
                       "top-level folder but the system ones is hidden, and /tmp is a private tmpfs). Fix: "
                       "run the grader with a Python installed under one of those folders or under /usr, or "
                       "a venv whose folder is not inside /tmp")
    return False, (f"namespaces are refused here ({why}); a container without CAP_SYS_ADMIN? Fix: run as root on "
                   "the host, or give the container CAP_SYS_ADMIN (docker run --cap-add SYS_ADMIN)")


def _probe(uid: int, gid: int, command: list[str]) -> tuple[bool, str]:
    """Run `command` in the sandbox without a scenario folder; (printed 'probe ok', the last error line)."""
    try:
        done = subprocess.run(_boot_command(uid, gid, None, 1, command), capture_output=True, text=True,
                              timeout=20, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"`unshare ...` failed: {err}"
    if done.returncode != 0 or "probe ok" not in done.stdout:
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return False, reason[0][:200]
    return True, ""


_warned = threading.Event()


def unisolated_allowed(config_allows: bool = False) -> bool:
    """True when the user opted in to running untrusted code without namespaces: the config's
    `allow_unisolated` (--unsafe-no-isolation) or TRACE_UNSAFE_NO_ISOLATION=1 in the environment."""
    return bool(config_allows) or os.environ.get(UNSAFE_ENV, "").strip() == "1"


def _refusal(why: str, requested: str) -> str:
    asked = ("isolation='fallback' was asked for" if requested == "fallback" else
             f"namespace isolation is not available: {why}")
    return (f"{asked}. Scenario code is untrusted and runs only with namespace isolation: root on Linux with "
            "util-linux `unshare` able to create mount, network and PID namespaces (a container needs "
            "CAP_SYS_ADMIN, or user namespaces allowed: check `unshare --user --map-root-user true`, and as root "
            "`unshare -m -n -p -f true`). To run it WITHOUT isolation anyway (leaky network block, as the current "
            f"user, host files readable), pass {UNSAFE_FLAG} (SandboxConfig(allow_unisolated=True); the games' "
            f"`allow_unisolated=true` override; or {UNSAFE_ENV}=1 in the environment).")


def resolve_isolation(requested: Isolation, allow_unisolated: bool = False) -> str:
    """The isolation a run will use: "namespace", or "fallback" only with the opt-in (`allow_unisolated` or
    TRACE_UNSAFE_NO_ISOLATION=1; warns once, loudly). Raises SandboxUnavailable otherwise."""
    if requested not in ("auto", "namespace", "fallback"):
        raise ValueError(f"isolation must be 'auto', 'namespace' or 'fallback', got {requested!r}")
    allowed = unisolated_allowed(allow_unisolated)
    if requested == "fallback":
        if not allowed:
            raise SandboxUnavailable(_refusal("", "fallback"))
        _warn_unisolated("isolation='fallback' was asked for")
        return "fallback"
    ok, why = namespace_support()
    if ok:
        return "namespace"
    if requested == "namespace":
        raise SandboxUnavailable(f"namespace isolation is not available: {why}. isolation='namespace' never falls "
                                 f"back; use 'auto' with {UNSAFE_FLAG} to accept the unisolated fallback.")
    if not allowed:
        raise SandboxUnavailable(_refusal(why, requested))
    _warn_unisolated(why)
    return "fallback"


def _warn_unisolated(why: str) -> None:
    if _warned.is_set():
        return
    _warned.set()
    message = (f"SANDBOX FALLBACK ({UNSAFE_FLAG}): {why}. Scenario tests run with limits, a clean environment and "
               "a socket block, but WITHOUT mount/network namespaces: they can bypass the socket block (through "
               "_socket or a child process), read what this user can, run as this user when `nobody` cannot reach "
               "the interpreter, and write to world-writable places such as /tmp. Use a root Linux machine with "
               "`unshare` for untrusted patches.")
    warnings.warn(message, SandboxWarning, stacklevel=4)
    print(f"WARNING: {message}", file=sys.stderr)


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
    isolation = resolve_isolation(config.isolation, config.allow_unisolated)
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
        runner = [sandbox_interpreter(), "-s", str(trace / "runner.py"), str(trace / "spec.json"), str(verdict_w)]
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
        for line in b"".join(received).decode("utf-8", errors="replace").split("\n"):  # (not splitlines: U+2028)
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


# --------------------------------------------------------------------------------------------------
# One shell command on a working tree (the scenario game's bash interface)
# --------------------------------------------------------------------------------------------------
SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache"})
MAX_TREE_FILES = 500
MAX_TREE_FILE_BYTES = 800_000
MAX_OUTPUT_BYTES = 2_000_000  # of the command's output read back (head and tail beyond it)


@dataclass
class CommandRun:
    """What one sandboxed shell command did: its exit status and output, and the tree after it."""

    returncode: int | None  # None when it timed out (or was killed before it ended)
    output: str  # stdout and stderr interleaved
    timed_out: bool
    files: dict[str, str]  # every text file of the tree after the command (path -> text)
    skipped: list[str] = field(default_factory=list)  # files not read back, with why
    isolation: str = ""
    seconds: float = 0.0


def _command_environment(home: str, tmp: str) -> dict[str, str]:
    venv_bin = os.path.dirname(sandbox_interpreter())  # `python`, `python3`, `pytest`: the grader's interpreter
    return {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PAGER": "cat", "MANPAGER": "cat", "LESS": "-R", "PIP_PROGRESS_BAR": "off", "TQDM_DISABLE": "1"}


def _read_tree(root: Path) -> tuple[dict[str, str], list[str]]:
    """The text files under `root` (regular files only: links, fifos and devices are never opened), and what
    was left out (binary, too large, too many, a bad path). Caches and .git are skipped silently."""
    files: dict[str, str] = {}
    skipped: list[str] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, root).replace(os.sep, "/")
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode):
                skipped.append(f"{relative} (not a regular file)")
                continue
            if check_relative_path(relative):
                skipped.append(f"{relative} ({check_relative_path(relative)})")
                continue
            if len(files) >= MAX_TREE_FILES:
                skipped.append(f"{relative} (more than {MAX_TREE_FILES} files)")
                continue
            if info.st_size > MAX_TREE_FILE_BYTES:
                skipped.append(f"{relative} (larger than {MAX_TREE_FILE_BYTES} bytes)")
                continue
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between lstat and open
                    skipped.append(f"{relative} (not a regular file)")
                    continue
                data = os.read(fd, MAX_TREE_FILE_BYTES + 1)
            finally:
                os.close(fd)
            try:
                files[relative] = data.decode("utf-8")
            except UnicodeDecodeError:
                skipped.append(f"{relative} (not UTF-8 text)")
    return files, skipped


def _read_output(path: Path) -> str:
    size = path.stat().st_size
    with path.open("rb") as handle:
        if size <= MAX_OUTPUT_BYTES:
            data = handle.read()
        else:
            half = MAX_OUTPUT_BYTES // 2
            head = handle.read(half)
            handle.seek(size - half)
            data = head + f"\n[{size - 2 * half} bytes not read]\n".encode() + handle.read()
    return data.decode("utf-8", errors="replace")


def run_command(files: dict[str, str], command: str, config: SandboxConfig | None = None,
                workdir: str | None = None) -> CommandRun:
    """`bash -c command` in the sandbox, in a folder holding `files`; returns its output and the folder's text
    files afterwards. Same isolation, limits and opt-in rule as `run_pytest`; the wall clock is
    `config.timeout_s` (then the whole process tree is killed). `workdir`: the folder's path (it must not
    exist; it is deleted afterwards), so that an episode's commands all see the same absolute path."""
    if not isinstance(command, str):
        raise ValueError(f"command must be a string, got {type(command).__name__}")
    config = config or SandboxConfig()
    isolation = resolve_isolation(config.isolation, config.allow_unisolated)
    started = time.perf_counter()
    if workdir is None:
        tree = Path(tempfile.mkdtemp(prefix="trace-sh-"))
    else:
        tree = Path(workdir)
        tree.mkdir(mode=0o700)  # refuses an existing path
    scratch = Path(tempfile.mkdtemp(prefix="trace-sh-home-"))
    log_dir = Path(tempfile.mkdtemp(prefix="trace-sh-log-"))
    try:
        _write_tree(tree, files)
        uid, gid = _nobody()
        drop_to = (uid, gid) if isolation == "namespace" else fallback_user()
        if isolation == "namespace":
            home = tmp = "/tmp"
        else:
            home, tmp = str(scratch / "home"), str(scratch / "tmp")
            for folder in (home, tmp):
                os.mkdir(folder)
            os.chmod(scratch, 0o711)
        if drop_to is not None:
            _chown_tree(tree, *drop_to)
            if isolation != "namespace":
                for folder in (home, tmp):
                    _chown_tree(Path(folder), *drop_to)
        shell = [shutil.which("bash") or "/bin/bash", "-c", command]
        if isolation == "namespace":
            argv = _boot_command(uid, gid, tree, config.tmpfs_mb, shell)
            preexec = functools.partial(_limits, config)
        else:
            argv = shell
            preexec = functools.partial(_fallback_preexec, config, drop_to)
        log_path = log_dir / "output.txt"
        timed_out = False
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, cwd=tree, env=_command_environment(home, tmp), stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,
                                       start_new_session=True)
            try:
                returncode: int | None = process.wait(timeout=config.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, returncode = True, None
                _kill_group(process)
                process.wait()
            finally:
                _kill_group(process)  # anything it left running in its group
        output = _read_output(log_path)
        after, skipped = _read_tree(tree)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    return CommandRun(returncode=returncode, output=output, timed_out=timed_out, files=after, skipped=skipped,
                      isolation=isolation, seconds=time.perf_counter() - started)
