"""Rollout speed of the in-process sampler: today's padded KV layout against the shared-prefix layout (and a vLLM server).

Usage (from the repo root):
    python bench/rollout_backends.py [--model DIR] [--groups 4 --group-size 4] [--max-episode-tokens N]
                                     [--single-turn-tokens 64] [--vllm-url URL [--vllm-model NAME]]
                                     [--threads N] [--target 3.0] [--lora]

The model is --model (default: the CPU-demo tiny model, built with train.tiny into a temp dir; the issue's
figures use assets/demo_base_agent with --groups 8 --group-size 8). Three workloads, each run by every side on
the same prompts:
  multi_turn   --groups x --group-size storefront episodes (configs/storefront/cpu_demo.yaml), a GRPO-like
               batch (each group shares a task seed, so its opening prompt), sampled at temperature 1
               through train.episodes.run_episodes: one backend call per turn with every active episode's
               whole history, as in GRPO (its seconds are one GRPO iteration's rollout);
  evaluation   --groups x --group-size distinct tasks, one greedy episode each, as train.evaluate plays them;
  single_turn  one call with the groups' opening prompts (each --group-size times), --single-turn-tokens
               new tokens per row, no stop token.
Sides: padded_nocache (HFBackend(kv_layout="padded", prefix_cache=False): every call prefills every prompt),
padded (today's path before the shared-prefix layout: left-padded static caches, keys/values kept across turns
and copied into each call's cache, and the chat template rendered whole each turn), shared_prefix_rowwise (the
shared-prefix layout with torch's attention kernel called per row and transformers' forward, `decode_kernel=False,
lean_forward=False`), shared_prefix_transformers (its compiled decoding kernel, train/decode_attention.py, still
transformers' forward), shared_prefix_torch_ops (the kernel and the model as plain tensor calls,
train/lean_forward.py, with torch's linear and RMSNorm ops, `compiled_ops=False`), shared_prefix_layered (the lean
forward's projections and norms by compiled kernels too, train/small_linear.py, op by op, `fused_step=False`),
shared_prefix (the default: all of that with each decoding step's layers in one compiled call,
train/csrc/decode_step.cpp, and the incremental chat template) and, with --vllm-url, vllm (VLLMBackend against
that server, which must serve --model). The HF sides share one seed and one sampling rule, so they sample the
same tokens: the bench checks it (identical_samples=1). With --lora the model is first wrapped in a LoRA shaped
like configs/grpo_tiny.yaml's (r 8 on every linear layer, non-zero weights), as GRPO samples it; a side
shared_prefix_unmerged (merge_lora=False) runs the LoRA layers at every step (`lora_merge_speedup=`).
Printed per side and workload: tokens/s (episodes/s for evaluation), seconds, prefill tokens (rows x columns run
before decoding) and the share of the seconds spent inside attention (shared_prefix's decoding steps attend inside
their one compiled call, where no clock sees them: its share counts prefills only; shared_prefix_layered's is
the attention share of the same computation); `decode_kernel_speedup=` (multi_turn
shared_prefix_transformers over shared_prefix_rowwise tokens/s), `lean_forward_speedup=` (shared_prefix_torch_ops
over shared_prefix_transformers), `compiled_ops_speedup=` (shared_prefix_layered over shared_prefix_torch_ops),
`fused_step_speedup=` (shared_prefix over shared_prefix_layered); then
`tokens_per_s_speedup=` (multi_turn shared_prefix over padded tokens/s) and `episodes_per_s_speedup=` (evaluation
episodes/s, same ratio), each on a line of its own, and as the last line the headline: `tokens_per_s_speedup=`
again, or with --vllm-url `hf_vs_vllm=` (multi_turn shared_prefix tokens/s over vllm's).
Exit 0 when the headline reaches --target (default 3.0, the issue's goal), 1 when it does not, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch
import yaml

from common.cli import cli_entry, exit_code, seed_value
from common.paths import REPO_ROOT
from common.validation import InputError, check_number
from game_registry import get_game
from train.backends import HFBackend, RolloutBackend, SamplingParams
from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes, start_episode
from train.shared_prefix import SharedPrefixStep

GAME = "storefront"
GAME_CONFIG = REPO_ROOT / "configs/storefront/cpu_demo.yaml"
FIRST_SEED = 1_000_000  # the trainer's first training task seed
FIRST_EVAL_SEED = 2_000_000  # distinct tasks for the evaluation workload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/rollout_backends.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="model folder (default: build the CPU-demo tiny model into a temp dir)")
    parser.add_argument("--groups", type=int, default=4, help="task seeds per batch (default 4)")
    parser.add_argument("--group-size", type=int, default=4, help="samples per task seed (default 4)")
    parser.add_argument("--max-episode-tokens", type=int, default=None,
                        help="token budget per episode, prompt included (default: longest opening prompt + 600)")
    parser.add_argument("--single-turn-tokens", type=int, default=64, help="new tokens per row, single turn")
    parser.add_argument("--vllm-url", default=None, help="a vLLM server serving --model (e.g. http://127.0.0.1:8000)")
    parser.add_argument("--vllm-model", default=None, help="its served model name (default: the first it lists)")
    parser.add_argument("--seed", type=seed_value, default=0, help="sampling seed (default 0)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--target", type=float, default=3.0, help="headline ratio to reach for exit 0 (default 3)")
    parser.add_argument("--lora", action="store_true",
                        help="sample the model under a LoRA, merged (default) and unmerged (shared_prefix_unmerged)")
    args = parser.parse_args(argv)
    for name in ("groups", "group_size", "single_turn_tokens"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_episode_tokens is not None and args.max_episode_tokens < 2:
        raise InputError(f"--max-episode-tokens must be >= 2, got {args.max_episode_tokens}")
    if args.threads < 0:
        raise InputError(f"--threads must be >= 0, got {args.threads}")
    check_number(args.target, "--target", 0.0)
    if args.model is not None and not (args.model / "config.json").is_file():
        raise InputError(f"--model {args.model}: not a model folder (no config.json); "
                         "build one with python -m train.tiny")
    if args.vllm_url is not None and not args.vllm_url.startswith(("http://", "https://")):
        raise InputError(f"--vllm-url must start with http:// or https://, got {args.vllm_url!r}")
    return args


def _with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """`model` under configs/grpo_tiny.yaml's LoRA shape, with non-zero weights (B starts at zero in training)."""
    from peft import LoraConfig, get_peft_model

    grpo = yaml.safe_load((REPO_ROOT / "configs/grpo_tiny.yaml").read_text())
    wrapped = get_peft_model(model, LoraConfig(r=grpo["lora_r"], lora_alpha=grpo["lora_alpha"],
                                               target_modules=grpo["lora_target_modules"], task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return wrapped


def served_model(url: str) -> str:
    """The first model a vLLM server lists."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as response:
            return json.loads(response.read())["data"][0]["id"]
    except (urllib.error.URLError, OSError, json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
        raise InputError(f"--vllm-url {url}: cannot list its models ({err}); pass --vllm-model") from None


class AttentionClock:
    """Seconds spent inside attention: transformers' sdpa entry (the padded layout) and SharedPrefixStep.attend (the
    shared-prefix layout, reached through its attention entry or from train/lean_forward.py), both wrapped for the
    bench's lifetime."""

    def __init__(self) -> None:
        from transformers import AttentionInterface

        self.seconds = 0.0
        self._mapping = AttentionInterface._global_mapping
        self._sdpa = self._mapping["sdpa"]
        self._mapping["sdpa"] = self._timed(self._sdpa)
        self._attend = SharedPrefixStep.attend
        SharedPrefixStep.attend = self._timed(self._attend)

    def _timed(self, function):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return timed

    def close(self) -> None:
        self._mapping["sdpa"] = self._sdpa
        SharedPrefixStep.attend = self._attend


def play(backend: RolloutBackend, spec, chat, requests, overrides, budget: int, temperature: float
         ) -> tuple[float, int, list]:
    """(seconds, sampled tokens, episodes) of one batch of episodes."""
    started = time.perf_counter()
    episodes = run_episodes(spec, requests, backend, chat, temperature=temperature, max_episode_tokens=budget,
                            game_overrides=overrides)
    return time.perf_counter() - started, sum(ep.n_generated for ep in episodes), episodes


def single_turn(backend: RolloutBackend, prompts: list[list[int]], new_tokens: int) -> tuple[float, int, list]:
    """(seconds, sampled tokens, completions) of one call."""
    started = time.perf_counter()
    completions = backend.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0))
    return time.perf_counter() - started, sum(len(c.token_ids) for c in completions), completions


