"""Environment steps per second for the target benchmark and every registered game, driven by the oracle.

Usage (from the repo root):
    python bench/env_step.py [--seconds 2.0] [--target 5000] [--games NAME ...]

Each game plays whole episodes (make_env + reset + oracle_response + extract_action + step, nothing
pre-generated) for about --seconds of wall time; a step is one `game.step` call. One line per game, the
target benchmark `storefront` first; the last line is `min_steps_per_s=<slowest game>`.
Exit 0 when every game reaches --target steps/s, 1 when one does not or no game is registered,
2 when a game fails to import or is unknown, or --seconds / --target is not a finite number (> 0, >= 0).
"""
from __future__ import annotations

import argparse
import sys
import time

from game_registry import GameSpec, list_games, lookup_game
from common.cli import cli_entry, exit_code
from common.validation import InputError, check_number

TARGET_BENCHMARK = "storefront"


def measure(spec: GameSpec, seconds: float) -> dict[str, float]:
    """Play oracle episodes for about `seconds`; return steps, episodes, elapsed time, steps/s and the share
    of the time spent in make_env + reset (counted in steps/s: an episode cannot start without them).

    Episodes end when the game is done or after `spec.max_turns` turns. The clock is checked between
    episodes only, so every timed episode is complete.
    """
    steps = episodes = 0
    seed = 0
    setup = 0.0  # time in make_env + reset, reported so a slow game shows where its time goes
    start = time.perf_counter()
    while True:
        before = time.perf_counter()
        game = spec.make_env()
        game.reset(seed)
        setup += time.perf_counter() - before
        turns = 0
        while not game.done and turns < spec.max_turns:
            game.step(spec.extract_action(game.oracle_response()))
            turns += 1
        steps += turns
        episodes += 1
        seed += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return {"steps": steps, "episodes": episodes, "seconds": elapsed, "steps_per_s": steps / elapsed,
            "reset_share": setup / elapsed}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Oracle-driven environment steps per second, per game.")
    parser.add_argument("--seconds", type=float, default=2.0, help="wall time per game (default 2.0)")
    parser.add_argument("--target", type=float, default=5000.0, help="steps/s every game should reach (default 5000)")
    parser.add_argument("--games", nargs="+", help="only these games (default: all registered)")
    args = parser.parse_args(argv)
    # NaN compares false with everything: `elapsed >= nan` would never end the loop
    check_number(args.seconds, "--seconds", 0.0, low_open=True)
    check_number(args.target, "--target", 0.0)
    try:
        names = args.games or list_games()
    except ImportError as err:  # GameImportError, or a built-in game module that is missing
        raise InputError(str(err)) from None
    specs = [lookup_game(name) for name in names]
    if not specs:
        print("no games are registered (nothing to benchmark; see python game_registry.py --list)")
        return 1
    specs.sort(key=lambda s: (s.name != TARGET_BENCHMARK, s.name))  # the target benchmark first
    rates = []
    for spec in specs:
        result = measure(spec, args.seconds)
        rates.append(result["steps_per_s"])
        flag = "" if result["steps_per_s"] >= args.target else f"  BELOW TARGET {args.target:.0f}"
        print(f"{spec.name:44s} steps_per_s={result['steps_per_s']:10.0f}  steps={result['steps']:7d}  "
              f"episodes={result['episodes']:6d}  reset_share={result['reset_share']:.0%}  "
              f"seconds={result['seconds']:.2f}{flag}", flush=True)
    slowest = min(rates)
    print(f"min_steps_per_s={slowest:.0f}")
    return 0 if slowest >= args.target else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
