"""Recalibrate a game: find a value of one difficulty knob that puts the base model's success rate in a band.

Only knobs the game declares as difficulty (`GameSpec.difficulty_knobs`, each a field of its config
dataclass with the direction that is harder) are searched: a field that is a class prior (a share of
refusals, say) moves different policies in opposite directions, and tuning it to a band would only
change the label mix. Which way is harder comes from the declaration (--harder, if given, must agree).

File mode (rollouts already collected, one τ²-bench results file per knob value):
    python -m pipeline.recalibrate --game NAME --knob KEY --rollouts VALUE=FILE [VALUE=FILE ...]
        [--band 0.1,0.6] [--harder increase|decrease] [--success-threshold 1.0] [--group-size 16]
        [--json-output FILE]
reports the in-band value closest to the band's centre, or which way to move and (for numeric knobs) the
next value to try by bisection. Each value's line also gives its mean reward and the estimated share of
GRPO groups of --group-size episodes whose rewards differ (`estimate_reward_spread`): GRPO learns from any
reward difference within a group, partial rewards included, so a value with no success can still teach.
For games that record them, each value's line is followed by its decision classes (share, success) and the
first mistakes of its failed episodes; out of the band, the value nearest the band's centre gets a verdict line:
its first mistakes, or, counted over fewer than 30 failed episodes, a request for more rollouts there before
calling the game *not trainable with this agent* (JSON: "not_in_band").
Exit 0 when a value is in the band, 1 when not, 2 on bad input (flags, NaN included, and the --json-output
path are checked before any file is read; nothing is written), a --json-output that names the game's own file,
and a rollouts file whose info.game_overrides records another value of the knob than its VALUE.

Search mode (library): `search_knob(spec, knob, values, collect, band)` bisects a sorted candidate list,
calling `collect(spec, {knob: value}) -> simulations` (τ²-bench simulations) for each probe. The rollout
collector of the training code plugs in there; `policy_collector` builds one from a scripted policy.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import types
import typing
from collections import Counter
from typing import Any, Callable, Sequence

from game_registry import DifficultyKnob, Game, GameSpec, lookup_game
from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, check_not_an_input, check_output_path, load_json
from common.validation import InputError, check_number
from pipeline.calibrate_environment import compute_metrics, estimate_reward_spread
from pipeline.probes import class_shares
from pipeline.validate_game import game_input_files

# The base agent's full-success rate a knob value should give: sometimes a win (GRPO needs groups with one, router
# SFT successful rollouts), not mostly wins (issue 41: measured on one-request games, 0.10 is within reach).
DEFAULT_BAND = (0.10, 0.60)
# Summary fields a collector keeps in each simulation's reward_info (games that record them): what
# `episode_classes` counts per probed value.
EPISODE_FACTS = ("decision_class", "first_mistake")
# A game no value brings into the band is *not trainable with this agent*; what the agent gets wrong there is
# reported from its first mistakes counted over at least this many failed episodes (issue 41).
MIN_FAILED_FOR_MISTAKES = 30
DEFAULT_GROUP_SIZE = 16  # GRPO's episodes per task (train.config's default, the paper's K=16)
HARDER_CHOICES = ("increase", "decrease")  # which way of moving the knob makes the game harder

Collect = Callable[[GameSpec, dict[str, Any]], list[dict[str, Any]]]


# --------------------------------------------------------------------------------------------------
# Knob and value checks
# --------------------------------------------------------------------------------------------------
def knob_type(spec: GameSpec, knob: str) -> type:
    """The declared type of config field `knob` (Optional[X] gives X); InputError when it is not a field."""
    config_cls = spec.config_cls
    if config_cls is None or not dataclasses.is_dataclass(config_cls):
        raise InputError(f"game {spec.name!r} has no config dataclass (spec.config_cls); it has no knobs")
    names = [f.name for f in dataclasses.fields(config_cls)]
    if knob not in names:
        raise InputError(f"{knob!r} is not a field of {config_cls.__name__}; fields: {', '.join(names)}")
    hint = typing.get_type_hints(config_cls).get(knob)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = options[0] if len(options) == 1 else hint
    if hint not in (int, float, bool, str):
        raise InputError(f"knob {knob!r} has type {hint!r}; only int, float, bool and str knobs are supported")
    return hint


def declared_knob(spec: GameSpec, knob: str) -> DifficultyKnob:
    """The difficulty knob `knob` as the game declares it; InputError naming the declared ones otherwise."""
    knob_type(spec, knob)
    declared = spec.difficulty_knob(knob)
    if declared is None:
        names = ", ".join(k.name for k in spec.difficulty_knobs) or "none"
        raise InputError(f"{knob!r} is not a declared difficulty knob of game {spec.name!r} (declared: {names}); "
                         f"declare it in the game's GameSpec(difficulty_knobs=(DifficultyKnob({knob!r}, 'increase'),)) "
                         "if raising or lowering it makes the capability harder rather than changing a class mix")
    return declared


def _field_default(config_cls: type, name: str) -> Any:
    """The default of dataclass field `name`, or dataclasses.MISSING when it has none."""
    spec_field = next(f for f in dataclasses.fields(config_cls) if f.name == name)
    if spec_field.default_factory is not dataclasses.MISSING:
        return spec_field.default_factory()
    return spec_field.default


def check_recorded_value(spec: GameSpec, knob: str, value: Any, info: Any, path: str) -> None:
    """InputError when the rollouts file at `path` records another value of `knob` than the VALUE it is given as.

    collect_rollouts and train.evaluate record the config fields they set in info.game_overrides; a field left out
    was played at the config's default. Without the record (hand-made or older files) the VALUE=FILE label is all
    there is, and it is trusted."""
    overrides = info.get("game_overrides") if isinstance(info, dict) else None
    if not isinstance(overrides, dict):
        return
    if knob in overrides:
        recorded, where = overrides[knob], "info.game_overrides"
    else:
        recorded, where = _field_default(spec.config_cls, knob), "the config's default; info.game_overrides omits it"
        if recorded is dataclasses.MISSING:
            return
    if recorded != value:
        raise InputError(f"{path}: rollouts played with {knob}={recorded!r} ({where}), but --rollouts gives them as "
                         f"{knob}={value!r}; pass them as {recorded}={path}")


def parse_knob_value(spec: GameSpec, knob: str, text: str) -> Any:
    """`text` parsed to the knob's type and accepted by the config dataclass; InputError otherwise."""
    kind = knob_type(spec, knob)
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError("expected true/false")
            value: Any = lowered in ("true", "1", "yes")
        else:
            value = kind(text)
    except ValueError as err:
        raise InputError(f"value {text!r} for knob {knob!r} is not of type {kind.__name__} ({err})") from None
    try:
        spec.config_cls(**{knob: value})
    except (ValueError, TypeError) as err:
        raise InputError(f"{spec.config_cls.__name__}({knob}={value!r}) is rejected: {err}") from None
    return value


