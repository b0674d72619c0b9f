"""The scenario game: a code-repair episode over one scenario, graded by its tests in the sandbox.

The agent sees the issue (`problem_statement`) and the file list, and works with five tools, one call per
turn:

    view_file(path, start_line?, end_line?)   numbered lines of a visible file
    search(pattern, path?)                    lines containing `pattern` (plain text, not a regex)
    replace_in_file(path, old, new)           replace the one occurrence of `old` (write; the file must have
                                              been viewed first; test files are read-only)
    run_tests(test?)                          the visible tests, or one of them (at most max_test_runs times)
    submit()                                  end the episode; the visible and hidden tests grade the code

Reward (pipeline/swebench/grading.py): 1.0 when the target test and every hidden test pass and no
regression test broke; `partial_credit` times the share of regression tests still passing when the target
and hidden tests pass but something broke (0 by default); 0 otherwise, and 0 without submit(). The tests
are always the scenario's own (edits of test files are refused, and test files are restored before
grading), hidden tests catch patches that only satisfy the visible example, and patches that reach for
process, file or interpreter internals are refused without a run.

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
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.tooling import Toolkit, ToolEnvGame, tool
from game_registry import Action, DifficultyKnob, Game, GameSpec, Probe, StepResult
from pipeline.swebench.generators import GENERATORS, generate_one
from pipeline.swebench.grading import Grade, GradeConfig, Grader
from pipeline.swebench.patches import apply_patch, replacements
from pipeline.swebench.sandbox import SandboxConfig
from pipeline.swebench.scenario import Scenario, default_scenarios_path, load_scenarios
from game_registry import render_tool_call

MAX_SEARCH_HITS = 40
MAX_FILE_CHARS = 200_000
_TIMING = re.compile(r"\bin \d+(?:\.\d+)?s\b")

SYSTEM_PROMPT = """You are a software engineer fixing a bug in a small Python repository.

The user message holds the issue (<pr_description>) and the list of files. Work only through the tools,
one tool call per turn:
- view_file shows a file with line numbers; search finds lines containing a text;
- replace_in_file replaces exactly one occurrence of a text in a file you have viewed before;
- run_tests runs the visible tests (a few times at most);
- submit ends the task: the visible tests and further hidden tests of the same behaviour grade the code.

