"""Self-test of one game: determinism, a winning oracle, losing baselines, reward-hacking probes that lose
(pipeline/probes.py), bounded rewards, tool schemas shared with the target benchmark, and robustness to
garbage actions. A game that declares decision classes (`GameSpec.decision_classes`) is also held to the
class-prior rule at every knob value (`class_prior`): no class above MAX_CLASS_SHARE of CLASS_INSTANCES
instances, and no ablation above the largest class's share + PRIOR_MARGIN nor winning where its skill matters.

Usage:
    python -m pipeline.validate_game NAME [--seeds 200] [--fuzz-actions 1000] [--max-baseline 0.5]
                                          [--probe-tolerance 0.1] [--no-probes] [--json-output FILE]
                                          [--game-overrides '{"storefront": "configs/storefront/cpu_demo.yaml"}']

Exit codes: 0 every check passed (warnings allowed), 1 some check failed (each failure listed),
2 unknown game, a game whose make_env raises, a bad flag, an unwritable --json-output or one that names the
game's own source or target file (all checked before any episode; nothing written). `validate(spec, ...)`
returns the same report as a dict.

Every episode is driven the way the trainer drives it: model text -> `spec.extract_action` -> `game.step`,
until `game.done` or `spec.max_turns` turns.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import random
import re
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from game_registry import REPO_ROOT, Action, Game, GameSpec, get_game, lookup_game
from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, check_not_an_input, check_output_path, load_json
from common.validation import InputError, check_number
from pipeline.probes import (
    DEFAULT_TOLERANCE,
    MAX_CLASS_SHARE,
    by_class_text,
    class_shares,
    evaluate_probes,
    format_table,
    shares_text,
    suite_problems,
    summarize,
    tool_facts,
)

PASS, FAIL, WARN = "PASS", "FAIL", "WARN"
ORACLE_MIN_SUCCESS = 0.99
MIN_DISTINCT_SHARE = 0.5  # below this share of distinct initial conversations, seeds barely matter
MAX_EXAMPLES = 5  # failure examples kept per check
HUGE = 100_000  # characters in the "huge string" fuzz inputs
CLASS_INSTANCES = 500  # instances drawn per setting to measure the decision classes' shares
DO_NOTHING_REPLIES = (
    "I cannot help with that.",
    "Sorry, I am not able to do that.",
    "Could you please repeat the question?",
    "Thank you, goodbye.",
)

# A policy maps (turn index, game, rng) to the model's text for that turn.
Policy = Callable[[int, Game, random.Random], str]


def canonical(obj: Any) -> str:
    """Canonical JSON used for every equality test (key order and float formatting fixed)."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, default=repr)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err)[:200]}"


# --------------------------------------------------------------------------------------------------
# Episodes
# --------------------------------------------------------------------------------------------------
@dataclass
class Episode:
    """What one episode produced; `error` names the phase and exception if the game raised."""

    seed: int
    initial: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)  # {"observation", "reward", "done"} per turn
    summary: dict[str, Any] | None = None
    final_messages: list[dict[str, Any]] = field(default_factory=list)
    system_prompt: str = ""
    error: str | None = None
    error_phase: str | None = None  # where `error` happened: "make_env", "reset", "step (turn 0)", ...

    @property
    def never_started(self) -> bool:
        """True when the episode raised before reset returned (no instance to compare or replay)."""
        return self.error_phase in ("make_env", "reset")

    @property
    def reward(self) -> float:
        value = (self.summary or {}).get("reward")
        return float(value) if _is_valid_reward(value) else 0.0

    def outcome(self) -> str:
        """Everything a replay must reproduce, as one canonical string."""
        return canonical([self.initial, self.steps, self.summary, self.final_messages, self.error])


def run_episode(spec: GameSpec, game: Game, seed: int, policy: Policy, rng: random.Random) -> Episode:
    """Play one episode of `game` from `seed` with `policy`; exceptions are recorded, not raised.

    Catching every exception here is deliberate: a game that raises is exactly what validation reports
    (the message names the phase and the exception), and one bad seed must not hide the other checks.
    """
    episode = Episode(seed=seed)
    phase = "reset"
    try:
        episode.initial = game.reset(seed)
        phase = "get_system_prompt"
        episode.system_prompt = game.get_system_prompt()
        for turn in range(spec.max_turns):
            phase = "done"
            if game.done:
                break
            phase = f"policy (turn {turn})"
            text = policy(turn, game, rng)
            if text is None:  # a replay ran out of recorded texts
                break
            episode.texts.append(text)
            phase = f"extract_action (turn {turn})"
            action = spec.extract_action(text)
            phase = f"step (turn {turn})"
            result = game.step(action)
            episode.steps.append(
                {"observation": result.observation_messages, "reward": result.reward, "done": result.done}
            )
        phase = "get_summary"
        episode.summary = game.get_summary()
        phase = "get_messages"
        episode.final_messages = game.get_messages()
    except Exception as err:  # noqa: BLE001 -- reported as a failure, see docstring
        episode.error, episode.error_phase = f"seed {seed}, {phase}: {_describe(err)}", phase
    return episode


def run_fresh_episode(spec: GameSpec, seed: int, policy: Policy, rng: random.Random) -> Episode:
    """`run_episode` on a new instance from `spec.make_env()`; a make_env that raises is recorded as the
    episode's error (phase "make_env"), like any other exception of the game (see run_episode)."""
    try:
        game = spec.make_env()
    except Exception as err:  # noqa: BLE001 -- game code may raise anything; reported, see run_episode
        return Episode(seed=seed, error=f"seed {seed}, make_env: {_describe(err)}", error_phase="make_env")
    return run_episode(spec, game, seed, policy, rng)


def oracle_policy(turn: int, game: Game, rng: random.Random) -> str:
    return game.oracle_response()


def do_nothing_policy(turn: int, game: Game, rng: random.Random) -> str:
    return DO_NOTHING_REPLIES[turn % len(DO_NOTHING_REPLIES)]


