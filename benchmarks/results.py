"""Write and read trajectories in τ²-bench's results format (`tau2 run` monolithic JSON).

    {"timestamp", "info", "tasks": [...], "simulations": [{"id", "task_id", "trial", "sample_idx", "seed",
      "messages": [...], "reward_info": {"reward", ...breakdown}, "termination_reason", ...}]}

Metrics: `pass_rates` (share of simulations that pass) and `pass_hat_k` (τ²-bench's pass^k: the chance that
k trials of a task all pass). A simulation passes when its reward is >= `SUCCESS_THRESHOLD`, τ²-bench's own
success (`tau2.metrics.agent_metrics.is_successful`: reward >= 1 - 1e-6), so a real τ²-bench file's 0.9999999
passes; the storefront's rewards are exactly 0 or 1 and unaffected.

Messages are the dicts of game_registry's docstring (assistant tool calls as `{"id", "name",
"arguments": dict}`, tool results as `{"role": "tool", "tool_call_id", "name", "content"}`). Benchmark
runs, calibration rollouts and GRPO rollouts all write this one format with `write_results`;
`load_results` reads ours and real τ²-bench files alike (pipeline/_summarize consumes both).
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

from common.io import atomic_write_json, load_json
from common.validation import InputError

# τ²-bench counts a simulation a success when its reward is within 1e-6 of 1 (`is_successful`): rewards that are
# products and sums of checks can land on 0.9999999. Every success decided here from a τ²-bench-format reward
# uses this threshold.
TAU2_SUCCESS_TOLERANCE = 1e-6
SUCCESS_THRESHOLD = 1.0 - TAU2_SUCCESS_TOLERANCE


def make_simulation(*, task_id: str, messages: list[dict[str, Any]], reward_info: dict[str, Any],
                    termination_reason: str, trial: int = 0, sample_idx: int = 0, seed: int | None = None,
                    sim_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """One simulation record. `reward_info["reward"]` must be a number in [0, 1]; `extra` keys are kept
    (e.g. `duration`, `agent`)."""
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"task_id must be a non-empty string, got {task_id!r}")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"simulation {task_id}: messages must be a list of dicts with a 'role'")
    reward = reward_info.get("reward") if isinstance(reward_info, dict) else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not 0.0 <= reward <= 1.0:
        raise ValueError(f"simulation {task_id}: reward_info['reward'] must be a number in [0, 1], got {reward!r}")
    for name, value in (("trial", trial), ("sample_idx", sample_idx)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"simulation {task_id}: {name} must be an int >= 0, got {value!r}")
    return {
        "id": sim_id or f"{task_id}-t{trial}-s{sample_idx}",
        "task_id": task_id,
        "trial": trial,
        "sample_idx": sample_idx,
        "seed": seed,
        "messages": messages,
        "reward_info": {**reward_info, "reward": float(reward)},
        "termination_reason": termination_reason,
        **extra,
    }


def results_document(simulations: list[dict[str, Any]], tasks: list[dict[str, Any]] | None = None,
                     info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole results object; simulation ids must be unique."""
    ids = [s.get("id") for s in simulations]
    duplicates = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if duplicates:
        raise ValueError(f"duplicate simulation ids: {duplicates[:5]}")
    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "info": dict(info or {}),
        "tasks": list(tasks or []),
        "simulations": list(simulations),
    }


