"""Write and read trajectories in τ²-bench's results format (`tau2 run` monolithic JSON).

    {"timestamp", "info", "tasks": [...], "simulations": [{"id", "task_id", "trial", "sample_idx", "seed",
      "messages": [...], "reward_info": {"reward", ...breakdown}, "termination_reason", ...}]}

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

from pipeline._io import InputError, atomic_write_json, load_json


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
               threshold: float = 1.0) -> dict[str, dict[str, float]]:
    """{group: {"n", "passed", "pass_rate", "mean_reward"}} over scored simulations (reward >= threshold
    passes)."""
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
