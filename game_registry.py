"""Game protocol and registry: what Step 2 produces and Steps 3-4 consume.

A *game* is a seeded, procedurally generated, verifiable environment that isolates one capability.
Each game lives in one file holding a config dataclass, the game class and one `register_game(...)`
call. The coding agent of Step 2 writes `capability_<name>_game.py` at the repository root; the games
shipped as worked examples live in `games/`. Both places (plus any folder listed in the
`TRACE_GAMES_DIRS` environment variable, `os.pathsep`-separated) are imported on the first lookup.

The protocol (see `Game`):
    messages = game.reset(seed)            # [system, user, ...] OpenAI-style dicts
    action = spec.extract_action(text)     # model text -> Action (never raises)
    result = game.step(action)             # StepResult(observation_messages, reward, done, info)
    game.done, game.get_messages(), game.get_summary()  # {"reward", "steps", "success", ...}

Messages use the τ²-bench shape our results files store: an assistant message is
`{"role": "assistant", "content": str | None, "tool_calls": [{"id", "name", "arguments": dict}]}`,
a tool result is `{"role": "tool", "tool_call_id", "name", "content"}`. The chat template
(`train/chat_template.py`) renders both.

Prompts: `get_system_prompt()` is the environment's own system prompt (policy, rules). For training,
`prompt_variant(messages, spec, hinted)` appends `spec.base_prompt` or `spec.hint_prompt` to it, so the
GRPO trainer can sample with the hint and re-score the same completion under the base prompt.

Usage: `python game_registry.py --list` (exit 2 when a game fails to import, or to build: its tool count
shows as `?` and stderr says why).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from common.paths import REPO_ROOT
from common.validation import InputError

DEFAULT_GAME_DIRS = (REPO_ROOT, REPO_ROOT / "games")
GAME_FILE_GLOB = "capability_*_game.py"
# Built-in games that are not capability games (the target benchmark itself, for direct-RL baselines).
BUILTIN_GAME_MODULES = ("benchmarks.storefront.game",)
# Games imported only when asked for by name: they need an optional package and a server (τ²-bench's domains need
# the `tau2` package and a customer model), so `list_games()` and the suites that play every game leave them out.
ON_DEMAND_GAMES = {"tau2_retail": "benchmarks.tau2_game", "tau2_airline": "benchmarks.tau2_game",
                   "tau2_retail_precondition_verification": "games.tau2.retail_precondition_verification",
                   "tau2_airline_precondition_verification": "games.tau2.airline_precondition_verification"}


# --------------------------------------------------------------------------------------------------
# Actions and step results
# --------------------------------------------------------------------------------------------------
@dataclass
class ToolCall:
    """One parsed tool call. `id` is assigned by the game when it executes the call."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class Action:
    """What the model did in one turn.

    kind:
      - "tool_call": `tool_calls` holds one or more calls; `content` is any text before them.
      - "reply":     a plain message to the user in `content`.
      - "malformed": the text could not be understood; `error` says why. Games answer with an
                     error observation (the episode goes on or ends by the game's own rule).
    """

    kind: Literal["tool_call", "reply", "malformed"]
    raw: str
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str = ""

    def to_message(self) -> dict[str, Any]:
        """The assistant message this action adds to the conversation."""
        if self.kind == "tool_call":
            return {
                "role": "assistant",
                "content": self.content or None,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            }
        return {"role": "assistant", "content": self.raw if self.kind == "malformed" else self.content}


