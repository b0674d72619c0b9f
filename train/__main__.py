"""Train one capability LoRA adapter with GRPO.

    python -m train --game capability_<name> --model MODEL [--config configs/grpo.yaml] [--resume DIR]
                    [--key value ...]
    python -m train --config RUN/config.yaml     # a run's resolved config names its game and model
    torchrun --nproc_per_node=N --master-port=P -m train --game ... --model ...

Any field of train/config.py's GRPOConfig can be set with `--key value` (e.g. `--iterations 20
--learning_rate 1e-3`). With VLLM_BASE_URLS (and VLLM_MODEL) set, rollouts go to those vLLM servers;
otherwise they are sampled in process. Under torchrun each rank collects its share of the groups
(gloo on CPU, nccl on GPU) and rank 0 writes the artifacts to `pipeline/adapters/<capability>/` (or
--output_dir): the PEFT adapter, config.yaml, metrics.jsonl, rollouts/ and checkpoints/. With `--report_to
tensorboard` (or wandb, trackio, mlflow; comma-separated for several) rank 0 also sends every metrics.jsonl line
to those trackers (train/tracking.py; TensorBoard's event files go to <output_dir>/tb/).

`--resume RUN` continues RUN (an output folder, or one of its checkpoints/iter_N) in RUN with the config RUN saved:
`python -m train --resume RUN` needs no other flag. A flag or --config value that differs from the saved config
exits 2 naming each difference, except --iterations (to extend the run; not below what is done), --save_every,
--save_rollouts and --report_to, which the start line reports as changed; --output_dir may name a new or empty
folder to continue the checkpoint there and leave RUN as it is (rerunning that command after it stopped before the new
folder's first checkpoint starts it again there). Resuming from a checkpoint before the run's last iteration (e.g.
`--resume RUN/checkpoints/iter_000010` of a run that went on to 20, or a run killed between checkpoints) first moves
what came after it, the later checkpoints, metrics lines, rollouts and the adapter they wrote, into
RUN/abandoned/<date-time>/ and says so: nothing is deleted, and RUN then reads as a run stopped at that checkpoint. A
damaged newest checkpoint (a state file cut short by a power loss) is passed over for the one before, with a warning.
A finished run says so and exits 0. A new run
refuses an --output_dir that holds another run's files unless `--overwrite` (which removes them), and a second
process on a folder in use is refused at once (common/run_folder.py's claimed_run_folder). Ctrl-C ends a
run at once (exit 130) with the command that resumes it; every file is the old one or a complete new one.

Inputs are checked before the model loads: the config (every field its declared type), the game, the VLLM_*
variables' format, the opening prompts against max_episode_tokens (tokenizer only), and the trackers, which start
their run then.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from game_registry import GameSpec, check_game_overrides, lookup_game
from common.validation import InputError
from common.cli import Interrupted, cli_entry, exit_code
from common.run_folder import add_overwrite_flag, check_model, check_output_dir, claimed_run_folder
from train.backends import HFBackend
from train.checkpoint import ResumePlan, latest_checkpoint, plan_resume, set_aside_after
from train.config import GRPOConfig, config_values, load_config
from train.distributed import exit_worker, world
from train.episodes import ChatTokenizer
from train.grpo import GRPOTrainer, check_prompts_fit, open_run_trackers
from train.policy import LoraPolicy, count_parameters, load_base_model, load_tokenizer
from train.tracking import MetricLogger, require_trackers
from train.vllm_backend import VLLMError, VLLMSettings, vllm_settings_from_env


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, str]]:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__.split("\n\n")[0])
    # Optional on the command line when the config file names them (a run's saved config.yaml does).
    parser.add_argument("--game", default=None, help="registered game, e.g. capability_precondition_verification")
    parser.add_argument("--model", default=None, help="base model: local directory or hub id")
    parser.add_argument("--config", default=None, help="YAML config (e.g. configs/grpo.yaml)")
    parser.add_argument("--resume", default=None, type=Path,
                        help="a run's output folder (its latest checkpoint) or one of its checkpoints/iter_N: the run "
                             "continues there with its saved config")
    add_overwrite_flag(parser)
    args, rest = parser.parse_known_args(argv)
    overrides: dict[str, str] = {}
    index = 0
    while index < len(rest):
        key = rest[index]
        if not key.startswith("--"):
            parser.error(f"unexpected argument {key!r}; options are --key value")
        if "=" in key:
            name, value = key[2:].split("=", 1)
            index += 1
        elif index + 1 < len(rest):
            name, value = key[2:], rest[index + 1]
            index += 2
        else:
            parser.error(f"option {key} needs a value")
        overrides[name] = value
    return args, overrides


def setup_distributed() -> torch.device:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if world_size > 1:  # share the CPU cores between ranks instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    return torch.device("cpu")


def resume_hint(output_dir: Path, world_size: int, command: str = "-m train", plan: ResumePlan | None = None,
                rerun_args: list[str] | None = None) -> str:
    """What to run after an interruption: the resume command when a checkpoint exists, else the command that starts
    the same work again (a new run: with --overwrite; a resume into another folder, `plan`: that resume again, with
    `rerun_args` when given, else with python -m train's flags for the plan's changes)."""
    launcher = "python" if world_size == 1 else f"torchrun --nproc_per_node={world_size}"
    try:
        latest_checkpoint(output_dir)
    except InputError:
        if plan is not None and plan.elsewhere:  # --resume RUN --output_dir NEW, stopped before NEW's first checkpoint
            args = rerun_args if rerun_args is not None else \
                ["--resume", str(plan.checkpoint), "--output_dir", str(output_dir), *plan.flags]
            again = shlex.join([*command.split(), *args])
            return (f"no checkpoint in {output_dir} yet: continue {plan.checkpoint} there again with: {launcher} "
                    f"{again}")
        return f"no checkpoint in {output_dir} yet: run the same command with --overwrite to start over"
    return f"resume with: {launcher} {command} --resume {output_dir}"


def finished_message(plan: ResumePlan, flag: str = "--iterations") -> str:
    return (f"{plan.run_dir}: finished, {plan.done} of {plan.config.iterations} iterations done; nothing to do "
            f"(to train on, resume with {flag} above {plan.done})")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    plan: ResumePlan | None = None
    if args.resume:  # the run's saved config, checked against what the command line asks for
        requested = config_values(args.config, overrides, game=args.game, model=args.model)
        plan = plan_resume(args.resume, requested, int(os.environ.get("WORLD_SIZE", "1")))
        config = plan.config
    else:
        config = load_config(args.config, overrides, game=args.game, model=args.model)
    for name in ("game", "model"):
        if not getattr(config, name):
            raise InputError(f"no {name}: pass --{name}, or a --config file with a `{name}:` key")
    if plan and plan.finished:
        print(finished_message(plan))
        return 0
    check_output_dir(config.resolved_output_dir(), "--output_dir", inputs=[("--model", config.model)])
    spec = lookup_game(config.game)
    check_game_overrides(spec, config.game_overrides)  # a bad field fails before the model loads
    require_trackers(config.report_to)  # a missing package stops the run before the model loads
    check_model(config.model)
    vllm = vllm_settings_from_env()  # the format of the VLLM_* variables (no request yet)
    if config.fsdp and vllm is None:
        raise InputError("--fsdp needs rollouts from vLLM servers (set VLLM_BASE_URLS and VLLM_MODEL): "
                         "in-process generation from a sharded model is not supported")
    output_dir = config.resolved_output_dir()
    # One folder, one run: a second process is refused, and a new run does not mix its files with another's.
    with claimed_run_folder(output_dir, "--output_dir", fresh=plan is None, overwrite=args.overwrite,
                            continue_hint=f"pass --resume {output_dir} to continue it"):
        if plan and os.environ.get("RANK", "0") == "0":  # a later attempt's files go aside before anything loads
            set_aside_after(output_dir, plan.done)
        return _train(config, spec, plan, vllm)


def _train(config: GRPOConfig, spec: GameSpec, plan: ResumePlan | None, vllm: VLLMSettings | None) -> int:
    device = setup_distributed()
    rank, world_size = world()
    output_dir = config.resolved_output_dir()
    backend = None
    tracker = MetricLogger()
    try:
        if config.groups_per_iteration < world_size:
            raise InputError(f"groups_per_iteration={config.groups_per_iteration} is smaller than the {world_size} "
                             "processes: every rank needs at least one group; raise --groups_per_iteration or "
                             "start fewer processes")
        checkpoint = plan.checkpoint if plan else None
        start = plan.done if plan else 0
        # What needs no weights is checked before they load: the prompts against the token budget (tokenizer
        # only), then the trackers start their run (a wandb login or an MLflow server that fails says so now).
        check_prompts_fit(config, spec, ChatTokenizer(load_tokenizer(config.model)), start, rank, world_size)
        tracker = open_run_trackers(config, start, rank)
        backend = vllm.backend(output_dir / "vllm_adapters", seed=config.seed + 1000 * rank) if vllm else None
        torch.manual_seed(config.seed)  # same LoRA init on every rank
        base, tokenizer = load_base_model(config.model, config.dtype, device)
        policy = LoraPolicy.create(
            base, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
            adapter_dir=checkpoint / "adapter" if checkpoint else None,
        )
        if config.fsdp:
            policy.shard()
        backend = backend or HFBackend(policy.model, tokenizer.pad_token_id, seed=config.seed + 1000 * rank)
        trainer = GRPOTrainer(config, spec, policy, tokenizer, backend)
        if checkpoint:
            trainer.resume_from(checkpoint)
        if rank == 0:
            trainable, total = count_parameters(policy.model)
            print(f"GRPO {config.game} on {config.model}: {trainable:,} trainable of {total:,} parameters; "
                  f"backend {type(backend).__name__}; world size {world_size}; "
                  f"output {output_dir}" + (f"; resumed at iteration {trainer.start_iteration}" if checkpoint else "")
                  + (f"; changed since the run was saved: {', '.join(plan.changes)}" if plan and plan.changes else ""))
        trainer.run(tracker, prompts_checked=True)
    except VLLMError as err:
        print(f"error: vLLM rollouts failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise Interrupted(resume_hint(output_dir, world_size, plan=plan)) from None
    finally:
        tracker.close()  # (already closed when the run got to train)
        if backend is not None:
            backend.close()  # a crashed run still unloads its adapter from the servers
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_worker(exit_code(main))