# --------------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------------
def _band_side(rate: float, band: tuple[float, float]) -> str:
    if rate > band[1]:
        return "too_easy"
    if rate < band[0]:
        return "too_hard"
    return "in_band"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def infer_harder(measurements: list[dict[str, Any]]) -> str | None:
    """'increase' when the success rate falls as the knob grows, 'decrease' when it rises, else None."""
    numeric = sorted((m for m in measurements if _is_number(m["value"])), key=lambda m: m["value"])
    if len(numeric) < 2 or numeric[0]["success_rate"] == numeric[-1]["success_rate"]:
        return None
    return "increase" if numeric[-1]["success_rate"] < numeric[0]["success_rate"] else "decrease"


def _midpoint(a: Any, b: Any) -> Any:
    """Bisection point between two knob values (integers stay integers); None when none lies between."""
    low, high = min(a, b), max(a, b)
    if isinstance(a, int) and isinstance(b, int):
        middle = (low + high) // 2
        return middle if low < middle < high else None
    middle = (low + high) / 2
    return middle if low < middle < high else None


def _step_out(edge: Any, step: Any, grow: bool, accept: Callable[[Any], bool]) -> Any:
    """A value `step` beyond `edge` that `accept` allows, halving the step until one is; None if none is."""
    integer = isinstance(edge, int) and isinstance(step, int)
    while step:
        candidate = edge + step if grow else edge - step
        if accept(candidate):
            return candidate
        step = step // 2 if integer else (step / 2 if abs(step) > 1e-9 * max(abs(edge), 1) else 0)
    return None


