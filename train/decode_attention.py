"""The shared-prefix sampler's decoding attention on the CPU: one call per layer for all rows of a step.

A decoding step gives every row one new token, which attends to the shared prefix and to the columns its own slot
holds (train/shared_prefix.py). Rows hold different numbers of columns, and torch has no ragged attention on the
CPU: its fused kernel (`aten._scaled_dot_product_flash_attention_for_cpu`) takes dense batches, so the sampler
called it once per row (or per run of neighbouring rows of similar length): ~11 calls per layer per step on GRPO's
64-row storefront rollouts, which in the running sampler read keys and values at ~10 GB/s, plus Python and
thread-pool overhead per call. `csrc/decode_attention.cpp` does all rows in one call: one task per row and query
head reads the prefix (from cache: it is the same for every row) and the row's own columns once each, an exact
float32 softmax over each part, the two merged by their log-sum-exps. It is our own code because nothing in
torch, transformers or a CPU wheel of an inference engine does ragged decoding attention over a slot pool.

The kernel is built with the others of train/cpu_kernels.py (compiled once per environment; where it cannot be
built the sampler keeps torch's per-row kernel and says so once: same results, slower; `TRACE_CPU_KERNELS=0` turns
it off, `HFBackend(decode_kernel=False)` for one backend).
"""
from __future__ import annotations

import torch

from train import cpu_kernels

HEAD_DIMS = (32, 64, 128)


def kernel_available() -> bool:
    """The compiled kernels are loaded (built now if needed) and not switched off (train/cpu_kernels.py)."""
    return cpu_kernels.available()


def kernel_applies(query: torch.Tensor, keys: torch.Tensor) -> bool:
    """The kernel handles these tensors (CPU, float32, a head size it is compiled for) and is available."""
    return (query.device.type == "cpu" and query.dtype == torch.float32 and keys.dtype == torch.float32
            and query.shape[-1] in HEAD_DIMS and keys.is_contiguous() and kernel_available())


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, prefix_keys: torch.Tensor, prefix_values: torch.Tensor, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row a's query [Hq, D] over the prefix's columns and columns [0, lengths[a]) of slot slots[a], the two
    partial attentions merged by their log-sum-exps: query [A, Hq, D], keys/values [S, Hkv, C, D], prefix
    keys/values [Hkv, P, D] (P = 0: no prefix) -> (out [A, Hq, D], lse [A, Hq]), float32. Call only where
    `kernel_applies`."""
    return tuple(cpu_kernels.extension().decode_attention(query.contiguous(), keys, values, slots, lengths,
                                                          prefix_keys.contiguous(), prefix_values.contiguous(),
                                                          float(scale)))
