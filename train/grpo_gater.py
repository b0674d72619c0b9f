"""GRPO over the gates only (Step 4), through the same trainer as the capability adapters.

    python -m train.grpo_gater --config configs/moe_gate.yaml [--game NAME] [--model DIR] [--output_dir DIR]
                               [--init_gate DIR] [--report_to tensorboard,...]
    python -m train.grpo_gater --resume RUN [--config ...] [--report_to ...] [--grpo_iterations N]

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

`--resume RUN` continues RUN in RUN with the moe_gate.yaml and config.yaml it saved (--config is then optional),
as `python -m train --resume` does: a --config, --game or --model that differs from the saved run exits 2 naming
each difference, except grpo.iterations (extend with --grpo_iterations N or in the config), grpo.save_every,
grpo.save_rollouts and report_to. The gate comes from RUN's checkpoint: --init_gate with --resume is refused, and
a --config file's init_gate and output_dir are not used (--output_dir may name a new or empty folder to continue
the checkpoint there). Ctrl-C ends a run at once (exit 130) with the command that resumes it.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from game_registry import GameSpec, check_game_overrides, lookup_game
from moe_gate import build_capability_model
from common.validation import InputError, check_int
from common.cli import Interrupted, cli_entry, exit_code
from common.run_folder import add_overwrite_flag, check_model, check_output_dir, claimed_run_folder
from train.__main__ import finished_message, resume_hint
from train.backends import HFBackend
from train.checkpoint import ResumePlan, latest_checkpoint, plan_resume, run_folder_of
from train.config import GRPOConfig
from train.game_mix import mixed_spec
from train.gate_config import MoEGateConfig, load_gate_config, save_gate_config
from train.gate_policy import GatePolicy
from train.grpo import GRPOTrainer
from train.policy import count_parameters, load_base_model
from train.tracking import require_trackers


GATE_FILE = "moe_gate.yaml"
# moe_gate.yaml fields a resume must keep (grpo: and report_to are checked through the GRPO config; init_gate and
# output_dir do not apply to a resume: the gate comes from the checkpoint, the run stays in its folder)
RESUME_GATE_FIELDS = ("adapters", "mode", "include_base_slot", "estimator", "gumbel_tau", "grpo_games",
                      "grpo_game_overrides")


def _check_same_routed_model(saved: MoEGateConfig, asked: MoEGateConfig, config_path: str, run_dir: Path) -> None:
    differ = [name for name in RESUME_GATE_FIELDS if getattr(saved, name) != getattr(asked, name)]
    if differ:
        named = ", ".join(f"{name} {getattr(asked, name)!r} (the run has {getattr(saved, name)!r})" for name in differ)
        raise InputError(f"--config {config_path}: {named}: a resume continues the run as {run_dir / GATE_FILE} "
                         "saved it; resume without --config, or start a new run in a new --output_dir")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.grpo_gater", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML config, e.g. configs/moe_gate.yaml (optional with --resume)")
    parser.add_argument("--game", default=None, help="registered game (overrides grpo.game)")
    parser.add_argument("--model", default=None, help="base model folder (overrides the config)")
    parser.add_argument("--output_dir", default=None, help="where the gate goes (overrides the config)")
    parser.add_argument("--init_gate", default=None, help="gate folder to start from (overrides the config)")
    parser.add_argument("--resume", default=None, type=Path,
                        help="a run's output folder (or one of its checkpoints/iter_N): continue it there with its "
                             "saved config")
    add_overwrite_flag(parser)
    parser.add_argument("--grpo_iterations", default=None, type=int,
                        help="grpo.iterations (e.g. to extend a resumed run)")
    parser.add_argument("--report_to", "--report-to", default=None,
                        help="trackers, comma-separated: tensorboard, wandb, trackio, mlflow, or none "
                             "(overrides the config)")
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    args = parser.parse_args(argv)
    if args.grpo_iterations is not None:
        check_int(args.grpo_iterations, "--grpo_iterations", 1)
    plan: ResumePlan | None = None
    if not args.config and not args.resume:
        raise InputError("pass --config (e.g. configs/moe_gate.yaml), or --resume RUN to continue a run")
    if args.resume and args.init_gate:
        raise InputError(f"--init_gate starts a new run from a gate; --resume {args.resume} continues that run "
                         "from its own checkpoint: pass one of them")
    run_dir = run_folder_of(latest_checkpoint(args.resume)) if args.resume else None
    saved_gate = load_gate_config(run_dir / GATE_FILE) if run_dir else None
    config = load_gate_config(args.config or run_dir / GATE_FILE, model=args.model, output_dir=args.output_dir,
                              init_gate=args.init_gate, report_to=args.report_to)
    if saved_gate and args.config:
        _check_same_routed_model(saved_gate, config, args.config, run_dir)
    games = [args.game] if args.game else config.grpo_games
    spec = (mixed_spec([lookup_game(name) for name in games], overrides=config.grpo_game_overrides)
            if len(games) > 1 else None)
    fixed = {"game": spec.name if spec else args.game, "report_to": args.report_to,
             "iterations": args.grpo_iterations}
    if args.resume:
        requested = config.grpo_values(**fixed)
        if not args.output_dir:  # the run stays in its folder whatever the --config file names
            requested.pop("output_dir")
        if not requested.get("game"):  # grpo.game "" (the game came from --game): the saved one
            requested.pop("game", None)
        plan = plan_resume(args.resume, requested, world_size=1, prefix="grpo.", start_files=(GATE_FILE,))
        grpo = plan.config
        config = dataclasses.replace(saved_gate, output_dir=grpo.output_dir, report_to=grpo.report_to)
    else:
        grpo = config.grpo_config(**fixed)
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
    if plan and plan.finished:
        print(finished_message(plan, "--grpo_iterations"))
        return 0
    check_output_dir(grpo.resolved_output_dir(), "output_dir",
                     inputs=[("the base model", grpo.model), ("init_gate", "" if plan else config.init_gate)])
    spec = spec or lookup_game(grpo.game)
    check_game_overrides(spec, grpo.game_overrides)
    require_trackers(grpo.report_to)  # a missing package stops the run before the model loads
    check_model(grpo.model)
    output = grpo.resolved_output_dir()
    # One folder, one run: a second process is refused, and a new run does not mix its files with another's.
    with claimed_run_folder(output, "output_dir", fresh=plan is None, overwrite=args.overwrite,
                            continue_hint=f"pass --resume {output} to continue it"):
        return _train_gates(config, grpo, spec, plan, output, argv)


def _train_gates(config: MoEGateConfig, grpo: GRPOConfig, spec: GameSpec, plan: ResumePlan | None,
                 output: Path, argv: list[str]) -> int:
    try:
        torch.manual_seed(grpo.seed)
        base, tokenizer = load_base_model(grpo.model, grpo.dtype)
        checkpoint = plan.checkpoint if plan else None
        start = checkpoint / "adapter" if checkpoint else (config.init_gate or None)
        model = build_capability_model(base, config.adapters, gate=start, mode=config.mode,
                                       include_base_slot=config.include_base_slot, estimator=config.estimator,
                                       tau=config.gumbel_tau)
        policy = GatePolicy(model, {"command": "train.grpo_gater", "game": grpo.game})
        backend = HFBackend(model, tokenizer.pad_token_id, seed=grpo.seed)
        trainer = GRPOTrainer(grpo, spec, policy, tokenizer, backend, run_kind="gate_grpo")
        if checkpoint:
            trainer.resume_from(checkpoint)
        output.mkdir(parents=True, exist_ok=True)
        save_gate_config(config, output / GATE_FILE, "python -m train.grpo_gater")
        trainable, total = count_parameters(model)
        print(f"GRPO gates on {grpo.game}: slots {model.slot_names}; {trainable:,} trainable of {total:,} parameters; "
              f"output {output}" + (f"; resumed at iteration {trainer.start_iteration}" if checkpoint else "")
              + (f"; changed since the run was saved: {', '.join(plan.changes)}" if plan and plan.changes else ""))
        trainer.run()
    except KeyboardInterrupt:
        # A resume into a new folder stopped before its first checkpoint: the command as typed runs it again (its
        # --grpo_iterations, --config and --report_to are not python -m train's flags for the plan's changes).
        raise Interrupted(resume_hint(output, 1, "-m train.grpo_gater", plan=plan, rerun_args=argv)) from None
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
