"""Smoke test of the routed model on a tiny random base with two random adapters.

    python -m moe_gate.smoke_test [--keep DIR]

Checks (exit 0 only when all hold):
  1. a one-hot gate on slot i gives the single-adapter PEFT model's logits (<= 1e-5, fp32), every adapter;
  2. a one-hot gate on slot 0 gives the base model's logits;
  3. the zero-initialised gate is uniform over the slots;
  4. greedy generation with the KV cache equals generation without it (token and trajectory routing);
  5. a backward pass puts gradients on gate parameters only;
  6. save -> load round-trips the gate exactly (weights and logits).
The adapters differ in rank, alpha, scaling rule and target modules, as real capability adapters may.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from common.cli import cli_entry, exit_code
from common.run_folder import check_output_dir, follow_umask

TOLERANCE = 1e-5


def make_tiny_base(seed: int = 0, *, hidden: int = 32, layers: int = 2, vocab: int = 96):
    """A random-init Qwen3 causal LM (fp32), identical for identical arguments."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=hidden // 2,
                         max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
                         bos_token_id=0)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).to(torch.float32).eval()


# A chat template for the word-level tokenizer of `save_tiny_base` (roles as words, no special tokens).
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'system', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
TINY_WORDS = ("[PAD]", "[EOS]", "[UNK]", "<", ">", "user", "system", "assistant", "hi", "where", "is", "my", "order")


def save_tiny_base(folder: Path) -> Path:
    """`make_tiny_base()` saved in `folder` with a word-level tokenizer (`TINY_WORDS`, within its vocabulary) and
    `TINY_CHAT_TEMPLATE`: a base model folder the serving front and `load_capability_model` can read."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    make_tiny_base().save_pretrained(folder)
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(TINY_WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]",
                                        unk_token="[UNK]")
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def make_random_adapter(base_factory: Callable[[], torch.nn.Module], directory: Path, *, r: int, alpha: int,
                        targets: list[str], seed: int, use_rslora: bool = False, std: float = 0.3) -> Path:
    """Save a PEFT LoRA adapter with random A and B (PEFT starts B at zero, which would change nothing)."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(base_factory(), LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                           use_rslora=use_rslora, task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    peft_model.save_pretrained(str(directory), save_embedding_layers=False)
    follow_umask(directory)  # safetensors writes 0600 files
    return directory


def make_adapters(workdir: Path, base_factory: Callable[[], torch.nn.Module]) -> dict[str, Path]:
    """Two adapters that differ in rank, alpha, scaling rule and targets."""
    return {
        "alpha": make_random_adapter(base_factory, workdir / "alpha", r=4, alpha=8, seed=1,
                                     targets=["q_proj", "v_proj", "down_proj"]),
        "beta": make_random_adapter(base_factory, workdir / "beta", r=8, alpha=4, seed=2, use_rslora=True,
                                    targets=["k_proj", "o_proj", "gate_proj", "up_proj"]),
    }


def set_one_hot_gate(model, slot: int, strength: float = 20.0) -> None:
    """Gate weights that choose `slot` for every token (zero weights, bias one-hot)."""
    gates = [model.gate] if model.mode == "global" else list(model.gate)
    with torch.no_grad():
        for gate in gates:
            gate.proj.weight.zero_()
            gate.proj.bias.zero_()
            gate.proj.bias[slot] = strength