def decide(
    measurements: list[dict[str, Any]], band: tuple[float, float], harder: str | None = None,
    accept: Callable[[Any], bool] = lambda value: True,
) -> dict[str, Any]:
    """What to do next, from {"value", "success_rate"} measurements of one knob.

    `accept(value)` says whether a proposed next value is allowed (e.g. the config dataclass accepts it).

    Returns {"status": in_band | too_easy | too_hard | bracketed, "value", "harder", "move", "next_value",
    "message", "warnings"}. too_easy/too_hard: every measured value is above/below the band; bracketed:
    some are above and some below but none inside (the band lies between two neighbours).
    """
    if not measurements:
        raise ValueError("decide needs at least one measurement")
    low, high = band
    centre = (low + high) / 2
    warnings: list[str] = []
    inferred = infer_harder(measurements)
    if harder is not None and inferred is not None and harder != inferred:
        # `harder` is the knob's declared direction (the CLI passes the declaration, not a flag of the user's)
        warnings.append(f"the declared direction (harder as the knob {harder}s) disagrees with the measurements, "
                        f"which get harder as it {inferred}s")
    harder = harder or inferred
    numeric = all(_is_number(m["value"]) for m in measurements)
    ordered = sorted(measurements, key=lambda m: m["value"]) if numeric else list(measurements)
    rates = [m["success_rate"] for m in ordered]
    if numeric and len(rates) > 2:
        rising = all(a <= b for a, b in zip(rates, rates[1:]))
        falling = all(a >= b for a, b in zip(rates, rates[1:]))
        if not (rising or falling):
            warnings.append("success rate is not monotone in the knob (noise, or the knob is not a difficulty knob)")
    decision: dict[str, Any] = {"value": None, "harder": harder, "move": None, "next_value": None, "warnings": warnings}
    inside = [m for m in ordered if low <= m["success_rate"] <= high]
    if inside:
        best = min(inside, key=lambda m: abs(m["success_rate"] - centre))
        decision.update(
            status="in_band", value=best["value"],
            message=f"use {best['value']!r}: success rate {best['success_rate']:.3f} is in [{low}, {high}] "
                    f"and closest to the centre {centre:.2f}",
        )
        return decision
    sides = {_band_side(r, band) for r in rates}
    if len(sides) == 2:  # some too easy, some too hard: bisect between the neighbours that straddle the band
        pair = next(
            (a, b) for a, b in zip(ordered, ordered[1:])
            if _band_side(a["success_rate"], band) != _band_side(b["success_rate"], band)
        )
        between = _midpoint(pair[0]["value"], pair[1]["value"]) if numeric else None
        decision.update(status="bracketed", next_value=between)
        if between is None:
            decision["message"] = (
                f"the band lies between {pair[0]['value']!r} ({pair[0]['success_rate']:.3f}) and "
                f"{pair[1]['value']!r} ({pair[1]['success_rate']:.3f}) and no value of the knob's type lies between "
                "them: make the knob finer or widen the band"
            )
        else:
            decision["message"] = (
                f"the band lies between {pair[0]['value']!r} ({pair[0]['success_rate']:.3f}) and "
                f"{pair[1]['value']!r} ({pair[1]['success_rate']:.3f}): try {between!r} next"
            )
        return decision
    status = sides.pop()
    move = "harder" if status == "too_easy" else "easier"
    decision.update(status=status, move=move)
    summary = f"every measured value is {'above' if status == 'too_easy' else 'below'} the band [{low}, {high}]"
    if harder is None:
        decision["message"] = f"{summary}: make the game {move}; measure a second value to learn which way that is"
        return decision
    grow = (harder == "increase") == (move == "harder")  # does moving the right way mean a larger value?
    if numeric:
        values = [m["value"] for m in ordered]
        edge = values[-1] if grow else values[0]
        step = (values[-1] - values[0]) or max(abs(edge), 1)  # step out by the measured span (or double)
        next_value = _step_out(edge, step, grow, accept)
        decision["next_value"] = next_value
        way = "raising" if grow else "lowering"
        if next_value is None:
            decision["message"] = f"{summary}: the knob cannot go further by {way} it from {edge!r}; this knob is exhausted"
        else:
            decision["message"] = f"{summary}: make the game {move} by {way} the knob; try {next_value!r}"
    else:
        decision["message"] = f"{summary}: make the game {move} ({'increase' if grow else 'decrease'} the knob)"
    return decision