@dataclass
class StepResult:
    observation_messages: list[dict[str, Any]]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes_action(text: str) -> Action:
    """Turn model text into an Action; never raises.

    Hermes-style calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one or more blocks;
    `arguments` may also be a JSON-encoded string of an object). Text without a tool-call tag is a reply
    to the user. A tag that is unclosed, or a block that is not a JSON object with a string `name` and
    an object `arguments`, makes the whole action malformed.
    """
    if not isinstance(text, str):
        return Action(kind="malformed", raw=repr(text), error="model output is not text")
    blocks = _TOOL_CALL_BLOCK.findall(text)
    if not blocks:
        if "<tool_call>" in text or "</tool_call>" in text:
            return Action(kind="malformed", raw=text, error="unbalanced <tool_call> tags")
        content = text.strip()
        if not content:
            return Action(kind="malformed", raw=text, error="empty response")
        return Action(kind="reply", raw=text, content=content)
    if text.count("<tool_call>") != len(blocks):
        return Action(kind="malformed", raw=text, error="unbalanced <tool_call> tags")
    calls = []
    for block in blocks:
        try:
            payload = json.loads(block.strip())
        except json.JSONDecodeError as err:
            return Action(kind="malformed", raw=text, error=f"tool call is not valid JSON: {err.msg}")
        except RecursionError:  # pathologically nested JSON is still just bad model output
            return Action(kind="malformed", raw=text, error="tool call JSON is nested too deeply")
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
            return Action(kind="malformed", raw=text, error='tool call needs a string "name"')
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as err:
                return Action(kind="malformed", raw=text, error=f"tool arguments are not valid JSON: {err.msg}")
            except RecursionError:
                return Action(kind="malformed", raw=text, error="tool arguments JSON is nested too deeply")
        if not isinstance(arguments, dict):
            return Action(kind="malformed", raw=text, error='tool call "arguments" must be a JSON object')
        calls.append(ToolCall(name=payload["name"], arguments=arguments))
    content = text[: text.index("<tool_call>")].strip()
    return Action(kind="tool_call", raw=text, content=content, tool_calls=calls)


def render_tool_call(name: str, arguments: dict[str, Any] | str) -> str:
    """The exact text an assistant turn contains for one tool call (same bytes the template writes).

    `arguments` as a dict is serialised like the template's `tojson`; as a string it is kept verbatim.
    It is the inverse of `parse_hermes_action`, and the tiny model's chat template (train/chat_template.py)
    writes the same bytes. An assistant turn with text and calls is `text + "\n" + "\n".join(calls)` (no
    separator before the first call when the text is empty).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool-call name must be a non-empty string, got {name!r}")
    if isinstance(arguments, str):
        args_text = arguments
    elif isinstance(arguments, dict):
        args_text = json.dumps(arguments, ensure_ascii=False)
    else:
        raise ValueError(
            f"tool-call arguments must be a dict or a JSON string, got {type(arguments).__name__}; "
            "wrap positional values in a dict such as {'value': ...}"
        )
    call_json = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + args_text + "}"
    return "<tool_call>\n" + call_json + "\n</tool_call>"



# --------------------------------------------------------------------------------------------------
# The game protocol
# --------------------------------------------------------------------------------------------------
class Game(ABC):
    """One environment instance. `reset(seed)` starts a new episode from `random.Random(seed)`."""

    @abstractmethod
    def reset(self, seed: int) -> list[dict[str, Any]]:
        """Start an episode; return the initial messages (system first, then the user's opening)."""

    @abstractmethod
    def get_system_prompt(self) -> str:
        """The environment's system prompt (policy and rules), without base/hint prompt."""

    @abstractmethod
    def get_tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas (`{"type": "function", "function": {...}}`) of the tools offered."""

    @abstractmethod
    def get_messages(self) -> list[dict[str, Any]]:
        """The whole conversation so far (a copy)."""

    @abstractmethod
    def step(self, action: Action) -> StepResult:
        """Apply one model action; return what the model sees next."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True once the episode has ended (by the game's rules)."""

    @abstractmethod
    def get_summary(self) -> dict[str, Any]:
        """At least {"reward": float in [0, 1], "steps": int, "success": bool}; valid at any time."""

    @abstractmethod
    def oracle_response(self) -> str:
        """The text an expert would produce now (tool-call markup or a reply). Used for validation and SFT."""

    # Optional facts for the reward-hacking probes of `pipeline.validate_game` (None: the game does not say,
    # and the probes that need the fact are skipped with a warning).
    def write_tool_names(self) -> frozenset[str] | None:
        """Names of the tools that change state (cancel, refund, ...)."""
        return None

    def auth_tool_names(self) -> frozenset[str] | None:
        """Names of the tools that identify the user (authentication look-ups)."""
        return None


# A policy plays one episode: (turn index, the live game, an rng) -> the model's text for that turn, or None to
# stop producing text (the episode then ends where it is).
Policy = Callable[[int, "Game", Any], "str | None"]


@dataclass(frozen=True)
class Probe:
    """A degenerate policy that must not succeed: a reward-hacking test of a game (see pipeline/probes.py).

    `make_policy(oracle_texts)` gets the oracle's texts on the seed being probed and returns the probe's
    policy for that seed, or None when the probe does not apply there (for example "stop after the first
    request" on a one-request episode, where it is the oracle). `expected_success` is the share of
    applicable seeds the probe may legitimately solve (0 for a pure hack).
    """

    name: str
    description: str
    make_policy: Callable[[list[str]], Policy | None]
    expected_success: float = 0.0

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name or ""):
            raise InputError(f"Probe.name must be snake_case, got {self.name!r}")
        if not callable(self.make_policy):
            raise InputError(f"Probe({self.name}).make_policy must be callable")
        if not _is_fraction(self.expected_success):
            raise InputError(f"Probe({self.name}).expected_success must be a number in [0, 1], "
                             f"got {self.expected_success!r}")


