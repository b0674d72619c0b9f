"""Which calibrated games Step 3 of the demo trains: the reward-spread rule (`not_trained_because`).

Shared by the steps (pipeline/demo/run.py, loop.py) and the report (report.py), which must agree on it.
"""
from __future__ import annotations

from typing import Any

from pipeline.recalibrate import measurement_text

FIGURES = ("success_rate", "mean_reward", "spread_share")  # what calibration measured at each probed value
HISTORY_KEYS = ("knob", "value", *FIGURES)
# A game gives GRPO a learning signal when at least this share of its groups has rewards that differ: below
# it, most groups are constant, GRPO drops them, and training only spends rollouts (and raises the
# baselines' matched budget). For 0/1 rewards the cut matches the success rate at which half the groups of
# `group_size` hold no success.
MIN_SPREAD_SHARE = 0.5


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


def not_trained_because(environment: dict[str, Any], group_size: int, forced: bool = False) -> str | None:
    """Why Step 3 skips a capability's game (None: it is trained); `group_size` is GRPO's, used for a record
    that does not say which group size its spread shares were estimated for.

    No game, or one that failed validation, cannot be trained. A calibrated game is skipped for lack of a
    learning signal when, at every value calibration tried, fewer than MIN_SPREAD_SHARE of GRPO's groups of
    `group_size` are estimated to hold rewards that differ (`estimate_reward_spread`): GRPO learns only from
    such groups, and it learns from a partial reward as much as from a success, so a game with no success
    whose partial rewards vary is trained, and one in the band whose tasks each always pass or always fail
    is not. A game with spread somewhere is trained at the value calibration kept (the one nearest the
    band). Capabilities the config forces (`loop.capabilities`, e.g. the fast profile's) are trained
    whatever calibration found; a game without knobs is trained as it is (nothing was measured).
    """
    status = environment["status"]
    if status in ("no_game", "invalid"):
        return environment.get("detail") or status
    if forced or environment.get("success_rate") is None:
        return None
    size = environment.get("group_size") or group_size  # the group size calibration estimated the spread for
    tried = _probes(environment, size)
    best = max(probe["spread_share"] for probe in tried)
    if best >= MIN_SPREAD_SHARE:
        return None
    knobs = list(dict.fromkeys(probe.get("knob") or environment.get("knob") for probe in tried))
    per_value = "; ".join(
        (f"{probe['value']!r}" if len(knobs) == 1 else f"{probe.get('knob')}={probe['value']!r}")
        + f": {measurement_text(probe)}" for probe in tried)
    return (f"no learning signal: at every {' / '.join(map(str, knobs))} value tried, under "
            f"{MIN_SPREAD_SHARE:.0%} of GRPO groups of {size} would hold rewards that differ (best spread "
            f"{best:.2f}); {per_value}")
