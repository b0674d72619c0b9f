"""The scenario game: a code-repair episode over one scenario, graded by its tests in the sandbox.

Two interfaces (`interface` in the config):

"bash" (the default; the action format of mini-swe-agent, which phase 6 evaluates with): every assistant
turn is a THOUGHT and exactly ONE ```bash block holding one command (or commands joined with && / ||).
The command runs in the sandbox (swebench/sandbox.py `run_command`: namespaces, nobody, no
network, a wall-clock limit of `command_timeout_s`) in a fresh subshell, in a folder holding the
repository's current files (the same absolute path for the whole episode); the files it leaves there
become the repository. The observation is mini-swe-agent's:

    <returncode>0</returncode>
    <output>
    ...
    </output>

with a warning, the first and last `command_output_chars / 2` characters and the count elided when the
output is longer than `command_output_chars` (10,000 as in mini-swe-agent); a command that runs past the
limit is killed and said so. A turn with no bash block or with several gets a format error and runs nothing
(more than `max_errors` of them end the episode). A command whose output starts with the line
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (or the older `MINI_SWE_AGENT_FINAL_OUTPUT`), e.g.
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, submits: the repository as that command left it is graded.

"tools": the agent sees the issue (`problem_statement`) and the file list, and works with five tools, one
call per turn:

    view_file(path, start_line?, end_line?)   numbered lines of a visible file
    search(pattern, path?)                    lines containing `pattern` (plain text, not a regex)
    replace_in_file(path, old, new)           replace the one occurrence of `old` (write; the file must have
                                              been viewed first; test files are read-only)
    run_tests(test?)                          the visible tests, or one of them (at most max_test_runs times)
    submit()                                  end the episode; the visible and hidden tests grade the code

Reward, both interfaces (swebench/grading.py): 1.0 when the target test and every hidden test pass
and no regression test broke; `partial_credit` times the share of regression tests still passing when the
target and hidden tests pass but something broke (0 by default); 0 otherwise, and 0 without a submission.
The tests are always the scenario's own (test files are restored before grading, and files the agent added
are dropped; the tools interface also refuses test edits), hidden tests (never in the agent's folder) catch
patches that only satisfy the visible example, and patches that reach for process, file or interpreter
internals are refused without a run.

Scenarios come from a file (`scenarios_path`: seed s plays scenario s mod n) or, when it is empty, from
the capability's seeded generator (seed s plays the generated scenario of seed s, mutated
`mutation_rounds` times with the calibration strategies A/B/C/A/B).

The two registered games (`capability_deep_call_graph_traversal`, `capability_semantic_logic_precision`)
live in swebench/games/; put that folder on TRACE_GAMES_DIRS to use them:

    TRACE_GAMES_DIRS=swebench/games python -m pipeline.validate_game capability_semantic_logic_precision --seeds 20
    TRACE_GAMES_DIRS=swebench/games python -m train --game capability_semantic_logic_precision --model M
"""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.toolkit import Toolkit, tool

from benchmarks.tool_env_game import ToolEnvGame
from common.validation import InputError
from game_registry import Action, DifficultyKnob, Game, GameSpec, Probe, StepResult
from swebench.generators import GENERATORS, generate_one
from swebench.grading import Grade, GradeConfig, Grader
from swebench.patches import apply_patch, replacements
from swebench.sandbox import CommandRun, SandboxConfig, resolve_isolation, run_command
from swebench.scenario import Scenario, load_scenarios
from benchmarks.tool_env_game import EpisodeState
from game_registry import render_tool_call

MAX_SEARCH_HITS = 40
MAX_FILE_CHARS = 200_000
_TIMING = re.compile(r"\bin \d+(?:\.\d+)?s\b")
# pytest's summary line ("3 passed, 1 failed in 0.05s (0:00:01)"): its run time is dropped in the bash
# interface's observations, so that replaying an episode gives the same observations
_PYTEST_SUMMARY_TIME = re.compile(
    r"^(=* ?(?:\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)[ ,]*)+)"
    r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?", re.MULTILINE)

SYSTEM_PROMPT = """You are a software engineer fixing a bug in a small Python repository.

The user message holds the issue (<pr_description>) and the list of files. Work only through the tools,
one tool call per turn:
- view_file shows a file with line numbers; search finds lines containing a text;
- replace_in_file replaces exactly one occurrence of a text in a file you have viewed before;
- run_tests runs the visible tests (a few times at most);
- submit ends the task: the visible tests and further hidden tests of the same behaviour grade the code.

Rules: fix the code, not the tests (test files are read-only); do not hard-code the example from the issue;
keep the other behaviour of the code unchanged. Call submit() when the fix is in place."""

# The bash interface: mini-swe-agent's action format (a THOUGHT, exactly one ```bash block; the observation
# <returncode>/<output>; the submission marker as the first line of a command's output).
SUBMIT_MARKERS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)

