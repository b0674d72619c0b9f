"""Reward-hacking probes: degenerate policies that must not win a tool-use game.

RL finds every hole in a reward. Each probe is a policy that skips or fakes part of the job (it never
authenticates, it answers with every value it has seen, it stops after the first request, ...); a game
whose reward lets such a policy succeed teaches that shortcut instead of the capability.
`pipeline.validate_game` runs the generic probes below on every game, plus the game-specific ones a
`GameSpec` registers in `probes=`, and fails the game when a probe succeeds on more applicable seeds than
its limit: `expected_success` (game-specific probes) or `spec.probe_expectations.get(name, 0.0)` (generic
ones, for a legitimate share such as "refusing is right on 30% of seeds"), plus a tolerance.

A probe (`game_registry.Probe`) turns the oracle's texts on a seed into a policy for that seed, or None
when it does not apply there (its script would equal the oracle's). Generic probes:

  do_nothing                polite replies that help with nothing
  refuse_blindly            the oracle without its write calls; every reply after the first tool call
                            becomes a refusal (needs the write tools)
  skip_authentication       the oracle without auth calls and without the replies before the first auth
                            call, i.e. the identity questions (needs the auth tools)
  all_calls_in_one_turn     every oracle tool call in the first turn, then the oracle's replies
  echo_last_observation     the oracle, but each reply after a tool call is the last tool message (live)
  list_enum_values          the oracle's calls; each reply after a tool call lists every enum value of the
                            tool schemas and every short string seen in tool results (live)
  spam_numbers              likewise with every number seen in tool results, their pairwise sums and
                            absolute differences (live)
  act_without_lookups       the oracle without read calls (needs write and auth tools)
  stop_after_first_request  the oracle up to its first closing statement, then "Goodbye." every turn
                            (needs the auth tools; n/a on one-request episodes)
  wrong_claim_then_report   the oracle, but before each statement after its first tool call that states a
                            number, the same statement with each number off by one, asked as a question:
                            guesses spread over turns must cost, not be dropped (n/a with no such statement)
  blanket_confirmation      the oracle, but each question right before a write names every write tool (and
                            the ids of the oracle's question): a yes to it approves no one action (needs the
                            write tools; n/a when the oracle asks nothing before its writes)
  report_in_malformed_turn  the oracle, but each statement after its first tool call is sent in a turn the
                            parser rejects, then "Done.": the user only got a format error
  report_as_question        the oracle, but each statement after its first tool call ends with a question: a
                            question asked is not an outcome reported

Ablations (`GameSpec.ablations`, origin "ablation" in the report) are run the same way: the expert without
the game's skill and constant policies (always act, always refuse), which a game declares itself. Each may
win at most ABLATION_LIMIT (0.25) of the seeds, with no tolerance: one skill must decide success (on fewer than
ABLATION_MIN_SEEDS seeds, a rate above it that chance at 0.25 often gives is WARN, not FAIL).

The class-prior rule, for a game with one decision per episode (`GameSpec.decision_classes`, each episode's
class in its summary's "decision_class"): a constant decision wins every episode of its class, so no limit
below the largest class's share can hold; instead each ablation may win at most that share (measured on the
seeds probed) + PRIOR_MARGIN, and never an episode where its skill matters (the summary's
"skill_matters"[name]: the expert without the skill would make another call there). validate_game's
class_prior check also keeps every class at or below MAX_CLASS_SHARE of the instances at every knob value,
and holds the ablations to the same rule there.

The write and auth facts come from `Game.write_tool_names()` / `Game.auth_tool_names()`; None means the
game does not say, and the probes needing the fact are reported as WARN instead of run. Script-based
probes stop producing text when their script runs out (the episode ends there, as a replay does).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from game_registry import Action, Game, GameSpec, Policy, Probe

PASS, FAIL, WARN, NA = "PASS", "FAIL", "WARN", "n/a"  # the first three as in validate_game
# The most an ablation (the expert without the game's skill, a constant policy) may win, with no tolerance.
ABLATION_LIMIT = 0.25
# Below this many seeds, a rate above the limit fails only when chance at the limit rarely gives it (one-sided
# binomial tail < ABLATION_CHANCE); otherwise the row is WARN, "too few seeds to tell": 3 wins in 10 seeds is
# what a policy winning 12.5% gets one time in eight.
ABLATION_MIN_SEEDS, ABLATION_CHANCE = 40, 0.05
# The class-prior rule (module docstring): an ablation of a game with decision classes may win at most the
# largest class's share + PRIOR_MARGIN of the seeds; no class may hold more than MAX_CLASS_SHARE of the instances.
PRIOR_MARGIN = 0.05
MAX_CLASS_SHARE = 0.55
# Below this many seeds, an ablation above its class-prior limit fails only when chance at the limit rarely gives
# it (as ABLATION_MIN_SEEDS for the 0.25 limit): near a limit of ~0.55, 40 seeds swing by +-0.15.
PRIOR_MIN_SEEDS = 200


def class_shares(classes: Sequence[Any]) -> dict[str, float]:
    """{class: share} of the episodes' decision classes (None counted as "(none)"), largest first."""
    counts: dict[str, int] = {}
    for name in classes:
        key = "(none)" if name is None else str(name)
        counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values()) or 1
    return {name: n / total for name, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))}