@dataclass(frozen=True)
class DifficultyKnob:
    """A config field whose value sets how hard the game is (not a class prior such as a label share).

    `harder` says which way is harder; `values` (optional) lists candidate values from easy to hard, for
    `pipeline.recalibrate` and the monotonicity tests.
    """

    name: str
    harder: Literal["increase", "decrease"] = "increase"
    values: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.harder not in ("increase", "decrease"):
            raise InputError(f"DifficultyKnob({self.name}).harder must be 'increase' or 'decrease', got {self.harder!r}")
        if not isinstance(self.values, tuple):
            raise InputError(f"DifficultyKnob({self.name}).values must be a tuple (easy to hard)")


def _is_fraction(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and value == value
            and 0.0 <= value <= 1.0)


@dataclass
class GameSpec:
    """Everything the trainer needs to know about a game."""

    name: str
    make_env: Callable[..., Game]  # make_env() or make_env(config) -> a fresh Game
    extract_action: Callable[[str], Action] = parse_hermes_action
    system_prompt: str = ""  # the static part of the system prompt (the game may add instance text)
    base_prompt: str = ""  # appended to the system prompt for ordinary rollouts
    hint_prompt: str = ""  # appended instead for hinted rollouts (expert guidance)
    max_gen_tokens: int = 256  # per assistant turn
    max_turns: int = 12  # assistant turns per episode
    capability: str = ""  # the capability this game trains (empty for target benchmarks)
    config_cls: type | None = None  # the game's config dataclass, for --key value overrides
    # The target benchmark whose tool schemas this game must reuse: a registered game name or a path to a
    # JSON list of OpenAI tool schemas. Empty: not checked (validate_game warns).
    target: str = ""
    # Config fields that set difficulty (pipeline.recalibrate searches only these).
    difficulty_knobs: tuple[DifficultyKnob, ...] = ()
    # Game-specific reward-hacking probes, run by validate_game after the generic ones.
    probes: tuple[Probe, ...] = ()
    # Shares of applicable seeds that generic probes legitimately solve here ({probe name: share}).
    probe_expectations: dict[str, float] = field(default_factory=dict)
    # The expert without the game's skill, and constant policies (always act, always refuse): each may win
    # at most pipeline.probes.ABLATION_LIMIT of the seeds, with no tolerance (one skill decides success); with
    # `decision_classes`, at most the largest class's share + pipeline.probes.PRIOR_MARGIN instead.
    ablations: tuple[Probe, ...] = ()
    # The classes of the decision an episode turns on (precondition: "act" / "refuse"), named so that
    # validate_game can hold the game to the class-prior rule: no class above pipeline.validate_game's
    # MAX_CLASS_SHARE of instances at any knob value, and no skill-less policy above the largest class's share +
    # PRIOR_MARGIN. A game that declares them puts its instance's class in `get_summary()["decision_class"]`
    # (an episode of several decisions: their classes joined with "+"). Empty: the stricter ABLATION_LIMIT.
    decision_classes: tuple[str, ...] = ()
    # The seed of task i in a run with base seed s, for evaluation (`train.evaluate`): None, the storefront's hash
    # of (s, i); a benchmark of fixed tasks maps seed to task and plays s + i.
    task_seed: Callable[[int, int], int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z0-9_]+", self.name or ""):
            raise InputError(f"GameSpec.name must be a snake_case string, got {self.name!r}")
        for attr in ("make_env", "extract_action"):
            if not callable(getattr(self, attr)):
                raise InputError(f"GameSpec({self.name}).{attr} must be callable, got {getattr(self, attr)!r}")
        for attr in ("system_prompt", "base_prompt", "hint_prompt", "capability", "target"):
            if not isinstance(getattr(self, attr), str):
                raise InputError(f"GameSpec({self.name}).{attr} must be a string")
        for attr in ("max_gen_tokens", "max_turns"):
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"GameSpec({self.name}).{attr} must be a positive int, got {value!r}")
        if self.config_cls is not None and not isinstance(self.config_cls, type):
            raise InputError(f"GameSpec({self.name}).config_cls must be a class")
        self.difficulty_knobs = tuple(self.difficulty_knobs)
        self.probes = tuple(self.probes)
        if any(not isinstance(k, DifficultyKnob) for k in self.difficulty_knobs):
            raise InputError(f"GameSpec({self.name}).difficulty_knobs must hold DifficultyKnob values")
        if self.difficulty_knobs:
            fields = {f.name for f in dataclasses.fields(self.config_cls)} if (
                self.config_cls is not None and dataclasses.is_dataclass(self.config_cls)) else set()
            unknown = [k.name for k in self.difficulty_knobs if k.name not in fields]
            if unknown:
                raise InputError(f"GameSpec({self.name}).difficulty_knobs {unknown} are not fields of its config_cls "
                                 f"({sorted(fields) or 'no config dataclass'}); declare knobs that the config has")
        self.ablations = tuple(self.ablations)
        if any(not isinstance(p, Probe) for p in (*self.probes, *self.ablations)):
            raise InputError(f"GameSpec({self.name}).probes and .ablations must hold Probe values")
        names = [p.name for p in (*self.probes, *self.ablations)]
        if len(set(names)) != len(names):
            raise InputError(f"GameSpec({self.name}).probes and .ablations share or repeat names: {names}")
        self.decision_classes = tuple(self.decision_classes)
        if any(not isinstance(c, str) or not re.fullmatch(r"[a-z0-9_]+", c) for c in self.decision_classes) or len(
                set(self.decision_classes)) != len(self.decision_classes):
            raise InputError(f"GameSpec({self.name}).decision_classes must be distinct snake_case names, got "
                             f"{self.decision_classes!r}")
        if len(self.decision_classes) == 1:
            raise InputError(f"GameSpec({self.name}).decision_classes names one class: a decision needs two or more "
                             f"(or none, to keep the stricter ablation limit)")
        if self.task_seed is not None and not callable(self.task_seed):
            raise InputError(f"GameSpec({self.name}).task_seed must be a function (seed, index) -> task seed")
        if not isinstance(self.probe_expectations, dict) or not all(
                isinstance(k, str) and _is_fraction(v) for k, v in self.probe_expectations.items()):
            raise InputError(f"GameSpec({self.name}).probe_expectations must map probe names to shares in [0, 1]")

    def difficulty_knob(self, name: str) -> DifficultyKnob | None:
        """The declared knob called `name`, or None."""
        return next((k for k in self.difficulty_knobs if k.name == name), None)

    def make(self, **overrides: Any) -> Game:
        """A fresh game; keyword overrides go to the config dataclass (needs `config_cls`)."""
        if not overrides:
            return self.make_env()
        if self.config_cls is None:
            raise ValueError(f"game {self.name!r} has no config_cls; it takes no overrides ({sorted(overrides)})")
        return self.make_env(self.config_cls(**overrides))


