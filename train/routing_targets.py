"""Reward targets for the gate: each slot's measured reward per task, what router SFT's "reward" objective fits.

    python -m train.routing_targets --slot base=runs/x/base.json --slot precondition=runs/x/precondition.json \
        [--slot NAME=RESULTS ...]

Every slot (the base agent, and each capability adapter alone) plays the same tasks (the same task ids). Per task, a
slot's target is its mean reward over its samples there (`reward_targets`), and router SFT with `sft.objective:
reward` (train/train_router_sft.py) fits each gate logit to its slot's target on every assistant token of every
conversation played on the task: the gate learns to predict which slot succeeds, and its top-1 routes to the
slot with the highest predicted reward. Where nothing in a conversation tells the tasks apart, that is the slot
that succeeds most often over all tasks.

Why not cross-entropy against a label: labeling a conversation by the game it comes from (router SFT's default)
teaches which game a conversation looks like, and where every game is played on the target's own surface (the
CPU demo's storefront) nothing tells the games apart: the demo's token gate split the target's tokens about evenly
over the slots and kept none of the precondition adapter's gain (README "Results", 2026-12-06). Labeling each task
by its best slots instead (ties keeping every tied slot) was measured too: on the easy tasks every slot succeeds,
so the base slot got as many labeled tokens as the slot that wins most hard tasks, and the gate learned near-uniform
logits whose top-1 flipped from epoch to epoch (held-out cross-entropy at the labels' entropy, 1.1 nats). A
regression target keeps what the labels lose: that one slot succeeds where the others fail. The reference
implementation's gate warm start also derives its targets from each capability's empirical reward per task.

The command prints, per slot, its mean reward and the tasks where it is a best slot (alone or tied); nothing is
written.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.results import load_results, simulation_reward
from common.cli import cli_entry, exit_code
from common.validation import InputError


def task_rewards(simulations: list[dict[str, Any]]) -> dict[str, list[float]]:
    """{task id: rewards of its scored simulations}; unscored simulations are left out."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for sim in simulations:
        reward = simulation_reward(sim)
        if reward is not None:
            rewards[str(sim["task_id"])].append(reward)
    return dict(rewards)


def reward_targets(simulations_by_slot: dict[str, list[dict[str, Any]]], slots: list[str]) -> dict[str, list[float]]:
    """{task id: [each slot's mean reward on it, in `slots` order]}. Every slot of `slots` must have played exactly
    the same tasks: a target measured on some tasks only would favour the slots that played the easy ones."""
    missing = [slot for slot in slots if not simulations_by_slot.get(slot)]
    if missing:
        raise InputError(f"reward targets need every slot's results on the same tasks; none for {missing} "
                         "(the base slot's too: the base agent alone on those tasks)")
    unknown = sorted(set(simulations_by_slot) - set(slots))
    if unknown:
        raise InputError(f"results for {unknown}, which are not slots ({slots})")
    rewards = {slot: task_rewards(simulations_by_slot[slot]) for slot in slots}
    tasks = set(rewards[slots[0]])
    for slot in slots[1:]:
        if set(rewards[slot]) != tasks:
            only = sorted(set(rewards[slot]) ^ tasks)[:5]
            raise InputError(f"slot {slot!r} played other tasks than slot {slots[0]!r} (e.g. {', '.join(only)}): "
                             "play every slot on the same tasks (same seed and task count)")
    return {task: [sum(rewards[slot][task]) / len(rewards[slot][task]) for slot in slots] for task in sorted(tasks)}


def best_slots(targets: dict[str, list[float]], slots: list[str]) -> dict[str, list[str]]:
    """{task id: the slots whose target is the task's highest}; [] where no slot scored above 0."""
    out = {}
    for task, means in targets.items():
        top = max(means)
        out[task] = [slot for slot, mean in zip(slots, means) if mean == top] if top > 0 else []
    return out


def summarize(targets: dict[str, list[float]], slots: list[str]) -> dict[str, Any]:
    """{"tasks", "unsolved", "slots": {slot: {"mean_reward", "best_tasks", "best_alone"}}}: what a report shows."""
    best = best_slots(targets, slots)
    n = max(len(targets), 1)
    return {"tasks": len(targets), "unsolved": sum(1 for b in best.values() if not b),
            "slots": {slot: {"mean_reward": sum(t[i] for t in targets.values()) / n,
                             "best_tasks": sum(1 for b in best.values() if slot in b),
                             "best_alone": sum(1 for b in best.values() if b == [slot])}
                      for i, slot in enumerate(slots)}}


def _slot_argument(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--slot takes NAME=RESULTS_FILE (e.g. base=runs/x/base.json), got {text!r}")
    return name, Path(path)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.routing_targets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--slot", action="append", type=_slot_argument, required=True,
                        help="NAME=RESULTS: a slot (base or an adapter's name) and a results file it played; repeat "
                             "per slot (a slot may list several files)")
    args = parser.parse_args(argv)
    simulations: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, path in args.slot:
        if not path.is_file():
            raise InputError(f"--slot {name}={path}: no such results file")
        simulations[name].extend(load_results(path)["simulations"])
    slots = list(simulations)
    summary = summarize(reward_targets(dict(simulations), slots), slots)
    for slot, s in summary["slots"].items():
        print(f"{slot}: mean reward {s['mean_reward']:.3f}; best on {s['best_tasks']} of {summary['tasks']} tasks "
              f"({s['best_alone']} alone)")
    print(f"no slot solved {summary['unsolved']} task(s)")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
