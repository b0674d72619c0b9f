"""Seconds per GRPO iteration: our trainer (train/grpo.py) against TRL's GRPOTrainer at equal work.

Usage (from the repo root):
    python bench/grpo_step.py [--iterations 3 --groups 2 --group-size 8] [--game NAME]
                              [--max-turn-tokens 160 --max-episode-tokens 2400] [--model-dir DIR]

Both trainers get the same tiny random-init Qwen3 model (built into a temp dir: vocab 1024, hidden 192,
4 layers, the CPU-demo size, unless --model-dir is given), the same LoRA (r 8, alpha 16, every linear layer
of the blocks), the same multi-turn capability game and task seeds, the same group size, groups per
iteration, token budgets per turn and per episode, temperature 1.0, micro-batch size and one optimizer
step per iteration. TRL plays the game through `rollout_func` with its in-process `model.generate` path
(bench/_trl_grpo.py); ours through its HFBackend. Each side runs one warm-up iteration, then
--iterations timed ones, alternating (TRL step, our iteration, ...) so both see the same background load;
the per-iteration wall time includes rollouts, scoring and the update.

Printed: per-iteration seconds for each side (with generation time and tokens), their means, rollout
tokens/s of both backends (sampled tokens / wall time of the episode loop), and as the last line
`speedup_vs_trl=<TRL seconds per iteration / ours>`.
Exit 0 when the speedup reaches --target (1.5), 1 when it does not, 2 on bad arguments, 3 when TRL fails.

The default is 2 groups of 8 (16 episodes) per iteration, not the 8 groups of the issue's example: the
capability games open with a ~2,000-token prompt (policy + the storefront's full tool list as JSON schemas);
on 2 CPU cores 16 episodes took ~17 s per iteration per side and 32 ~30 s with the earlier ~1,200-token
prompt (a tool subset), so 8 groups would need ~10 minutes for the whole run instead of ~2.5. Pass
--groups 8 on a bigger machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from tqdm import tqdm

from game_registry import GameSpec, lookup_game
from common.cli import cli_entry, exit_code, seed_value
from common.validation import InputError, check_number

DEFAULT_GAME = "capability_precondition_verification"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TRAIN_SEED_START = 1_000_000  # our trainer's default: training tasks start here


@dataclasses.dataclass
class SideResult:
    """Timed iterations of one trainer (warm-up excluded)."""

    name: str
    seconds: list[float]  # wall time per iteration
    gen_seconds: list[float]  # wall time of the episode loop per iteration
    gen_tokens: list[int]  # sampled tokens per iteration
    sequence_tokens: list[int]  # unpadded tokens the update trained on per iteration

    @property
    def seconds_per_iteration(self) -> float:
        return statistics.mean(self.seconds)

    @property
    def rollout_tokens_per_s(self) -> float:
        return sum(self.gen_tokens) / max(sum(self.gen_seconds), 1e-9)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default=DEFAULT_GAME, help=f"registered multi-turn game (default {DEFAULT_GAME})")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per trainer, after 1 warm-up")
    parser.add_argument("--groups", type=int, default=2, help="groups (task seeds) per iteration (default 2)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per group (default 8)")
    parser.add_argument("--max-turn-tokens", type=int, default=None,
                        help="tokens sampled per assistant turn (default: the game's max_gen_tokens)")
    parser.add_argument("--max-episode-tokens", type=int, default=2400,
                        help="token budget per episode, prompt included (default 2400: the ~2,000-token opening "
                             "with the storefront's full tool list, plus two to three turns)")
    parser.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward (default 16)")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an existing tiny model folder (default: build one with train.tiny into a temp dir)")
    parser.add_argument("--seed", type=seed_value, default=0, help="LoRA init and sampling seed (default 0)")
    parser.add_argument("--target", type=float, default=1.5, help="speedup to reach for exit 0 (default 1.5)")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """InputError naming the bad argument and a valid value."""
    for name in ("iterations", "groups", "micro_batch"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        raise InputError(f"--group-size must be >= 2 (GRPO compares samples within a group), got {args.group_size}")
    batch = args.groups * args.group_size
    if batch % args.micro_batch:
        raise InputError(f"--micro-batch {args.micro_batch} must divide groups x group size = {batch} "
                         "(TRL splits the generation batch into whole micro-batches)")
    if args.max_turn_tokens is not None and args.max_turn_tokens < 1:
        raise InputError(f"--max-turn-tokens must be >= 1, got {args.max_turn_tokens}")
    check_number(args.learning_rate, "--learning-rate", 0.0, low_open=True)
    check_number(args.target, "--target", 0.0, low_open=True)
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file():
        raise InputError(f"{args.model_dir}: not a model folder (no config.json); build one with python -m train.tiny")


def check_prompts_fit(spec: GameSpec, seeds: list[int], tokenizer, max_episode_tokens: int) -> int:
    """Longest opening prompt over `seeds`; InputError when one leaves no room for a first turn."""
    from train.episodes import ChatTokenizer, EpisodeRequest, start_episode

    chat = ChatTokenizer(tokenizer)
    longest = max(len(start_episode(spec, spec.make(), EpisodeRequest(seed, 0), chat).token_ids) for seed in seeds)
    if longest >= max_episode_tokens:
        raise InputError(f"game {spec.name}: the longest opening prompt has {longest} tokens, which fills "
                         f"--max-episode-tokens {max_episode_tokens}; pass e.g. --max-episode-tokens {longest + 400}")
    return longest


class OurTrainerError(RuntimeError):
    """Our trainer failed (raised inside TRL's loop, so it must not be reported as a TRL failure)."""


class OursRunner:
    """Our GRPOTrainer, one `iteration(i)` at a time; records the timed ones (iteration 0 is the warm-up)."""

    def __init__(self, spec: GameSpec, args: argparse.Namespace, model_dir: str, output_dir: Path):
        from train.backends import HFBackend
        from train.config import GRPOConfig
        from train.grpo import GRPOTrainer
        from train.policy import LoraPolicy, load_base_model

        config = GRPOConfig(
            game=spec.name, model=model_dir, output_dir=str(output_dir),
            lora_r=8, lora_alpha=16, lora_dropout=0.0, lora_target_modules=list(LORA_TARGETS),
            learning_rate=args.learning_rate, iterations=args.iterations + 1, ppo_epochs=1,
            micro_batch_size=args.micro_batch, groups_per_iteration=args.groups, group_size=args.group_size,
            temperature=1.0, max_episode_tokens=args.max_episode_tokens, train_seed_start=TRAIN_SEED_START,
            # Equal work: TRL trains on every group (zero advantage for constant ones) and has no hint re-scoring.
            hint_fraction=0.0, filter_constant_groups=False, loss_agg="grpo", kl_beta=0.0,
            seed=args.seed, save_rollouts=False, save_every=10**9,
        )
        torch.manual_seed(config.seed)  # same LoRA init as the TRL side
        base, tokenizer = load_base_model(model_dir)
        policy = LoraPolicy.create(base, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                                   target_modules=config.lora_target_modules)
        self.backend = HFBackend(policy.model, tokenizer.pad_token_id, seed=config.seed)
        self.trainer = GRPOTrainer(config, spec, policy, tokenizer, self.backend)
        output_dir.mkdir(parents=True, exist_ok=True)  # iteration() appends metrics.jsonl there (run() makes it)
        self.trained_tokens: list[int] = []
        make_sequences = self.trainer.sequences

        def recording_sequences(episodes):  # the metrics hold rates only; record the trained token count too
            sequences, stats = make_sequences(episodes)
            self.trained_tokens.append(sum(len(s.token_ids) for s in sequences))
            return sequences, stats

        self.trainer.sequences = recording_sequences
        self.result = SideResult("ours", [], [], [], [])

    def iteration(self, iteration: int) -> None:
        started = time.perf_counter()
        try:
            metrics = self.trainer.iteration(iteration)
        except Exception as err:
            raise OurTrainerError(f"our trainer failed in iteration {iteration}: {err}") from err
        seconds = time.perf_counter() - started
        if iteration == 0:
            return
        gen_tokens = int(metrics["gen_tokens"])
        self.result.seconds.append(seconds)
        self.result.gen_tokens.append(gen_tokens)
        # The trainer reports the rate gen_tokens / (wall time of run_episodes); invert it for the time.
        self.result.gen_seconds.append(gen_tokens / metrics["gen_tokens_per_s"] if gen_tokens else 0.0)
        self.result.sequence_tokens.append(self.trained_tokens[-1])


def run_both(spec: GameSpec, args: argparse.Namespace, model_dir: str, seeds: list[int],
             output_dir: Path) -> tuple[SideResult, SideResult]:
    """Alternate the two trainers iteration by iteration (TRL step, our iteration, TRL step, ...).

    Interleaving exposes both to the same background load, which on a shared machine drifts by more than the
    difference being measured; each side's clock only runs during its own work.
    """
    from _trl_grpo import TRLSettings, run_trl  # bench/_trl_grpo.py: this script's folder is first on sys.path

    ours = OursRunner(spec, args, model_dir, output_dir)
    settings = TRLSettings(
        model_dir=model_dir, seeds=seeds, steps=args.iterations + 1, group_size=args.group_size,
        micro_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.groups * args.group_size // args.micro_batch,
        learning_rate=args.learning_rate, temperature=1.0, max_episode_tokens=args.max_episode_tokens,
        lora_r=8, lora_alpha=16, lora_target_modules=list(LORA_TARGETS), seed=args.seed,
    )
    bar = tqdm(total=args.iterations + 1, desc="iterations, TRL then ours (1 warm-up)", unit="it", file=sys.stderr)

    def our_iteration(trl_step: int) -> None:
        ours.iteration(trl_step - 1)
        bar.update(1)

    try:
        run = run_trl(spec, settings, between_steps=our_iteration)
    finally:
        bar.close()
        ours.backend.close()
    timed = run.rollouts[1:]
    theirs = SideResult("trl", run.step_seconds[1:], [r.seconds for r in timed], [r.generated_tokens for r in timed],
                        [r.sequence_tokens for r in timed])
    return ours.result, theirs


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    spec = lookup_game(args.game)
    if args.max_turn_tokens is not None:
        spec = dataclasses.replace(spec, max_gen_tokens=args.max_turn_tokens)
    seeds = [TRAIN_SEED_START + i for i in range((args.iterations + 1) * args.groups)]

    with tempfile.TemporaryDirectory(prefix="grpo-step-bench-") as scratch:
        model_dir = str(args.model_dir) if args.model_dir else _build_model(Path(scratch) / "tiny")
        from transformers import AutoTokenizer

        longest = check_prompts_fit(spec, seeds, AutoTokenizer.from_pretrained(model_dir), args.max_episode_tokens)
        print(f"game {spec.name} (multi-turn, <= {spec.max_turns} turns, <= {spec.max_gen_tokens} tokens/turn, "
              f"<= {args.max_episode_tokens} tokens/episode, openings up to {longest} tokens); "
              f"model {model_dir}; LoRA r8 alpha16 on {','.join(LORA_TARGETS)}")
        print(f"work per iteration: {args.groups} groups x {args.group_size} episodes, temperature 1.0, "
              f"micro-batch {args.micro_batch}, 1 optimizer step; 1 warm-up + {args.iterations} timed iterations "
              f"each, interleaved; torch threads {torch.get_num_threads()}", flush=True)
        try:
            ours, theirs = run_both(spec, args, model_dir, seeds, Path(scratch) / "ours")
        except OurTrainerError:
            raise
        except Exception as err:  # any TRL failure: report it and exit non-zero (traceback kept on stderr)
            traceback.print_exc()
            print(f"error: the TRL side failed: {type(err).__name__}: {err}", file=sys.stderr)
            return 3

    for side in (ours, theirs):
        for number, (seconds, gen_s, gen_tokens, seq_tokens) in enumerate(
            zip(side.seconds, side.gen_seconds, side.gen_tokens, side.sequence_tokens), start=1
        ):
            print(f"{side.name:4s} iter {number}: {seconds:7.2f} s  (rollout {gen_s:6.2f} s, rest {seconds - gen_s:6.2f} s)"
                  f"  sampled {gen_tokens} tokens, trained on {seq_tokens} tokens")
    print("notes: both sides play the game through train.episodes.run_episodes and differ in sampler and trainer; "
          "their samples differ (separate RNG streams), so token counts per iteration differ a little; "
          "ours runs with hint_fraction 0 and filter_constant_groups off to do TRL's work; "
          "TRL gets the task seed through a placeholder prompt (rollout_func receives only the prompt column); "
          "timings on a shared machine are noisy: compare runs, not single iterations")
    print(f"ours_seconds_per_iteration={ours.seconds_per_iteration:.3f}")
    print(f"trl_seconds_per_iteration={theirs.seconds_per_iteration:.3f}")
    print(f"ours_rollout_tokens_per_s={ours.rollout_tokens_per_s:.1f}")
    print(f"trl_rollout_tokens_per_s={theirs.rollout_tokens_per_s:.1f}")
    speedup = theirs.seconds_per_iteration / ours.seconds_per_iteration
    print(f"speedup_vs_trl={speedup:.3f}")
    return 0 if speedup >= args.target else 1


def _build_model(out_dir: Path) -> str:
    from train.tiny import build_tiny_model

    print("building the tiny model (vocab 1024, hidden 192, 4 layers) ...", file=sys.stderr, flush=True)
    return str(build_tiny_model(out_dir, vocab_size=1024, hidden_size=192, num_layers=4, num_heads=4))


if __name__ == "__main__":
    sys.exit(exit_code(main))
