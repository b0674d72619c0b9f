"""Collect rollouts of a model on a game, for calibration (Step 2) and evaluation.

    python -m train.collect_rollouts --game NAME --model M [--adapter DIR] --seeds 100 --samples 16 \
        --temperature 1.0 --out rollouts.json [--seed-start 0] [--game-overrides '{"knob": 3}']

Writes τ²-bench results format: one simulation per (seed, sample) with `task_id` = seed and `sample_idx`
set, which is what `pipeline/calibrate_environment.py` reads. Rollouts go to vLLM when VLLM_BASE_URLS is
set (then --adapter must name an adapter the server has loaded, or be omitted, and only the tokenizer is
loaded here: a 30B model's weights stay on the server), else in process through the same backend interface
the trainer uses.

A run survives its process and its server (train/batch_journal.py): each batch's episodes, then the sampler's
state, go to `<out>.partial.jsonl` as the batch ends; the same command continues from the first unfinished batch
with the same samples an uninterrupted run would draw. A server that fails for good ends the run with one line
(exit 1) and the finished batches kept; a second process on the same `--out`, or other settings, is refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.results import write_results
from benchmarks.results_journal import ResultsJournal, kept_on_interrupt
from game_registry import GameSpec, check_game_overrides, lookup_game
from common.io import check_model_folder, check_output_path
from common.validation import InputError, check_int, check_number
from common.cli import exit_code, seed_value
from train.backends import HFBackend, RolloutBackend
from train.batch_journal import folder_fingerprint, play_journaled
from train.episodes import ChatTokenizer, EpisodeRequest, check_prompts_fit, episode_to_simulation, run_episodes
from train.policy import load_base_model, load_tokenizer
from train.vllm_backend import VLLMError, backend_from_env, vllm_settings_from_env


ROLLOUT_BATCH_SIZE = 256  # episodes played at once


def collect(
    spec: GameSpec,
    backend: RolloutBackend,
    chat: ChatTokenizer,
    *,
    seeds: list[int],
    samples: int,
    temperature: float,
    max_episode_tokens: int,
    game_overrides: dict[str, Any] | None = None,
    episodes_per_batch: int = ROLLOUT_BATCH_SIZE,
    progress: bool = True,
    journal: ResultsJournal | None = None,
) -> list[dict[str, Any]]:
    """Simulations for every (seed, sample), played `episodes_per_batch` at a time; with a `journal`, kept batch by
    batch and continued from it (train/batch_journal.py)."""
    requests = [EpisodeRequest(seed=seed, sample_idx=k) for seed in seeds for k in range(samples)]
    keys = [(i, k) for i in range(len(seeds)) for k in range(samples)]

    def play_batch(chunk: list[EpisodeRequest]) -> list[dict[str, Any]]:
        return [episode_to_simulation(ep) for ep in run_episodes(
            spec, chunk, backend, chat, temperature=temperature, max_episode_tokens=max_episode_tokens,
            game_overrides=game_overrides)]

    with tqdm(total=len(requests), desc=f"rollouts {spec.name}", unit="ep", disable=not progress or None) as bar:
        return play_journaled(requests, keys, episodes_per_batch, backend, journal, play_batch, bar.update)


def make_backend(args: argparse.Namespace) -> RolloutBackend:
    """The vLLM servers of VLLM_BASE_URLS (this process loads no weights), else the model in process."""
    backend = backend_from_env(args.out.parent / ".vllm_adapters", seed=args.sampling_seed)
    if backend is None:
        model, tokenizer = load_base_model(args.model)
        if args.adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, args.adapter)
        torch.manual_seed(args.sampling_seed)
        backend = HFBackend(model, tokenizer.pad_token_id, seed=args.sampling_seed)
    elif args.adapter:  # the server samples: this process only renders prompts, so it loads no weights
        backend.served_model = args.adapter  # an adapter name the server already has loaded
    return backend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.collect_rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", required=True)
    parser.add_argument("--model", required=True, help="base model directory (or hub id)")
    parser.add_argument("--adapter", default=None, help="PEFT adapter directory to apply (in-process backend)")
    parser.add_argument("--seeds", type=int, default=100, help="number of task seeds (groups)")
    parser.add_argument("--seed-start", type=seed_value, default=0)
    parser.add_argument("--samples", type=int, default=16, help="samples per seed")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-episode-tokens", type=int, default=4096)
    parser.add_argument("--game-overrides", default="{}", help="JSON object of game config fields")
    parser.add_argument("--sampling-seed", type=seed_value, default=0)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    # Everything is checked before any weights load or rollout is played: flags, the output path, the game and
    # its overrides, the model folder, and that the opening prompts leave room to generate (tokenizer only).
    try:
        check_int(args.seeds, "--seeds", 1)
        check_int(args.samples, "--samples", 1)
        check_number(args.temperature, "--temperature", 0.0)
        check_output_path(args.out, "--out", [("--model", args.model), ("--adapter", args.adapter)])
        try:
            overrides = json.loads(args.game_overrides)
        except json.JSONDecodeError as err:
            raise InputError(f"--game-overrides is not JSON: {err}") from None
        if not isinstance(overrides, dict):
            raise InputError("--game-overrides must be a JSON object")
        spec = lookup_game(args.game)
        check_game_overrides(spec, overrides, "--game-overrides")  # before the model loads
        # A local folder (else a hub id, which load_tokenizer resolves) needs its weights unless a vLLM server
        # samples (VLLM_BASE_URLS): then this process loads only the tokenizer.
        vllm = vllm_settings_from_env()  # the servers that sample, if any (InputError for a malformed VLLM_*)
        if Path(args.model).exists() and vllm is None:
            check_model_folder(args.model, "--model")
        seeds = list(range(args.seed_start, args.seed_start + args.seeds))
        tokenizer = load_tokenizer(args.model)
        chat = ChatTokenizer(tokenizer)
        check_prompts_fit(spec, [EpisodeRequest(seed=seed, sample_idx=0) for seed in seeds], chat,
                          args.max_episode_tokens, overrides)
    except (InputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # What decides the rollouts: a rerun with the same settings continues the journal, another is refused.
    # Where a vLLM server samples, the weights behind its names are the server's: only the names are compared, those
    # of what samples (VLLM_MODEL, and the adapter it serves: --adapter) beside --model (then only the tokenizer).
    served = vllm is not None
    sampled_by: dict[str, Any] = {"sampled_by": "in-process"}
    if vllm is not None:
        sampled_by = {"sampled_by": "vllm", "vllm_model": vllm.model, "served_model": args.adapter or vllm.model}
    settings = {"game": args.game, "overrides": overrides, "seeds": seeds, "samples": args.samples,
                "temperature": args.temperature, "max_episode_tokens": args.max_episode_tokens,
                "sampling_seed": args.sampling_seed, **sampled_by, "batch_size": ROLLOUT_BATCH_SIZE,
                "model": [args.model, folder_fingerprint(args.model) if Path(args.model).exists() and not served
                          else None],
                "adapter": [args.adapter, None if served else folder_fingerprint(args.adapter)]}
    try:
        # the journal's lock and settings before any weights load
        with ResultsJournal(args.out, settings) as journal, kept_on_interrupt(journal, "rollouts"):
            try:
                backend = make_backend(args)
                simulations = collect(spec, backend, chat, seeds=seeds, samples=args.samples,
                                      temperature=args.temperature, max_episode_tokens=args.max_episode_tokens,
                                      game_overrides=overrides, episodes_per_batch=ROLLOUT_BATCH_SIZE,
                                      journal=journal)
            except VLLMError as err:  # the server failed for good after its retries: what was played is kept
                print(f"error: {err}; {len(journal.scored)} rollouts are kept in {journal.path}: run the same "
                      "command again to continue", file=sys.stderr)
                return 1
    except (InputError, ValueError) as err:  # the journal's lock or settings; a chat template not append-only
        print(f"error: {err}", file=sys.stderr)
        return 2
    info = {"game": args.game, "model": args.model, "adapter": args.adapter, **sampled_by,
            "temperature": args.temperature, "samples": args.samples, "game_overrides": overrides}
    write_results(args.out, simulations, info=info)
    journal.remove()
    rewards = [s["reward_info"]["reward"] for s in simulations]
    print(f"{len(simulations)} rollouts -> {args.out}; mean reward {sum(rewards) / len(rewards):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))  # Ctrl-C: one line, exit 130 (the finished batches stay in the journal)
