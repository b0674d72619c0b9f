"""The base agent's full success on each capability game, per knob value, as Step 2 will see it.

    python bench/game_success.py [--model assets/demo_base_agent] [--config configs/demo.yaml]
        [--games precondition_verification ...] [--episodes 64] [--temperatures 0 1] [--hint]
        [--out bench_out/game_success.json]

Each game is played on the demo's storefront surface (the config's `storefront` and `storefront_overrides`,
as `demo` passes it to Step 2) at every value of every declared difficulty knob (the others at the
game's defaults), --episodes episodes a cell (seeds 10000.., one sample each), greedy and at T=1. Printed per
cell: full-success rate, mean reward, the decision classes' shares with the agent's success on each, and the
first mistakes of the failed episodes (the game's `first_mistake` classes). With --hint each game is also played
at its defaults with the hint prompt on every episode, beside the same episodes without it (issue 41 point 5:
does the hint help this agent?). Last lines: `in_band_games=N` (games with some cell's T=1 success in
[0.10, 0.60]) and the seconds taken.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from common.cli import cli_entry, exit_code
from common.paths import REPO_ROOT
from common.io import atomic_write_json, check_output_path
from common.validation import InputError, check_int

GAMES = ("precondition_verification", "structured_data_reasoning", "tool_calling_precision")
BAND = (0.10, 0.60)


def play(spec: Any, model: Any, tokenizer: Any, overrides: dict[str, Any], episodes: int, temperature: float,
         hinted: bool, max_episode_tokens: int) -> list[dict[str, Any]]:
    """`episodes` episodes (seeds 10000.., one sample each) of `spec` with `overrides`: their summaries."""
    from train.backends import HFBackend
    from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes

    backend = HFBackend(model, tokenizer.pad_token_id, seed=0)
    requests = [EpisodeRequest(10_000 + i, 0, hinted=hinted) for i in range(episodes)]
    played = run_episodes(spec, requests, backend, ChatTokenizer(tokenizer), temperature=temperature,
                          max_episode_tokens=max_episode_tokens, game_overrides=overrides)
    backend.close()
    return [{**ep.summary, "reward": ep.reward} for ep in played]


def cell(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Success, mean reward, classes and first mistakes of one cell's summaries."""
    from pipeline.recalibrate import episode_classes

    n = len(summaries)
    return {"episodes": n, "success_rate": sum(s["reward"] >= 1.0 for s in summaries) / n,
            "mean_reward": sum(s["reward"] for s in summaries) / n,
            **episode_classes([{"reward_info": s} for s in summaries])}


def cell_text(label: str, figures: dict[str, Any]) -> str:
    from pipeline.recalibrate import classes_text, mistakes_text

    classes = classes_text(figures)
    return (f"  {label:34s} success {figures['success_rate']:.3f}  mean reward {figures['mean_reward']:.3f}  "
            f"classes {classes}\n  {'':34s} first mistakes: {mistakes_text(figures) or '-'}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "assets" / "demo_base_agent"))
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=GAMES)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--hint", action="store_true", help="also measure the hint prompt at each game's defaults")
    parser.add_argument("--defaults_only", action="store_true", help="only each game's defaults (no knob values)")
    parser.add_argument("--max_episode_tokens", type=int, default=3072)
    parser.add_argument("--out", default="bench_out/game_success.json")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise InputError(f"--episodes must be >= 1, got {args.episodes}")
    check_int(args.max_episode_tokens, "--max_episode_tokens", 1)
    if any(not 0.0 <= t <= 2.0 for t in args.temperatures):
        raise InputError(f"--temperatures must lie in [0, 2], got {args.temperatures}")
    check_output_path(args.out, "--out", [("--model", args.model), ("--config", args.config)])
    if not (Path(args.model) / "config.json").is_file():
        raise InputError(f"--model {args.model}: no config.json there (the shipped base agent is "
                         f"assets/demo_base_agent)")
    from demo.config import load_demo_config
    config = load_demo_config(args.config)

    import torch

    from game_registry import get_game
    from benchmarks.storefront.config import surface_fields
    from train.policy import load_base_model

    started = time.perf_counter()
    model, tokenizer = load_base_model(args.model, "float32", torch.device("cpu"))
    surface = {"storefront": surface_fields(config.storefront_config(REPO_ROOT))}  # as the demo's game_surface
    results: dict[str, Any] = {"model": args.model, "config": args.config, "episodes": args.episodes, "games": {}}
    in_band = 0
    for name in args.games:
        spec = get_game(f"capability_{name}")
        print(f"{name}:", flush=True)
        cells: dict[str, Any] = {}
        settings = [("defaults", {})] + ([] if args.defaults_only else [
            (f"{knob.name}={value!r}", {knob.name: value}) for knob in spec.difficulty_knobs for value in knob.values])
        for label, overrides in settings:
            for temperature in args.temperatures:
                key = f"{label} T={temperature:g}"
                cells[key] = cell(play(spec, model, tokenizer, {**surface, **overrides}, args.episodes, temperature,
                                       False, args.max_episode_tokens))
                print(cell_text(key, cells[key]), flush=True)
        if args.hint:
            for temperature in args.temperatures:
                key = f"defaults + hint T={temperature:g}"
                cells[key] = cell(play(spec, model, tokenizer, surface, args.episodes, temperature, True,
                                       args.max_episode_tokens))
                print(cell_text(key, cells[key]), flush=True)
        results["games"][name] = cells
        in_band += any(BAND[0] <= c["success_rate"] <= BAND[1] for k, c in cells.items()
                       if k.endswith("T=1") and "hint" not in k)
    seconds = time.perf_counter() - started
    results["seconds"] = round(seconds, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, results)
    print(f"in_band_games={in_band}")
    print(f"seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
