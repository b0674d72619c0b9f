"""Generation speed of the routed model against the base and a single PEFT LoRA.

Usage (from the repo root):
    python bench/gate_overhead.py [--rounds 5 --batch 8 --prompt-len 64 --new-tokens 64]
                                  [--hidden 192 --layers 4 --vocab 1024 --adapters 4 --rank 8]
                                  [--shapes 2x8:0.9 2x64 8x8 8x64:0.8 | --shapes none] [--shape-hidden 4096
                                   --shape-layers 1 --shape-prompt-len 16 --shape-new-tokens 32]
                                  [--path auto|masked|grouped] [--threads N] [--device cpu|cuda]

Three models generate from the same random-init tiny Qwen3 (the CPU-demo size by default), the same
batch of prompts and the same greedy settings, through the in-process rollout backend used for training
(train/backends.py, static KV cache):
  base     the base model alone;
  lora     base + one LoRA through peft (r --rank on every linear of the blocks), unmerged (a runtime LoRA);
  routed   base + --adapters LoRAs of the same shape under token-level top-1 gates (moe_gate), with a
           random gate without bias so that the tokens of every step spread over the slots (the worst case
           for grouping; with a random bias most layers sent nearly every token to one slot).
The three run one after another in each of --rounds rounds, so they see the same background load; each
side's figure is its best round. Each --shapes entry (ADAPTERSxRANK, optionally :TARGET) is measured first on a
--shape-hidden wide model (4096, --shape-layers 1, intermediate 2 x hidden; short prompts so that decoding
steps dominate) and printed as one line `shape N adapters x rank R ...: routed_vs_single_lora=<ratio>`. Then
the default shape: tokens/s per side, the routed model's slot shares, and as the last line
`routed_vs_single_lora=<routed tokens/s / lora tokens/s>`. --path forces the routed model's hard path
(masked or grouped; auto is the per-module cost rule of moe_gate/multi_lora.py) to compare the two.
Exit 0 when the default's ratio reaches --target (0.8) and every shape with a target reaches it, 1 when one
does not, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from common.cli import cli_entry, exit_code
from common.validation import InputError, check_int, check_number
from moe_gate import build_capability_model
from moe_gate.model_builder import MASKED_MAX_MACS
from moe_gate.smoke_test import make_random_adapter, make_tiny_base, randomise_gate
from train.backends import HFBackend, SamplingParams

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# The targets: routed >= 0.9x a single LoRA at 2 adapters of rank 8, >= 0.8x at 8 of rank 64 (4096 wide).
DEFAULT_SHAPES = ("2x8:0.9", "2x64", "8x8", "8x64:0.8")
PATHS = {"auto": MASKED_MAX_MACS, "masked": math.inf, "grouped": 0}  # the routed model's masked_max_macs


def tokens_per_second(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int) -> float:
    # merge_lora=False: the single LoRA is sampled unmerged, as a runtime LoRA is served (merged it runs at the
    # base's speed after a copy of the model per call, which no per-token routing can do)
    backend = HFBackend(model, pad_token_id=0, seed=0, merge_lora=False)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    started = time.perf_counter()
    completions = backend.generate(prompts, params)
    seconds = time.perf_counter() - started
    return sum(len(c.token_ids) for c in completions) / seconds


def check_device(device: str) -> None:
    """InputError unless `device` is cpu, or cuda / cuda:N on a machine where that GPU exists."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
        raise InputError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    if kind == "cuda" and (not torch.cuda.is_available() or int(index or 0) >= torch.cuda.device_count()):
        raise InputError(f"--device {device}: no such GPU here ({torch.cuda.device_count()} visible); use --device cpu")


def parse_shape(text: str) -> tuple[int, int, float | None]:
    """`NxR` or `NxR:TARGET` -> (adapters, rank, target or None)."""
    shape, _, target = text.partition(":")
    adapters, _, rank = shape.partition("x")
    if not (adapters.isdigit() and rank.isdigit() and int(adapters) >= 1 and int(rank) >= 1):
        raise InputError(f"--shapes: {text!r} is not ADAPTERSxRANK[:TARGET] (e.g. 2x8:0.9 or 8x64)")
    try:
        value = float(target) if target else None
    except ValueError:
        raise InputError(f"--shapes: the target in {text!r} is not a number") from None
    if value is not None:
        check_number(value, f"--shapes target in {text!r}", 0.0)
    return int(adapters), int(rank), value