def _measurement(value: Any, simulations: Any, success_threshold: float, source: str,
                 group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, Any]:
    """One probed value: its success rate (what the band is about), mean reward, and the estimated share of
    GRPO groups of `group_size` with reward spread (what GRPO learns from); the full metrics beside them."""
    metrics = compute_metrics(simulations, success_threshold, source=source)
    spread = estimate_reward_spread(simulations, group_size, source=source)
    return {
        "value": value,
        "success_rate": metrics["success_rate"],
        "mean_reward": metrics["mean_reward"],
        "spread_share": spread["spread_share"],
        "n_samples": metrics["n_samples"],
        **episode_classes(simulations, success_threshold),
        "spread": spread,
        "metrics": metrics,
    }


def episode_classes(simulations: Any, success_threshold: float = 1.0) -> dict[str, Any]:
    """What the simulations' reward_info says beyond the reward (games that record it): {"class_shares": {decision
    class: share}, "success_by_class": {class: success rate}, "first_mistakes": {class: count over the failed
    episodes}, "failed": count}; empty for simulations that carry neither field."""
    infos = [sim.get("reward_info") or {} for sim in simulations]
    out: dict[str, Any] = {}
    if any(info.get("decision_class") is not None for info in infos):
        out["class_shares"] = class_shares([str(info.get("decision_class")) for info in infos])
        counts = {name: [0, 0] for name in out["class_shares"]}  # {class: [episodes, successes]}
        for info in infos:
            tally = counts[str(info.get("decision_class"))]
            tally[0] += 1
            tally[1] += int(info["reward"] >= success_threshold)
        out["success_by_class"] = {name: wins / n for name, (n, wins) in counts.items()}
    failed = [info for info in infos if info["reward"] < success_threshold]
    if any(info.get("first_mistake") is not None for info in failed):
        mistakes = Counter(str(info.get("first_mistake")) for info in failed)
        out["first_mistakes"] = dict(sorted(mistakes.items(), key=lambda item: (-item[1], item[0])))
        out["failed"] = len(failed)
    return out


def counts_text(counts: dict[str, int]) -> str:
    """'wrong_value:item_ids 41, no_action 12' of a {class: count} mapping."""
    return ", ".join(f"{name} {n}" for name, n in counts.items())


def mistakes_text(measurement: dict[str, Any]) -> str:
    """'wrong_value:item_ids 41, no_action 12 (of 60 failed)' for a measurement that counted first mistakes ('' if
    none)."""
    mistakes = measurement.get("first_mistakes") or {}
    if not mistakes:
        return ""
    return counts_text(mistakes) + f" (of {measurement.get('failed', sum(mistakes.values()))} failed)"


def classes_text(measurement: dict[str, Any]) -> str:
    """'act 0.50 (0.31), refuse 0.50 (0.12)': each decision class's share and the success on it ('' if none)."""
    success = measurement.get("success_by_class") or {}
    return ", ".join(f"{name} {share:.2f} ({success.get(name, 0.0):.2f})"
                     for name, share in (measurement.get("class_shares") or {}).items())


def measurement_text(measurement: dict[str, Any]) -> str:
    """`success 0.19, mean reward 0.45, spread 0.87` of one probe ('-' for a figure it lacks: an older record)."""
    def figure(key: str) -> str:
        value = measurement.get(key)
        return "-" if value is None else f"{value:.2f}"

    return f"success {figure('success_rate')}, mean reward {figure('mean_reward')}, spread {figure('spread_share')}"