def check_game_overrides(spec: GameSpec, overrides: dict[str, Any], where: str = "game_overrides") -> None:
    """Build one game of `spec` with `overrides` now, so a misspelt or bad config field is refused before any
    model loads: InputError naming `where`, the game and the config's own message. A game's config raises
    TypeError for an unknown field and ValueError (InputError is one) for a bad value, as the game prompts ask."""
    try:
        spec.make(**overrides)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where} {overrides} do not fit game {spec.name!r}: {err}") from None


def prompt_variant(messages: list[dict[str, Any]], spec: GameSpec, hinted: bool) -> list[dict[str, Any]]:
    """Copy of `messages` whose system message carries the base prompt or, when hinted, the hint prompt."""
    extra = spec.hint_prompt if hinted else spec.base_prompt
    if not messages or messages[0].get("role") != "system":
        raise ValueError(f"game {spec.name!r}: the first message must be the system prompt")
    out = [dict(m) for m in messages]
    if extra:
        out[0]["content"] = f"{out[0]['content'].rstrip()}\n\n{extra.strip()}"
    return out


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------
_REGISTRY: dict[str, GameSpec] = {}
_LOADED_FILES: set[Path] = set()
_FAILED_FILES: dict[Path, str] = {}  # game file -> why it failed to import, raised again on every later lookup
_DISCOVERED = False


class GameImportError(ImportError):
    """A game file failed to import; the message names the file."""


