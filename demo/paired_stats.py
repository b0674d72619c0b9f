"""Paired bootstrap intervals for the difference in pass rate between two models that played the same tasks.

Method (what every figure of this module means):

- The unit is a task under an evaluation seed: a (seed, task id) pair. Its score is its pass^1, the mean over
  its scored samples of `reward >= threshold` (τ²-bench's pass^1: one sample when greedy, every sample at a
  temperature); a simulation without `reward_info` is left out, and a task with no scored sample has no score.
- A model's figure is the mean over seeds of the mean over that seed's tasks (with the same number of tasks
  per seed: the mean over all pairs, the pass^1 the demo's table shows as "mean over seeds").
- The difference of model A against model B is computed on the pairs both scored: per seed the mean of
  (score_A - score_B) over that seed's tasks, then the mean over seeds. Pairs one model lacks are left out
  and counted (`left_out`).
- Its interval is a percentile bootstrap **stratified by evaluation seed**: each of `resamples` (default
  10,000) resamples draws, within every seed, as many of that seed's tasks as it has, with replacement, and
  the statistic above is recomputed on the draw; the interval is the (1 - confidence)/2 and
  (1 + confidence)/2 quantiles of the resampled differences (numpy's linear interpolation). The same draw
  is used for both models — that is the pairing: a task that is hard for every model moves both sides
  together and cancels from the difference, so the interval reflects how consistently A beats B task by
  task, not how much tasks differ in difficulty. `unpaired_difference` resamples the two models' tasks
  independently (what an interval without pairing would be), for comparison.
- Randomness: `numpy.random.default_rng(seed)` with a fixed seed (default 0), drawn afresh per call, so every
  figure reproduces exactly and comparisons over the same tasks share their resamples.
- Floating noise: every resampled statistic (and every estimate) is rounded to `DECIMALS` (12) decimals, so one
  that is exactly 0 in exact arithmetic (seed means 1/105, 2/105 and -3/105, each rounded, sum to 3.5e-18) is
  0, not ±1e-18, and an interval that ends there does not "exclude 0"; the scores
  are multiples of 1/(tasks × samples), far coarser than 1e-12, so nothing else moves.
- A difference "excludes 0" when its whole interval lies on one side of 0. A percentile bootstrap is too
  narrow when the difference rests on a handful of untied pairs (greedy decoding: most tasks tie), so each
  paired difference also carries the exact sign test's p on its untied pairs (`sign_test`).

Sizing: the interval's half-width shrinks as 1/sqrt(pairs), so a half-width h measured on n pairs becomes
h * sqrt(n / m) on m pairs (`pairs_for_half_width`).
"""
from __future__ import annotations

import math
from typing import Any, Hashable, Iterable, Mapping

import numpy as np

from benchmarks.results import SUCCESS_THRESHOLD

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
_CHUNK = 1_000  # resamples drawn at once (bounds memory on large evaluations)
DECIMALS = 12  # statistics and estimates are rounded to this many decimals (the module docstring's floating noise)

# {stratum (an evaluation seed): {task id: score}}
Scores = Mapping[Hashable, Mapping[Hashable, float]]


def task_scores(simulations: Iterable[Mapping[str, Any]], threshold: float = SUCCESS_THRESHOLD
                ) -> dict[Hashable, float]:
    """{task_id: pass^1 of the task}: the share of its scored samples with reward >= threshold (default
    τ²-bench's success, `benchmarks.results.SUCCESS_THRESHOLD`)."""
    outcomes: dict[Hashable, list[bool]] = {}
    for sim in simulations:
        info = sim.get("reward_info")
        if info is None:
            continue
        outcomes.setdefault(sim["task_id"], []).append(float(info["reward"]) >= threshold)
    return {task: sum(passed) / len(passed) for task, passed in outcomes.items()}