# --------------------------------------------------------------------------------------------------
# Search with a collector
# --------------------------------------------------------------------------------------------------
def search_knob(
    spec: GameSpec,
    knob: str,
    values: list[Any],
    collect: Collect,
    band: tuple[float, float] = DEFAULT_BAND,
    max_rounds: int = 5,
    success_threshold: float = 1.0,
    harder: str | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> dict[str, Any]:
    """Bisect the candidate `values` of `knob` for a success rate inside `band`; one `collect` call per round.

    Values are sorted (numbers; str/bool values keep the given order, which must be monotone in difficulty)
    and must be accepted by the config dataclass. The knob must be a declared difficulty knob; its declared
    direction is used (`harder`, if given, must agree), so bisection starts in the middle. Returns
    {"status": in_band | out_of_range | not_found | max_rounds, "value", "success_rate", "mean_reward",
    "spread_share", "group_size", "harder", "rounds", "history": [measurements in probe order]}. not_found:
    the band falls between two neighbouring candidates. Every measurement carries its success rate, mean
    reward and the estimated share of GRPO groups of `group_size` whose rewards differ (`_measurement`).
    Out of the band, the value kept is the probe closest to the band's centre; among equally close ones the
    one with the most spread, then the latest (which bisection moved furthest toward the band).
    """
    if harder not in (None, *HARDER_CHOICES):
        raise ValueError(f"harder must be one of {HARDER_CHOICES} or None, got {harder!r}")
    if not values:
        raise ValueError("search_knob needs at least one candidate value")
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    low, high = band
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"band must satisfy 0 <= low <= high <= 1, got {band}")
    try:
        declared = declared_knob(spec, knob)
    except InputError as err:
        raise ValueError(str(err)) from None
    if harder is not None and harder != declared.harder:
        raise ValueError(f"harder={harder!r} contradicts the declaration of {knob!r} ({declared.harder!r})")
    harder = declared.harder
    candidates = sorted(set(values)) if all(_is_number(v) for v in values) else list(dict.fromkeys(values))
    for value in candidates:
        spec.config_cls(**{knob: value})  # ValueError from the config names a bad candidate before any rollout
    measured: dict[int, dict[str, Any]] = {}
    history: list[dict[str, Any]] = []

    def measure(index: int) -> dict[str, Any]:
        if index not in measured:
            simulations = collect(spec, {knob: candidates[index]})
            measured[index] = _measurement(candidates[index], simulations, success_threshold,
                                           f"{knob}={candidates[index]!r}", group_size)
            history.append(measured[index])
        return measured[index]

    def result(status: str, chosen: dict[str, Any] | None) -> dict[str, Any]:
        if chosen is None and history:  # the probe closest to the band's centre; among equals the one whose
            # groups vary most (GRPO's signal), then the latest, which bisection moved furthest toward the band
            chosen = min(reversed(history), key=lambda m: (abs(m["success_rate"] - (low + high) / 2),
                                                           -m["spread_share"]))
        return {
            "status": status, "value": chosen["value"] if chosen else None,
            **{key: chosen[key] if chosen else None for key in ("success_rate", "mean_reward", "spread_share")},
            "group_size": group_size, "harder": harder, "rounds": len(history), "band": [low, high],
            "history": history,
        }

    lo, hi = 0, len(candidates) - 1
    while lo <= hi:
        if len(history) >= max_rounds:
            return result("max_rounds", None)
        mid = (lo + hi) // 2
        probe = measure(mid)
        side = _band_side(probe["success_rate"], band)
        if side == "in_band":
            return result("in_band", probe)
        go_up = (side == "too_easy") == (harder == "increase")  # harder is upward when harder == "increase"
        lo, hi = (mid + 1, hi) if go_up else (lo, mid - 1)
    all_sides = {_band_side(m["success_rate"], band) for m in history}
    return result("not_found" if len(all_sides) == 2 else "out_of_range", None)


def search_knobs(spec: GameSpec, collect: Collect, band: tuple[float, float] = DEFAULT_BAND,
                 max_rounds: int = 5, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, Any]:
    """`search_knob` over every declared difficulty knob in declared order, until one brings the game into `band`.

    A knob that cannot reach the band (too hard at its easiest value, or too easy at its hardest) stays at
    its value nearest to the band while the next knob moves. Returns the last search's status, knob, value
    and figures (success rate, mean reward, spread share at `group_size`), plus "settings" ({knob: chosen
    value} of every knob searched) and "history" (every probe, each with its "knob").
    """
    if not spec.difficulty_knobs:
        raise ValueError(f"game {spec.name!r} declares no difficulty knob")
    settings: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for knob in spec.difficulty_knobs:
        pinned = dict(settings)
        search = search_knob(spec, knob.name, list(knob.values), lambda s, o: collect(s, {**pinned, **o}),
                             band=band, max_rounds=max_rounds, group_size=group_size)
        history += [{**probe, "knob": knob.name} for probe in search["history"]]
        if search["value"] is not None:
            settings[knob.name] = search["value"]
        if search["status"] != "out_of_range":
            break
    return {**search, "knob": knob.name, "settings": settings, "history": history}