Rules: fix the code, not the tests (test files are read-only); do not hard-code the example from the issue;
keep the other behaviour of the code unchanged. Call submit() when the fix is in place."""

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
    partial_credit: float = 0.0  # see pipeline/swebench/grading.py
    max_steps: int = 16  # assistant turns
    max_errors: int = 3  # malformed turns tolerated
    max_test_runs: int = 4  # run_tests calls per episode
    test_timeout_s: float = 20.0  # wall clock per pytest run
    isolation: str = "auto"  # sandbox isolation: auto | namespace | fallback
    max_observation_chars: int = 8000
    max_turn_chars: int = 12000

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.capability not in GENERATORS:
            raise ValueError(f"{owner}.capability must be one of {sorted(GENERATORS)}, got {self.capability!r}")
        if not isinstance(self.scenarios_path, str):
            raise ValueError(f"{owner}.scenarios_path must be a path string or '' (generate per seed)")
        if self.scenarios_path and not Path(self.scenarios_path).is_file():
            raise ValueError(f"{owner}.scenarios_path {self.scenarios_path!r} is not a file; generate one with "
                             f"python -m pipeline.swebench.generate --capability {self.capability} --n 10 "
                             f"--out {self.scenarios_path}, or leave it empty to generate per seed")
        for name, low in (("mutation_rounds", 0), ("max_steps", 2), ("max_errors", 0), ("max_test_runs", 0),
                          ("max_observation_chars", 500), ("max_turn_chars", 500)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{owner}.{name} must be an int >= {low}, got {value!r}")
        if self.mutation_rounds > 5:
            raise ValueError(f"{owner}.mutation_rounds must be within 0..5 (the calibration schedule has 5 rounds), "
                             f"got {self.mutation_rounds}")
        if self.mutation_rounds and self.scenarios_path:
            raise ValueError(f"{owner}: mutation_rounds applies to generated scenarios; a scenarios file carries its "
                             "own mutations (pipeline.swebench.calibrate writes them)")
        GradeConfig(partial_credit=self.partial_credit)  # validates partial_credit with its message
        SandboxConfig(timeout_s=self.test_timeout_s, isolation=self.isolation)  # validates both

    def grade_config(self) -> GradeConfig:
        return GradeConfig(partial_credit=self.partial_credit,
                           sandbox=SandboxConfig(timeout_s=self.test_timeout_s, cpu_s=max(5, int(self.test_timeout_s)),
                                                 isolation=self.isolation))


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
            from pipeline.swebench.mutations import mutate_rounds

            scenario = mutate_rounds(scenario, config.mutation_rounds)
        return scenario

    # ---- protocol -------------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        self.seed = seed
        scenario = self.scenario_for(seed)
        visible = {path: scenario.files[path] for path in scenario.visible_files()}
        self.workspace = Workspace(scenario=scenario, grader=Grader(scenario, self.config.grade_config()),
                                   files=visible, max_test_runs=self.config.max_test_runs)
        self._fixed = {path: text for path, text in apply_patch(scenario.files, scenario.oracle_patch).items()
                       if path in visible}
        listing = "\n".join(f"  {path} ({len(visible[path].splitlines())} lines)" for path in sorted(visible))
        tests = ", ".join(scenario.test_files)
        opening = (f"<pr_description>\n{scenario.problem_statement.strip()}\n</pr_description>\n\n"
                   f"Repository files:\n{listing}\n\n"
                   f"Fix the code so that the behaviour the issue asks for holds. The visible tests are in {tests}; "
                   "hidden tests check the same behaviour. Call submit() when you are done.")
        return self.start_episode(ScenarioTools(self.workspace), [{"role": "user", "content": opening}])

    def get_system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        return ("There is no one to talk to here: use the tools, and call submit() when the fix is in place.",
                False)

    def step(self, action: Action) -> StepResult:
        result = super().step(action)
        if self.workspace is not None and self.workspace.submitted and not self.state.done:
            self.end_episode("submitted")
            return StepResult(result.observation_messages, float(self.get_summary()["reward"]), True,
                              {**result.info, "termination_reason": self.state.termination_reason})
        return result

    def get_summary(self) -> dict[str, Any]:
        ws = self.workspace
        if ws is None:
            return {"reward": 0.0, "steps": 0, "success": False}
        grade = ws.grade
        reward = grade.reward if grade is not None else 0.0
        return {"reward": float(reward), "steps": self.state.turns, "success": bool(grade and grade.success),
                "scenario_id": ws.scenario.id, "capability": ws.scenario.capability, "seed": self.seed,
                "submitted": ws.submitted, "grade": grade.to_dict() if grade else None, "test_runs": ws.test_runs,
                "edited_files": sorted(p for p in ws.files if ws.files[p] != ws.scenario.files.get(p)),
                "format_errors": self.state.format_errors, "termination_reason": self.state.termination_reason}

    def oracle_response(self) -> str:
        """View each file the fix changes, edit it to the fixed text, run the tests once, submit."""
        ws = self.workspace
        if ws is None or self.state.done:
            raise RuntimeError("oracle_response() needs a running episode (reset first)")
        for path in sorted(self._fixed):
            if self._fixed[path] == ws.files[path]:
                continue
            if path not in ws.viewed:
                return render_tool_call("view_file", {"path": path})
            old, new = replacements(ws.files[path], self._fixed[path])[0]
            return render_tool_call("replace_in_file", {"path": path, "old": old, "new": new})
        if ws.test_runs == 0 and ws.max_test_runs > 0:
            return render_tool_call("run_tests", {})
        return render_tool_call("submit", {})


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
    return render_tool_call("replace_in_file", {"path": path, "old": header, "new": header + "    return\n"})


def _delete_test(game: ScenarioGame) -> str:
    path, name, text = _target_parts(game)
    start = text.index(f"def {name}():")
    end = text.find("\ndef ", start + 1)
    return render_tool_call("replace_in_file", {"path": path, "old": text[start:end if end > 0 else len(text)],
                                                "new": ""})


def _view_target_test(game: ScenarioGame) -> str:
    return render_tool_call("view_file", {"path": _target_parts(game)[0]})


def _submit(game: ScenarioGame) -> str:
    return render_tool_call("submit", {})


def _hard_code_steps(index: int) -> Callable[[ScenarioGame], str | None]:
    def step(game: ScenarioGame) -> str | None:
        scenario = game.workspace.scenario
        shortcut = scenario.metadata.get("shortcut_patch")
        if not shortcut:
            return None
        hacked = apply_patch(scenario.files, shortcut)
        path = next(p for p in sorted(hacked) if hacked[p] != scenario.files[p])
        if index == 0:
            return render_tool_call("view_file", {"path": path})
        edits = replacements(game.workspace.files[path], hacked[path])
        return render_tool_call("replace_in_file", {"path": path, "old": edits[0][0], "new": edits[0][1]}) if edits \
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


def make_spec(capability: str) -> GameSpec:
    """The GameSpec of the scenario game for `capability` (registered by swebench/games/)."""
    if capability not in CONFIG_CLASSES:
        raise ValueError(f"no scenario game for {capability!r}; known: {sorted(CONFIG_CLASSES)}")
    config_cls = CONFIG_CLASSES[capability]

    def make_env(config: ScenarioGameConfig | None = None) -> ScenarioGame:
        return ScenarioGame(config or config_cls())

    return GameSpec(
        name=f"capability_{capability}",
        make_env=make_env,
        system_prompt=SYSTEM_PROMPT,
        base_prompt="",
        hint_prompt=HINTS[capability],
        max_gen_tokens=768,
        max_turns=config_cls().max_steps,
        capability=capability,
        config_cls=config_cls,
        difficulty_knobs=(DifficultyKnob("mutation_rounds", "increase", (0, 1, 2, 3, 4, 5)),),
        probes=SCENARIO_PROBES,
    )


def default_scenarios(capability: str) -> str:
    """The calibrated set's path when it exists (pipeline/swebench/<capability>/scenarios_parsed.json), else ""."""
    path = default_scenarios_path(capability)
    return str(path) if path.is_file() else ""


def describe(game: ScenarioGame) -> str:
    """One line about the current scenario (for logs)."""
    ws = game.workspace
    return json.dumps({"scenario": ws.scenario.id, "difficulty": ws.scenario.metadata.get("difficulty")}) if ws else "{}"
