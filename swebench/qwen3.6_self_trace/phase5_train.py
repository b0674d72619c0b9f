"""Phase 5: GRPO training of one LoRA adapter per capability on the scenario game, through `train` unchanged.

    python swebench/qwen3.6_self_trace/phase5_train.py --capability NAME --model MODEL [--nproc 4]
        [--scenarios pipeline/swebench/NAME/scenarios_parsed.json]
        [--config swebench/qwen3.6_self_trace/configs/grpo_swebench.yaml] [--output-dir pipeline/adapters/NAME]
        [--master-port 29501] [--interface bash|tools] [--unsafe-no-isolation] [--allow-cpu] [--dry-run]
        [-- TRAIN_ARGS ...]

Inputs:  the calibrated scenarios of the capability (phase 3/4), the base model (a local directory or a hub
         id), --nproc CUDA GPUs for torchrun; optional: VLLM_BASE_URLS / VLLM_MODEL (with
         VLLM_ALLOW_RUNTIME_LORA_UPDATING=True on the server) to sample rollouts on vLLM. Extra arguments
         after `--` go to `python -m train` (e.g. -- --iterations 20).
Outputs: <output-dir>/ (default pipeline/adapters/<capability>/): the PEFT adapter
         (adapter_model.safetensors, adapter_config.json), config.yaml, metrics.jsonl, rollouts/, checkpoints/
         (resume with -- --resume <output-dir>).

The agent acts in the format phase 6 evaluates with: --interface bash (the default) is mini-swe-agent's (a
THOUGHT and one ```bash command per turn, <returncode>/<output> observations, `echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` submits); --interface tools is the five-tool JSON interface. The
scenario code runs in the namespace sandbox; --unsafe-no-isolation accepts running it without namespaces
where they are missing (swebench/sandbox.py).

Checks first, and exits 2 listing what is missing: the GPUs (unless --allow-cpu, for a tiny-model smoke
run on CPU), the scenario file, and every vLLM server named in VLLM_BASE_URLS. --dry-run prints the
command without checks. The exit code is the trainer's otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _common import CAPABILITIES, HERE, REPO_ROOT, Missing, gpu_problem, run, server_problem
from common.cli import cli_entry, exit_code
from common.io import load_yaml_mapping
from common.run_folder import check_output_dir
from common.validation import InputError, check_int


def game_overrides(args: argparse.Namespace, scenarios: Path) -> dict:
    overrides = {"scenarios_path": str(scenarios), "interface": args.interface}
    if args.unsafe_no_isolation:
        overrides["allow_unisolated"] = True
    return overrides


def command(args: argparse.Namespace, scenarios: Path, output_dir: Path) -> list[str]:
    train = ["-m", "train", "--game", f"capability_{args.capability}", "--model", args.model, "--config",
             str(args.config), "--output_dir", str(output_dir), "--game_overrides",
             json.dumps(game_overrides(args, scenarios)), *args.train_args]
    if args.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
                f"--master-port={args.master_port}", *train]
    return [sys.executable, *train]


@cli_entry
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", required=True, choices=CAPABILITIES)
    parser.add_argument("--model", required=True)
    parser.add_argument("--nproc", type=int, default=4, help="GPUs (torchrun processes)")
    parser.add_argument("--scenarios", type=Path, default=None)
    parser.add_argument("--config", type=Path, default=HERE / "configs" / "grpo_swebench.yaml")
    parser.add_argument("--output-dir", type=Path, default=None)
    parser.add_argument("--master-port", type=int, default=29501)
    parser.add_argument("--interface", choices=("bash", "tools"), default="bash",
                        help="the agent's action format (default bash: mini-swe-agent's, as phase 6 evaluates)")
    parser.add_argument("--unsafe-no-isolation", action="store_true",
                        help="run scenario code without namespace isolation where namespaces are missing (unsafe)")
    parser.add_argument("--allow-cpu", action="store_true", help="skip the GPU check (tiny-model smoke runs)")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args = parser.parse_args(argv)
    args.train_args = extra
    check_int(args.nproc, "--nproc", 1)
    check_int(args.master_port, "--master-port", 1, 65535)

    from swebench.scenario import default_scenarios_path, load_scenarios

    # What the command names is input (one line, exit 2); what an earlier phase should have left is a prerequisite.
    if args.scenarios is not None:
        try:
            load_scenarios(args.scenarios)
        except (OSError, ValueError) as err:
            raise InputError(f"--scenarios: {err}") from None
    load_yaml_mapping(args.config)
    scenarios = args.scenarios or default_scenarios_path(args.capability)
    output_dir = args.output_dir or REPO_ROOT / "pipeline" / "adapters" / args.capability
    check_output_dir(output_dir, "--output-dir", inputs=[("--scenarios", scenarios), ("--config", args.config)])
    cmd = command(args, scenarios, output_dir)
    env = {**os.environ, "TRACE_GAMES_DIRS": os.pathsep.join(
        p for p in (str(REPO_ROOT / "swebench" / "games"), os.environ.get("TRACE_GAMES_DIRS", "")) if p)}
    if args.dry_run:
        print(f"TRACE_GAMES_DIRS={env['TRACE_GAMES_DIRS']} " + " ".join(cmd))
        return 0
    missing = Missing(f"phase 5 (GRPO training of {args.capability})")
    if args.allow_cpu:
        print("WARNING: --allow-cpu: no GPU check; only a tiny model trains in reasonable time on CPU", file=sys.stderr)
    else:
        missing.add(gpu_problem(args.nproc))
    if args.scenarios is None:  # the default, phases 3 and 4's output (a named --scenarios was read at the door)
        if not scenarios.is_file():
            missing.add(f"scenarios: {scenarios} does not exist (run phases 3 and 4, or pass --scenarios)")
        else:
            try:
                load_scenarios(scenarios)
            except ValueError as err:
                missing.add(f"scenarios: {err}")
    for url in [u.strip() for u in os.environ.get("VLLM_BASE_URLS", "").split(",") if u.strip()]:
        missing.add(server_problem(url.rstrip("/") + "/v1"))
    missing.stop_if_any()
    return run(cmd, env=env, cwd=REPO_ROOT)


if __name__ == "__main__":
    sys.exit(exit_code(main))
