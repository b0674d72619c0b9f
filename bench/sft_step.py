"""SFT tokens/s with the shared opening run once per batch, against every row run in full.

Usage (from the repo root):
    python bench/sft_step.py [--model DIR] [--demos 600] [--epochs 0.5] [--batch-tokens 4096] [--threads N]
                             [--target 1.0]

The model is --model (default: the CPU demo's base-agent architecture, hidden 192, 4 layers, 6 heads,
random init, built with train.tiny into a temp dir); the data are --demos storefront expert demonstrations
with the demo's storefront (configs/demo.yaml). Both sides start from the same weights and train on the
same batches in the same order (train.sft.train_sft, `share_prefix` on and off), so they do the same
arithmetic up to float rounding: the bench prints each side's tokens/s (real tokens, padding left out) and
final loss, and as the last line `shared_prefix_speedup=<shared tokens/s / unshared tokens/s>`.
Exit 0 when the speedup reaches --target (1.0), 1 when it does not, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

from common.cli import cli_entry, exit_code
from common.paths import REPO_ROOT
from common.io import check_model_folder
from common.validation import InputError, check_int, check_number

DEMO_CONFIG = REPO_ROOT / "configs/demo.yaml"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/sft_step.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="model folder (default: the demo's base-agent architecture, random init, temp dir)")
    parser.add_argument("--demos", type=int, default=600, help="storefront demonstrations (default 600)")
    parser.add_argument("--epochs", type=float, default=0.5, help="passes over them per side (default 0.5)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batch (default 4096)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--target", type=float, default=1.0, help="speedup to reach for exit 0 (default 1)")
    args = parser.parse_args(argv)
    if args.demos < 2:
        raise InputError(f"--demos must be >= 2, got {args.demos}")
    check_number(args.epochs, "--epochs", 0.0, low_open=True)
    check_int(args.threads, "--threads", 0)
    check_number(args.target, "--target", 0.0)
    from train.sft import SFTConfig

    try:  # the trainer's own checks (batch_tokens >= 64, ...), before the demonstrations are built
        SFTConfig(epochs=args.epochs, batch_tokens=args.batch_tokens)
    except ValueError as err:
        raise InputError(f"--batch-tokens / --epochs: {err}") from None
    if args.model is not None:
        check_model_folder(args.model, "--model")
    return args


def run(args: argparse.Namespace, model_dir: Path, demos: list) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.sft import SFTConfig, tokenize_chats, train_sft

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    chats = tokenize_chats(tokenizer, demos, progress=False)
    config = SFTConfig(epochs=args.epochs, batch_tokens=args.batch_tokens)
    figures = {}
    for side, share in (("unshared", False), ("shared", True)):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
        result = train_sft(model, chats, dataclasses.replace(config, share_prefix=share), tokenizer.pad_token_id,
                           progress=False)
        figures[side] = result
        print(f"{side:9s} {result['steps']} steps, {result['tokens']} tokens in {result['seconds']:.1f} s = "
              f"{result['tokens_per_s']:.0f} tokens/s, final loss {result['final_loss']:.4f}")
    for side, result in figures.items():
        print(f"{side}_tokens_per_s={result['tokens_per_s']:.1f}")
        print(f"{side}_final_loss={result['final_loss']:.4f}")
    speedup = figures["shared"]["tokens_per_s"] / figures["unshared"]["tokens_per_s"]
    if speedup < args.target:
        print(f"BELOW TARGET: {speedup:.3f} < {args.target}")
    print(f"shared_prefix_speedup={speedup:.3f}")
    return 0 if speedup >= args.target else 1


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from benchmarks.storefront.demos import make_demonstrations
    from demo.config import load_demo_config
    from train.tiny import build_tiny_model

    demo = load_demo_config(DEMO_CONFIG)
    demos = make_demonstrations(args.demos, 7, demo.storefront_config(REPO_ROOT), demo.base.planted, progress=False)
    if args.model is not None:
        return run(args, args.model, demos)
    base = demo.base
    with tempfile.TemporaryDirectory() as tmp:  # the demo's tokenizer recipe: trained on the demonstrations
        build_tiny_model(Path(tmp) / "model", chats=demos, vocab_size=base.vocab_size, hidden_size=base.hidden_size,
                         num_layers=base.num_layers, num_heads=base.num_heads, seed=0, tools_view=base.tools_view)
        return run(args, Path(tmp) / "model", demos)


if __name__ == "__main__":
    sys.exit(exit_code(main))