def measure(args: argparse.Namespace, *, hidden: int, layers: int, adapters: int, rank: int, prompt_len: int,
            new_tokens: int, label: str) -> tuple[dict[str, float], list[float], list[str]]:
    """Best tokens/s over --rounds of base, single LoRA and routed; the routed model's slot shares and names."""
    def base():
        return make_tiny_base(0, hidden=hidden, layers=layers, vocab=args.vocab)

    torch.manual_seed(0)
    prompts = torch.randint(2, args.vocab, (args.batch, prompt_len)).tolist()
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as scratch:
        paths = {f"cap{i}": make_random_adapter(base, Path(scratch) / f"cap{i}", r=rank, alpha=2 * rank,
                                                targets=TARGETS, seed=i, std=0.05)
                 for i in range(adapters)}
        from peft import PeftModel

        models = {
            "base": base().to(args.device),
            "lora": PeftModel.from_pretrained(base(), str(paths["cap0"])).to(args.device).eval(),
            "routed": build_capability_model(base().to(args.device), paths, mode="token").eval(),
        }
        models["routed"].masked_max_macs = PATHS[args.path]
        randomise_gate(models["routed"], seed=0, std=1.0)
        with torch.no_grad():  # no bias: a random bias picks one slot for most tokens of a layer, not a spread
            for name, parameter in models["routed"].gate.named_parameters():
                if name.endswith("bias"):
                    parameter.zero_()
        with models["routed"].record_routing() as record:
            tokens_per_second(models["routed"], prompts[:2], 4)
        shares = torch.bincount(record.all_slots(), minlength=models["routed"].n_slots).float()
        shares = (shares / shares.sum()).tolist()
        best = {name: 0.0 for name in models}
        for round_index in range(args.rounds):
            for name, model in models.items():
                speed = tokens_per_second(model, prompts, new_tokens)
                best[name] = max(best[name], speed)
                print(f"{label}round {round_index + 1}: {name:6s} {speed:9.1f} tokens/s", flush=True)
        return best, shares, list(models["routed"].slot_names)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gate_overhead.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)  # best of 5: one round of a shared 2-core machine swings ~15%
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES),
                        help="ADAPTERSxRANK[:TARGET] measured on a --shape-hidden wide model ('none': skip)")
    parser.add_argument("--shape-hidden", type=int, default=4096)
    parser.add_argument("--shape-layers", type=int, default=1)
    parser.add_argument("--shape-prompt-len", type=int, default=16)
    parser.add_argument("--shape-new-tokens", type=int, default=32)
    parser.add_argument("--path", choices=sorted(PATHS), default="auto",
                        help="the routed model's hard path: auto (the per-module cost rule), masked or grouped")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where there is a GPU")
    args = parser.parse_args(argv)
    # every flag before any model is built
    for flag in ("rounds", "batch", "prompt_len", "new_tokens", "adapters", "rank", "layers", "shape_layers",
                 "shape_prompt_len", "shape_new_tokens"):
        check_int(getattr(args, flag), f"--{flag.replace('_', '-')}", 1)
    check_int(args.vocab, "--vocab", 3)  # prompts are drawn from ids 2 .. vocab - 1
    check_int(args.threads, "--threads", 0)
    check_number(args.target, "--target", 0.0)
    for flag in ("hidden", "shape_hidden"):
        if getattr(args, flag) < 2 or getattr(args, flag) % 2:
            raise InputError(f"--{flag.replace('_', '-')} must be an even integer >= 2, got {getattr(args, flag)}")
    shapes = [] if args.shapes == ["none"] else [parse_shape(text) for text in args.shapes]
    check_device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    reached = True
    for adapters, rank, target in shapes:  # one line each, before the default shape's figures
        best, _, _ = measure(args, hidden=args.shape_hidden, layers=args.shape_layers, adapters=adapters, rank=rank,
                             prompt_len=args.shape_prompt_len, new_tokens=args.shape_new_tokens,
                             label=f"[{adapters}x{rank}] ")
        ratio = best["routed"] / best["lora"]
        reached = reached and (target is None or ratio >= target)
        verdict = "" if target is None else f" (target {target:.2f}: {'reached' if ratio >= target else 'NOT reached'})"
        print(f"shape {adapters} adapters x rank {rank}, {args.shape_hidden} wide, {args.shape_layers} layer(s), "
              f"path {args.path}: routed_vs_single_lora={ratio:.3f}{verdict}", flush=True)
    best, shares, slot_names = measure(args, hidden=args.hidden, layers=args.layers, adapters=args.adapters,
                                       rank=args.rank, prompt_len=args.prompt_len, new_tokens=args.new_tokens, label="")
    print(f"model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; batch {args.batch}, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy, static KV cache; "
          f"{args.device}, {torch.get_num_threads()} threads; routed hard path {args.path}")
    print(f"routed slot shares ({', '.join(slot_names)}): " + ", ".join(f"{s:.2f}" for s in shares))
    for name, speed in best.items():
        print(f"{name}_tokens_per_s={speed:.1f}")
    ratio = best["routed"] / best["lora"]
    print(f"routed_vs_base={best['routed'] / best['base']:.3f}")
    print(f"routed_vs_single_lora={ratio:.3f}")
    return 0 if ratio >= args.target and reached else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