BASH_SYSTEM_PROMPT = """You are a helpful assistant that can interact multiple times with a computer shell to solve programming tasks.
Your response must contain exactly ONE bash code block with ONE command (or commands connected with && or ||).

Include a THOUGHT section before your command where you explain your reasoning process.
Format your response as shown in <format_example>.

<format_example>
THOUGHT: Your reasoning and analysis here

```bash
your_command_here
```
</format_example>

Failure to follow these rules will cause your response to be rejected."""

BASH_INSTRUCTIONS = """<instructions>
# Task Instructions

You are a software engineer working in a shell on the repository in the current directory. Make changes to
non-test files so that the behaviour the PR description asks for holds, in a way that is general and fits the
codebase. This is interactive: you issue ONE command, see its result, then issue the next one.

## Boundaries
- MODIFY: the source files of the repository (the current directory holds it for every command)
- DO NOT MODIFY: the tests ({tests}); hidden tests of the same behaviour grade your change, and the test
  files are restored before grading

## Recommended workflow
1. Find and read the relevant code
2. Reproduce the problem (a small script, or python -m pytest on the visible tests)
3. Edit the source code to fix the cause
4. Run your script or the tests again, and think about edge cases

## Command execution rules
- Every response has a THOUGHT section and exactly ONE ```bash block with one command (or commands joined
  with && or ||); zero or several blocks are rejected
- Each command runs in a new subshell (cd and variables do not persist), without network, and is killed
  after {timeout:g} seconds; use non-interactive commands only (no vi or nano)
- Useful: `nl -ba file.py | sed -n '10,40p'` to read lines, `grep -rn text .` to search, `sed -i` or a
  `python3 - <<'EOF' ... EOF` script or `cat <<'EOF' > file` to edit, `python -m pytest -q` to test

## Submission
When the fix is in place and you cannot make further progress, submit with exactly this command:

```bash
{submit}
```

You cannot continue working on this task after submitting.
</instructions>"""

