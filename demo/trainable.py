"""Which calibrated games Step 3 of the demo trains: the full-success rule (`not_trained_because`).

Shared by the steps (demo/run.py, loop.py) and the report (report.py), which must agree on it.
"""
from __future__ import annotations

from typing import Any

from pipeline.recalibrate import DEFAULT_BAND, counts_text, measurement_text, mistakes_text

FIGURES = ("success_rate", "mean_reward", "spread_share")  # what calibration measured at each probed value
HISTORY_KEYS = ("knob", "value", *FIGURES)
# A capability game is trained only where the base agent sometimes wins it in full: its full-success rate at some
# value calibration tried lies in this band (loop.band, whose default this is). A game this agent never wins gives
# GRPO partial credit alone (the adapters of the 2026-12-03 run learned +0.005 to +0.066 of mean reward and no
# success), and router SFT no successful rollout to label with the capability.
TRAIN_BAND = DEFAULT_BAND  # (0.10, 0.60)


def binary_spread_share(success_rate: float, group_size: int) -> float:
    """Share of groups of `group_size` with reward spread when every episode independently succeeds (1) at
    `success_rate` or fails (0): 1 - p^G - (1 - p)^G. It stands in for the spread a record written before
    calibration measured it lacks (those records held 0/1 success figures only)."""
    return 1.0 - success_rate ** group_size - (1.0 - success_rate) ** group_size


def _probes(environment: dict[str, Any], group_size: int) -> list[dict[str, Any]]:
    """The probes calibration made (its history, or the chosen value alone), each with a spread share."""
    tried = environment.get("history") or [{"knob": environment.get("knob"), "value": environment.get("value"),
                                            **{k: environment.get(k) for k in FIGURES}}]
    return [probe if probe.get("spread_share") is not None
            else {**probe, "spread_share": binary_spread_share(probe["success_rate"], group_size)}
            for probe in tried]


def census_text(census: dict[str, Any]) -> str:
    """'wrong_value:item_ids 41, no_action 12 (of 53 failed in 128 episodes, success 0.59)', and a warning when the
    census ended short of its minimum of failed episodes (a game the agent nearly always wins)."""
    text = (counts_text(census["first_mistakes"]) or "none") + (
        f" (of {census['failed']} failed in {census['episodes']} episodes, success {census['success_rate']:.2f})")
    if census["failed"] < census.get("min_failed", 0):
        text += (f"; fewer than the {census['min_failed']} failed episodes the census aims for after "
                 f"{census['rounds']} more rounds")
    return text


def not_trained_because(environment: dict[str, Any], group_size: int, forced: bool = False) -> str | None:
    """Why Step 3 skips a capability's game (None: it is trained); `group_size` is GRPO's, for the spread figures
    of a record that lacks them.

    No game, or one that failed validation, cannot be trained. A calibrated game is trained only when the base
    agent's full-success rate at some value calibration tried lies in the band (the record's "band", else
    TRAIN_BAND): GRPO then sees groups with a win, and router SFT successful rollouts of the capability.
    Otherwise the game is *not trainable with this agent*, and the reason gives each value's figures and the base
    agent's first mistakes at the settings kept (what it would have to learn first), from calibration's mistake
    census over at least 30 failed episodes (`demo.loop.count_first_mistakes`; a record without one: the kept
    probe's own failed episodes).
    Capabilities the config forces (`loop.capabilities`, e.g. the fast profile's) are trained whatever calibration
    found; a game without knobs is trained as it is (nothing was measured).
    """
    status = environment["status"]
    if status in ("no_game", "invalid"):
        return environment.get("detail") or status
    if forced or environment.get("success_rate") is None:
        return None
    low, high = environment.get("band") or TRAIN_BAND
    tried = _probes(environment, environment.get("group_size") or group_size)
    if any(low <= probe["success_rate"] <= high for probe in tried):
        return None
    knobs = list(dict.fromkeys(probe.get("knob") or environment.get("knob") for probe in tried))
    per_value = "; ".join(
        (f"{probe['value']!r}" if len(knobs) == 1 else f"{probe.get('knob')}={probe['value']!r}")
        + f": {measurement_text(probe)}" for probe in tried)
    census = environment.get("mistake_census")
    if census:
        settings = environment.get("settings") or {environment.get("knob"): environment.get("value")}
        where = ", ".join(f"{name}={value!r}" for name, value in settings.items())
        mistakes = f"; the base agent's first mistakes at {where}: {census_text(census)}"
    else:  # a record written before the census: the kept probe's own failed episodes
        kept = next((p for p in reversed(tried) if p.get("value") == environment.get("value")
                     and p.get("first_mistakes")), None)
        where = f"{kept.get('knob') or environment.get('knob')}={kept['value']!r}" if kept else ""
        mistakes = f"; the base agent's first mistakes at {where}: {mistakes_text(kept)}" if kept else ""
    return (f"not trainable with this agent: its full-success rate is outside [{low:g}, {high:g}] at every "
            f"{' / '.join(map(str, knobs))} value tried ({per_value}){mistakes}")