def prior_limit(shares: dict[str, float]) -> float:
    """The most a skill-less policy may win under the class-prior rule: the largest share + PRIOR_MARGIN."""
    return min(1.0, max(shares.values(), default=0.0) + PRIOR_MARGIN)


def shares_text(shares: dict[str, float]) -> str:
    return ", ".join(f"{name} {share:.2f}" for name, share in shares.items())


def binomial_tail(successes: int, trials: int, p: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, p)."""
    return sum(math.comb(trials, k) * p ** k * (1 - p) ** (trials - k) for k in range(successes, trials + 1))
DEFAULT_TOLERANCE = 0.1
REFUSAL = "I'm sorry, I cannot do that: it is not allowed by our policy."
GOODBYE = "Goodbye."
POLITE_REPLIES = (
    "Thank you for reaching out.",
    "I understand.",
    "Thanks for your patience.",
    "Have a great day!",
)
NOTHING_SEEN = "I have nothing more to add."  # a live reply with nothing to list or echo
MAX_LEAF_CHARS = 40  # string leaves of tool results longer than this are not listed
MAX_LISTED = 300  # values in one list_enum_values / spam_numbers reply
MAX_REPLY_CHARS = 3000  # ... and characters (games cap a turn's length; a cut reply would just be malformed)
MAX_EXAMPLES = 5

_CALL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")  # "45.30", "-3", not the digits of "W123"


# --------------------------------------------------------------------------------------------------
# The oracle's script
# --------------------------------------------------------------------------------------------------
@dataclass
class OracleTurn:
    """One oracle text and what the game's `extract_action` makes of it."""

    text: str
    action: Action

    @property
    def is_call(self) -> bool:
        return self.action.kind == "tool_call" and bool(self.action.tool_calls)

    @property
    def is_reply(self) -> bool:
        return not self.is_call

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.action.tool_calls] if self.is_call else []


def tool_call_markup(name: str, arguments: Any) -> str:
    """Hermes markup of one call (used only when a turn's own text cannot be cut apart)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def keep_calls(turn: OracleTurn, keep: Sequence[bool]) -> str | None:
    """`turn`'s text with only the tool calls whose `keep` flag is set; None when none is kept.

    The turn's own text is cut where it has one `<tool_call>` block per call (so its format is kept);
    otherwise the kept calls are written as Hermes markup.
    """
    if all(keep):
        return turn.text
    if not any(keep):
        return None
    blocks = list(_CALL_BLOCK.finditer(turn.text))
    if len(blocks) != len(keep):
        calls = turn.action.tool_calls
        return "\n".join(tool_call_markup(c.name, c.arguments) for c, kept in zip(calls, keep) if kept)
    pieces, position = [], 0
    for block, kept in zip(blocks, keep):
        if not kept:
            pieces.append(turn.text[position:block.start()])
            position = block.end()
    pieces.append(turn.text[position:])
    return "".join(pieces)


class ScriptPolicy:
    """Plays `entries` turn by turn, then `after` every turn (None: stop, the episode ends there).

    An entry is a fixed text, or a function of the live game that writes the text at play time.
    """

    def __init__(self, entries: Sequence[Any], after: str | None = None) -> None:
        self.entries = list(entries)
        self.after = after

    def __call__(self, turn: int, game: Game, rng: Any) -> str | None:
        if turn < len(self.entries):
            entry = self.entries[turn]
            return entry if isinstance(entry, str) else entry(game)
        return self.after


def _script(entries: list[Any], oracle_texts: list[str], after: str | None = None) -> Policy | None:
    """The policy of a script, or None when it would replay the oracle's texts exactly."""
    if after is None and all(isinstance(e, str) for e in entries) and entries == list(oracle_texts):
        return None
    return ScriptPolicy(entries, after)


def _first_call_index(turns: list[OracleTurn], names: frozenset[str] | None = None) -> int | None:
    """Index of the first turn calling a tool (one of `names` when given)."""
    for index, turn in enumerate(turns):
        if turn.is_call and (names is None or any(n in names for n in turn.names)):
            return index
    return None


