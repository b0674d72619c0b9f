"""The lean forward (train/lean_forward.py) computes what transformers' forward computes, on every family it takes,
and is refused where it would not."""
from __future__ import annotations

import pytest
import torch
import transformers

from train import cpu_kernels
from train.lean_forward import LeanForward
from train.small_linear import PackedLinears
from train.shared_prefix import SharedPrefixStep, SharedPrefixStore, stepping

FAMILIES = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),  # q/k norms
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),  # q/k/v biases
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_theta": 100000.0}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
}


def _model(family: str) -> torch.nn.Module:
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = config_class(vocab_size=200, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256, **extra)
    model = model_class(config).eval()
    with torch.no_grad():  # biases and norm weights away from their initial zeros / ones, so that they count
        for name, parameter in model.named_parameters():
            if name.endswith(("bias", "norm.weight", "layernorm.weight")):
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


def _run(model: torch.nn.Module, lean: bool, store: SharedPrefixStore, slots, starts, tails,
         linears: PackedLinears | None = None) -> torch.Tensor:
    """One step of the shared-prefix sampler through either forward (the lean one with the compiled kernels when
    given `linears`): logits of each row's last token [A, V]."""
    step = SharedPrefixStep(store, slots, starts, [len(t) for t in tails], torch.device("cpu"))
    input_ids, position_ids, keep = step.model_input(tails, torch.device("cpu"))
    with torch.no_grad():
        if lean:
            logits = LeanForward.of(model, linears).forward(step, input_ids, position_ids, keep)
        else:
            with stepping(model, step):
                logits = model(input_ids=input_ids, position_ids=position_ids, cache=step, use_cache=True,
                               logits_to_keep=keep).logits
    return logits[0] if step.packed else logits[:, -1]


def _store(model: torch.nn.Module, prefix_len: int) -> SharedPrefixStore:
    config = model.config
    store = SharedPrefixStore()
    like = torch.empty((1, config.num_key_value_heads, 1, getattr(config, "head_dim", None)
                        or config.hidden_size // config.num_attention_heads))
    store.reserve(config.num_hidden_layers, like, 4, 64)
    if prefix_len:
        scratch = SharedPrefixStore()
        scratch.reserve(config.num_hidden_layers, like, 1, prefix_len)
        _run(model, False, scratch, [0], [0], [list(range(3, 3 + prefix_len))])
        store.prefix = [(keys[:1, :, :prefix_len].clone(), values[:1, :, :prefix_len].clone())
                        for keys, values in scratch.pool]
        store.prefix_ids = list(range(3, 3 + prefix_len))
    return store


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("prefix_len", [0, 12])
@pytest.mark.parametrize("compiled", [False, True], ids=["torch_ops", "compiled_kernels"])
def test_lean_forward_equals_transformers(family, prefix_len, compiled):
    """A packed prefill of three rows then two decoding steps, each through both forwards on copies of one
    store: the same logits and the same keys/values written into the slots. `compiled`: the lean forward's
    projections and norms by the compiled kernels (train/small_linear.py, train/csrc/rms_norm.cpp)."""
    if compiled and not cpu_kernels.available():
        pytest.fail("the compiled CPU kernels (train/cpu_kernels.py) are not available on this machine")
    model = _model(family)
    assert LeanForward.of(model) is not None
    linears = PackedLinears() if compiled else None
    stores = {lean: _store(model, prefix_len) for lean in (False, True)}
    tails = [[5, 9, 11, 40], [7], [60, 61, 62, 63, 64, 65, 66]]
    steps = [([0, 2, 3], [0, 0, 0], tails), ([0, 2, 3], [4, 1, 7], [[12], [13], [14]]),
             ([3, 0], [8, 5], [[15], [16]])]
    for slots, starts, step_tails in steps:
        logits = {lean: _run(model, lean, stores[lean], slots, starts, step_tails, linears if lean else None)
                  for lean in (False, True)}
        torch.testing.assert_close(logits[True], logits[False], atol=2e-5, rtol=1e-5)
    for (keys, values), (lean_keys, lean_values) in zip(stores[False].pool, stores[True].pool):
        torch.testing.assert_close(lean_keys, keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lean_values, values, atol=1e-5, rtol=1e-5)


def test_lean_forward_is_refused_where_it_would_not_be_transformers_forward():
    """bf16 weights, an unmerged LoRA layer, a subclass of a supported model: transformers' forward runs."""
    import peft

    assert LeanForward.of(_model("qwen3").to(torch.bfloat16)) is None
    lora = peft.get_peft_model(_model("llama"), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert LeanForward.of(lora) is None and LeanForward.of(lora.get_base_model()) is None

    class Patched(transformers.Qwen2ForCausalLM):  # a forward we do not know
        pass

    assert LeanForward.of(Patched(_model("qwen2").config)) is None


def _model_with_head_size_32(family: str) -> torch.nn.Module:
    """`_model`'s family with heads of 32 (a size the fused step's attention is built for), 3 layers."""
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(1)
    config = config_class(vocab_size=200, hidden_size=128, intermediate_size=200, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          **{**extra, "head_dim": 32})
    model = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("bias", "norm.weight", "layernorm.weight")):
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("prefix_len", [0, 12])
def test_fused_decoding_step_equals_the_lean_forward(family, prefix_len):
    """Decoding steps by the fused call (train/csrc/decode_step.cpp: every layer in one call) and by the lean
    forward's op-by-op path, on copies of one store after the same prefill: the same logits and the same
    keys/values written into the slots (rows in any slot order, each at its own column)."""
    if not cpu_kernels.available():
        pytest.fail("the compiled CPU kernels (train/cpu_kernels.py) are not available on this machine")
    model = _model_with_head_size_32(family)
    lean = LeanForward.of(model, PackedLinears())
    assert lean is not None and lean.fused
    stores = {fused: _store(model, prefix_len) for fused in (False, True)}
    prefill = ([0, 2, 3], [0, 0, 0], [[5, 9, 11, 40], [7], [60, 61, 62, 63, 64, 65, 66]])
    for store in stores.values():
        _run(model, True, store, *prefill, linears=PackedLinears())
    for slots, starts, tokens in (([0, 2, 3], [4, 1, 7], [12, 13, 14]), ([3, 0], [8, 5], [15, 16]),
                                  ([2, 3, 0], [2, 9, 6], [199, 0, 17])):
        with torch.no_grad():
            fused = lean.decode(stores[True], slots, starts, tokens)  # [A, V]
        layered = _run(model, True, stores[False], slots, starts, [[token] for token in tokens],
                       linears=PackedLinears())
        torch.testing.assert_close(fused, layered, atol=2e-5, rtol=1e-5)
    for (keys, values), (fused_keys, fused_values) in zip(stores[False].pool, stores[True].pool):
        torch.testing.assert_close(fused_keys, keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_values, values, atol=1e-5, rtol=1e-5)


def test_the_fused_step_is_used_only_where_it_computes_the_same():
    """No compiled kernels, a head size the attention kernel is not built for, norms with different epsilons:
    the lean forward keeps its op-by-op path (and `decode` says why it cannot run)."""
    model = _model_with_head_size_32("llama")
    assert not LeanForward.of(model).fused  # no packs: torch's ops
    assert not LeanForward.of(_model("llama"), PackedLinears()).fused  # heads of 16
    model.model.layers[1].input_layernorm.variance_epsilon = 1e-3
    lean = LeanForward.of(model, PackedLinears())
    assert not lean.fused
    with pytest.raises(ValueError, match="fused step"):
        lean.decode(_store(model, 0), [0], [0], [1])