def policy_collector(
    policy: Callable[[Game, random.Random], str], n_tasks: int = 20, n_samples: int = 4, first_seed: int = 0,
    rng_seed: int = 0, task_seeds: Sequence[int] | None = None,
) -> Collect:
    """A `collect` callable that plays `policy(game, rng) -> text` on seeds first_seed.. (n_samples each), or on
    exactly `task_seeds` where given (e.g. the tasks a model's evaluation played: `train.evaluate` draws them by
    hash, not in a row).

    The policy's rng depends only on (rng_seed, task seed, sample index), so every knob value sees the same
    random draws (common random numbers: differences come from the knob, not the noise).
    """
    if n_tasks < 1 or n_samples < 1:
        raise ValueError(f"n_tasks and n_samples must be >= 1, got {n_tasks}, {n_samples}")
    seeds = list(range(first_seed, first_seed + n_tasks)) if task_seeds is None else list(task_seeds)
    if not seeds:
        raise ValueError("task_seeds is empty: give at least one task seed")

    def collect(spec: GameSpec, overrides: dict[str, Any]) -> list[dict[str, Any]]:
        simulations = []
        for seed in seeds:
            for sample in range(n_samples):
                game = spec.make(**overrides)
                rng = random.Random((rng_seed * 1_000_003 + seed) * 1_009 + sample)
                game.reset(seed)
                turns = 0
                while not game.done and turns < spec.max_turns:
                    game.step(spec.extract_action(policy(game, rng)))
                    turns += 1
                summary = game.get_summary()
                simulations.append({
                    "id": f"{spec.name}-{seed}-{sample}", "task_id": seed, "trial": 0, "sample_idx": sample,
                    "seed": seed, "messages": game.get_messages(),
                    "reward_info": {"reward": float(summary["reward"]),
                                    **{k: summary[k] for k in EPISODE_FACTS if k in summary}},
                    "termination_reason": "done" if game.done else "max_turns",
                })
        return simulations

    return collect


def classes_and_mistakes_lines(measurement: dict[str, Any]) -> list[str]:
    """`classes act 0.50 (0.31), refuse 0.50 (0.12)` and `first mistakes no_action 12, ... (of 20 failed)` of one
    measurement, for the games that record them (none otherwise)."""
    classes, mistakes = classes_text(measurement), mistakes_text(measurement)
    return ([f"classes {classes}"] if classes else []) + ([f"first mistakes {mistakes}"] if mistakes else [])


def not_in_band_report(measurements: list[dict[str, Any]], band: tuple[float, float]) -> dict[str, Any]:
    """No measured value is in the band: the value nearest its centre, and whether its first mistakes were counted
    over enough failed episodes (MIN_FAILED_FOR_MISTAKES) to say what the agent would have to learn first, should
    no value of any knob bring the game into the band (then it is *not trainable with this agent*)."""
    centre = (band[0] + band[1]) / 2
    nearest = min(measurements, key=lambda m: abs(m["success_rate"] - centre))
    failed = nearest.get("failed")
    out = {"value": nearest["value"], "success_rate": nearest["success_rate"], "failed": failed,
           "first_mistakes": nearest.get("first_mistakes"), "min_failed": MIN_FAILED_FOR_MISTAKES}
    where = f"at {nearest['value']!r} (nearest the band)"
    if failed is None:
        out["message"] = f"NOT IN BAND: the rollouts {where} record no first mistakes (a game that does not classify them)"
    elif failed < MIN_FAILED_FOR_MISTAKES:
        out["message"] = (f"NOT IN BAND: first mistakes {where} counted over {failed} failed episodes, fewer than "
                          f"{MIN_FAILED_FOR_MISTAKES}: collect more rollouts there before reporting the game not "
                          "trainable with this agent")
    else:
        out["message"] = (f"NOT IN BAND: if no value brings the game into the band it is not trainable with this agent; "
                          f"its first mistakes {where}: {mistakes_text(nearest)}")
    return out


