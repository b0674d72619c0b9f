"""GRPO over the gates only (Step 4), through the same trainer as the capability adapters.

    python -m train.grpo_gater --config configs/moe_gate.yaml [--game NAME] [--model DIR] [--output_dir DIR]
                               [--init_gate DIR] [--resume DIR] [--report_to tensorboard,...]

The routed model (`moe_gate.build_capability_model`: frozen base, frozen capability adapters, trainable
gates, starting from `init_gate`, e.g. the router SFT warm start, or zero) is wrapped in a `GatePolicy`
and handed to `train.grpo.GRPOTrainer` with the in-process backend, so the routed model itself plays the
rollouts. The update, checkpoints (the gate where a LoRA run keeps its adapter) and `--resume` are those
of `python -m train`. Every GRPO hyper-parameter comes from the config's `grpo:` section; the game is
`grpo.game`, or a mix of the games in `grpo_games` (train/game_mix.py: groups cycle through the games,
optionally a target benchmark's game among them), or `--game`.

Only `mode: token` trains here: the scorer computes log-probs of whole sequences without knowing where
each prompt ends, while trajectory/global routing decides from the prompt; train those routers with
`python -m train.train_router_sft`.

Writes to `output_dir`: gate.safetensors + gate_config.json, config.yaml (the GRPO config),
moe_gate.yaml (this config), metrics.jsonl, rollouts/ and checkpoints/ as `python -m train` does, and sends
metrics.jsonl's lines to the trackers of `report_to` (grpo.report_to, else the top-level key; train/tracking.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from game_registry import GameImportError, get_game
from moe_gate import GateError, build_capability_model
from common.io import InputError
from train.__main__ import _check_game_overrides
from train.backends import HFBackend
from train.checkpoint import latest_checkpoint
from train.game_mix import mixed_spec
from train.gate_config import load_gate_config, save_gate_config
from train.gate_policy import GatePolicy
from train.grpo import GRPOTrainer
from train.policy import count_parameters, load_base_model
from train.tracking import require_trackers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.grpo_gater", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML config, e.g. configs/moe_gate.yaml")
    parser.add_argument("--game", default=None, help="registered game (overrides grpo.game)")
    parser.add_argument("--model", default=None, help="base model folder (overrides the config)")
    parser.add_argument("--output_dir", default=None, help="where the gate goes (overrides the config)")
    parser.add_argument("--init_gate", default=None, help="gate folder to start from (overrides the config)")
    parser.add_argument("--resume", default=None, type=Path, help="checkpoint dir, or an output dir (latest checkpoint)")
    parser.add_argument("--report_to", "--report-to", default=None,
                        help="trackers, comma-separated: tensorboard, wandb, trackio, mlflow, or none "
                             "(overrides the config)")
    args = parser.parse_args(argv)
    try:
        config = load_gate_config(args.config, model=args.model, output_dir=args.output_dir, init_gate=args.init_gate,
                                  report_to=args.report_to)
        games = [args.game] if args.game else config.grpo_games
        spec = (mixed_spec([get_game(name) for name in games], overrides=config.grpo_game_overrides)
                if len(games) > 1 else None)
        grpo = config.grpo_config(game=spec.name if spec else args.game, report_to=args.report_to)
        if spec and (grpo.hint_fraction > 0 or grpo.game_overrides):
            raise InputError("a game mix (grpo_games) takes no hint prompts, and its game overrides are per game: "
                             "set grpo.hint_fraction: 0 and give overrides in grpo_game_overrides")
        if config.mode != "token":
            raise InputError(f"grpo_gater trains token routing only (mode: token), not mode {config.mode!r}: "
                             "train trajectory/global routers with python -m train.train_router_sft")
        if config.estimator != "straight_through":
            raise InputError("grpo_gater needs estimator: straight_through (a Gumbel sample in the update would not "
                             "be the top-1 routing the rollouts were sampled with)")
        if not grpo.game:
            raise InputError("no game: set grpo.game (or grpo_games, a mix) in the config or pass --game")
        spec = spec or get_game(grpo.game)
        _check_game_overrides(spec, grpo.game_overrides)
        require_trackers(grpo.report_to)  # a missing package stops the run before the model loads
    except (InputError, ValueError, KeyError, GameImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        torch.manual_seed(grpo.seed)
        base, tokenizer = load_base_model(grpo.model, grpo.dtype)
        checkpoint = latest_checkpoint(args.resume) if args.resume else None
        start = checkpoint / "adapter" if checkpoint else (config.init_gate or None)
        model = build_capability_model(base, config.adapters, gate=start, mode=config.mode,
                                       include_base_slot=config.include_base_slot, estimator=config.estimator,
                                       tau=config.gumbel_tau)
        policy = GatePolicy(model, {"command": "train.grpo_gater", "game": grpo.game})
        backend = HFBackend(model, tokenizer.pad_token_id, seed=grpo.seed)
        trainer = GRPOTrainer(grpo, spec, policy, tokenizer, backend, run_kind="gate_grpo")
        if checkpoint:
            trainer.resume_from(checkpoint)
        output = grpo.resolved_output_dir()
        output.mkdir(parents=True, exist_ok=True)
        save_gate_config(config, output / "moe_gate.yaml", "python -m train.grpo_gater")
        trainable, total = count_parameters(model)
        print(f"GRPO gates on {grpo.game}: slots {model.slot_names}; {trainable:,} trainable of {total:,} parameters; "
              f"output {output}" + (f"; resumed at iteration {trainer.start_iteration}" if checkpoint else ""))
        trainer.run()
    except (InputError, GateError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