def randomise_gate(model, seed: int, std: float = 2.0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.gate_parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def run_checks(workdir: Path) -> list[tuple[str, bool, str]]:
    from peft import PeftModel

    from moe_gate.model_builder import build_capability_model, gate_state, save_gate

    results: list[tuple[str, bool, str]] = []
    adapters = make_adapters(workdir, make_tiny_base)
    ids = torch.tensor([[5, 17, 33, 8, 61, 2, 44, 9, 70, 12], [3, 3, 90, 41, 7, 25, 66, 18, 5, 1]])  # [B, T]
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row

    def logits(model) -> torch.Tensor:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits  # [B, T, V]

    routed = build_capability_model(make_tiny_base(), adapters).eval()
    base_logits = logits(make_tiny_base())
    for slot, name in enumerate(routed.slot_names):
        set_one_hot_gate(routed, slot)
        if name == "base":
            reference = logits(make_tiny_base())
            check = "slot 0 (base) equals the base model"
        else:
            reference = logits(PeftModel.from_pretrained(make_tiny_base(), str(adapters[name])).eval())
            check = f"one-hot gate on slot {slot} ({name}) equals the single-adapter PEFT model"
        diff = _max_diff(logits(routed), reference)
        effect = _max_diff(reference, base_logits)  # an adapter that changes nothing would prove nothing
        ok = diff <= TOLERANCE and (name == "base" or effect > 1e-2)
        results.append((check, ok, f"max |diff| {diff:.2e}; the adapter moves logits by up to {effect:.2e}"))

    fresh = build_capability_model(make_tiny_base(), adapters).eval()
    with fresh.record_routing(keep_logits=True) as record:
        logits(fresh)
    probs = torch.cat([torch.softmax(e.logits, -1).reshape(-1, fresh.n_slots) for e in record.events])
    uniform = torch.allclose(probs, torch.full_like(probs, 1 / fresh.n_slots), atol=1e-7)
    results.append(("zero-initialised gate is uniform", uniform, f"probabilities in [{probs.min():.4f}, {probs.max():.4f}]"))

    for mode in ("token", "trajectory"):
        model = build_capability_model(make_tiny_base(), adapters, mode=mode).eval()
        randomise_gate(model, seed=3)
        prompt = ids[:1]
        kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
        with model.record_routing() as record:
            cached = model.generate(prompt, use_cache=True, **kwargs)
        used = sorted({int(s) for slots in record.slots().values() for s in slots.flatten()})
        uncached = model.generate(prompt, use_cache=False, **kwargs)
        results.append((f"KV-cache generation equals no-cache generation ({mode} routing, slots used {used})",
                        torch.equal(cached, uncached), f"{cached[0, -12:].tolist()} vs {uncached[0, -12:].tolist()}"))

    model = build_capability_model(make_tiny_base(), adapters).train()
    randomise_gate(model, seed=4, std=0.5)
    model(input_ids=ids, attention_mask=mask).logits.float().pow(2).mean().backward()
    gate_ids = {id(p) for p in model.gate_parameters()}
    others = [n for n, p in model.named_parameters() if id(p) not in gate_ids and p.grad is not None]
    gate_grads = [p.grad for p in model.gate_parameters()]
    reached = all(g is not None and float(g.abs().sum()) > 0 for g in gate_grads)
    trainable = {id(p) for p in model.parameters() if p.requires_grad} == gate_ids
    results.append(("only gate parameters get gradients", reached and not others and trainable,
                    f"gate grads nonzero: {reached}; other parameters with grads: {others[:3]}"))

    model = build_capability_model(make_tiny_base(), adapters).eval()
    randomise_gate(model, seed=5)
    save_gate(model, workdir / "gate")
    loaded = build_capability_model(make_tiny_base(), adapters, gate=workdir / "gate").eval()
    before, after = gate_state(model), gate_state(loaded)
    same = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    same_logits = torch.equal(logits(model), logits(loaded))
    results.append(("save -> load round-trips the gate exactly", same and same_logits,
                    f"weights equal: {same}; logits equal: {same_logits}"))
    return results


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_gate.smoke_test", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, default=None, help="write the adapters and gate here and keep them")
    args = parser.parse_args(argv)
    if args.keep is not None:
        check_output_dir(args.keep, "--keep")
    with tempfile.TemporaryDirectory(prefix="moe-gate-smoke-") as scratch:
        workdir = args.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        results = run_checks(workdir)
    for check, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {check}  ({detail})")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"moe_gate smoke test: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