def write_results(path: str | os.PathLike, simulations: list[dict[str, Any]],
                  tasks: list[dict[str, Any]] | None = None, info: dict[str, Any] | None = None) -> Path:
    """Write a results file atomically (temp file + rename); returns its path."""
    return atomic_write_json(path, results_document(simulations, tasks, info))


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a results file (ours or τ²-bench's); problems raise InputError naming the file.

    Every simulation needs `task_id` and a `messages` list; `reward_info` may be null (an unscored
    simulation, as τ²-bench writes when evaluation failed) but, when present, its `reward` must be a
    finite number.
    """
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
        raise InputError(f"{path}: not a τ²-bench results file (needs a top-level object with a 'simulations' list)")
    for index, sim in enumerate(data["simulations"]):
        where = f"{path}: simulations[{index}]"
        if not isinstance(sim, dict):
            raise InputError(f"{where} is not an object")
        if not isinstance(sim.get("task_id"), (str, int)):
            raise InputError(f"{where} has no 'task_id'")
        if not isinstance(sim.get("messages"), list):
            raise InputError(f"{where} ({sim.get('task_id')}) has no 'messages' list")
        info = sim.get("reward_info")
        if info is not None:
            reward = info.get("reward") if isinstance(info, dict) else None
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise InputError(f"{where} ({sim.get('task_id')}): reward_info.reward must be a number, got {reward!r}")
    data.setdefault("info", {})
    data.setdefault("tasks", [])
    return data


def simulation_reward(sim: dict[str, Any]) -> float | None:
    """The reward of a simulation, or None when it was not scored."""
    info = sim.get("reward_info")
    return None if info is None else float(info["reward"])


def pass_rates(simulations: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] = lambda s: "all",
               threshold: float = SUCCESS_THRESHOLD) -> dict[str, dict[str, float]]:
    """{group: {"n", "passed", "pass_rate", "mean_reward"}} over scored simulations (reward >= threshold
    passes; by default τ²-bench's success, `SUCCESS_THRESHOLD`)."""
    buckets: dict[str, list[float]] = defaultdict(list)
    for sim in simulations:
        reward = simulation_reward(sim)
        if reward is not None:
            buckets[group(sim)].append(reward)
    out = {}
    for key in sorted(buckets):
        rewards = buckets[key]
        passed = sum(r >= threshold for r in rewards)
        out[key] = {"n": len(rewards), "passed": passed, "pass_rate": passed / len(rewards),
                    "mean_reward": sum(rewards) / len(rewards)}
    return out


def pass_hat_k(simulations: Iterable[dict[str, Any]], k_max: int,
               groups: Callable[[dict[str, Any]], Iterable[str]] = lambda sim: ["all"],
               threshold: float = SUCCESS_THRESHOLD) -> dict[str, dict[str, Any]]:
    """τ²-bench's pass^k for k = 1..k_max, averaged over tasks, per group.

    A task (simulations sharing a `task_id`) with n scored trials of which c pass (reward >= `threshold`, by
    default τ²-bench's success, `SUCCESS_THRESHOLD`)
    has pass^k = C(c, k) / C(n, k): the chance that k of its trials, drawn without replacement, all pass
    (unbiased; 0 when c < k). Unscored simulations (reward_info null) are left out. A task belongs to every
    group that `groups(sim)` names for any of its simulations (a task holding a cancel and a return counts
    under both kinds).

    A task with fewer than k scored trials contributes nothing to pass^k: that k's mean runs over the other
    tasks of the group, `n_tasks_at_k[k]` says how many there were, and a k that no task reaches is left
    out of `pass_hat_k`. So when trials are uneven, compare `n_tasks_at_k` with `n_tasks` before reading it.

    Returns {group: {"n_tasks": tasks with a scored trial, "pass_hat_k": {k: mean}, "n_tasks_at_k": {k: int}}},
    groups sorted by name.
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise ValueError(f"k_max must be an int >= 1, got {k_max!r}")
    outcomes: dict[Any, list[bool]] = defaultdict(list)  # task_id -> pass/fail of each scored trial
    task_groups: dict[Any, set[str]] = defaultdict(set)
    for sim in simulations:
        labels = groups(sim)
        if isinstance(labels, str):
            raise TypeError(f"groups must return a list of group names, got the string {labels!r}; wrap it: [name]")
        task_groups[sim["task_id"]].update(labels)
        reward = simulation_reward(sim)
        if reward is not None:
            outcomes[sim["task_id"]].append(reward >= threshold)
    members: dict[str, list[Any]] = defaultdict(list)
    for task_id, labels in task_groups.items():
        if outcomes.get(task_id):  # a task without a scored trial says nothing about pass^k
            for label in labels:
                members[label].append(task_id)
    out: dict[str, dict[str, Any]] = {}
    for label in sorted(members):
        means: dict[int, float] = {}
        counts: dict[int, int] = {}
        for k in range(1, k_max + 1):
            values = [math.comb(sum(outcomes[t]), k) / math.comb(len(outcomes[t]), k)
                      for t in members[label] if len(outcomes[t]) >= k]
            if values:
                means[k], counts[k] = sum(values) / len(values), len(values)
        out[label] = {"n_tasks": len(members[label]), "pass_hat_k": means, "n_tasks_at_k": counts}
    return out


def mean_reward(simulations: list[dict[str, Any]]) -> float:
    """Mean episode reward over scored simulations (0.0 when none is scored). On a game whose success needs every
    request of an episode right, pass^1 can sit at 0 while the partial reward still moves: this is that figure."""
    rewards = [s["reward_info"]["reward"] for s in simulations if s.get("reward_info")]
    return sum(rewards) / len(rewards) if rewards else 0.0
