"""The shared-prefix sampler's forward pass for Llama-family models, as plain tensor calls.

Why: a decoding step of the CPU demo's agent (4 layers, 192 wide) costs less in arithmetic than in transformers'
per-module Python: each layer runs ~15 module calls (projections, two RMSNorm modules plus Qwen3's per-head ones,
rotary helpers, the attention interface's dispatch) through hooks, kwargs checks and output records, ~40,000
module calls and ~10,000 RMSNorm modules of 4-5 tensor ops each in one 64-episode GRPO batch. Here a step is the
same computation as transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` /
`MistralForCausalLM` forward in inference, written against the modules' own weights (read at each call, so an
optimizer step or a re-merged LoRA copy is seen), with one fused RMSNorm per norm and the rotary embedding
applied to queries and keys together. With the compiled kernels (the sampler passes its `PackedLinears`), the
projections run on packed copies of the weights (train/small_linear.py: held by the sampler with its keys/values,
re-packed when a weight changes in place; as much memory again as the projections' weights) and the norms by
train/csrc/rms_norm.cpp; without, by torch's `F.linear` and `torch.rms_norm`. Keys/values and attention go
through the step as before (`SharedPrefixStep.update` / `attend`), so the layout, the kernel and the merge are
shared with the transformers path. Equal to it up to float rounding: tests compare logits and sampled episodes on
every family above.

Used only where that equality is what the code checks: float32 weights, a model of one of those types (exactly,
not a subclass) with plain `nn.Linear` projections (no LoRA layer: a PEFT policy is sampled through its merged
copy), SiLU MLPs and no sliding window. Anything else (a gated capability model, an unmerged adapter, bf16) runs
transformers' forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from train import cpu_kernels
from train.small_linear import PackedLinears


class AttentionStep(Protocol):
    """Where a pass's keys/values go and how its queries attend (train/shared_prefix.py's SharedPrefixStep)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store key/value states [Bq, Hkv, Lq, D] of layer `layer_idx`."""

    def attend(self, layer_idx: int, query: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention output [Bq, Lq, Hq, D] of query [Bq, Hq, Lq, D] over what the layer holds."""

# model_type -> (transformers' causal-LM class, whether its attention normalises each head's queries and keys:
# Qwen3's q_norm / k_norm)
FAMILIES = {"llama": ("LlamaForCausalLM", False), "mistral": ("MistralForCausalLM", False),
            "qwen2": ("Qwen2ForCausalLM", False), "qwen3": ("Qwen3ForCausalLM", True)}


@dataclass(frozen=True)
class _Layer:
    attention: torch.nn.Module  # its q/k/v/o projections, q_norm/k_norm (Qwen3) and `scaling`
    mlp: torch.nn.Module  # gate/up/down projections
    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module