# --------------------------------------------------------------------------------------------------
# Live replies: built from the conversation at play time
# --------------------------------------------------------------------------------------------------
def _tool_contents(game: Game) -> list[str]:
    """Contents of the tool messages so far, newest first."""
    return [m["content"] for m in reversed(game.get_messages())
            if m.get("role") == "tool" and isinstance(m.get("content"), str)]


def echo_reply(game: Game) -> str:
    """The content of the last tool message in the conversation."""
    return next((c for c in _tool_contents(game) if c.strip()), NOTHING_SEEN)


def _decoded(content: str) -> Any:
    """A tool result as JSON, or the text itself when it is not JSON."""
    try:
        return json.loads(content)
    except (json.JSONDecodeError, RecursionError):
        return content


def _leaves(value: Any, depth: int = 0) -> Iterator[Any]:
    """Scalar leaves of a decoded JSON value (strings, numbers, booleans, nulls)."""
    if depth > 50:
        return
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, depth + 1)
    else:
        yield value


def schema_enum_values(schemas: Any, depth: int = 0) -> list[str]:
    """Every value of every `enum` in the tool schemas, as text, in schema order."""
    found: list[str] = []
    if depth > 50:
        return found
    if isinstance(schemas, dict):
        enum = schemas.get("enum")
        if isinstance(enum, list):
            found += [v if isinstance(v, str) else json.dumps(v) for v in enum]
        for key, value in schemas.items():
            if key != "enum":
                found += schema_enum_values(value, depth + 1)
    elif isinstance(schemas, list):
        for item in schemas:
            found += schema_enum_values(item, depth + 1)
    return found


def _listing(values: list[str]) -> str:
    """'It is one of: a, b, c.' with distinct non-empty values, at most MAX_LISTED / MAX_REPLY_CHARS."""
    kept, seen, size = [], set(), 0
    for value in values:
        value = value.strip()
        if not value or value in seen:
            continue
        if len(kept) >= MAX_LISTED or size + len(value) + 2 > MAX_REPLY_CHARS:
            break
        seen.add(value)
        kept.append(value)
        size += len(value) + 2
    return f"It is one of: {', '.join(kept)}." if kept else NOTHING_SEEN


def enum_reply(game: Game) -> str:
    """Every enum value of the tool schemas, then every short string of the tool results (newest first)."""
    values = schema_enum_values(game.get_tool_schemas())
    for content in _tool_contents(game):
        decoded = _decoded(content)
        values += [leaf for leaf in _leaves(decoded) if isinstance(leaf, str) and len(leaf.strip()) <= MAX_LEAF_CHARS]
    return _listing(values)


def observed_numbers(game: Game) -> list[float]:
    """Distinct numbers in the tool results (JSON numbers and numbers written in strings), newest first."""
    numbers: list[float] = []
    seen: set[str] = set()
    for content in _tool_contents(game):
        for leaf in _leaves(_decoded(content)):
            if isinstance(leaf, bool) or leaf is None:
                continue
            candidates = [leaf] if isinstance(leaf, (int, float)) else _NUMBER.findall(str(leaf))
            for candidate in candidates:
                try:
                    number = float(candidate)
                except OverflowError:  # an integer beyond float range: not an amount anyone states
                    continue
                if math.isfinite(number) and f"{number:.2f}" not in seen:
                    seen.add(f"{number:.2f}")
                    numbers.append(number)
    return numbers


def numbers_reply(game: Game) -> str:
    """Every number seen in tool results, then their pairwise sums and absolute differences, two decimals."""
    numbers = observed_numbers(game)
    values = [f"{x:.2f}" for x in numbers]
    for i, first in enumerate(numbers):
        for second in numbers[i + 1:]:
            if len(values) > 3 * MAX_LISTED:  # _listing keeps MAX_LISTED distinct ones; enough candidates
                break
            values += [f"{first + second:.2f}", f"{abs(first - second):.2f}"]
    return _listing(values)


# --------------------------------------------------------------------------------------------------
# Generic probes
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolFacts:
    """What the generic probes know about a game: its parser and which tools write or authenticate."""

    extract_action: Callable[[str], Action]
    write_tools: frozenset[str] | None
    auth_tools: frozenset[str] | None


@dataclass(frozen=True)
class GenericProbe:
    """A generic probe: name, what it does, the facts it needs, and its script builder."""

    name: str
    description: str
    needs: tuple[str, ...]  # "write" and/or "auth"
    build: Callable[[list[OracleTurn], list[str], ToolFacts], Policy | None]


