"""Storefront demonstrations for supervised fine-tuning, with planted deficits.

    python -m benchmarks.storefront.demos --n 4000 --seed 0 --config configs/storefront/cpu_demo.yaml \\
        --plant skip_status_check=0.8,wrong_refund_method=0.8 --out runs/x/demos.jsonl

Each demonstration is one task played to the end by the expert, or by a flawed expert
(`benchmarks/storefront/flaws.py`) that lacks some capabilities. `planted` gives, per flaw, the share of
demonstrations whose agent has it; a flaw only changes the steps where its mistake applies, so among the
tasks a flaw can touch, that share of demonstrations shows the mistake and the rest show the right way.
A model trained on them learns the mistake about that often: a base agent with known, recurrent failures.

Task seeds come from their own salted hash ("storefront-demo"), so they never line up with the evaluation
seeds of `benchmarks.storefront.run` ("storefront-run"); the customer's wording trial is drawn per
demonstration. Records are chat records for `train.sft` / `train.tiny --corpus`: {"messages", "tools"} plus
what was planted ("flaws"), the task seed, request kinds and the reward the episode got.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import random
import sys
from typing import Any

from tqdm import tqdm

from benchmarks.agents import Agent, ExpertAgent
from benchmarks.storefront.config import StorefrontConfig
from benchmarks.storefront.env import StorefrontGame
from benchmarks.storefront.flaws import FLAWS, FlawedExpertAgent
from benchmarks.storefront.run import load_config, play_episode
from benchmarks.storefront.tools import StorefrontTools
from common.cli import cli_entry, exit_code, seed_value
from common.io import atomic_write_jsonl, check_output_path
from common.validation import InputError

TRIALS = 4  # customer wordings a demonstration draws from
ITEM_KINDS = ("return", "exchange")  # the request kinds whose write names items of an order


def demonstration_seed(seed: int, index: int) -> int:
    """Task seed of demonstration `index` (disjoint in practice from benchmarks.storefront.run.task_seed)."""
    digest = hashlib.sha256(f"storefront-demo:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def check_planted(planted: dict[str, float], owner: str = "planted") -> dict[str, float]:
    """{flaw: share} with known flaws and shares in [0, 1] (raises InputError naming the fix)."""
    if not isinstance(planted, dict):
        raise InputError(f"{owner} must be a {{flaw: share}} mapping, got {planted!r}")
    unknown = [f for f in planted if f not in FLAWS]
    if unknown:
        raise InputError(f"{owner}: unknown flaw {', '.join(map(str, unknown))}; choose from {', '.join(FLAWS)}")
    for flaw, share in planted.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise InputError(f"{owner}.{flaw} must be a share in [0, 1], got {share!r}")
    return {f: float(s) for f, s in planted.items()}


def parse_planted(text: str) -> dict[str, float]:
    """'skip_status_check=0.8,drop_hash=0.5' -> {flaw: share} (empty text: nothing planted)."""
    planted = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        flaw, sep, share = pair.partition("=")
        try:
            if not sep:
                raise ValueError
            value = float(share)
        except ValueError:
            raise InputError(f"--plant: write FLAW=SHARE pairs, got {pair!r}") from None
        if flaw.strip() in planted:  # a second share for one flaw: which one was meant is not ours to guess
            raise InputError(f"--plant: {flaw.strip()} is given twice ({planted[flaw.strip()]:g} and {value:g}); "
                             "give each flaw once")
        planted[flaw.strip()] = value
    return check_planted(planted, "--plant")


def make_demonstrations(n: int, seed: int, config: StorefrontConfig, planted: dict[str, float],
                        progress: bool = True) -> list[dict[str, Any]]:
    """`n` demonstration records (see the module docstring), reproducible from `seed`."""
    planted = check_planted(planted)
    rng = random.Random(f"storefront-demos:{seed}")
    game = StorefrontGame(config)
    tools = game.get_tool_schemas()
    expert = ExpertAgent()
    records = []
    for index in tqdm(range(n), desc="demonstrations", unit="demo", file=sys.stderr, disable=not progress):
        flaws = tuple(flaw for flaw, share in planted.items() if rng.random() < share)
        trial = rng.randrange(TRIALS)
        agent: Agent = FlawedExpertAgent(flaws) if flaws else expert
        task_seed = demonstration_seed(seed, index)
        messages, summary = play_episode(game, agent, task_seed, trial=trial)
        records.append({"messages": messages, "tools": tools, "flaws": list(flaws), "task_seed": task_seed,
                        "trial": trial, "request_kinds": list(game.task.request_kinds),
                        "reward": summary["reward"]})
    return records


def through_first_call(record: dict[str, Any], tools: frozenset[str]) -> dict[str, Any] | None:
    """The demonstration cut right after the assistant's first call of one of `tools` (the call included), or
    None when it makes none."""
    messages = record["messages"]
    for end, message in enumerate(messages):
        calls = (message.get("tool_calls") or []) if message["role"] == "assistant" else []
        if any(call["name"] in tools for call in calls):
            return {**record, "messages": messages[: end + 1]}
    return None


def opening(record: dict[str, Any]) -> dict[str, Any]:
    """The demonstration cut after the assistant's first order look-up (`get_order_details`): the request,
    the identification and the look-ups, the turns where values the customer gave are copied into calls.
    A demonstration with no look-up is kept whole."""
    return through_first_call(record, frozenset({"get_order_details"})) or record


def make_openings(n: int, seed: int, config: StorefrontConfig, progress: bool = True) -> list[dict[str, Any]]:
    """`n` expert demonstrations cut to their openings (`opening`), for a curriculum that trains copying
    first: a tiny model learns the format and the phrases long before it copies an email or an order id
    from the conversation into a call, and openings put several such copies in a few hundred tokens.
    Nothing is planted: the flaws act after the look-up."""
    return [opening(record) for record in make_demonstrations(n, seed, config, {}, progress=progress)]


def through_first_write(record: dict[str, Any], write_tools: frozenset[str]) -> dict[str, Any] | None:
    """The demonstration cut right after the assistant's first write (the call included), or None when it makes
    none (a refusal, an unknown order): the turns where the agent picks which of an order's items the request is
    about and copies their ids into the write."""
    return through_first_call(record, write_tools)


def make_item_selections(n: int, seed: int, config: StorefrontConfig, planted: dict[str, float],
                         progress: bool = True) -> list[dict[str, Any]]:
    """Demonstrations of the requests that name items (returns and exchanges, at the config's own relative
    weights), each cut through its first write (`through_first_write`); the ones without a write are dropped,
    so fewer than `n` come back. A curriculum stage for selecting by content: after whole demonstrations a tiny
    model copies values a fixed cue announces (a payment id) but writes the wrong item ids, and a stage where
    that choice is most of every example teaches it (README, "What this base agent cannot copy").
    `planted` as in make_demonstrations (a wrong refund method shows in the write)."""
    weights = {kind: w for kind, w in config.kind_weights.items() if kind in ITEM_KINDS and w > 0}
    if not weights:
        raise InputError(f"item selections need returns or exchanges among the storefront's kind_weights, got "
                         f"{config.kind_weights}; give return and/or exchange a weight > 0")
    config = dataclasses.replace(config, kind_weights=weights)
    writes = StorefrontTools.write_tools()
    cut = (through_first_write(r, writes) for r in make_demonstrations(n, seed, config, planted, progress))
    return [record for record in cut if record is not None]


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.storefront.demos",
                                     description="Storefront demonstrations (expert, some with planted flaws).")
    parser.add_argument("--n", type=int, required=True, help="number of demonstrations")
    parser.add_argument("--seed", type=seed_value, default=0, help="base seed (default 0)")
    parser.add_argument("--config", help="YAML of StorefrontConfig fields, e.g. configs/storefront/cpu_demo.yaml")
    parser.add_argument("--plant", default="", help=f"FLAW=SHARE pairs, flaws from {', '.join(FLAWS)}")
    parser.add_argument("--out", required=True, help="JSONL file to write")
    args = parser.parse_args(argv)
    if args.n < 1:
        raise InputError(f"--n must be >= 1, got {args.n}")
    check_output_path(args.out, "--out", [("--config", args.config)])
    planted = parse_planted(args.plant)
    config = load_config(args.config)
    records = make_demonstrations(args.n, args.seed, config, planted)
    atomic_write_jsonl(args.out, records)
    shown = sum(r["reward"] < 1 for r in records)
    print(f"wrote {len(records)} demonstrations to {args.out} ({shown} show a planted mistake that costs the task)")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