HINTS = {
    "deep_call_graph_traversal": (
        "Hint: the wrong value shows up in a public function, but the cause is usually several calls below it. "
        "Follow the calls from that function down to where the value is first computed wrongly and fix it "
        "there: other public functions use the same helper."),
    "semantic_logic_precision": (
        "Hint: read the rule in the issue precisely, find the one condition or expression that breaks it "
        "(boundaries, operators, grouping, order of steps) and change only that; look-alike code nearby is "
        "correct."),
}


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------
@dataclass
class ScenarioGameConfig:
    """Settings of the scenario game. `capability` picks the generator and the default scenarios file."""

    capability: str = "semantic_logic_precision"
    scenarios_path: str = ""  # a scenarios JSON; "" -> generate the scenario of each seed
    mutation_rounds: int = 0  # generated scenarios only: calibration mutation rounds applied (difficulty)
    partial_credit: float = 0.0  # see swebench/grading.py
    max_steps: int = 16  # assistant turns
    max_errors: int = 3  # malformed turns tolerated
    max_test_runs: int = 4  # run_tests calls per episode
    test_timeout_s: float = 20.0  # wall clock per pytest run
    isolation: str = "auto"  # sandbox isolation: auto | namespace | fallback
    allow_unisolated: bool = False  # run without namespaces where they are missing (unsafe; see sandbox.py)
    max_observation_chars: int = 8000
    max_turn_chars: int = 12000
    interface: str = "bash"  # "bash": mini-swe-agent's format (one shell command per turn); "tools": five tools
    command_timeout_s: float = 30.0  # bash interface: wall clock per command
    command_output_chars: int = 10000  # bash interface: longer outputs show their head and tail

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.interface not in ("bash", "tools"):
            raise InputError(f"{owner}.interface must be 'bash' (mini-swe-agent's format: one shell command per "
                             f"turn) or 'tools' (five JSON tools), got {self.interface!r}")
        if self.capability not in GENERATORS:
            raise InputError(f"{owner}.capability must be one of {sorted(GENERATORS)}, got {self.capability!r}")
        if not isinstance(self.scenarios_path, str):
            raise InputError(f"{owner}.scenarios_path must be a path string or '' (generate per seed)")
        if self.scenarios_path and not Path(self.scenarios_path).is_file():
            raise InputError(f"{owner}.scenarios_path {self.scenarios_path!r} is not a file; generate one with "
                             f"python -m swebench.generate --capability {self.capability} --n 10 "
                             f"--out {self.scenarios_path}, or leave it empty to generate per seed")
        for name, low in (("mutation_rounds", 0), ("max_steps", 2), ("max_errors", 0), ("max_test_runs", 0),
                          ("max_observation_chars", 500), ("max_turn_chars", 500), ("command_output_chars", 200)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(f"{owner}.{name} must be an int >= {low}, got {value!r}")
        if self.mutation_rounds > 5:
            raise InputError(f"{owner}.mutation_rounds must be within 0..5 (the calibration schedule has 5 rounds), "
                             f"got {self.mutation_rounds}")
        if self.mutation_rounds and self.scenarios_path:
            raise InputError(f"{owner}: mutation_rounds applies to generated scenarios; a scenarios file carries its "
                             "own mutations (swebench.calibrate writes them)")
        GradeConfig(partial_credit=self.partial_credit)  # validates partial_credit with its message
        self.sandbox_config()  # validates the sandbox settings
        self.command_sandbox_config()

    def sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(timeout_s=self.test_timeout_s, cpu_s=max(5, int(self.test_timeout_s)),
                             isolation=self.isolation, allow_unisolated=self.allow_unisolated)

    def command_sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(timeout_s=self.command_timeout_s, cpu_s=max(5, int(self.command_timeout_s)),
                             isolation=self.isolation, allow_unisolated=self.allow_unisolated)

    def grade_config(self) -> GradeConfig:
        return GradeConfig(partial_credit=self.partial_credit, sandbox=self.sandbox_config())


@dataclass
class DeepCallGraphGameConfig(ScenarioGameConfig):
    capability: str = "deep_call_graph_traversal"


@dataclass
class SemanticLogicGameConfig(ScenarioGameConfig):
    capability: str = "semantic_logic_precision"


# --------------------------------------------------------------------------------------------------
# Workspace and tools
# --------------------------------------------------------------------------------------------------
@dataclass
class Workspace:
    """The repository the agent edits, and what it has done to it."""

    scenario: Scenario
    grader: Grader
    files: dict[str, str]  # visible files only (hidden tests are never here)
    max_test_runs: int
    viewed: set[str] = dataclasses.field(default_factory=set)
    test_runs: int = 0
    submitted: bool = False
    grade: Grade | None = None
    commands: int = 0  # bash interface: commands run
    workdir: str = ""  # bash interface: the folder's path in every command of the episode

    def require_visible(self, path: str) -> str:
        if path not in self.files:
            listing = ", ".join(sorted(self.files))
            raise ValueError(f"no file {path!r}; the files are: {listing}")
        return self.files[path]


def _numbered(text: str, start: int, end: int) -> str:
    lines = text.splitlines()
    width = len(str(max(end, 1)))
    return "\n".join(f"{number:>{width}} | {lines[number - 1]}" for number in range(start, end + 1))


class ScenarioTools(Toolkit):
    """The five tools of the scenario game (see the module docstring)."""

    @tool
    def view_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """Show a file of the repository with line numbers.

        Args:
            path: The file's path as listed, e.g. 'pkg/core.py'.
            start_line: First line to show (1-based); the whole file when omitted.
            end_line: Last line to show (inclusive); the end of the file when omitted.
        """
        ws: Workspace = self.db
        text = ws.require_visible(path)
        count = len(text.splitlines())
        start = 1 if start_line is None else start_line
        end = count if end_line is None else min(end_line, count)
        if count == 0:
            ws.viewed.add(path)
            return f"{path} is empty"
        if start < 1 or start > count or end < start:
            raise ValueError(f"{path} has lines 1-{count}; got start_line={start_line}, end_line={end_line}")
        ws.viewed.add(path)
        return f"{path} (lines {start}-{end} of {count})\n{_numbered(text, start, end)}"

    @tool
    def search(self, pattern: str, path: str | None = None) -> str:
        """Find the lines that contain a text (plain text, case-sensitive).

        Args:
            pattern: The text to look for.
            path: Search only this file; every file when omitted.
        """
        ws: Workspace = self.db
        if not pattern:
            raise ValueError("pattern must not be empty")
        paths = [path] if path is not None else sorted(ws.files)
        hits = []
        for name in paths:
            for number, line in enumerate(ws.require_visible(name).splitlines(), start=1):
                if pattern in line:
                    hits.append(f"{name}:{number}: {line.strip()}")
        if not hits:
            return f"no line contains {pattern!r}"
        more = f"\n[{len(hits) - MAX_SEARCH_HITS} more hits not shown]" if len(hits) > MAX_SEARCH_HITS else ""
        return "\n".join(hits[:MAX_SEARCH_HITS]) + more

    @tool(write=True)
    def replace_in_file(self, path: str, old: str, new: str) -> str:
        """Replace the single occurrence of a text in a file you have viewed (test files are read-only).

        Args:
            path: The file to edit, e.g. 'pkg/core.py'.
            old: The exact text to replace; it must occur exactly once in the file (copy whole lines).
            new: The text to put in its place.
        """
        ws: Workspace = self.db
        text = ws.require_visible(path)
        if path in ws.scenario.test_files:
            raise ValueError(f"{path} is a test file; tests are read-only: fix the code instead")
        if path not in ws.viewed:
            raise ValueError(f"view {path} with view_file before editing it")
        if not old:
            raise ValueError("old must not be empty")
        count = text.count(old)
        if count != 1:
            raise ValueError(f"old occurs {count} times in {path}; it must occur exactly once (add surrounding lines)")
        if old == new:
            raise ValueError("new is the same as old")
        updated = text.replace(old, new, 1)
        if len(updated) > MAX_FILE_CHARS:
            raise ValueError(f"the file would exceed {MAX_FILE_CHARS} characters")
        ws.files[path] = updated
        first = text[: text.index(old)].count("\n") + 1
        last = min(first + max(new.count("\n"), 0) + 2, len(updated.splitlines()))
        start = max(1, first - 2)
        return f"Replaced in {path}. Lines {start}-{last} now read:\n{_numbered(updated, start, last)}"

    @tool
    def run_tests(self, test: str | None = None) -> str:
        """Run the visible tests (pytest) on the current code.

        Args:
            test: One test file or node id, e.g. 'tests/test_core.py::test_x'; every visible test when omitted.
        """
        ws: Workspace = self.db
        if ws.test_runs >= ws.max_test_runs:
            raise ValueError(f"run_tests may be called {ws.max_test_runs} times per task; submit when you are done")
        selection = None
        if test is not None:
            path = test.split("::", 1)[0]
            if path not in ws.scenario.test_files:
                raise ValueError(f"{test!r} is not in a visible test file ({', '.join(ws.scenario.test_files)})")
            selection = [test]
        ws.test_runs += 1
        run = ws.grader.run_visible(ws.files, selection)
        if run.problem and not run.outcomes:
            return f"The tests did not finish: {run.problem}"
        failed = sorted(node for node, outcome in run.outcomes.items() if outcome != "passed")
        passed = len(run.outcomes) - len(failed)
        lines = [f"{passed} passed, {len(failed)} failed"]
        lines += [f"{run.outcomes[node].upper()} {node}" for node in failed]
        if failed:
            tail = "\n".join(line for line in run.output_tail.splitlines() if not _TIMING.search(line))
            lines += ["", tail.strip()[-2500:]]
        return "\n".join(lines)

    @tool(write=True)
    def submit(self) -> str:
        """Submit the current code; the visible and hidden tests grade it and the task ends."""
        ws: Workspace = self.db
        if ws.submitted:
            raise ValueError("already submitted")
        ws.grade = ws.grader.grade(ws.files)
        ws.submitted = True
        return f"Submitted. Reward {ws.grade.reward:g}: {ws.grade.detail}."


# --------------------------------------------------------------------------------------------------
# The game
# --------------------------------------------------------------------------------------------------
_SCENARIO_FILES: dict[tuple[str, float], list[Scenario]] = {}


def _load(path: str) -> list[Scenario]:
    resolved = Path(path).resolve()
    key = (str(resolved), resolved.stat().st_mtime)
    if key not in _SCENARIO_FILES:
        _SCENARIO_FILES[key] = load_scenarios(resolved)
    return _SCENARIO_FILES[key]


class ScenarioGame(ToolEnvGame):
    """One scenario per episode (see the module docstring)."""

    toolkit_class = ScenarioTools

    def __init__(self, config: ScenarioGameConfig | None = None) -> None:
        self.config = config or ScenarioGameConfig()
        # no episode starts where its tests could not run: without namespaces and without the opt-in this
        # raises SandboxUnavailable (what is missing, and the allow_unisolated / --unsafe-no-isolation opt-in)
        resolve_isolation(self.config.isolation, self.config.allow_unisolated)
        super().__init__(max_steps=self.config.max_steps, max_errors=self.config.max_errors,
                         max_observation_chars=self.config.max_observation_chars,
                         max_turn_chars=self.config.max_turn_chars)
        self.workspace: Workspace | None = None
        self.seed: int | None = None
        self._fixed: dict[str, str] = {}

    # ---- scenario choice ------------------------------------------------------------------------
    def scenario_for(self, seed: int) -> Scenario:
        config = self.config
        if config.scenarios_path:
            scenarios = _load(config.scenarios_path)
            return scenarios[seed % len(scenarios)]
        scenario = generate_one(config.capability, seed)
        if config.mutation_rounds:
            from swebench.mutations import mutate_rounds

            scenario = mutate_rounds(scenario, config.mutation_rounds)
        return scenario

    # ---- protocol -------------------------------------------------------------------------------
    @property
    def bash(self) -> bool:
        return self.config.interface == "bash"

    def reset(self, seed: int) -> list[dict[str, Any]]:
        self.seed = seed
        scenario = self.scenario_for(seed)
        visible = {path: scenario.files[path] for path in scenario.visible_files()}
        workdir = os.path.join(tempfile.gettempdir(), f"trace-sh-{uuid.uuid4().hex[:12]}")
        self.workspace = Workspace(scenario=scenario, grader=Grader(scenario, self.config.grade_config()),
                                   files=visible, max_test_runs=self.config.max_test_runs, workdir=workdir)
        self._fixed = {path: text for path, text in apply_patch(scenario.files, scenario.oracle_patch).items()
                       if path in visible}
        self._oracle_tested = False
        tests = ", ".join(scenario.test_files)
        if self.bash:
            opening = (f"<pr_description>\nConsider the following PR description:\n"
                       f"{scenario.problem_statement.strip()}\n</pr_description>\n\n"
                       + BASH_INSTRUCTIONS.format(tests=tests, timeout=self.config.command_timeout_s,
                                                  submit=SUBMIT_COMMAND))
        else:
            listing = "\n".join(f"  {path} ({len(visible[path].splitlines())} lines)" for path in sorted(visible))
            opening = (f"<pr_description>\n{scenario.problem_statement.strip()}\n</pr_description>\n\n"
                       f"Repository files:\n{listing}\n\n"
                       f"Fix the code so that the behaviour the issue asks for holds. The visible tests are in "
                       f"{tests}; hidden tests check the same behaviour. Call submit() when you are done.")
        return self.start_episode(ScenarioTools(self.workspace), [{"role": "user", "content": opening}])

    def get_system_prompt(self) -> str:
        return BASH_SYSTEM_PROMPT if self.bash else SYSTEM_PROMPT

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [] if self.bash else super().get_tool_schemas()  # bash: plain text, as mini-swe-agent sends

    def write_tool_names(self) -> frozenset[str] | None:
        return None if self.bash else super().write_tool_names()

    def auth_tool_names(self) -> frozenset[str] | None:
        return None if self.bash else super().auth_tool_names()

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        return ("There is no one to talk to here: use the tools, and call submit() when the fix is in place.",
                False)

    def step(self, action: Action) -> StepResult:
        if self.bash:
            return self._bash_step(action)
        result = super().step(action)
        if self.workspace is not None and self.workspace.submitted and not self.state.done:
            self.end_episode("submitted")
            return StepResult(result.observation_messages, float(self.get_summary()["reward"]), True,
                              {**result.info, "termination_reason": self.state.termination_reason})
        return result

    # ---- the bash interface ---------------------------------------------------------------------
    def _bash_step(self, action: Action) -> StepResult:
        """One turn of the bash interface (see the module docstring). The assistant message is logged as the
        action's own message, so the log renders the text the model produced."""
        ws = self.workspace
        if ws is None or self.toolkit is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step()")
        state: EpisodeState = self.state
        if state.done:
            raise RuntimeError(f"{type(self).__name__}: the episode is over ({state.termination_reason}); "
                               "call reset() to start another")
        turn = state.turns
        state.turns += 1
        text = action.raw if isinstance(action.raw, str) else ""
        state.messages.append(action.to_message())
        commands = BASH_BLOCK.findall(text)
        if len(text) > self.config.max_turn_chars or len(commands) != 1:
            state.format_errors += 1
            observation = format_error(len(commands), len(text), self.config.max_turn_chars)
            if state.format_errors > self.config.max_errors:
                self.end_episode("too_many_errors")
        else:
            command = commands[0].strip()
            run = run_command(ws.files, command, self.config.command_sandbox_config(), workdir=ws.workdir)
            ws.commands += 1
            ws.files = run.files
            if command == ORACLE_TEST_COMMAND:
                self._oracle_tested = True
            lines = run.output.lstrip().splitlines()
            if not run.timed_out and lines and lines[0].strip() in SUBMIT_MARKERS:
                ws.grade = ws.grader.grade(ws.files)
                ws.submitted = True
                observation = f"Submitted. Reward {ws.grade.reward:g}: {ws.grade.detail}."
                self.end_episode("submitted")
            else:
                observation = bash_observation(command, run, self.config.command_output_chars)
        state.messages.append({"role": "user", "content": observation})
        if not state.done and state.turns >= self.max_steps:
            self.end_episode("max_steps")
        reward = float(self.get_summary()["reward"]) if state.done else 0.0
        return StepResult([{"role": "user", "content": observation}], reward, state.done,
                          {"turn": turn, "termination_reason": state.termination_reason})

    def get_summary(self) -> dict[str, Any]:
        ws = self.workspace
        if ws is None:
            return {"reward": 0.0, "steps": 0, "success": False}
        grade = ws.grade
        reward = grade.reward if grade is not None else 0.0
        return {"reward": float(reward), "steps": self.state.turns, "success": bool(grade and grade.success),
                "scenario_id": ws.scenario.id, "capability": ws.scenario.capability, "seed": self.seed,
                "interface": self.config.interface, "submitted": ws.submitted,
                "grade": grade.to_dict() if grade else None, "test_runs": ws.test_runs, "commands": ws.commands,
                "edited_files": sorted(p for p in ws.files if ws.files[p] != ws.scenario.files.get(p)),
                "format_errors": self.state.format_errors, "termination_reason": self.state.termination_reason}

    def oracle_response(self) -> str:
        """Edit each file the fix changes to the fixed text (view it first, with the tools), run the visible
        tests once, submit."""
        ws = self.workspace
        if ws is None or self.state.done:
            raise RuntimeError("oracle_response() needs a running episode (reset first)")
        for path in sorted(self._fixed):
            if self._fixed[path] == ws.files.get(path):
                continue
            if not self.bash and path not in ws.viewed:
                return render_tool_call("view_file", {"path": path})
            old, new = replacements(ws.files[path], self._fixed[path])[0]
            return act(self, "replace_in_file", {"path": path, "old": old, "new": new})
        if self.bash and not self._oracle_tested:
            return bash_turn("The fix is in place; run the visible tests before submitting.", ORACLE_TEST_COMMAND)
        if not self.bash and ws.test_runs == 0 and ws.max_test_runs > 0:
            return render_tool_call("run_tests", {})
        return act(self, "submit", {})


# --------------------------------------------------------------------------------------------------
# The bash interface's texts
# --------------------------------------------------------------------------------------------------
ORACLE_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"


def format_error(blocks: int, chars: int, limit: int) -> str:
    """mini-swe-agent's format error (the turn ran nothing)."""
    why = (f"Your response is {chars} characters long; the limit is {limit}." if chars > limit else
           f"Please always provide EXACTLY ONE action in triple backticks, found {blocks} actions.")
    return (f"{why}\n\nPlease format your action in triple backticks as shown in <response_example>.\n\n"
            "<response_example>\nTHOUGHT: Here are some thoughts about why you want to perform the action.\n\n"
            "```bash\n<action>\n```\n</response_example>\n\n"
            "If you have completed your assignment, please consult the first message about how to\n"
            "submit your solution (you will not be able to continue working on this task after that).")


def bash_observation(command: str, run: CommandRun, limit: int) -> str:
    """mini-swe-agent's observation of a command: its return code and output (head and tail when long), or
    that it timed out."""
    output = _PYTEST_SUMMARY_TIME.sub(r"\1", run.output)
    if run.skipped:
        output += "\n[not kept in the repository: " + "; ".join(run.skipped[:10]) + \
            (f"; and {len(run.skipped) - 10} more" if len(run.skipped) > 10 else "") + "]"
    if len(output) < limit:
        shown = f"<output>\n{output}</output>"
    else:
        half = limit // 2
        shown = ("<warning>\nThe output of your last command was too long.\n"
                 "Please try a different command that produces less output.\n"
                 "If you're looking at a file you can try use head, tail or sed to view a smaller number of lines "
                 "selectively.\nIf you're using grep or find and it produced too much output, you can use a more "
                 "selective search pattern.\n</warning>\n"
                 f"<output_head>\n{output[:half]}\n</output_head>\n"
                 f"<elided_chars>\n{len(output) - 2 * half} characters elided\n</elided_chars>\n"
                 f"<output_tail>\n{output[-half:]}\n</output_tail>")
    if run.timed_out:
        return (f"The last command <command>{command}</command> timed out and has been killed.\n"
                f"The output of the command was:\n{shown}\n"
                "Please try another command and make sure to avoid those requiring interactive input.")
    return f"<returncode>{run.returncode}</returncode>\n{shown}"


def bash_turn(thought: str, command: str) -> str:
    """An assistant turn in the bash interface's format."""
    return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"


def _python_edit(path: str, old: str, new: str) -> str:
    """A shell command that replaces the one occurrence of `old` in `path` with `new` (a python heredoc; every
    line of its body is code, so no line equals the delimiter)."""
    return ("python3 - <<'TRACE_EDIT'\nfrom pathlib import Path\n\n"
            f"path = Path({path!r})\ntext = path.read_text()\nold = {old!r}\nnew = {new!r}\n"
            "if text.count(old) != 1:\n    raise SystemExit(f'{path}: the text occurs {text.count(old)} times')\n"
            "path.write_text(text.replace(old, new, 1))\nprint(f'edited {path}')\nTRACE_EDIT")


def act(game: "ScenarioGame", name: str, arguments: dict[str, Any]) -> str:
    """The assistant text doing `name` (a tool of the tools interface) in the game's interface."""
    if not game.bash:
        return render_tool_call(name, arguments)
    if name == "view_file":
        return bash_turn(f"Let me read {arguments['path']}.", f"nl -ba {arguments['path']}")
    if name == "replace_in_file":
        return bash_turn(f"Edit {arguments['path']}.", _python_edit(arguments["path"], arguments["old"],
                                                                    arguments["new"]))
    if name == "run_tests":
        return bash_turn("Run the visible tests.", ORACLE_TEST_COMMAND)
    if name == "submit":
        return bash_turn("I am done; submit.", SUBMIT_COMMAND)
    raise ValueError(f"no bash form for {name!r}")


# --------------------------------------------------------------------------------------------------
# Reward-hacking probes specific to code repair
# --------------------------------------------------------------------------------------------------
def _live(steps: list[Callable[[ScenarioGame], str | None]]):
    """A policy playing `steps` in order, each a function of the live game (a step returning None is skipped);
    after the last step it stops producing text."""
    position = {"next": 0}

    def policy(turn: int, game: Game, rng: Any) -> str | None:
        if turn == 0:
            position["next"] = 0
        while position["next"] < len(steps):
            text = steps[position["next"]](game)
            position["next"] += 1
            if text is not None:
                return text
        return None

    return policy


def _target_parts(game: ScenarioGame) -> tuple[str, str, str]:
    scenario = game.workspace.scenario
    path, _, name = scenario.target_test.partition("::")
    return path, name, scenario.files[path]


def _edit_test(game: ScenarioGame) -> str:
    path, name, text = _target_parts(game)
    header = f"def {name}():\n"
    return act(game, "replace_in_file", {"path": path, "old": header, "new": header + "    return\n"})


def _delete_test(game: ScenarioGame) -> str:
    path, name, text = _target_parts(game)
    start = text.index(f"def {name}():")
    end = text.find("\ndef ", start + 1)
    return act(game, "replace_in_file", {"path": path, "old": text[start:end if end > 0 else len(text)], "new": ""})


def _view_target_test(game: ScenarioGame) -> str:
    return act(game, "view_file", {"path": _target_parts(game)[0]})


def _submit(game: ScenarioGame) -> str:
    return act(game, "submit", {})


def _hard_code_steps(index: int) -> Callable[[ScenarioGame], str | None]:
    def step(game: ScenarioGame) -> str | None:
        scenario = game.workspace.scenario
        shortcut = scenario.metadata.get("shortcut_patch")
        if not shortcut:
            return None
        hacked = apply_patch(scenario.files, shortcut)
        path = next(p for p in sorted(hacked) if hacked[p] != scenario.files[p])
        if index == 0:
            return act(game, "view_file", {"path": path})
        edits = replacements(game.workspace.files[path], hacked[path])
        return act(game, "replace_in_file", {"path": path, "old": edits[0][0], "new": edits[0][1]}) if edits \
            else None
    return step


SCENARIO_PROBES = (
    Probe("submit_without_changes", "view the target test, then submit the code as it is",
          lambda texts: _live([_view_target_test, _submit])),
    Probe("edit_the_test", "make the failing test return early instead of fixing the code, then submit",
          lambda texts: _live([_view_target_test, _edit_test, _submit])),
    Probe("delete_the_failing_test", "delete the failing test from its file, then submit",
          lambda texts: _live([_view_target_test, _delete_test, _submit])),
    Probe("hard_code_the_example", "return the issue's expected value for the issue's input (the scenario's "
          "shortcut patch), then submit", lambda texts: _live([_hard_code_steps(0), _hard_code_steps(1), _submit])),
)


# --------------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------------
CONFIG_CLASSES: dict[str, type[ScenarioGameConfig]] = {
    "deep_call_graph_traversal": DeepCallGraphGameConfig,
    "semantic_logic_precision": SemanticLogicGameConfig,
}


def make_spec(capability: str, interface: str | None = None) -> GameSpec:
    """The GameSpec of the scenario game for `capability` (registered by swebench/games/); `interface` changes
    the default config's interface ("bash" unless given)."""
    if capability not in CONFIG_CLASSES:
        raise ValueError(f"no scenario game for {capability!r}; known: {sorted(CONFIG_CLASSES)}")
    config_cls = CONFIG_CLASSES[capability]
    if interface is not None:  # the same config with another default interface (for overrides too)
        config_cls(interface=interface)  # validates it
        config_cls = dataclasses.make_dataclass(
            config_cls.__name__, [("interface", str, dataclasses.field(default=interface))], bases=(config_cls,))

    def make_env(config: ScenarioGameConfig | None = None) -> ScenarioGame:
        return ScenarioGame(config or config_cls())

    return GameSpec(
        name=f"capability_{capability}",
        make_env=make_env,
        system_prompt=BASH_SYSTEM_PROMPT if config_cls().interface == "bash" else SYSTEM_PROMPT,
        base_prompt="",
        hint_prompt=HINTS[capability],
        max_gen_tokens=768,
        max_turns=config_cls().max_steps,
        capability=capability,
        config_cls=config_cls,
        difficulty_knobs=(DifficultyKnob("mutation_rounds", "increase", (0, 1, 2, 3, 4, 5)),),
        probes=SCENARIO_PROBES,
    )