def _do_nothing(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    def policy(turn: int, game: Game, rng: Any) -> str:
        return POLITE_REPLIES[turn % len(POLITE_REPLIES)]

    if texts == [POLITE_REPLIES[i % len(POLITE_REPLIES)] for i in range(len(texts))]:
        return None
    return policy


def _refuse_blindly(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    first_call = _first_call_index(turns)
    entries: list[Any] = []
    for index, turn in enumerate(turns):
        if turn.is_call:
            text = keep_calls(turn, [name not in facts.write_tools for name in turn.names])
            if text is not None:
                entries.append(text)
        else:
            entries.append(REFUSAL if first_call is not None and index > first_call else turn.text)
    return _script(entries, texts)


def _skip_authentication(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    first_auth = _first_call_index(turns, facts.auth_tools)
    if first_auth is None:
        return None
    entries: list[Any] = []
    for index, turn in enumerate(turns):
        if turn.is_call:
            text = keep_calls(turn, [name not in facts.auth_tools for name in turn.names])
            if text is not None:
                entries.append(text)
        elif index > first_auth:
            entries.append(turn.text)
    return _script(entries, texts)


def _all_calls_in_one_turn(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    calls = [call for turn in turns if turn.is_call for call in turn.action.tool_calls]
    if len(calls) < 2:
        return None
    combined = None
    for candidate in ("\n".join(t.text for t in turns if t.is_call),
                      "\n".join(tool_call_markup(c.name, c.arguments) for c in calls)):
        action = facts.extract_action(candidate)
        if action.kind == "tool_call" and len(action.tool_calls) == len(calls):
            combined = candidate
            break
    if combined is None:  # the game's format cannot hold several calls in one turn: nothing to probe
        return None
    return _script([combined, *(t.text for t in turns if t.is_reply)], texts)


def _live_replies(reply: Callable[[Game], str]) -> Callable[[list[OracleTurn], list[str], ToolFacts], Policy | None]:
    """A builder: the oracle's texts with each statement (a reply without '?') after its first tool call
    written live by `reply`. Questions are kept: replacing a confirmation question would end the conversation
    before the write, and the probe would then test nothing about what the agent *tells*."""

    def build(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
        first_call = _first_call_index(turns)

        def replaced(index: int, turn: OracleTurn) -> bool:
            return turn.is_reply and index > first_call and "?" not in turn.text

        if first_call is None or not any(replaced(i, t) for i, t in enumerate(turns)):
            return None  # nothing would be replaced: it is the oracle
        entries = [reply if replaced(index, turn) else turn.text for index, turn in enumerate(turns)]
        return _script(entries, texts)

    return build


def _act_without_lookups(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    acting = facts.write_tools | facts.auth_tools
    entries: list[Any] = []
    for turn in turns:
        if turn.is_call:
            text = keep_calls(turn, [name in acting for name in turn.names])
            if text is not None:
                entries.append(text)
        else:
            entries.append(turn.text)
    return _script(entries, texts)


def _stop_after_first_request(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    worked = False  # a non-auth tool call has been made
    for index, turn in enumerate(turns):
        if turn.is_call:
            worked = worked or any(name not in facts.auth_tools for name in turn.names)
        elif worked and "?" not in turn.text:
            if index == len(turns) - 1:
                return None  # the oracle's last text: a one-request episode, where this is the oracle
            return ScriptPolicy([t.text for t in turns[: index + 1]], after=GOODBYE)
    return None


def _statement_indices(turns: list[OracleTurn]) -> list[int]:
    """Indices of the oracle's statements (replies without '?') after its first tool call."""
    first_call = _first_call_index(turns)
    if first_call is None:
        return []
    return [i for i, t in enumerate(turns) if i > first_call and t.is_reply and "?" not in t.text]


def _off_by_one(match: re.Match[str]) -> str:
    number = match.group(0)
    decimals = len(number.split(".")[1]) if "." in number else 0
    return f"{float(number) + 1:.{decimals}f}"


def _wrong_claim_then_report(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    entries: list[Any] = list(texts)
    inserted = 0
    for index in _statement_indices(turns):
        text = turns[index].text
        wrong = _NUMBER.sub(_off_by_one, text)
        if wrong != text:
            entries.insert(index + inserted, f"{wrong.rstrip('.')}. Is that right?")
            inserted += 1
    return _script(entries, texts) if inserted else None


def _blanket_confirmation(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    names = sorted(facts.write_tools)
    if len(names) < 2:
        return None  # one write tool: a question can only name that one action
    offer = ", ".join(names[:-1]) + f" or {names[-1]}"
    entries, replaced = list(texts), False
    for index, turn in enumerate(turns[:-1]):
        follows = turns[index + 1]
        if turn.is_reply and "?" in turn.text and any(n in facts.write_tools for n in follows.names):
            ids = [token for token in re.findall(r"[#\w.@-]*\d[#\w.@-]*", turn.text)]
            entries[index] = f"Shall I proceed with {offer}" + (f" for {' '.join(ids)}" if ids else "") + "?"
            replaced = True
    return _script(entries, texts) if replaced else None


def _report_in_malformed_turn(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    entries: list[Any] = list(texts)
    inserted = 0
    for index in _statement_indices(turns):
        text = turns[index].text
        hidden = next((h for h in (f"{text}\n</tool_call>", f"<tool_call>\n{text}")
                       if facts.extract_action(h).kind == "malformed"), None)
        if hidden is None:
            continue  # the game's parser reads both as replies: nothing to probe here
        entries[index + inserted] = hidden
        entries.insert(index + inserted + 1, "Done.")
        inserted += 1
    return _script(entries, texts) if inserted else None


def _report_as_question(turns: list[OracleTurn], texts: list[str], facts: ToolFacts) -> Policy | None:
    entries: list[Any] = list(texts)
    indices = _statement_indices(turns)
    for index in indices:
        entries[index] = f"{turns[index].text} Is there anything else I can do about it?"
    return _script(entries, texts) if indices else None


GENERIC_PROBES: tuple[GenericProbe, ...] = (
    GenericProbe("do_nothing", "polite replies that help with nothing", (), _do_nothing),
    GenericProbe("refuse_blindly", "the oracle without write calls; replies after the first tool call are refusals",
                 ("write",), _refuse_blindly),
    GenericProbe("skip_authentication", "the oracle without auth calls and without the identity questions before them",
                 ("auth",), _skip_authentication),
    GenericProbe("all_calls_in_one_turn", "every oracle tool call in the first turn, then the oracle's replies", (),
                 _all_calls_in_one_turn),
    GenericProbe("echo_last_observation", "the oracle, each reply after a tool call replaced by the last tool result",
                 (), _live_replies(echo_reply)),
    GenericProbe("list_enum_values", "the oracle's calls; each later reply lists every enum value and short string seen",
                 (), _live_replies(enum_reply)),
    GenericProbe("spam_numbers", "the oracle's calls; each later reply lists every number seen, pairwise sums and "
                 "differences", (), _live_replies(numbers_reply)),
    GenericProbe("act_without_lookups", "the oracle without read calls (neither write nor auth)", ("write", "auth"),
                 _act_without_lookups),
    GenericProbe("stop_after_first_request", "the oracle up to its first closing statement, then 'Goodbye.'",
                 ("auth",), _stop_after_first_request),
    GenericProbe("wrong_claim_then_report", "the oracle; before each statement stating a number, that statement "
                 "with every number off by one, asked as a question", (), _wrong_claim_then_report),
    GenericProbe("blanket_confirmation", "the oracle; each question before a write names every write tool", ("write",),
                 _blanket_confirmation),
    GenericProbe("report_in_malformed_turn", "the oracle; each statement sent in a malformed turn, then 'Done.'", (),
                 _report_in_malformed_turn),
    GenericProbe("report_as_question", "the oracle; each statement ends with a question", (), _report_as_question),
)
GENERIC_PROBE_NAMES = tuple(p.name for p in GENERIC_PROBES)


def read_oracle(texts: list[str], extract_action: Callable[[str], Action]) -> list[OracleTurn]:
    return [OracleTurn(text, extract_action(text)) for text in texts]


def generic_probes(spec: GameSpec, facts: ToolFacts) -> tuple[list[Probe], dict[str, str]]:
    """The generic probes as `Probe`s for `spec`, and {name: why skipped} for those lacking a fact."""
    probes, skipped = [], {}
    parsed: dict[tuple[str, ...], list[OracleTurn]] = {}  # the oracle texts of the seed being probed, parsed once

    def turns_of(texts: list[str]) -> list[OracleTurn]:
        key = tuple(texts)
        if key not in parsed:
            parsed.clear()
            parsed[key] = read_oracle(list(texts), facts.extract_action)
        return parsed[key]

    for generic in GENERIC_PROBES:
        missing = [need for need in generic.needs if getattr(facts, f"{need}_tools") is None]
        if missing:
            skipped[generic.name] = " and ".join(f"{need}_tool_names() is None" for need in missing)
            continue

        def make_policy(texts: list[str], build=generic.build) -> Policy | None:
            return build(turns_of(texts), list(texts), facts)

        probes.append(Probe(name=generic.name, description=generic.description, make_policy=make_policy,
                            expected_success=spec.probe_expectations.get(generic.name, 0.0)))
    return probes, skipped


def _tool_name_set(value: Any, method: str) -> tuple[frozenset[str] | None, str | None]:
    """(names, problem): the answer of `write_tool_names()` / `auth_tool_names()` checked."""
    if value is None:
        return None, None
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
        return frozenset(value), None
    return None, f"{method}() must return a set of tool names or None, got {type(value).__name__} {str(value)[:60]}"


def tool_facts(spec: GameSpec, game: Game) -> tuple[ToolFacts, list[str], list[str]]:
    """The facts of a fresh, reset `game`: (facts, problems, warnings). Game exceptions propagate."""
    problems, warnings = [], []
    write, problem = _tool_name_set(game.write_tool_names(), "write_tool_names")
    problems += [problem] if problem else []
    auth, problem = _tool_name_set(game.auth_tool_names(), "auth_tool_names")
    problems += [problem] if problem else []
    offered = {s["function"].get("name") for s in game.get_tool_schemas()
               if isinstance(s, dict) and isinstance(s.get("function"), dict)}
    for method, names in (("write_tool_names", write), ("auth_tool_names", auth)):
        unknown = sorted((names or frozenset()) - offered)
        if unknown:
            warnings.append(f"{method}() names tools the game does not offer: {unknown}")
    return ToolFacts(spec.extract_action, write, auth), problems, warnings


# --------------------------------------------------------------------------------------------------
# Running and judging
# --------------------------------------------------------------------------------------------------
@dataclass
class ProbeResult:
    """One probe's numbers over the seeds of a validation."""

    name: str
    origin: str  # "generic" or "game"
    description: str
    expected: float
    limit: float
    skipped: str = ""  # why it did not run: the missing fact, e.g. "write_tool_names() is None"
    applicable: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    success_seeds: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # exceptions from the game or the probe itself
    # {decision class: [applicable seeds, successes]} (games with decision classes)
    by_class: dict[str, list[int]] = field(default_factory=dict)
    # Ablations: seeds where the skill it lacks matters (summary "skill_matters"), and its wins among them.
    matters: int = 0
    wins_where_matters: list[int] = field(default_factory=list)
    tracked_matters: int = 0  # applicable seeds whose summary said whether the skill matters
    prior_rule: bool = False  # an ablation judged by the class-prior rule (the game declares decision classes)

    @property
    def min_seeds(self) -> int:
        """An ablation above its limit on fewer seeds is judged by chance (`too_few_seeds`)."""
        return PRIOR_MIN_SEEDS if self.prior_rule else ABLATION_MIN_SEEDS

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.applicable if self.applicable else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.applicable if self.applicable else None

    @property
    def skill_never_matters(self) -> bool:
        """An ablation whose skill matters on none of the seeds (the game says so in every summary): there it is
        the oracle (`first_items` when every item of the order is named), so it tests nothing. Only under the
        class-prior rule, whose class-balance check covers a setting where one answer fits every instance; without
        decision classes such a setting still fails on the ablation's rate (nothing else would catch it)."""
        return (self.origin == "ablation" and self.prior_rule and self.tracked_matters == self.applicable > 0
                and self.matters == 0)

    @property
    def too_few_seeds(self) -> bool:
        """An ablation above its limit on fewer than `min_seeds` seeds, by a margin chance gives often."""
        return (self.origin == "ablation" and 0 < self.applicable < self.min_seeds
                and self.success_rate > self.limit + 1e-9
                and binomial_tail(self.successes, self.applicable, self.limit) >= ABLATION_CHANCE)

    @property
    def status(self) -> str:
        if self.skipped:
            return WARN
        if self.errors or self.wins_where_matters:
            return FAIL
        if self.too_few_seeds:
            return WARN
        if not self.applicable or self.skill_never_matters:
            return NA
        return FAIL if self.success_rate > self.limit + 1e-9 else PASS

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "description": self.description, "status": self.status,
                "applicable_seeds": self.applicable, "success_rate": self.success_rate,
                "mean_reward": self.mean_reward, "expected_success": self.expected, "limit": self.limit,
                "skipped": self.skipped, "example_success_seeds": self.success_seeds[:MAX_EXAMPLES],
                "errors": len(self.errors), "error_examples": self.errors[:MAX_EXAMPLES],
                "success_by_class": {name: (wins / n if n else None) for name, (n, wins) in self.by_class.items()},
                "seeds_by_class": {name: n for name, (n, _) in self.by_class.items()},
                "skill_matters_seeds": self.matters, "wins_where_skill_matters": len(self.wins_where_matters),
                "example_wins_where_skill_matters": self.wins_where_matters[:MAX_EXAMPLES]}

    def record(self, seed: int, summary: dict[str, Any], succeeded: bool) -> None:
        """Count one applicable episode: its class, and for an ablation whether its skill mattered there."""
        self.applicable += 1
        if succeeded:
            self.successes += 1
            self.success_seeds.append(seed)
        if "decision_class" in summary:
            counts = self.by_class.setdefault(str(summary["decision_class"]), [0, 0])
            counts[0] += 1
            counts[1] += int(succeeded)
        matters = summary.get("skill_matters")
        if self.origin == "ablation" and isinstance(matters, dict) and self.name in matters:
            self.tracked_matters += 1
            if matters[self.name]:
                self.matters += 1
                if succeeded:
                    self.wins_where_matters.append(seed)


def episode_succeeded(episode: Any) -> bool:
    """summary["success"] is True, or the reward reached 1.0."""
    summary = episode.summary if isinstance(episode.summary, dict) else {}
    return summary.get("success") is True or episode.reward >= 1.0


# play(seed, policy, label, probe index) -> an episode with .summary, .reward and .error (validate_game's Episode)
Player = Callable[[int, Policy, str, int], Any]


def evaluate_probes(spec: GameSpec, seeds: Sequence[int], oracle_texts: dict[int, list[str]], facts: ToolFacts,
                    play: Player, tolerance: float = DEFAULT_TOLERANCE,
                    seed_bar: Callable[[Sequence[int]], Any] = iter, shares: dict[str, float] | None = None,
                    only_ablations: bool = False) -> list[ProbeResult]:
    """Run the generic probes, then `spec.probes` and `spec.ablations`, on every seed of `oracle_texts`; one
    result per probe. `shares`: the decision classes' shares on these seeds (a game with decision classes): the
    ablations' limit is then `prior_limit(shares)` instead of ABLATION_LIMIT (the class-prior rule).
    `only_ablations`: run the ablations alone."""
    ablation_limit = prior_limit(shares) if shares else ABLATION_LIMIT
    generic, skipped = generic_probes(spec, facts)
    if only_ablations:
        generic, skipped = [], {}
    results: list[ProbeResult] = []
    for name, why in skipped.items():
        described = next(p.description for p in GENERIC_PROBES if p.name == name)
        expected = spec.probe_expectations.get(name, 0.0)
        results.append(ProbeResult(name, "generic", described, expected, expected + tolerance, skipped=why))
    # A game probe named like a generic one is not run (suite_problems reports the clash).
    runnable = ([(p, "generic") for p in generic]
                + [(p, "game") for p in spec.probes if p.name not in GENERIC_PROBE_NAMES and not only_ablations]
                + [(p, "ablation") for p in spec.ablations if p.name not in GENERIC_PROBE_NAMES])
    by_name: dict[str, ProbeResult] = {}
    for probe, origin in runnable:
        by_name[probe.name] = (ProbeResult(probe.name, origin, probe.description, ablation_limit, ablation_limit,
                                           prior_rule=bool(shares))
                               if origin == "ablation" else
                               ProbeResult(probe.name, origin, probe.description, probe.expected_success,
                                           probe.expected_success + tolerance))
    for seed in seed_bar([s for s in seeds if s in oracle_texts]):
        for index, (probe, _) in enumerate(runnable):
            result = by_name[probe.name]
            try:
                policy = probe.make_policy(list(oracle_texts[seed]))
            except Exception as err:  # noqa: BLE001 -- game code (its parser, its own probe): reported as a failure
                result.errors.append(f"seed {seed}, make_policy: {type(err).__name__}: {str(err)[:200]}")
                continue
            if policy is None:
                continue
            episode = play(seed, policy, probe.name, index)
            if episode.error:
                result.errors.append(episode.error)
                continue
            result.reward_sum += episode.reward
            result.record(seed, episode.summary if isinstance(episode.summary, dict) else {},
                          episode_succeeded(episode))
    order = {name: i for i, name in enumerate(dict.fromkeys([*GENERIC_PROBE_NAMES, *(p.name for p in spec.probes),
                                                             *(p.name for p in spec.ablations)]))}
    return sorted([*results, *by_name.values()], key=lambda r: order[r.name])


def suite_problems(spec: GameSpec) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the spec's probe declarations: name clashes, unknown expectation names."""
    problems, warnings = [], []
    clashes = sorted(p.name for p in (*spec.probes, *spec.ablations) if p.name in GENERIC_PROBE_NAMES)
    if clashes:
        problems.append(f"game-specific probes {clashes} reuse generic probe names; rename them, or set "
                        "probe_expectations to change a generic probe's limit")
    unknown = sorted(set(spec.probe_expectations) - set(GENERIC_PROBE_NAMES))
    if unknown:
        warnings.append(f"probe_expectations names no generic probe: {unknown} (generic probes: "
                        f"{', '.join(GENERIC_PROBE_NAMES)}; a game-specific probe sets its own expected_success)")
    return problems, warnings


def summarize(results: list[ProbeResult], problems: list[str], warnings: list[str]) -> tuple[str, str]:
    """(status, detail) of the whole probe suite."""
    failed = [r for r in results if r.status == FAIL]
    undecided = [r for r in results if r.too_few_seeds]
    warned = [r for r in results if r.status == WARN and not r.too_few_seeds]
    parts = []
    for r in failed:
        if r.errors:
            parts.append(f"{r.name} raised on {len(r.errors)} seed(s): {'; '.join(r.errors[:2])}")
        elif r.wins_where_matters:
            parts.append(f"{r.name} wins {len(r.wins_where_matters)} of the {r.matters} seeds where the skill it lacks "
                         f"matters (e.g. seeds {r.wins_where_matters[:MAX_EXAMPLES]}): the reward does not turn on "
                         f"that skill there")
        if r.success_rate is not None and r.success_rate > r.limit + 1e-9 and not r.errors:
            parts.append(f"{r.name} succeeds on {r.success_rate:.1%} of {r.applicable} applicable seeds "
                         f"(limit {r.limit:.2f}; e.g. seeds {r.success_seeds[:MAX_EXAMPLES]})")
    parts += problems
    if warned:
        parts.append(f"not run: {', '.join(f'{r.name} ({r.skipped})' for r in warned)}; make write_tool_names() and "
                     "auth_tool_names() return the tool names (ToolEnvGame: @tool(write=True) / @tool(auth=True))")
    parts += [f"{r.name} succeeds on {r.success_rate:.1%} of only {r.applicable} seeds, above its limit {r.limit:.2f} "
              f"by a margin chance often gives; run {r.min_seeds} seeds or more to judge it" for r in undecided]
    parts += warnings
    not_applicable = [r.name for r in results if r.status == NA]
    if not_applicable:
        parts.append(f"n/a: {', '.join(not_applicable)}")
    status = FAIL if failed or problems else WARN if warned or undecided or warnings else PASS
    ran = len(results) - len(warned)
    head = f"{len(failed)} of {ran} probes run beat their limit" if failed else (
        f"no probe beats its limit ({ran} of {len(results)} probes run)")
    return status, "; ".join([head, *parts])


def format_table(check: dict[str, Any]) -> list[str]:
    """Indented lines: one row per probe under the oracle's success rate (for validate_game's report)."""
    rows = check.get("probes") or {}
    if not rows:
        return []
    shares = check.get("class_shares") or {}
    lines = [f"      decision classes on these seeds: {shares_text(shares)} (ablations' limit: the largest + "
             f"{PRIOR_MARGIN})"] if shares else []
    lines += [f"      {'probe':26s} {'seeds':>5s} {'success':>8s} {'reward':>7s} {'limit':>6s}  status",
              f"      {'(oracle)':26s} {check.get('probed_seeds', 0):5d} {check.get('oracle_success_rate', 0.0):8.1%} "
              f"{check.get('oracle_mean_reward', 0.0):7.3f} {'':>6s}"]
    for name, row in rows.items():
        rate = "-" if row["success_rate"] is None else f"{row['success_rate']:.1%}"
        reward = "-" if row["mean_reward"] is None else f"{row['mean_reward']:.3f}"
        note = f"  not run: {row['skipped']}" if row["skipped"] else (
            f"  {row['errors']} raised" if row["errors"] else "")
        if row["origin"] == "ablation" and shares:
            note += "  " + by_class_text(row)
        lines.append(f"      {name:26s} {row['applicable_seeds']:5d} {rate:>8s} {reward:>7s} {row['limit']:6.2f}  "
                     f"{row['status']}{note}")
    return lines


def by_class_text(row: dict[str, Any]) -> str:
    """'per class: act 100%, refuse 0%; wins 0 of 98 seeds where its skill matters' for a probe row."""
    per_class = ", ".join(f"{name} {'-' if rate is None else f'{rate:.0%}'}"
                          for name, rate in row.get("success_by_class", {}).items())
    return (f"per class: {per_class}; wins {row.get('wins_where_skill_matters', 0)} of "
            f"{row.get('skill_matters_seeds', 0)} seeds where its skill matters")
