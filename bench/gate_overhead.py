"""Generation speed of the routed model against the base and a single PEFT LoRA.

Usage (from the repo root):
    python bench/gate_overhead.py [--rounds 3 --batch 8 --prompt-len 64 --new-tokens 64]
                                  [--hidden 192 --layers 4 --vocab 1024 --adapters 4 --rank 8]
                                  [--threads N] [--device cpu|cuda]

Three models generate from the same random-init tiny Qwen3 (the CPU-demo size by default), the same
batch of prompts and the same greedy settings, through the in-process rollout backend used for training
(train/backends.py, static KV cache):
  base     the base model alone;
  lora     base + one LoRA through peft (r --rank on every linear of the blocks);
  routed   base + --adapters LoRAs of the same shape under token-level top-1 gates (moe_gate), with a
           random gate without bias so that the tokens of every step spread over the slots (the worst case
           for grouping; with a random bias most layers sent nearly every token to one slot).
The three run one after another in each of --rounds rounds, so they see the same background load; each
side's figure is its best round. Printed: tokens/s per side, the routed model's slot shares, and as the
last line `routed_vs_single_lora=<routed tokens/s / lora tokens/s>`.
Exit 0 when the ratio reaches --target (0.8), 1 when it does not, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repo's packages importable
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from common.io import InputError, check_int, check_number  # noqa: E402
from moe_gate import build_capability_model  # noqa: E402
from moe_gate.smoke_test import make_random_adapter, make_tiny_base, randomise_gate  # noqa: E402
from train.backends import HFBackend, SamplingParams  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tokens_per_second(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int) -> float:
    backend = HFBackend(model, pad_token_id=0, seed=0)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gate_overhead.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where there is a GPU")
    args = parser.parse_args(argv)
    try:  # every flag before any model is built
        for flag in ("rounds", "batch", "prompt_len", "new_tokens", "adapters", "rank", "layers"):
            check_int(getattr(args, flag), f"--{flag.replace('_', '-')}", 1)
        check_int(args.vocab, "--vocab", 3)  # prompts are drawn from ids 2 .. vocab - 1
        check_int(args.threads, "--threads", 0)
        check_number(args.target, "--target", 0.0)
        if args.hidden < 2 or args.hidden % 2:
            raise InputError(f"--hidden must be an even integer >= 2, got {args.hidden}")
        check_device(args.device)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    def base():
        return make_tiny_base(0, hidden=args.hidden, layers=args.layers, vocab=args.vocab)

    torch.manual_seed(0)
    prompts = torch.randint(2, args.vocab, (args.batch, args.prompt_len)).tolist()
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as scratch:
        paths = {f"cap{i}": make_random_adapter(base, Path(scratch) / f"cap{i}", r=args.rank, alpha=2 * args.rank,
                                                targets=TARGETS, seed=i, std=0.05)
                 for i in range(args.adapters)}
        from peft import PeftModel

        models = {
            "base": base().to(args.device),
            "lora": PeftModel.from_pretrained(base(), str(paths["cap0"])).to(args.device).eval(),
            "routed": build_capability_model(base().to(args.device), paths, mode="token").eval(),
        }
        randomise_gate(models["routed"], seed=0, std=1.0)
        with torch.no_grad():  # no bias: a random bias picks one slot for most tokens of a layer, not a spread
            for name, parameter in models["routed"].gate.named_parameters():
                if name.endswith("bias"):
                    parameter.zero_()
        with models["routed"].record_routing() as record:
            tokens_per_second(models["routed"], prompts[:2], 4)
        shares = torch.bincount(torch.cat([s.flatten() for s in record.slots().values()]),
                                minlength=models["routed"].n_slots).float()
        shares = (shares / shares.sum()).tolist()
        best = {name: 0.0 for name in models}
        for round_index in range(args.rounds):
            for name, model in models.items():
                speed = tokens_per_second(model, prompts, args.new_tokens)
                best[name] = max(best[name], speed)
                print(f"round {round_index + 1}: {name:6s} {speed:9.1f} tokens/s")
    print(f"model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; batch {args.batch}, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy, static KV cache; "
          f"{args.device}, {torch.get_num_threads()} threads")
    print(f"routed slot shares ({', '.join(models['routed'].slot_names)}): "
          + ", ".join(f"{s:.2f}" for s in shares))
    for name, speed in best.items():
        print(f"{name}_tokens_per_s={speed:.1f}")
    ratio = best["routed"] / best["lora"]
    print(f"routed_vs_base={best['routed'] / best['base']:.3f}")
    print(f"routed_vs_single_lora={ratio:.3f}")
    return 0 if ratio >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