def replay_policy(texts: list[str]) -> Policy:
    def policy(turn: int, game: Game, rng: random.Random) -> str | None:
        return texts[turn] if turn < len(texts) else None

    return policy


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_#@.\-]{1,40}")
_INT = re.compile(r"(?<![A-Za-z0-9])-?\d{1,9}")  # "IT-557" gives 557, not -557


def _conversation_values(game: Game) -> tuple[list[str], list[int]]:
    """Words and integers seen in the conversation (not the system prompt): plausible argument values."""
    # Only the start of each message: fuzz inputs put 100k-character strings into the conversation.
    text = " ".join(
        (m.get("content") or "")[:2000] for m in game.get_messages()[1:] if isinstance(m.get("content"), str)
    )
    return _WORD.findall(text), [int(x) for x in _INT.findall(text)]


def random_value(schema: Any, rng: random.Random, words: list[str], ints: list[int], depth: int = 0) -> Any:
    """A random value of the JSON type `schema` asks for; half the time a value copied from the conversation."""
    if not isinstance(schema, dict):
        schema = {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = rng.choice(kind) if kind else "string"
    plausible = rng.random() < 0.5
    if kind == "integer":
        return rng.choice(ints) if plausible and ints else rng.randint(-10, 1000)
    if kind == "number":
        return float(rng.choice(ints)) if plausible and ints else round(rng.uniform(-10, 1000), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        if depth > 3:
            return []
        return [random_value(schema.get("items", {}), rng, words, ints, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        if depth > 3:
            return {}
        return random_arguments(schema, rng, words, ints, depth + 1)
    if kind == "null":
        return None
    if plausible and words:
        return rng.choice(words)
    return "".join(rng.choice(string.ascii_letters + string.digits + "-_") for _ in range(rng.randint(1, 12)))


def random_arguments(params: Any, rng: random.Random, words: list[str], ints: list[int], depth: int = 0) -> dict:
    """Random arguments for a function's `parameters` schema: every required one, each optional one half the time."""
    if not isinstance(params, dict):
        return {}
    properties = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or [])
    return {
        name: random_value(prop, rng, words, ints, depth)
        for name, prop in properties.items()
        if name in required or rng.random() < 0.5
    }


def tool_call_markup(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def _functions(game: Game) -> list[dict[str, Any]]:
    schemas = game.get_tool_schemas()
    return [s["function"] for s in schemas if isinstance(s, dict) and isinstance(s.get("function"), dict)]


def random_tool_policy(turn: int, game: Game, rng: random.Random) -> str:
    """A random tool from the game's schemas with random arguments of the right JSON types."""
    functions = _functions(game)
    if not functions:
        return do_nothing_policy(turn, game, rng)
    function = rng.choice(functions)
    words, ints = _conversation_values(game)
    return tool_call_markup(str(function.get("name")), random_arguments(function.get("parameters"), rng, words, ints))


def _policy_rng(kind: int, seed: int) -> random.Random:
    # Integer seeding: identical across processes (str/tuple hashing is salted per process).
    return random.Random(seed * 7919 + kind)


# --------------------------------------------------------------------------------------------------
# Value checks
# --------------------------------------------------------------------------------------------------
def _is_valid_reward(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 1.0


def reward_problem(value: Any) -> str | None:
    """Why `value` is not a reward (a float in [0, 1]), or None."""
    if isinstance(value, bool) or not isinstance(value, float):
        return f"{value!r} is a {type(value).__name__}, not a float"
    if not math.isfinite(value):
        return f"{value!r} is not finite"
    if not 0.0 <= value <= 1.0:
        return f"{value!r} is outside [0, 1]"
    return None


def summary_problem(summary: Any) -> str | None:
    """Why `summary` breaks the protocol ({"reward", "steps": int, "success": bool, ...}), or None."""
    if not isinstance(summary, dict):
        return f"summary is a {type(summary).__name__}, not a dict"
    missing = [k for k in ("reward", "steps", "success") if k not in summary]
    if missing:
        return f"summary lacks {', '.join(missing)}"
    if isinstance(summary["steps"], bool) or not isinstance(summary["steps"], int):
        return f"summary steps {summary['steps']!r} is not an int"
    if not isinstance(summary["success"], bool):
        return f"summary success {summary['success']!r} is not a bool"
    return None


def initial_problem(initial: Any, system_prompt: str) -> str | None:
    """Why reset's return value breaks the protocol (a list starting with the system prompt), or None."""
    if not isinstance(initial, list) or not initial:
        return f"reset returned {type(initial).__name__} {str(initial)[:60]!r}, not a non-empty list"
    first = initial[0]
    if not isinstance(first, dict) or first.get("role") != "system":
        return "reset's first message is not a system message"
    if first.get("content") != system_prompt:
        return "reset's system message content differs from get_system_prompt()"
    return None


class Problems:
    """Counts problems of one kind and keeps the first few as examples."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[str] = []

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES and message not in self.examples:
            self.examples.append(message)

    def text(self) -> str:
        more = f" (+{self.count - len(self.examples)} more, similar or not shown)" if self.count > len(self.examples) else ""
        return "; ".join(self.examples) + more


def _audit(episode: Episode, label: str, rewards: Problems, protocol: Problems) -> None:
    """Record reward and protocol problems of one finished episode."""
    where = f"{label} seed {episode.seed}"
    for turn, step in enumerate(episode.steps):
        problem = reward_problem(step["reward"])
        if problem:
            rewards.add(f"{where} turn {turn} step reward {problem}")
    if episode.summary is not None:
        problem = summary_problem(episode.summary)
        if problem:
            protocol.add(f"{where}: {problem}")
        elif reward_problem(episode.summary["reward"]):
            rewards.add(f"{where} summary reward {reward_problem(episode.summary['reward'])}")
    if not episode.never_started:  # a game that never reset has no initial messages to judge
        problem = initial_problem(episode.initial, episode.system_prompt)
        if problem:
            protocol.add(f"{where}: {problem}")


# --------------------------------------------------------------------------------------------------
# Fuzz inputs
# --------------------------------------------------------------------------------------------------
_UNICODE = "héllo wörld ✓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 😀🔥 مرحبا שלום 中文 \u200b\u200d\ufeff e\u0301 \x00 \x1b[31m"


def fuzz_text(rng: random.Random, functions: list[dict[str, Any]], words: list[str], ints: list[int]) -> tuple[str, str]:
    """One random or malformed model output and its category name."""
    names = [str(f.get("name")) for f in functions] or ["some_tool"]
    name = rng.choice(names)
    params = next((f.get("parameters") for f in functions if f.get("name") == name), {})
    wrong = [None, 12345, -1.5, True, [], [1, "a"], {"x": {"y": []}}, "", "x" * 50, "😀"]
    category = rng.choice(
        [
            "garbage", "empty", "unknown_tool", "wrong_types", "missing_args", "extra_args", "huge_reply",
            "huge_argument", "unbalanced_tags", "non_object_json", "bad_arguments", "unicode", "deep_nesting",
            "multiple_calls", "valid_random_call", "truncated_json",
        ]
    )
    if category == "garbage":
        text = "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 300)))
    elif category == "empty":
        text = rng.choice(["", " ", "\n\n", "\t"])
    elif category == "unknown_tool":
        text = tool_call_markup(rng.choice(["no_such_tool", "", "DROP TABLE", name.upper() + "_x", "😀"]), {})
    elif category == "wrong_types":
        properties = (params or {}).get("properties") or {"arg": {}}
        text = tool_call_markup(name, {key: rng.choice(wrong) for key in properties})
    elif category == "missing_args":
        text = tool_call_markup(name, {})
    elif category == "extra_args":
        args = random_arguments(params, rng, words, ints)
        args["unexpected_argument"] = rng.choice(wrong)
        text = tool_call_markup(name, args)
    elif category == "huge_reply":
        text = rng.choice(string.ascii_letters) * HUGE
    elif category == "huge_argument":
        properties = (params or {}).get("properties") or {"arg": {}}
        text = tool_call_markup(name, {key: "A" * HUGE for key in properties})
    elif category == "unbalanced_tags":
        text = rng.choice(
            [
                '<tool_call>{"name": "%s", "arguments": {}}' % name,
                '{"name": "%s", "arguments": {}}</tool_call>' % name,
                "<tool_call><tool_call>{}</tool_call>",
                "</tool_call><tool_call>",
                "<tool_call>",
            ]
        )
    elif category == "non_object_json":
        text = "<tool_call>" + rng.choice(["[1, 2]", '"text"', "null", "42", "true", "[]", "{}", "{name}"]) + "</tool_call>"
    elif category == "bad_arguments":
        arguments = rng.choice(['"not json {"', "[1, 2]", '"[]"', "null", "7", '"\\"x\\""'])
        text = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (name, arguments)
    elif category == "unicode":
        text = rng.choice([_UNICODE, tool_call_markup(name, {k: _UNICODE for k in ((params or {}).get("properties") or {"a": 0})})])
    elif category == "deep_nesting":
        depth = rng.choice([100, 5000])
        text = "<tool_call>" + "[" * depth + "]" * depth + "</tool_call>"
    elif category == "multiple_calls":
        text = "".join(
            tool_call_markup(rng.choice(names), random_arguments(params, rng, words, ints)) for _ in range(rng.randint(2, 5))
        )
    elif category == "valid_random_call":
        text = tool_call_markup(name, random_arguments(params, rng, words, ints))
    else:  # truncated_json
        full = tool_call_markup(name, random_arguments(params, rng, words, ints))
        text = full[: rng.randint(1, max(1, len(full) - 1))]
    return category, text


# --------------------------------------------------------------------------------------------------
# Tool schemas against the target
# --------------------------------------------------------------------------------------------------
def _wrap_schema(schema: Any) -> Any:
    """OpenAI tool schemas come wrapped ({"type": "function", "function": {...}}) or bare; compare wrapped."""
    if isinstance(schema, dict) and "function" not in schema and "name" in schema:
        return {"type": "function", "function": schema}
    return schema


def _schema_name(schema: Any) -> str | None:
    if isinstance(schema, dict) and isinstance(schema.get("function"), dict):
        name = schema["function"].get("name")
        return name if isinstance(name, str) and name else None
    return None


def target_is_path(target: str) -> bool:
    """Whether `target` names a tool-schema file rather than a registered benchmark (game names have neither)."""
    return target.endswith(".json") or "/" in target


def target_file(target: str) -> Path | None:
    """The existing file `target` names, from the current folder or the repo root; None when there is none."""
    if not target:
        return None
    return next((p for p in (Path(target), REPO_ROOT / target) if p.is_file()), None)


def load_target_schemas(target: str) -> tuple[list[Any] | None, str]:
    """Tool schemas of `target` (a JSON file or a registered game name), or (None, why not)."""
    path = target_file(target)
    if path is not None:
        data = load_json(path)  # InputError on broken JSON: the caller reports it as a failure
        if not isinstance(data, list):
            raise InputError(f"{path}: target tool schemas must be a JSON list, got {type(data).__name__}")
        return data, f"file {path}"
    if target_is_path(target):
        return None, f"target file {target} not found"
    try:
        target_spec = get_game(target)
    except KeyError as err:
        return None, str(err.args[0])
    try:
        return target_spec.make_env().get_tool_schemas(), f"game {target!r}"
    except Exception as err:  # noqa: BLE001 -- game code may raise anything; the caller reports a failure
        raise InputError(f"target game {target!r} cannot be built: {_describe(err)}") from None


# --------------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------------
def _check(status: str, detail: str, seconds: float, **numbers: Any) -> dict[str, Any]:
    return {"status": status, "detail": detail, "seconds": round(seconds, 3), **numbers}


@dataclass
class _Run:
    """State shared by the checks of one validation: the seeds, and problems gathered across checks."""

    spec: GameSpec
    seeds: list[int]
    progress: bool
    rewards: Problems = field(default_factory=Problems)
    protocol: Problems = field(default_factory=Problems)

    def bar(self, label: str, items: Any = None) -> Any:
        return tqdm(self.seeds if items is None else items, desc=f"{self.spec.name}: {label}", file=sys.stderr,
                    disable=not self.progress, leave=False)

    def play(self, seed: int, policy: Policy, rng: random.Random, label: str, errors: Problems) -> Episode:
        """One episode on a fresh instance, audited for reward and protocol problems."""
        episode = run_fresh_episode(self.spec, seed, policy, rng)
        _audit(episode, label, self.rewards, self.protocol)
        if episode.error:
            errors.add(f"{label}: {episode.error}")
        return episode


def _oracle_check(run: _Run, min_success: float) -> tuple[dict[str, Any], list[Episode]]:
    """The oracle's text, parsed and stepped, reaches reward 1.0 on at least `min_success` of the seeds,
    and no oracle episode raises (`min_success` tolerates unwinnable seeds, not a game that crashes)."""
    t0, errors = time.perf_counter(), Problems()
    episodes = [run.play(seed, oracle_policy, _policy_rng(0, seed), "oracle", errors) for seed in run.bar("oracle")]
    n = len(episodes)
    wins = sum(1 for e in episodes if e.error is None and e.reward >= 1.0)
    lost = [e.seed for e in episodes if e.error is None and e.reward < 1.0][:MAX_EXAMPLES]
    detail = f"reward 1.0 on {wins}/{n} seeds ({wins / n:.1%}, need >= {min_success:.0%})"
    detail += f"; lost e.g. seeds {lost}" if lost else ""
    detail += f"; {errors.count} raised: {errors.text()}" if errors.count else ""
    check = _check(PASS if wins / n >= min_success and not errors.count else FAIL, detail, time.perf_counter() - t0,
                   success_rate=wins / n, mean_turns=sum(len(e.steps) for e in episodes) / n)
    return check, episodes


def _baselines_check(run: _Run, max_baseline: float) -> tuple[dict[str, Any], list[Episode]]:
    """Doing nothing and calling random tools both score a mean reward below `max_baseline`."""
    t0, errors = time.perf_counter(), Problems()
    nothing, randoms = [], []
    for seed in run.bar("baselines"):
        nothing.append(run.play(seed, do_nothing_policy, _policy_rng(1, seed), "do-nothing", errors))
        randoms.append(run.play(seed, random_tool_policy, _policy_rng(2, seed), "random-tool", errors))
    nothing_mean = sum(e.reward for e in nothing) / len(nothing)
    random_mean = sum(e.reward for e in randoms) / len(randoms)
    bad = nothing_mean >= max_baseline or random_mean >= max_baseline or errors.count
    detail = f"mean reward do-nothing {nothing_mean:.3f}, random-tool {random_mean:.3f} (fail at >= {max_baseline})"
    detail += f"; {errors.count} raised: {errors.text()}" if errors.count else ""
    check = _check(FAIL if bad else PASS, detail, time.perf_counter() - t0,
                   do_nothing_mean_reward=nothing_mean, random_tool_mean_reward=random_mean)
    return check, randoms


def _fresh_tool_facts(spec: GameSpec, seed: int) -> tuple[Any, list[str], list[str]]:
    """`tool_facts` of a new instance reset to `seed`: a game may know its tools only once an instance is drawn.
    Exceptions of the game propagate; each caller reports them as a failure of its check."""
    fresh = spec.make_env()
    fresh.reset(seed)
    return tool_facts(spec, fresh)


def _probes_check(run: _Run, oracle_episodes: list[Episode], tolerance: float) -> dict[str, Any]:
    """Generic and game-specific reward-hacking probes (pipeline/probes.py) each succeed on at most their
    expected share of the applicable seeds plus `tolerance`; a probe episode that raises is a failure.

    Probes replay the oracle's texts of the same seed, so seeds where the oracle raised are left out (the
    oracle check reports them).
    """
    t0, spec = time.perf_counter(), run.spec
    problems, warnings = suite_problems(spec)
    try:
        facts, fact_problems, fact_warnings = _fresh_tool_facts(spec, run.seeds[0])
    except Exception as err:  # noqa: BLE001 -- the game raised: reported as a failure of this check
        return _check(FAIL, f"a fresh game raised while asked for its tool facts: {_describe(err)}",
                      time.perf_counter() - t0)
    problems += fact_problems
    warnings += fact_warnings
    oracle_texts = {e.seed: e.texts for e in oracle_episodes if e.error is None}
    errors = Problems()  # run.play wants one; evaluate_probes keeps each probe's errors for the report

    def play(seed: int, policy: Policy, label: str, index: int) -> Episode:
        return run.play(seed, policy, _policy_rng(10 + index, seed), f"probe {label}", errors)

    probed = [e for e in oracle_episodes if e.error is None]
    shares = episode_class_shares(spec, probed)
    results = evaluate_probes(spec, run.seeds, oracle_texts, facts, play, tolerance,
                              seed_bar=lambda seeds: run.bar("probes", seeds), shares=shares)
    status, detail = summarize(results, problems, warnings)
    if shares:
        detail = f"decision classes {shares_text(shares)}; " + detail
    if len(probed) < len(oracle_episodes):
        detail += f"; {len(oracle_episodes) - len(probed)} seeds left out (the oracle raised there)"
    n = max(len(probed), 1)
    return _check(status, detail, time.perf_counter() - t0, tolerance=tolerance, probed_seeds=len(probed),
                  oracle_success_rate=sum(1 for e in probed if e.reward >= 1.0) / n,
                  oracle_mean_reward=sum(e.reward for e in probed) / n, class_shares=shares,
                  probes={r.name: r.to_dict() for r in results})


def episode_class_shares(spec: GameSpec, episodes: list[Episode]) -> dict[str, float] | None:
    """{decision class: share} over the episodes' summaries, for a spec that declares decision classes (None
    otherwise)."""
    if not spec.decision_classes:
        return None
    return class_shares([(e.summary or {}).get("decision_class") for e in episodes])


def undeclared_classes(spec: GameSpec, shares: dict[str, float]) -> list[str]:
    """Classes in `shares` that are not a declared class or a '+' join of declared ones."""
    declared = set(spec.decision_classes)
    return [name for name in shares if not set(name.split("+")) <= declared]


def knob_settings(spec: GameSpec) -> list[tuple[str, GameSpec]]:
    """('as configured', spec), then ('knob=value', spec with that value) for each declared knob value, the other
    fields as `spec.make_env()` configures them. A value the config refuses (with these fields) is left out."""
    settings = [("as configured", spec)]
    if not spec.difficulty_knobs:
        return settings
    config = getattr(spec.make_env(), "config", None)
    if config is None or not dataclasses.is_dataclass(config):
        return settings
    try:
        spec.make_env(config)
    except TypeError:  # a make_env that takes no config: its knobs cannot be set from here
        return settings
    for knob in spec.difficulty_knobs:
        for value in knob.values:
            if getattr(config, knob.name) == value:
                continue
            try:
                changed = dataclasses.replace(config, **{knob.name: value})
            except (TypeError, ValueError):  # e.g. more distractor items than the store has products
                continue
            settings.append((f"{knob.name}={value!r}",
                             dataclasses.replace(spec, make_env=lambda cfg=None, changed=changed: spec.make_env(
                                 cfg or changed))))
    return settings


def instance_classes(spec: GameSpec, seeds: list[int]) -> list[Any]:
    """The decision class of each seed's instance, as the summary right after reset gives it."""
    game = spec.make_env()
    classes = []
    for seed in seeds:
        game.reset(seed)
        classes.append(game.get_summary().get("decision_class"))
    return classes


def _knob_ablations(run: _Run, label: str, variant: GameSpec, row: dict[str, Any], failures: list[str],
                    undecided: list[str]) -> None:
    """The oracle and the ablations at one knob value (`variant`) over the run's seeds: each ablation's result goes
    into row["ablations"]; a failed oracle, a game that raises and a failed ablation into `failures`, an ablation
    with too few seeds to judge into `undecided`."""
    sub = _Run(variant, run.seeds, False)
    oracle, oracle_episodes = _oracle_check(sub, ORACLE_MIN_SUCCESS)
    if oracle["status"] == FAIL:  # a knob value the game declares (so training may use) must be winnable too
        failures.append(f"{label}: oracle {oracle['detail']}")
    probed = [e for e in oracle_episodes if e.error is None]
    try:
        facts, _, _ = _fresh_tool_facts(variant, run.seeds[0])
    except Exception as err:  # noqa: BLE001 -- game code may raise anything; reported, as in _probes_check
        failures.append(f"{label}: a fresh game raised while asked for its tool facts: {_describe(err)}")
        return
    errors = Problems()

    def play(seed: int, policy: Policy, name: str, index: int) -> Episode:
        return sub.play(seed, policy, _policy_rng(10 + index, seed), f"{label} ablation {name}", errors)

    results = evaluate_probes(variant, run.seeds, {e.seed: e.texts for e in probed}, facts, play,
                              shares=episode_class_shares(variant, probed), only_ablations=True)
    for result in results:
        data = result.to_dict()
        row["ablations"][result.name] = data
        if data["status"] == FAIL:
            failures.append(f"{label}: {summarize([result], [], [])[1]}")
        elif result.too_few_seeds:
            undecided.append(f"{label}: {summarize([result], [], [])[1]}")


def _class_prior_check(run: _Run, instances: int) -> dict[str, Any]:
    """The class-prior rule (pipeline/probes.py) at the configured setting and every declared knob value: the
    decision classes' shares over `instances` instances, each at most MAX_CLASS_SHARE; and at each knob value the
    ablations over the validation seeds, each winning at most the largest class's share there + PRIOR_MARGIN and
    never where its skill matters (the configured setting's ablations are the probes check's)."""
    t0, spec = time.perf_counter(), run.spec
    first = run.seeds[0]
    rows, failures, undecided = [], [], []
    for label, variant in knob_settings(spec):
        try:
            shares = class_shares(instance_classes(variant, list(range(first, first + instances))))
        except Exception as err:  # noqa: BLE001 -- game code may raise anything; reported as a failure
            failures.append(f"{label}: drawing instances raised {_describe(err)}")
            continue
        row: dict[str, Any] = {"setting": label, "class_shares": shares, "ablations": {}}
        unknown = undeclared_classes(spec, shares)
        if unknown:
            failures.append(f"{label}: summaries name undeclared decision classes {unknown} (declared: "
                            f"{list(spec.decision_classes)})")
        largest = max(shares.values())
        if largest > MAX_CLASS_SHARE + 1e-9:
            failures.append(f"{label}: the largest decision class holds {largest:.1%} of {instances} instances "
                            f"(limit {MAX_CLASS_SHARE:.0%}): {shares_text(shares)}; a constant decision would win that "
                            f"share, so level the classes (a class-prior field of the config)")
        if label != "as configured" and spec.ablations:
            _knob_ablations(run, label, variant, row, failures, undecided)
        rows.append(row)
    detail = (f"{len(rows)} settings; largest class share {max(max(r['class_shares'].values()) for r in rows):.2f} "
              f"(limit {MAX_CLASS_SHARE})" if rows else "no setting could be drawn")
    if failures or undecided:
        detail += "; " + "; ".join(failures + undecided)
    status = FAIL if failures or not rows else WARN if undecided else PASS
    return _check(status, detail, time.perf_counter() - t0, instances=instances, settings=rows)


def format_class_prior(check: dict[str, Any]) -> list[str]:
    """Indented lines: per setting, the class shares and each ablation's success beside its limit."""
    lines = []
    for row in check.get("settings", []):
        lines.append(f"      {row['setting']:28s} classes: {shares_text(row['class_shares'])}")
        for name, data in row["ablations"].items():
            rate = "-" if data["success_rate"] is None else f"{data['success_rate']:.1%}"
            lines.append(f"        {name:26s} {rate:>7s} (limit {data['limit']:.2f}) {data['status']}  "
                         f"{by_class_text(data)}")
    return lines


def probe_check(spec: GameSpec, seeds: int = 100, first_seed: int = 0, tolerance: float = DEFAULT_TOLERANCE,
                progress: bool = False) -> dict[str, Any]:
    """Only the probes check of `validate` (after recording the oracle's texts on each seed)."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    run = _Run(spec, list(range(first_seed, first_seed + seeds)), progress)
    _, oracle_episodes = _oracle_check(run, ORACLE_MIN_SUCCESS)
    return _probes_check(run, oracle_episodes, tolerance)


def _determinism_check(run: _Run, recorded: dict[str, list[Episode]]) -> dict[str, Any]:
    """Recorded action texts replayed on fresh instances reproduce everything; seeds change the instance.

    A seed whose reset raised (in the first recorded run) is still replayed (a reset that raises only
    sometimes is a mismatch), but it never counts as reproducing, and the distinct-instance share is taken
    over the seeds that did reset. When no seed could be reset at all, the check fails: determinism was
    never shown.
    """
    t0, mismatches, mismatched_seeds = time.perf_counter(), Problems(), set()
    reference = next(iter(recorded.values()))
    started = [e for e in reference if not e.never_started]
    unstarted = [e for e in reference if e.never_started]
    for index, seed in enumerate(run.bar("determinism")):
        before = mismatches.count
        for label, episodes in recorded.items():
            original = episodes[index]
            replay = run_fresh_episode(run.spec, seed, replay_policy(original.texts), random.Random(0))
            if canonical(replay.initial) != canonical(original.initial):
                mismatches.add(f"seed {seed}: initial messages differ between two resets")
            elif replay.outcome() != original.outcome():
                mismatches.add(f"seed {seed}: replaying the {label} actions gives a different outcome")
        # The same instance reset again must start over exactly (no state leaking across episodes).
        try:
            reused = run.spec.make_env()
        except Exception as err:  # noqa: BLE001 -- game code may raise anything; reported as a mismatch
            mismatches.add(f"seed {seed}: make_env raised {_describe(err)}")
        else:
            first = run_episode(run.spec, reused, seed, do_nothing_policy, random.Random(0))
            again = run_episode(run.spec, reused, seed, do_nothing_policy, random.Random(0))
            if first.outcome() != again.outcome():
                mismatches.add(f"seed {seed}: a reused instance reset to the same seed plays differently")
        if mismatches.count > before:
            mismatched_seeds.add(seed)
    n = len(run.seeds)
    if not started:
        detail = f"no seed could be reset ({n} tried), nothing to compare: {unstarted[0].error}"
        detail += f"; {mismatches.text()}" if mismatches.count else ""
        return _check(FAIL, detail, time.perf_counter() - t0, mismatches=mismatches.count, unreset_seeds=n,
                      distinct_initial_share=0.0)
    distinct = len({canonical(e.initial) for e in started}) / len(started)
    reproduced = sum(1 for e in started if e.seed not in mismatched_seeds)
    detail = f"{reproduced}/{n} seeds reproduce; distinct initial messages {distinct:.1%}"
    if unstarted:
        detail += f"; {len(unstarted)} seeds could not be reset (e.g. {unstarted[0].error})"
    status = PASS
    if mismatches.count:
        status, detail = FAIL, detail + f"; {mismatches.text()}"
    if distinct < MIN_DISTINCT_SHARE and len(started) > 1:
        status, detail = FAIL, detail + f"; under {MIN_DISTINCT_SHARE:.0%} of seeds give distinct instances"
    return _check(status, detail, time.perf_counter() - t0, mismatches=mismatches.count,
                  unreset_seeds=len(unstarted), distinct_initial_share=distinct)


def _fuzz_check(run: _Run, n_actions: int, rng: random.Random) -> dict[str, Any]:
    """Random and malformed texts through `spec.extract_action` and `game.step` never raise.

    Episodes are reset when done or after `max_turns` actions; an instance that raised is replaced.
    Exceptions are caught on purpose: each is counted and reported as a failure of this check.
    """
    t0, spec = time.perf_counter(), run.spec
    extract_errors, step_errors = Problems(), Problems()
    game: Game | None = None  # built inside the try below: a make_env that raises is counted, not raised
    functions: list[dict[str, Any]] = []
    episode_index, turns, needs_reset = 0, 0, True
    for i in run.bar("fuzz", range(n_actions)):
        try:
            if game is None:
                game = spec.make_env()
            if needs_reset:
                game.reset(run.seeds[episode_index % len(run.seeds)])
                functions = _functions(game)
                episode_index, turns, needs_reset = episode_index + 1, 0, False
            words, ints = _conversation_values(game)
        except Exception as err:  # noqa: BLE001 -- reported, see docstring
            step_errors.add(f"action {i} ({'make_env' if game is None else 'reset'}): {_describe(err)}")
            game, needs_reset = None, True
            continue
        category, text = fuzz_text(rng, functions, words, ints)
        try:
            action = spec.extract_action(text)
        except Exception as err:  # noqa: BLE001 -- reported, see docstring
            extract_errors.add(f"{category}: {_describe(err)}")
            continue
        if not isinstance(action, Action):
            extract_errors.add(f"{category}: returned {type(action).__name__}, not an Action")
            continue
        try:
            result = game.step(action)
            if reward_problem(result.reward):
                run.rewards.add(f"fuzz {category} step reward {reward_problem(result.reward)}")
            turns += 1
            needs_reset = bool(game.done) or turns >= spec.max_turns
            if needs_reset:
                summary = game.get_summary()
                if summary_problem(summary):
                    run.protocol.add(f"fuzz: {summary_problem(summary)}")
                elif reward_problem(summary["reward"]):
                    run.rewards.add(f"fuzz summary reward {reward_problem(summary['reward'])}")
        except Exception as err:  # noqa: BLE001 -- reported, see docstring
            step_errors.add(f"{category} (action kind {action.kind}): {_describe(err)}")
            game, needs_reset = None, True  # the instance may be corrupt: start a fresh one
    detail = f"{n_actions} actions: extract_action raised {extract_errors.count}, step raised {step_errors.count}"
    examples = "; ".join(x for x in (extract_errors.text(), step_errors.text()) if x)
    return _check(FAIL if extract_errors.count or step_errors.count else PASS,
                  detail + (f"; {examples}" if examples else ""), time.perf_counter() - t0,
                  extract_errors=extract_errors.count, step_errors=step_errors.count)


def _protocol_check(run: _Run) -> dict[str, Any]:
    """Problems gathered from every episode, plus a fresh instance's summary and tool schema names."""
    t0 = time.perf_counter()
    try:
        fresh = run.spec.make_env()
        fresh.reset(run.seeds[0])
        problem = summary_problem(fresh.get_summary())
        if problem:
            run.protocol.add(f"right after reset: {problem}")
        for schema in fresh.get_tool_schemas():
            if _schema_name(_wrap_schema(schema)) is None:
                run.protocol.add(f"tool schema without function.name: {str(schema)[:80]}")
    except Exception as err:  # noqa: BLE001 -- reported as a protocol failure
        run.protocol.add(f"fresh instance: {_describe(err)}")
    problems = run.protocol
    detail = (f"{problems.count} problems: {problems.text()}" if problems.count
              else "reset starts with the system prompt; summaries carry reward/steps/success")
    return _check(FAIL if problems.count else PASS, detail, time.perf_counter() - t0, problems=problems.count)


def validate(
    spec: GameSpec,
    seeds: int = 200,
    fuzz_actions: int = 1000,
    max_baseline: float = 0.5,
    oracle_min_success: float = ORACLE_MIN_SUCCESS,
    first_seed: int = 0,
    progress: bool = False,
    probes: bool = True,
    probe_tolerance: float = DEFAULT_TOLERANCE,
    class_instances: int = CLASS_INSTANCES,
) -> dict[str, Any]:
    """Run every check on `spec` over seeds first_seed .. first_seed+seeds-1; return the report dict.

    Report: {"game", "seeds", "first_seed", "fuzz_actions", "passed", "seconds",
    "checks": {name: {"status": PASS|FAIL|WARN, "detail", "seconds", <numbers>}}, "failures", "warnings"}.
    Checks, in order: oracle, baselines, probes, determinism, fuzz, rewards, protocol, tool_schemas. The
    probes check carries a row per probe under "probes" (see pipeline/probes.py); `probes=False` turns it
    into a warning that says it was skipped.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if fuzz_actions < 0:
        raise ValueError(f"fuzz_actions must be >= 0, got {fuzz_actions}")
    if isinstance(probe_tolerance, bool) or not isinstance(probe_tolerance, (int, float)) or not (
            0.0 <= probe_tolerance <= 1.0):
        raise ValueError(f"probe_tolerance must be a number in [0, 1], got {probe_tolerance!r}")
    started = time.perf_counter()
    run = _Run(spec, list(range(first_seed, first_seed + seeds)), progress)
    checks: dict[str, dict[str, Any]] = {}
    checks["oracle"], oracle_episodes = _oracle_check(run, oracle_min_success)
    checks["baselines"], random_episodes = _baselines_check(run, max_baseline)
    checks["probes"] = (_probes_check(run, oracle_episodes, probe_tolerance) if probes
                        else _check(WARN, "skipped (probes=False / --no-probes): reward hacks were not looked for", 0.0))
    if spec.decision_classes:
        checks["class_prior"] = _class_prior_check(run, class_instances)
    checks["determinism"] = _determinism_check(run, {"oracle": oracle_episodes, "random-tool": random_episodes})
    checks["fuzz"] = _fuzz_check(run, fuzz_actions, random.Random(first_seed * 31 + 5))
    checks["rewards"] = _check(  # gathered from every episode above
        FAIL if run.rewards.count else PASS,
        f"{run.rewards.count} rewards outside float [0, 1]" + (f": {run.rewards.text()}" if run.rewards.count else ""),
        0.0, bad_rewards=run.rewards.count,
    )
    checks["protocol"] = _protocol_check(run)
    t0 = time.perf_counter()
    checks["tool_schemas"] = _check_tool_schemas(spec)
    checks["tool_schemas"]["seconds"] = round(time.perf_counter() - t0, 3)
    failures = [f"{name}: {c['detail']}" for name, c in checks.items() if c["status"] == FAIL]
    warnings = [f"{name}: {c['detail']}" for name, c in checks.items() if c["status"] == WARN]
    return {
        "game": spec.name,
        "seeds": seeds,
        "first_seed": first_seed,
        "fuzz_actions": fuzz_actions,
        "passed": not failures,
        "seconds": round(time.perf_counter() - started, 3),
        "checks": checks,
        "failures": failures,
        "warnings": warnings,
    }


def _check_tool_schemas(spec: GameSpec) -> dict[str, Any]:
    """Every tool the game offers exists, identical, in the target benchmark."""
    try:
        game = spec.make_env()
        game.reset(0)  # some games build their tool list per instance
        schemas = [_wrap_schema(s) for s in game.get_tool_schemas()]
    except Exception as err:  # noqa: BLE001 -- reported as a failure
        return _check(FAIL, f"get_tool_schemas raised {_describe(err)}", 0.0)
    if not spec.target:
        return _check(WARN, f"{len(schemas)} tools; no target set on the spec, not compared", 0.0)
    try:
        target_schemas, source = load_target_schemas(spec.target)
    except (InputError, ImportError) as err:  # ImportError: the target game module is broken
        return _check(FAIL, f"target {spec.target!r} cannot be loaded: {err}", 0.0)
    if target_schemas is None and target_is_path(spec.target):
        # A path is the author's own file: missing, it is a typo or a file left out, not an optional benchmark.
        return _check(FAIL, f"target file {spec.target} not found (looked in the current folder and {REPO_ROOT}); "
                            "fix GameSpec.target to the target's tool-schema JSON file, or set it to '' to skip "
                            "the comparison", 0.0)
    if target_schemas is None:  # a registered benchmark that is not installed here: nothing to compare against
        return _check(WARN, f"target {spec.target!r} not available ({source}); not compared", 0.0)
    by_name = {_schema_name(s): canonical(s) for s in map(_wrap_schema, target_schemas) if _schema_name(s)}
    problems = Problems()
    for schema in schemas:
        name = _schema_name(schema)
        if name is None:
            problems.add(f"schema without a name: {str(schema)[:60]}")
        elif name not in by_name:
            problems.add(f"tool {name!r} is not in the target")
        elif canonical(schema) != by_name[name]:
            problems.add(f"tool {name!r} differs from the target's schema")
    detail = f"{len(schemas) - problems.count}/{len(schemas)} tools match {source}"
    return _check(FAIL if problems.count else PASS, detail + (f"; {problems.text()}" if problems.count else ""), 0.0,
                  mismatched_tools=problems.count)


def format_report(report: dict[str, Any]) -> str:
    """The one-screen text report: a line per check, then the verdict."""
    lines = [f"validate_game {report['game']}  ({report['seeds']} seeds, {report['fuzz_actions']} fuzz actions)"]
    for name, check in report["checks"].items():
        lines.append(f"{check['status']:4s}  {name:12s} {check['seconds']:7.2f}s  {check['detail']}")
        if name == "probes":
            lines += format_table(check)
        if name == "class_prior":
            lines += format_class_prior(check)
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append(
        f"RESULT: {verdict} ({len(report['failures'])} failed, {len(report['warnings'])} warnings) "
        f"in {report['seconds']:.2f}s"
    )
    return "\n".join(lines)


def with_overrides(spec: GameSpec, overrides: dict[str, Any]) -> GameSpec:
    """`spec` whose `make_env()` builds the game with these config fields (e.g. the target's storefront surface
    and calibrated knobs), so a game is validated as it will be trained. ValueError/TypeError from the config
    class propagate: the caller names the bad field."""
    if not overrides:
        return spec
    spec.make(**overrides)  # a bad field fails here, once, not on every seed
    return dataclasses.replace(spec, make_env=lambda config=None: spec.make_env(config or spec.config_cls(**overrides)))


def _source_file(obj: Any) -> str | None:
    """The Python file that defines `obj` (a class or function), or None (built-ins, partials, the REPL)."""
    try:
        return inspect.getsourcefile(obj)
    except TypeError:  # no file behind it: nothing on disk to protect
        return None


def game_input_files(spec: GameSpec) -> list[tuple[str, Any]]:
    """(what, path) pairs of the files a command on `spec` reads: the game's source (where make_env and the config
    class are defined) and its target tool-schema file. An output flag must name none of them (check_output_path):
    writing a report there would replace the game with JSON."""
    files = [("the game's source file", _source_file(spec.make_env))]
    if spec.config_cls is not None:
        files.append(("the game's config source file", _source_file(spec.config_cls)))
    target = target_file(spec.target)
    if target is not None:
        files.append(("the game's target tool-schema file", target))
    return files


def _check_buildable(spec: GameSpec) -> None:
    """InputError unless `spec.make_env()` builds an instance (a make_env that raises: nothing could be
    validated)."""
    try:
        spec.make_env()
    except Exception as err:  # noqa: BLE001 -- game code may raise anything; it is the reason we report
        raise InputError(f"game {spec.name!r} cannot be built: make_env() raised {_describe(err)}; "
                         "fix the game's make_env, then validate again") from None


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Validate a registered game (see module docstring).")
    parser.add_argument("name", help="registered game name (python game_registry.py --list)")
    parser.add_argument("--seeds", type=int, default=200, help="seeds 0..N-1 to play (default 200)")
    parser.add_argument("--fuzz-actions", type=int, default=1000, help="random/malformed actions (default 1000)")
    parser.add_argument("--max-baseline", type=float, default=0.5, help="fail when a baseline's mean reward >= this")
    parser.add_argument("--probe-tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="a probe fails when its success rate > its expected share + this (default 0.1)")
    parser.add_argument("--no-probes", action="store_true", help="skip the reward-hacking probes (reported as WARN)")
    parser.add_argument("--json-output", help="write the report here (JSON)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--game-overrides", default="{}",
                        help='JSON object of game config fields to validate with, e.g. \'{"storefront": '
                             '"configs/storefront/cpu_demo.yaml"}\' (the game as it will be trained)')
    args = parser.parse_args(argv)
    # every flag, the output path and the game itself are checked before the first episode
    if args.seeds < 1:
        raise InputError(f"--seeds must be >= 1, got {args.seeds}")
    if args.fuzz_actions < 0:
        raise InputError(f"--fuzz-actions must be >= 0, got {args.fuzz_actions}")
    check_number(args.max_baseline, "--max-baseline", 0.0, 1.0, low_open=True)
    check_number(args.probe_tolerance, "--probe-tolerance", 0.0, 1.0)
    if args.json_output is not None:  # the path alone first: a typo must not cost importing the game
        check_output_path(args.json_output, "--json-output")
    spec = lookup_game(args.name)  # InputError: an unknown game or a game file that fails to import
    if args.json_output is not None:
        check_not_an_input(args.json_output, "--json-output", game_input_files(spec))
    _check_buildable(spec)
    try:
        overrides = json.loads(args.game_overrides)
    except json.JSONDecodeError as err:
        raise InputError(f"--game-overrides is not JSON ({err}); pass an object such as '{{\"short_ids\": true}}'") from None
    if not isinstance(overrides, dict):
        raise InputError(f"--game-overrides must be a JSON object, got {args.game_overrides!r}")
    try:
        spec = with_overrides(spec, overrides)
    except (TypeError, ValueError) as err:
        raise InputError(f"--game-overrides {overrides} do not fit game {args.name!r}: {err}") from None
    report = validate(spec, seeds=args.seeds, fuzz_actions=args.fuzz_actions, max_baseline=args.max_baseline,
                      progress=not args.no_progress, probes=not args.no_probes, probe_tolerance=args.probe_tolerance)
    print(format_report(report))
    if args.json_output:
        atomic_write_json(args.json_output, report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