def run(args: argparse.Namespace, model_dir: Path) -> int:
    from train.policy import load_base_model

    model, tokenizer = load_base_model(str(model_dir))
    if args.lora:
        model = _with_lora(model)
    spec = get_game(GAME)
    overrides = yaml.safe_load(GAME_CONFIG.read_text()) or {}
    chats = {True: ChatTokenizer(tokenizer), False: ChatTokenizer(tokenizer, incremental=False)}
    requests = [EpisodeRequest(FIRST_SEED + g, s) for g in range(args.groups) for s in range(args.group_size)]
    eval_requests = [EpisodeRequest(FIRST_EVAL_SEED + task, 0) for task in range(args.groups * args.group_size)]
    openings = [start_episode(spec, spec.make(**overrides), r, chats[True]).token_ids for r in requests + eval_requests]
    budget = args.max_episode_tokens or max(len(p) for p in openings) + 600
    if max(len(p) for p in openings) >= budget:
        raise InputError(f"the longest opening prompt has {max(len(p) for p in openings)} tokens, which fills "
                         f"--max-episode-tokens {budget}; pass a larger one")
    openings = openings[: len(requests)]

    pad = tokenizer.pad_token_id
    sides: dict[str, tuple[RolloutBackend, bool]] = {  # name -> (backend, incremental chat template)
        "padded_nocache": (HFBackend(model, pad, seed=args.seed, prefix_cache=False, kv_layout="padded"), False),
        "padded": (HFBackend(model, pad, seed=args.seed, kv_layout="padded"), False),
        "shared_prefix_rowwise": (HFBackend(model, pad, seed=args.seed, decode_kernel=False, lean_forward=False),
                                  True),
        "shared_prefix_transformers": (HFBackend(model, pad, seed=args.seed, lean_forward=False), True),
        "shared_prefix_torch_ops": (HFBackend(model, pad, seed=args.seed, compiled_ops=False), True),
        "shared_prefix_layered": (HFBackend(model, pad, seed=args.seed, fused_step=False), True),
        "shared_prefix": (HFBackend(model, pad, seed=args.seed), True),
    }
    if args.lora:
        sides["shared_prefix_unmerged"] = (HFBackend(model, pad, seed=args.seed, merge_lora=False), True)
    scratch = tempfile.TemporaryDirectory(prefix="rollout-bench-")
    if args.vllm_url:
        from train.vllm_backend import VLLMBackend

        sides["vllm"] = (VLLMBackend([args.vllm_url], args.vllm_model or served_model(args.vllm_url),
                                     adapter_dir=scratch.name, seed=args.seed), True)
    warm = [openings[0][:32]]
    for backend, _ in sides.values():  # first-call overheads (allocator, kernels, connections) out of the timings
        backend.generate(warm, SamplingParams(max_new_tokens=4, temperature=1.0))
        if isinstance(backend, HFBackend):
            backend.clear_prefix_cache()
            backend.prefill_stats.prompt_tokens = backend.prefill_stats.prefill_tokens = 0

    workloads = ("multi_turn", "evaluation", "single_turn")
    figures: dict[str, dict[str, tuple[float, int, int]]] = {w: {} for w in workloads}  # (seconds, tokens, episodes)
    prefill: dict[str, dict[str, int]] = {w: {} for w in workloads}
    attention: dict[str, dict[str, float]] = {w: {} for w in workloads}
    samples: dict[str, dict[str, list]] = {w: {} for w in workloads}
    clock = AttentionClock()
    try:
        for workload in workloads:
            for name, (backend, incremental) in sides.items():
                if isinstance(backend, HFBackend):
                    backend.generator.manual_seed(args.seed)  # the HF sides sample the same tokens
                    backend.clear_prefix_cache()
                    before = backend.prefill_stats.prefill_tokens
                clock.seconds = 0.0
                if workload == "single_turn":
                    seconds, tokens, result = single_turn(backend, openings, args.single_turn_tokens)
                    samples[workload][name], episodes = [c.token_ids for c in result], 0
                else:
                    batch, temperature = (requests, 1.0) if workload == "multi_turn" else (eval_requests, 0.0)
                    seconds, tokens, result = play(backend, spec, chats[incremental], batch, overrides, budget,
                                                   temperature)
                    samples[workload][name], episodes = [ep.token_ids for ep in result], len(result)
                figures[workload][name] = (seconds, tokens, episodes)
                attention[workload][name] = clock.seconds
                if isinstance(backend, HFBackend):
                    prefill[workload][name] = backend.prefill_stats.prefill_tokens - before
                rate = f"{episodes / seconds:6.2f} episodes/s, " if episodes else ""
                print(f"{workload:11s} {name:22s} {tokens:6d} tokens in {seconds:7.2f} s = {tokens / seconds:8.1f} "
                      f"tokens/s, {rate}attention {clock.seconds / seconds:4.0%}"
                      + (f", {prefill[workload][name]} prefill tokens" if name in prefill[workload] else ""), flush=True)
    finally:
        clock.close()
    for backend, _ in sides.values():
        backend.close()
    scratch.cleanup()

    print(f"model {model_dir.name}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{next(model.parameters()).dtype}; {args.groups} groups x {args.group_size} samples, {GAME} "
          f"({GAME_CONFIG.relative_to(REPO_ROOT)}), opening prompts {min(map(len, openings))}-"
          f"{max(map(len, openings))} tokens, episode budget {budget}; {torch.get_num_threads()} threads")
    for workload, per_side in figures.items():
        for name, (seconds, tokens, episodes) in per_side.items():
            print(f"{workload}_{name}_tokens_per_s={tokens / seconds:.1f}")
            if episodes:
                print(f"{workload}_{name}_episodes_per_s={episodes / seconds:.3f}")
            print(f"{workload}_{name}_seconds={seconds:.2f}")
            if name in prefill[workload]:
                print(f"{workload}_{name}_attention_share={attention[workload][name] / seconds:.3f}")
        for name, count in prefill[workload].items():
            print(f"{workload}_{name}_prefill_tokens={count}")
    identical = all(samples[w][name] == samples[w]["padded_nocache"] for w in samples for name in samples[w]
                    if not name.startswith("vllm"))
    print(f"identical_samples={int(identical)}")
    rate = {w: {name: tokens / seconds for name, (seconds, tokens, _) in figures[w].items()} for w in workloads}
    print(f"multi_turn_prefix_cache_speedup={rate['multi_turn']['padded'] / rate['multi_turn']['padded_nocache']:.3f}")
    print(f"decode_kernel_speedup={rate['multi_turn']['shared_prefix_transformers'] / rate['multi_turn']['shared_prefix_rowwise']:.3f}")
    print(f"lean_forward_speedup={rate['multi_turn']['shared_prefix_torch_ops'] / rate['multi_turn']['shared_prefix_transformers']:.3f}")
    print(f"compiled_ops_speedup={rate['multi_turn']['shared_prefix_layered'] / rate['multi_turn']['shared_prefix_torch_ops']:.3f}")
    print(f"fused_step_speedup={rate['multi_turn']['shared_prefix'] / rate['multi_turn']['shared_prefix_layered']:.3f}")
    if "shared_prefix_unmerged" in rate["multi_turn"]:
        print(f"lora_merge_speedup={rate['multi_turn']['shared_prefix'] / rate['multi_turn']['shared_prefix_unmerged']:.3f}")
    tokens_speedup = rate["multi_turn"]["shared_prefix"] / rate["multi_turn"]["padded"]
    episodes_rate = {name: episodes / seconds for name, (seconds, _, episodes) in figures["evaluation"].items()}
    print(f"tokens_per_s_speedup={tokens_speedup:.3f}")
    print(f"episodes_per_s_speedup={episodes_rate['shared_prefix'] / episodes_rate['padded']:.3f}")
    if "vllm" in rate["multi_turn"]:
        headline_name, headline = "hf_vs_vllm", rate["multi_turn"]["shared_prefix"] / rate["multi_turn"]["vllm"]
    else:
        headline_name, headline = "tokens_per_s_speedup", tokens_speedup
    print(f"{headline_name}={headline:.3f}")
    return 0 if headline >= args.target else 1


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.model is not None:
        return run(args, args.model)
    from train.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="rollout-bench-model-") as scratch:
        return run(args, build_tiny_model(Path(scratch) / "tiny", seed=0))


if __name__ == "__main__":
    sys.exit(exit_code(main))