class LeanForward:
    """`forward(step, input_ids, position_ids, keep)` -> logits of the kept positions, for a model `of(model)`
    accepted. Holds the modules, never copies of their weights (packed copies live in the `PackedLinears`)."""

    def __init__(self, model: torch.nn.Module, linears: PackedLinears | None = None):
        body = model.model
        # with `linears` and the kernels built (decided once, for the call this forward serves): projections by
        # train/small_linear.py's loop (few rows) and RMSNorm by train/csrc/rms_norm.cpp; else torch's ops
        self.compiled = linears is not None and cpu_kernels.available()
        self.linear = linears.linear if self.compiled else self._plain_linear
        self.model, self.body = model, body
        self.head_norms = FAMILIES[model.config.model_type][1]
        self.layers = [_Layer(layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)
                       for layer in body.layers]
        self.head_dim = self.layers[0].attention.head_dim

    @classmethod
    def of(cls, model: torch.nn.Module, linears: PackedLinears | None = None) -> "LeanForward | None":
        """A lean forward for `model`, or None where it does not apply (see the module docstring). With `linears`
        (the sampler's packs), the compiled kernels: projections by train/small_linear.py, RMSNorm by
        train/csrc/rms_norm.cpp; without, torch's ops."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in FAMILIES:
            return None
        family = config.model_type
        if (type(model).__name__, type(model).__module__) != (
                FAMILIES[family][0], f"transformers.models.{family}.modeling_{family}"):
            return None
        if getattr(config, "hidden_act", None) != "silu":  # (full attention only: the sampler checks that)
            return None
        if next(model.parameters()).dtype != torch.float32:
            return None
        projections = [model.lm_head] + [getattr(layer.self_attn, name) for layer in model.model.layers
                                         for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(layer.mlp, name) for layer in model.model.layers
                        for name in ("gate_proj", "up_proj", "down_proj")]
        if any(type(projection) is not torch.nn.Linear for projection in projections):
            return None
        return cls(model, linears)

    @staticmethod
    def _plain_linear(module: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, module.weight, module.bias)

    def _norm(self, module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """transformers' RMSNorm modules (weight * x / rms(x)) over hidden's last dimension, as one op: the
        compiled one (train/csrc/rms_norm.cpp) with the compiled kernels, else torch's."""
        if self.compiled:
            rows = hidden.reshape(-1, hidden.shape[-1]).contiguous()  # [N, D]
            return cpu_kernels.extension().rms_norm(rows, module.weight, module.variance_epsilon).view(hidden.shape)
        return torch.rms_norm(hidden, (hidden.shape[-1],), module.weight, module.variance_epsilon)

    @staticmethod
    def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (rotate-half convention): states [Bq, Lq, H, D], cos/sin [Bq, Lq, 1, D]."""
        first, second = states.chunk(2, dim=-1)
        return states * cos + torch.cat((-second, first), dim=-1) * sin

    def forward(self, step: AttentionStep, input_ids: torch.Tensor, position_ids: torch.Tensor,
                keep: int | torch.Tensor) -> torch.Tensor:
        """Logits [Bq, K, V] of input_ids [Bq, Lq] at position_ids [Bq, Lq]; `keep` as transformers'
        `logits_to_keep` (an int: the last so many positions; a tensor: those positions)."""
        hidden = self.body.embed_tokens(input_ids)  # [Bq, Lq, E]
        cos, sin = self.body.rotary_emb(hidden, position_ids)  # [Bq, Lq, D] each
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [Bq, Lq, 1, D]
        batch, width = input_ids.shape
        for index, layer in enumerate(self.layers):
            attention = layer.attention
            normed = self._norm(layer.input_norm, hidden)  # [Bq, Lq, E]
            query = self.linear(attention.q_proj, normed).view(batch, width, -1, self.head_dim)
            key = self.linear(attention.k_proj, normed).view(batch, width, -1, self.head_dim)
            value = self.linear(attention.v_proj, normed).view(batch, width, -1, self.head_dim)
            if self.head_norms:
                query, key = self._norm(attention.q_norm, query), self._norm(attention.k_norm, key)
            n_heads = query.shape[2]
            rotated = self._rotate(torch.cat((query, key), dim=2), cos, sin)  # [Bq, Lq, Hq+Hkv, D]
            query, key = rotated[:, :, :n_heads], rotated[:, :, n_heads:]
            step.update(key.transpose(1, 2), value.transpose(1, 2), index)  # [Bq, Hkv, Lq, D]
            attended = step.attend(index, query.transpose(1, 2), attention.scaling)  # [Bq, Lq, Hq, D]
            hidden = hidden + self.linear(attention.o_proj, attended.reshape(batch, width, -1))
            normed = self._norm(layer.post_attention_norm, hidden)
            mlp = layer.mlp
            gated = F.silu(self.linear(mlp.gate_proj, normed)) * self.linear(mlp.up_proj, normed)
            hidden = hidden + self.linear(mlp.down_proj, gated)
        kept = hidden[:, -keep:] if isinstance(keep, int) else hidden[:, keep]  # [Bq, K, E]
        return self.linear(self.model.lm_head, self._norm(self.body.norm, kept))  # [Bq, K, V]

