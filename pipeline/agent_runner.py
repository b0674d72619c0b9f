"""Hand a rendered stage prompt to a coding agent and check what it produced (`render_pipeline.py --run`).

    python render_pipeline.py CONFIG --stage capability  --run claude
    python render_pipeline.py CONFIG --stage environment --run codex [--all]

The agent's command line comes from an agents file (default `configs/agents.yaml`; see its header),
never from code. The agent runs in the work folder (`--workdir`, default the repository root), its
output (stdout and stderr) is streamed to `runs/<run_name>/agent_logs/<time>_<stage>[_<capability>]_<agent>.log`
under that folder and echoed to stderr. Afterwards the stage's artifact must exist, be new, and validate:

- capability: the config's selected list (`<output_dir>selected_capabilities.json`, default
  `pipeline/selected_capabilities.json`; `--selected` overrides it), rewritten during the run, in the
  export schema of `aggregate_capabilities` (every entry PENDING), with its `_report.json` beside it.
- environment (tool_use): a new or rewritten `capability_<name>_game.py` in the work folder or a game
  folder (`game_registry.game_dirs()`), which `python -m pipeline.validate_game capability_<name>` passes
  (run in the work folder, where the prompt's relative paths such as the target tool schemas point), and
  the capability marked DONE. (code_edit: a new `pipeline/swebench/<name>/scenarios_parsed.json`
  list of scenarios, and DONE.) The capability is the one `pipeline.capabilities next` names before the
  agent starts — the prompt tells the agent to take exactly that one.

`--all` (environment only) repeats this for every PENDING capability, one agent invocation each, and
stops at the first failure. A capability whose run fails or is interrupted (Ctrl-C) is put back to
PENDING, whatever the agent marked it, so the next run takes it again; a capability found IN_PROGRESS
(claimed by an agent still working, or one killed with its runner) stops the run until it is marked
PENDING again. Exit codes: 0 done, 1 the agent or its artifact failed (the reason is printed), 2 bad
input (agents file, unknown agent, no selected list, a capability IN_PROGRESS), 130 interrupted.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml

from game_registry import game_dirs
from common.cli import Interrupted
from common.paths import REPO_ROOT
from common.io import atomic_write_json, load_json
from common.validation import InputError
from pipeline.capabilities import load_selected, locked, mark, next_pending

DEFAULT_AGENTS_FILE = REPO_ROOT / "configs" / "agents.yaml"
SELECTED_RELATIVE = Path("pipeline") / "selected_capabilities.json"
DEFAULT_VALIDATE_SEEDS = 200
VALIDATE_TIMEOUT_S = 3600
KILL_GRACE_S = 10  # seconds between SIGTERM and SIGKILL when an agent times out
GAME_NAME = re.compile(r"[a-z0-9_]+")
AGENT_KEYS = {"command", "stdin", "timeout_s", "env"}
# The export of aggregate_capabilities.selected_entries: key -> accepted JSON types.
EXPORT_FIELDS: dict[str, tuple[type, ...]] = {
    "skill": (str,), "description": (str,), "mean_cov": (int, float), "std_cov": (int, float),
    "mean_delta": (int, float), "std_delta": (int, float), "n_runs_passed": (int,), "n_runs_total": (int,),
    "passes_consistency": (bool,), "example_failed_cases": (list,), "status": (str,),
}


class AgentRunError(Exception):
    """The agent failed or left no valid artifact; the message says why (exit 1)."""


@dataclass(frozen=True)
class AgentSpec:
    """One entry of the agents file."""

    name: str
    command: tuple[str, ...]
    stdin: bool = True
    timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, values: dict[str, str]) -> list[str]:
        """The command with {placeholder}s replaced in every argument."""
        out = []
        for arg in self.command:
            for key, value in values.items():
                arg = arg.replace("{" + key + "}", value)
            out.append(arg)
        return out


def load_agents(path: str | Path) -> dict[str, AgentSpec]:
    """Read an agents file (`agents: {name: {command: [...], stdin, timeout_s, env}}`); InputError naming the problem."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: agents file not found; pass --agents FILE (see configs/agents.yaml)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read agents file ({err})") from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: invalid YAML: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("agents"), dict) or not data["agents"]:
        raise InputError(f"{path}: expected a mapping 'agents:' with one entry per agent")
    agents = {}
    for name, entry in data["agents"].items():
        where = f"{path}: agents.{name}"
        if not isinstance(entry, dict):
            raise InputError(f"{where} must be a mapping with a 'command' list")
        unknown = set(entry) - AGENT_KEYS
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(AGENT_KEYS))}")
        command = _command_list(entry.get("command"), where)
        if not isinstance(command, list) or not command or not all(isinstance(a, (str, int, float)) for a in command):
            raise InputError(f"{where}.command must be a non-empty list of arguments, e.g. [codex, exec, '-']")
        stdin = entry.get("stdin", True)
        if not isinstance(stdin, bool):
            raise InputError(f"{where}.stdin must be true or false")
        timeout = entry.get("timeout_s")
        # YAML reads .inf and .nan as floats: neither can arm the timer (it would die and leave the agent unbounded)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise InputError(f"{where}.timeout_s must be a finite positive number of seconds, or null for none "
                             f"(got {timeout!r})")
        env = entry.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
            raise InputError(f"{where}.env must map variable names to values")
        agents[str(name)] = AgentSpec(str(name), tuple(str(a) for a in command), stdin,
                                      None if timeout is None else float(timeout), {k: str(v) for k, v in env.items()})
    return agents