def register_game(spec: GameSpec) -> GameSpec:
    """Add a game. Raises ValueError on a duplicate name or a value that is not a GameSpec."""
    if not isinstance(spec, GameSpec):
        raise ValueError(f"register_game expects a GameSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY:
        raise ValueError(f"game {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def game_dirs() -> list[Path]:
    """Folders searched for `capability_*_game.py`: repo root, games/, and $TRACE_GAMES_DIRS."""
    extra = [Path(p) for p in os.environ.get("TRACE_GAMES_DIRS", "").split(os.pathsep) if p]
    return [*DEFAULT_GAME_DIRS, *extra]


def _import_game_file(path: Path) -> None:
    path = path.resolve()
    if path in _FAILED_FILES:  # not run twice: a file that registered its game before failing would fail otherwise
        raise GameImportError(_FAILED_FILES[path])
    if path in _LOADED_FILES:
        return
    _LOADED_FILES.add(path)
    module_name = f"trace_games.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise GameImportError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # re-raised with the file name: a broken game is never swallowed
        sys.modules.pop(module_name, None)
        _FAILED_FILES[path] = f"{path}: failed to import game: {type(err).__name__}: {err}"
        raise GameImportError(_FAILED_FILES[path]) from err


def discover_games() -> None:
    """Import built-in game modules and every game file in `game_dirs()` (once it has gone through: after a game
    failed to import, every later call raises that error again rather than leave the later files unimported)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    for folder in game_dirs()[len(DEFAULT_GAME_DIRS):]:  # a typo there would otherwise only show as "unknown game"
        if not folder.is_dir():
            raise GameImportError(f"TRACE_GAMES_DIRS names {folder} ({folder.resolve()}), which is not a folder; "
                                  "fix or remove that entry (entries are separated by "
                                  f"{os.pathsep!r}, relative ones start at the current folder)")
    for module in BUILTIN_GAME_MODULES:
        if importlib.util.find_spec(module.rsplit(".", 1)[0]) is not None:
            importlib.import_module(module)
    for folder in game_dirs():
        if folder.is_dir():
            for path in sorted(folder.glob(GAME_FILE_GLOB)):
                _import_game_file(path)
    _DISCOVERED = True


def get_game(name: str) -> GameSpec:
    """The spec of a registered game; unknown names raise KeyError listing the known ones."""
    discover_games()
    if name not in _REGISTRY and name in ON_DEMAND_GAMES:
        importlib.import_module(ON_DEMAND_GAMES[name])
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"unknown game {name!r}; registered games: {known}")
    return _REGISTRY[name]


def lookup_game(name: str) -> GameSpec:
    """`get_game(name)` for a command's input: an unknown name, a game file that fails to import or a built-in
    game module that is missing raise InputError (the message lists the known games or names the file)."""
    try:
        return get_game(name)
    except KeyError as err:
        raise InputError(err.args[0]) from None
    except ImportError as err:  # GameImportError, or a built-in game module that is missing
        raise InputError(str(err)) from None


def list_games() -> list[str]:
    """The games discovery registers (not ON_DEMAND_GAMES, even once one was asked for by name)."""
    discover_games()
    return sorted(name for name in _REGISTRY if name not in ON_DEMAND_GAMES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List the registered games.")
    parser.add_argument("--list", action="store_true", help="print each game with its capability and tool count")
    args = parser.parse_args(argv)
    if not args.list:
        parser.print_help()
        return 0
    try:
        names = list_games()
    except GameImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{'game':44s} {'capability':34s} tools  max_turns")
    broken = []
    for name in names:
        spec = _REGISTRY[name]
        try:
            n_tools = f"{len(spec.make_env().get_tool_schemas()):5d}"
        except Exception as err:  # noqa: BLE001 -- game code may raise anything; one broken game hides no other
            n_tools = f"{'?':>5s}"
            broken.append(name)
            print(f"warning: game {name!r} cannot be built or list its tools: {type(err).__name__}: "
                  f"{str(err)[:200]} (python -m pipeline.validate_game {name} checks it)", file=sys.stderr)
        print(f"{name:44s} {spec.capability or '-':34s} {n_tools}  {spec.max_turns:9d}")
    print(f"on demand (asked for by name; an optional package and a server): {', '.join(sorted(ON_DEMAND_GAMES))}")
    if broken:
        print(f"error: {len(broken)} game(s) could not be built: {', '.join(broken)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Run through the importable module so game files that `import game_registry` share one registry.
    import game_registry

    sys.exit(game_registry.main())