# --------------------------------------------------------------------------------------------------
# CLI (file mode)
# --------------------------------------------------------------------------------------------------
def _band(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH (e.g. 0.2,0.6), got {text!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 <= low <= high <= 1.0):
        raise argparse.ArgumentTypeError(f"band needs finite numbers 0 <= LOW <= HIGH <= 1, got {text!r}")
    return low, high


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Pick a difficulty-knob value from per-value rollouts.")
    parser.add_argument("--game", required=True, help="registered game name")
    parser.add_argument("--knob", required=True, help="field of the game's config dataclass")
    parser.add_argument("--rollouts", required=True, nargs="+", metavar="VALUE=FILE",
                        help="τ²-bench results file measured with the knob at VALUE")
    parser.add_argument("--band", type=_band, default=DEFAULT_BAND, help="target success-rate band (default 0.1,0.6)")
    parser.add_argument("--harder", choices=HARDER_CHOICES,
                        help="which way makes the game harder (default: the knob's declaration; must agree with it)")
    parser.add_argument("--success-threshold", type=float, default=1.0, help="success = reward >= this")
    parser.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                        help=f"GRPO's episodes per task, for the share of groups with reward spread "
                             f"(default {DEFAULT_GROUP_SIZE})")
    parser.add_argument("--json-output", help="write the decision here (JSON)")
    args = parser.parse_args(argv)
    check_number(args.success_threshold, "--success-threshold", 0.0, 1.0, low_open=True)
    if args.group_size < 2:
        raise InputError(f"--group-size must be >= 2 (GRPO compares the episodes of a group), "
                         f"got {args.group_size}")
    if args.json_output is not None:
        check_output_path(args.json_output, "--json-output",
                          [("a --rollouts file", item.partition("=")[2]) for item in args.rollouts])
    spec = lookup_game(args.game)
    if args.json_output is not None:  # the game is known only now: its own files are inputs too
        check_not_an_input(args.json_output, "--json-output", game_input_files(spec))
    declared = declared_knob(spec, args.knob)
    if args.harder is not None and args.harder != declared.harder:
        raise InputError(f"--harder {args.harder} contradicts the game's declaration of {args.knob!r} "
                         f"(harder as it {declared.harder}s); leave --harder out")
    harder = declared.harder
    measurements = []
    seen: set[Any] = set()
    for item in args.rollouts:
        value_text, sep, path = item.partition("=")
        if not sep or not path:
            raise InputError(f"--rollouts expects VALUE=FILE, got {item!r}")
        value = parse_knob_value(spec, args.knob, value_text)
        if value in seen:
            raise InputError(f"knob value {value!r} is given twice in --rollouts")
        seen.add(value)
        data = load_json(path)
        if not isinstance(data, dict) or "simulations" not in data:
            raise InputError(f"{path}: not τ²-bench results JSON (no `simulations` key)")
        played = (data.get("info") or {}).get("game") if isinstance(data.get("info"), dict) else None
        if played is not None and played != spec.name:  # collect_rollouts and train.evaluate record the game
            raise InputError(f"{path}: rollouts of game {played!r}, not of --game {spec.name}; give the rollouts "
                             f"collected on {spec.name} (python -m train.collect_rollouts --game {spec.name} ...)")
        check_recorded_value(spec, args.knob, value, data.get("info"), path)
        measurement = _measurement(value, data["simulations"], args.success_threshold, path, args.group_size)
        measurement["file"] = path
        measurements.append(measurement)
    def accept(value: Any) -> bool:
        try:
            spec.config_cls(**{args.knob: value})
        except (ValueError, TypeError):
            return False
        return True

    decision = decide(measurements, args.band, harder, accept)
    report = {
        "game": spec.name, "knob": args.knob, "band": list(args.band), "group_size": args.group_size, **decision,
        "measurements": [{k: v for k, v in m.items() if k != "metrics"} for m in measurements],
    }
    print(f"recalibrate {spec.name}: knob {args.knob}, band [{args.band[0]}, {args.band[1]}]; spread = estimated "
          f"share of GRPO groups of {args.group_size} whose rewards differ")
    for m in sorted(measurements, key=lambda m: m["value"]) if all(_is_number(m["value"]) for m in measurements) else measurements:
        print(f"  {args.knob}={m['value']!r:10} success_rate {m['success_rate']:.3f}  "
              f"mean_reward {m['mean_reward']:.3f}  spread {m['spread_share']:.3f}  "
              f"({_band_side(m['success_rate'], args.band)}, {m['n_samples']} samples)")
        for line in classes_and_mistakes_lines(m):
            print(f"      {line}")
    for warning in decision["warnings"]:
        print(f"WARN  {warning}")
    print(f"{decision['status'].upper()}: {decision['message']}")
    if decision["status"] != "in_band":
        report["not_in_band"] = not_in_band_report(measurements, args.band)
        print(report["not_in_band"]["message"])
    if args.json_output:
        atomic_write_json(args.json_output, report)
    return 0 if decision["status"] == "in_band" else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