def _command_list(command: Any, where: str) -> Any:
    """A command given as one string, split the way a shell would; any other value is returned as it is."""
    if not isinstance(command, str):
        return command
    try:
        return shlex.split(command)
    except ValueError as err:  # e.g. "No closing quotation": a typo in the agents file, not a bug of the runner
        raise InputError(f"{where}.command {command!r} cannot be split into arguments ({err}); close the quote, "
                         "or write the command as a list, e.g. [claude, -p, '...']") from None


def get_agent(path: str | Path, name: str) -> AgentSpec:
    """The agent `name` of the agents file; InputError listing the known names."""
    agents = load_agents(path)
    if name not in agents:
        raise InputError(f"{path}: no agent {name!r}; known: {', '.join(sorted(agents))}")
    return agents[name]


# ----------------------------------------------------------------------------------------------
# Launching
# ----------------------------------------------------------------------------------------------

def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def log_path_for(workdir: Path, run_name: str, stage: str, agent: str, capability: str | None) -> Path:
    """A new log file name under <workdir>/runs/<run_name>/agent_logs/."""
    folder = workdir / "runs" / run_name / "agent_logs"
    stem = "_".join(part for part in (_utc_stamp(), stage, capability, agent) if part)
    path, n = folder / f"{stem}.log", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}.{n}.log"
    return path


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the agent's process group (it was started in its own session), SIGKILL after a grace period."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace or None)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(agent: AgentSpec, argv: list[str], *, cwd: Path, env: dict[str, str], prompt_text: str, log_path: Path,
           timeout_s: float | None, echo: Callable[[str], Any] | None = None) -> int:
    """Run the agent, streaming its merged stdout/stderr to `log_path` (and `echo`); return its exit code.

    Raises AgentRunError when the command cannot be started or runs past `timeout_s`.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"# agent: {agent.name}\n# command: {shlex.join(argv)}\n# cwd: {cwd}\n"
                  f"# prompt on stdin: {agent.stdin}\n# started: {_utc_stamp()}\n")
        log.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE if agent.stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except FileNotFoundError:
            raise AgentRunError(f"agent {agent.name!r}: command {argv[0]!r} not found; install it or fix "
                                "'command' in the agents file") from None
        except PermissionError:
            raise AgentRunError(f"agent {agent.name!r}: command {argv[0]!r} is not executable") from None
        if agent.stdin:
            def feed() -> None:
                try:
                    proc.stdin.write(prompt_text.encode("utf-8"))
                    proc.stdin.close()
                except (BrokenPipeError, OSError):  # the agent exited or closed stdin early: its exit code tells
                    pass
            threading.Thread(target=feed, daemon=True).start()
        timed_out = threading.Event()

        def on_timeout() -> None:
            timed_out.set()
            _stop_group(proc)

        timer = threading.Timer(timeout_s, on_timeout) if timeout_s else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                if echo is not None:
                    echo(line)
            code = proc.wait()
        except KeyboardInterrupt:
            _stop_group(proc)
            raise
        finally:
            if timer:
                timer.cancel()
            proc.stdout.close()  # drained (or the agent stopped): release the pipe, one per invocation with --all
        log.write(f"\n# exit code: {code}\n# seconds: {time.monotonic() - started:.1f}\n")
    if timed_out.is_set():
        raise AgentRunError(f"agent {agent.name!r} timed out after {timeout_s:g}s and was stopped; log: {log_path}")
    return code


# ----------------------------------------------------------------------------------------------
# Artifact checks
# ----------------------------------------------------------------------------------------------

def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of a file, None when absent: enough to tell that the agent wrote it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


class Snapshot:
    """Stamps and content hashes of files before the agent runs, to tell which ones it wrote."""

    def __init__(self, paths: list[Path]) -> None:
        self.before = {path: (_stamp(path), _sha(path)) for path in paths}

    def changed(self, path: Path) -> bool:
        stamp, sha = self.before.get(path, (None, None))
        return _stamp(path) is not None and (_stamp(path) != stamp or _sha(path) != sha)


def _statuses(selected: Path) -> dict[str, str]:
    """skill -> status of the selected list at `selected` ({} when there is none or it cannot be read)."""
    try:
        return {entry["skill"]: entry["status"] for entry in load_selected(selected)} if selected.exists() else {}
    except InputError:
        return {}


def check_selection(selected: Path, snapshot: Snapshot, before: dict[str, str] | None = None) -> list[dict]:
    """The capability stage's artifact: a fresh, valid export with its report; AgentRunError otherwise. Every entry
    is PENDING, or keeps the status it had in the list before the agent ran (`before`: skill -> status), as the
    aggregation keeps Step 2's progress on a capability selected again."""
    if not selected.exists():
        raise AgentRunError(f"{selected} was not written (the prompt's Phase 3 exports it)")
    if not snapshot.changed(selected):
        raise AgentRunError(f"{selected} is unchanged: the agent did not export a new selection")
    try:
        entries = load_selected(selected)
    except InputError as err:
        raise AgentRunError(f"invalid selection: {err}") from None
    for entry in entries:
        where = f"{selected}: entry {entry['skill']!r}"
        missing = [key for key in EXPORT_FIELDS if key not in entry]
        if missing:
            raise AgentRunError(f"{where} lacks {', '.join(missing)} (not written by aggregate_capabilities --export)")
        for key, types in EXPORT_FIELDS.items():
            if (isinstance(entry[key], bool) and bool not in types) or not isinstance(entry[key], types):
                raise AgentRunError(f"{where}: {key} is {entry[key]!r}, expected {'/'.join(t.__name__ for t in types)}")
        if entry["status"] != "PENDING" and (before or {}).get(entry["skill"]) != entry["status"]:
            raise AgentRunError(f"{where} has status {entry['status']}; a fresh export marks a new entry PENDING "
                                "(only a capability the previous list held keeps its status)")
    report_path = selected.with_name(f"{selected.stem}_report.json")
    if not snapshot.changed(report_path):
        raise AgentRunError(f"{report_path} was not (re)written; the export and its report come from one "
                            "aggregate_capabilities run")
    try:
        report = load_json(report_path)
    except InputError as err:
        raise AgentRunError(f"invalid aggregation report: {err}") from None
    chosen = report.get("selected") if isinstance(report, dict) else None
    if not isinstance(chosen, list) or sorted(map(str, chosen)) != sorted(e["skill"] for e in entries):
        raise AgentRunError(f"{selected} lists {[e['skill'] for e in entries]} but {report_path} selected {chosen}")
    return entries