def _check(resamples: int, confidence: float) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an int >= 1, got {resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def _resampled_means(strata: list[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """(resamples,) statistics: per resample, the mean over strata of the mean of a with-replacement draw of
    each stratum's values (as many as it holds)."""
    out = np.zeros(resamples)
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        for values in strata:
            draw = rng.integers(0, len(values), size=(size, len(values)))
            out[start:start + size] += values[draw].mean(axis=1)
    return _clean(out / len(strata))


def _clean(values: Any) -> Any:
    """`values` rounded to DECIMALS decimals, -0.0 made 0.0: a statistic that is 0 in exact arithmetic is 0."""
    return np.round(values, DECIMALS) + 0.0


def _interval(statistics: np.ndarray, confidence: float) -> tuple[float, float]:
    low, high = _clean(np.quantile(statistics, [(1 - confidence) / 2, (1 + confidence) / 2]))
    return float(low), float(high)


def _summary(estimate: float, low: float, high: float, pairs: int, strata: int, resamples: int, seed: int,
             confidence: float, **extra: Any) -> dict[str, Any]:
    return {"difference": estimate, "low": low, "high": high, "half_width": (high - low) / 2,
            "excludes_zero": bool(low > 0 or high < 0), "pairs": pairs, "strata": strata,
            "resamples": resamples, "seed": seed, "confidence": confidence, **extra}


def _aligned(a: Scores, b: Scores) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Per stratum both models scored, their scores on the tasks both scored (same order); pairs left out."""
    left_out = 0
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for stratum in sorted(set(a) | set(b), key=str):
        ta, tb = a.get(stratum, {}), b.get(stratum, {})
        common = sorted(set(ta) & set(tb), key=str)
        left_out += len(set(ta) ^ set(tb))
        if common:
            xs.append(np.array([ta[t] for t in common], dtype=float))
            ys.append(np.array([tb[t] for t in common], dtype=float))
    if not xs:
        raise ValueError("the two models share no scored (seed, task) pair: nothing to compare")
    return xs, ys, left_out


def paired_difference(a: Scores, b: Scores, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                      confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """A - B with its paired bootstrap interval, stratified by stratum (the module docstring's method).

    Returns {"difference", "low", "high", "half_width", "excludes_zero", "pairs", "strata", "left_out",
    "better", "worse" (pairs where A scored above / below B), "sign_test_p" (`sign_test`), "resamples", "seed",
    "confidence"}."""
    _check(resamples, confidence)
    xs, ys, left_out = _aligned(a, b)
    diffs = [x - y for x, y in zip(xs, ys)]
    estimate = float(_clean(np.mean([d.mean() for d in diffs])))
    low, high = _interval(_resampled_means(diffs, np.random.default_rng(seed), resamples), confidence)
    pooled = np.concatenate(diffs)
    better, worse = int((pooled > 0).sum()), int((pooled < 0).sum())
    return _summary(estimate, low, high, len(pooled), len(diffs), resamples, seed, confidence, left_out=left_out,
                    better=better, worse=worse, sign_test_p=sign_test(better, worse))


def sign_test(better: int, worse: int) -> float:
    """Exact two-sided sign test on the untied pairs: the chance, if A and B were equally likely to win each
    untied pair, of a split at least as uneven as `better` : `worse`. A check on a bootstrap interval that
    rests on few untied pairs (4 : 0 excludes 0 in a percentile bootstrap, but its sign test p is 0.125)."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def unpaired_difference(a: Scores, b: Scores, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                        confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """A - B on the same pairs as `paired_difference`, but each model's tasks resampled independently (within
    each stratum): the interval a comparison that ignores the pairing would give."""
    _check(resamples, confidence)
    xs, ys, left_out = _aligned(a, b)
    rng = np.random.default_rng(seed)
    statistics = _resampled_means(xs, rng, resamples) - _resampled_means(ys, rng, resamples)
    estimate = float(_clean(np.mean([x.mean() - y.mean() for x, y in zip(xs, ys)])))
    low, high = _interval(statistics, confidence)
    return _summary(estimate, low, high, sum(map(len, xs)), len(xs), resamples, seed, confidence,
                    left_out=left_out)


def mean_interval(a: Scores, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                  confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """One model's pass^1 (mean over strata of the mean over tasks) with its stratified bootstrap interval;
    the same keys as `paired_difference` ("difference" holds the mean)."""
    _check(resamples, confidence)
    strata = [np.array(list(tasks.values()), dtype=float) for _, tasks in sorted(a.items(), key=lambda kv: str(kv[0]))
              if tasks]
    if not strata:
        raise ValueError("no scored task: no pass rate to bound")
    estimate = float(_clean(np.mean([s.mean() for s in strata])))
    low, high = _interval(_resampled_means(strata, np.random.default_rng(seed), resamples), confidence)
    return _summary(estimate, low, high, sum(map(len, strata)), len(strata), resamples, seed, confidence)


def pairs_for_half_width(half_width: float, pairs: int, target: float) -> int | None:
    """Pairs needed for a half-width measured as `half_width` on `pairs` pairs to shrink to `target`
    (half-width ~ 1/sqrt(pairs)); None when the measured half-width is 0 (no variance to scale)."""
    if pairs < 1 or target <= 0:
        raise ValueError(f"pairs must be >= 1 and target > 0, got {pairs!r}, {target!r}")
    if half_width <= 0:
        return None
    return max(1, math.ceil(pairs * (half_width / target) ** 2))