def game_search_dirs(workdir: Path) -> list[Path]:
    """Where a new game file may appear: the work folder and every registry game folder (deduplicated)."""
    dirs = []
    for folder in [workdir, *game_dirs()]:
        resolved = folder.resolve()
        if resolved not in dirs:
            dirs.append(resolved)
    return dirs


def _status_of(selected: Path, name: str) -> str:
    try:
        entries = load_selected(selected)
    except InputError as err:
        raise AgentRunError(f"the agent broke the selected list: {err}") from None
    for entry in entries:
        if entry["skill"] == name:
            return entry["status"]
    raise AgentRunError(f"{selected}: capability {name!r} disappeared from the list")


def _absolute_entries(variable: str) -> list[str]:
    """The os.pathsep-separated entries of an environment variable, made absolute against this process's folder
    (the validation runs in another folder, where a relative entry would name something else)."""
    return [str(Path(p).resolve()) for p in os.environ.get(variable, "").split(os.pathsep) if p]


def validate_game_file(game_file: Path, game: str, seeds: int, log_path: Path, cwd: Path) -> str:
    """Run `python -m pipeline.validate_game` in a fresh process (a fresh registry finds the new file) in `cwd`,
    the agent's work folder, where the prompt's relative paths (the game's `target` schemas file) point;
    returns its verdict line, raises AgentRunError when it does not pass."""
    dirs = _absolute_entries("TRACE_GAMES_DIRS")
    if str(game_file.parent.resolve()) not in dirs:
        dirs.append(str(game_file.parent.resolve()))
    # REPO_ROOT first: pipeline.validate_game and game_registry are imported from the repository, whatever cwd is
    python_path = [str(REPO_ROOT), *_absolute_entries("PYTHONPATH")]
    env = {**os.environ, "TRACE_GAMES_DIRS": os.pathsep.join(dirs), "PYTHONPATH": os.pathsep.join(python_path)}
    report_file = log_path.resolve().with_name(f"{log_path.stem}_validate.json")  # absolute: cwd is not ours
    argv = [sys.executable, "-m", "pipeline.validate_game", game, "--seeds", str(seeds), "--no-progress",
            "--json-output", str(report_file)]
    try:
        result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=VALIDATE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AgentRunError(f"validate_game {game} ran past {VALIDATE_TIMEOUT_S}s") from None
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n# runner: {shlex.join(argv)}\n{result.stdout}{result.stderr}# validate_game exit code: "
                  f"{result.returncode}\n")
    verdict = next((line for line in reversed(result.stdout.splitlines()) if line.startswith("RESULT")), "")
    if result.returncode != 0:
        failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
        detail = "; ".join(failed[:3]) or (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise AgentRunError(f"{game_file}: python -m pipeline.validate_game {game} failed (exit "
                            f"{result.returncode}): {detail}; full output in {log_path}")
    return verdict


def check_scenarios(path: Path, name: str, snapshot: Snapshot) -> int:
    """The code_edit artifact: a fresh, valid scenarios file for `name` (swebench/scenario.py's
    format, checked by its loader); returns how many scenarios it holds."""
    from swebench.scenario import load_scenarios

    if not snapshot.changed(path):
        raise AgentRunError(f"{path} was not written (the code_edit prompt's Step 4 self-test writes it)")
    try:
        scenarios = load_scenarios(path)
    except InputError as err:  # ScenarioError is an InputError: it names the scenario and the field
        raise AgentRunError(str(err)) from None
    for index, scenario in enumerate(scenarios):
        if scenario.capability != name:
            raise AgentRunError(f"{path}: scenario {index} is for capability {scenario.capability!r}, not {name!r}")
    return len(scenarios)


# ----------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------

@dataclass
class RunContext:
    """Everything a stage run needs besides the agent."""

    run_name: str
    prompt_file: Path
    prompt_text: str
    workdir: Path
    selected: Path
    environment_kind: str = "tool_use"
    validate_seeds: int = DEFAULT_VALIDATE_SEEDS
    timeout_s: float | None = None
    echo: Callable[[str], Any] | None = None
    say: Callable[[str], Any] = field(default=lambda text: print(text, file=sys.stderr))


def _run_agent(agent: AgentSpec, ctx: RunContext, stage: str, capability: str | None) -> Path:
    """Launch the agent once for `stage`; returns the log path; AgentRunError on a non-zero exit."""
    values = {"prompt_file": str(ctx.prompt_file.resolve()), "workdir": str(ctx.workdir), "repo": str(REPO_ROOT),
              "stage": stage, "capability": capability or ""}
    argv = agent.argv(values)
    env = {**os.environ, **agent.env, "TRACE_STAGE": stage, "TRACE_PROMPT_FILE": values["prompt_file"],
           "TRACE_CAPABILITY": capability or ""}
    log_path = log_path_for(ctx.workdir, ctx.run_name, stage, agent.name, capability)
    ctx.say(f"running agent {agent.name!r} for stage {stage}{f' ({capability})' if capability else ''}; "
            f"log: {log_path}")
    timeout = ctx.timeout_s if ctx.timeout_s is not None else agent.timeout_s
    try:
        code = launch(agent, argv, cwd=ctx.workdir, env=env, prompt_text=ctx.prompt_text, log_path=log_path,
                      timeout_s=timeout, echo=ctx.echo)
    except KeyboardInterrupt:  # the default "nothing was saved" would be untrue: the agent may have written files
        raise Interrupted(f"agent {agent.name!r} was stopped; what it wrote so far is kept, unchecked; "
                          f"log: {log_path}") from None
    if code != 0:
        raise AgentRunError(f"agent {agent.name!r} exited with code {code}; see {log_path}")
    return log_path


def run_capability_stage(agent: AgentSpec, ctx: RunContext) -> int:
    """Step 1 through the agent; 0 when a valid new selection was exported."""
    report_path = ctx.selected.with_name(f"{ctx.selected.stem}_report.json")
    snapshot = Snapshot([ctx.selected, report_path])
    before = _statuses(ctx.selected)
    _run_agent(agent, ctx, "capability", None)
    entries = check_selection(ctx.selected, snapshot, before)
    names = ", ".join(e["skill"] for e in entries) or "none (nothing passed the thresholds)"
    ctx.say(f"capability selection done: {len(entries)} selected in {ctx.selected}: {names}")
    return 0


def _environment_once(agent: AgentSpec, ctx: RunContext, name: str) -> str:
    """One Step-2 invocation for capability `name`; returns a one-line account of what was checked."""
    if not GAME_NAME.fullmatch(name):
        raise AgentRunError(f"capability name {name!r} cannot name a game (use lower-case letters, digits and _ only)")
    if ctx.environment_kind == "code_edit":
        scenarios = ctx.workdir / "pipeline" / "swebench" / name / "scenarios_parsed.json"
        snapshot = Snapshot([scenarios])
        _run_agent(agent, ctx, "environment", name)
        count = check_scenarios(scenarios, name, snapshot)
        account = f"{count} scenarios in {scenarios}"
    else:
        candidates = [folder / f"capability_{name}_game.py" for folder in game_search_dirs(ctx.workdir)]
        snapshot = Snapshot(candidates)
        log_path = _run_agent(agent, ctx, "environment", name)
        written = [path for path in candidates if snapshot.changed(path)]
        if not written:
            raise AgentRunError(f"no new capability_{name}_game.py in {', '.join(str(p.parent) for p in candidates)}")
        if len(written) > 1:
            raise AgentRunError(f"capability_{name}_game.py was written in several folders: "
                                f"{', '.join(map(str, written))}; keep one")
        verdict = validate_game_file(written[0], f"capability_{name}", ctx.validate_seeds, log_path,
                                     ctx.workdir)
        account = f"{written[0]} passes validate_game ({verdict or 'PASS'})"
    status = _status_of(ctx.selected, name)
    if status != "DONE":
        raise AgentRunError(f"capability {name!r} is {status}, not DONE, in {ctx.selected} (the prompt leaves it "
                            "IN_PROGRESS when calibration stays out of band); see the agent log")
    return account


def put_back(selected: Path, name: str) -> str:
    """Set capability `name` back to PENDING after a failed or interrupted run, as the next run (and the prompt's
    `capabilities next`) takes PENDING ones only; returns a clause saying what became of it. The agent log, which
    the failure message names, is the record of the failed try (the list's schema has no field for one)."""
    try:
        with locked(selected):  # another agent's `mark` on the same list is not lost
            entries = load_selected(selected)
            status = next((entry["status"] for entry in entries if entry["skill"] == name), None)
            if status is None:
                return f"{name} is no longer in {selected}"
            if status == "PENDING":
                return f"{name} is still PENDING in {selected}"
            atomic_write_json(selected, mark(entries, name, "PENDING"))
    except (InputError, OSError) as err:  # the agent broke the list, or it cannot be written: say so, keep the cause
        return (f"{name} could not be put back to PENDING ({err}); fix {selected}, then run `python -m "
                f"pipeline.capabilities mark {name} PENDING --file {selected}`")
    return f"{name} was put back from {status} to PENDING in {selected}, so the next run takes it again"


def _refuse_claimed(entries: list[dict], selected: Path) -> None:
    """InputError when a capability is IN_PROGRESS: the runner puts its own failures back to PENDING, so one left
    IN_PROGRESS was claimed by an agent that is still working or died with its runner; `next` would skip it."""
    claimed = [entry["skill"] for entry in entries if entry["status"] == "IN_PROGRESS"]
    if claimed:
        verb = "is" if len(claimed) == 1 else "are"
        raise InputError(f"{selected}: {', '.join(claimed)} {verb} IN_PROGRESS (claimed by an agent that is still "
                         f"working or was killed); if none is working on it, run `python -m pipeline.capabilities mark "
                         f"{claimed[0]} PENDING --file {selected}` and run again")


def _environment_or_put_back(agent: AgentSpec, ctx: RunContext, name: str) -> str:
    """`_environment_once`, putting `name` back to PENDING when it fails or is interrupted (the agent may have
    marked it IN_PROGRESS or DONE before its work turned out unfinished or invalid)."""
    try:
        return _environment_once(agent, ctx, name)
    except AgentRunError as err:
        raise AgentRunError(f"{err}; {put_back(ctx.selected, name)}") from None
    except KeyboardInterrupt as err:  # also while validate_game runs; the message says what the list now holds
        stopped = str(err) if isinstance(err, Interrupted) and str(err) else "stopped while checking the agent's work"
        raise Interrupted(f"{stopped}; {put_back(ctx.selected, name)}") from None


def run_environment_stage(agent: AgentSpec, ctx: RunContext, run_all: bool) -> int:
    """Step 2 through the agent for the next PENDING capability, or (run_all) every PENDING one in turn. A failed
    or interrupted capability is put back to PENDING; a capability found IN_PROGRESS stops the run (see
    `_refuse_claimed`)."""
    done = 0
    seen: set[str] = set()
    while True:
        try:
            entries = load_selected(ctx.selected)
        except InputError as err:
            if done:
                raise AgentRunError(f"the selected list became unreadable: {err}") from None
            raise InputError(f"{err} (run Step 1 first, or pass --selected FILE)") from None
        try:
            _refuse_claimed(entries, ctx.selected)
        except InputError as err:
            if done:  # claimed during this run, by something else than the agents it started
                raise AgentRunError(str(err)) from None
            raise
        entry = next_pending(entries)
        if entry is None:
            if done or run_all:
                ctx.say(f"no PENDING capability left in {ctx.selected}; {done} done in this run")
                return 0
            ctx.say(f"no PENDING capability in {ctx.selected}: Step 2 has nothing to do")
            return 1
        name = entry["skill"]
        if name in seen:  # cannot happen after a successful check (it demands DONE); a guard against loops
            raise AgentRunError(f"capability {name!r} is PENDING again after its run")
        seen.add(name)
        account = _environment_or_put_back(agent, ctx, name)
        done += 1
        ctx.say(f"capability {name}: DONE; {account}")
        if not run_all:
            return 0


def environment_kind(config: dict) -> str:
    """The config's environment_kind (tool_use when absent)."""
    kind = config.get("environment_kind", "tool_use")
    if kind not in ("tool_use", "code_edit"):
        raise InputError(f"environment_kind {kind!r}: the runner checks tool_use and code_edit artifacts only")
    return kind


def default_validate_seeds(config: dict) -> int:
    """Seeds for validate_game: the config's validation_seeds, else DEFAULT_VALIDATE_SEEDS."""
    seeds = config.get("validation_seeds", DEFAULT_VALIDATE_SEEDS)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise InputError(f"validation_seeds must be a positive integer (got {seeds!r})")
    return seeds
