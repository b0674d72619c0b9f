"""Linear layers over a few rows, as the sampler's decoding steps run them: weights packed once, our own loop.

Why: a decoding step multiplies a handful of rows (one new token each) by every weight of the model once, right
after the attention kernel has streamed the rows' keys/values through the cache, so the weights come from memory.
torch's CPU linear (MKL's sgemm) repacks its weight operand at every call and reads it there at ~5 GB/s. Measured
on this project's 2-core machines (`python bench/rollout_backends.py`, and weights of 12 layers of the demo's
agent cycled so that none stays in cache; microseconds per layer, MKL -> ours): 4 rows 62 -> 17, 23 rows 107 -> 52,
64 rows 166 -> 106, 256 rows 446 -> 369. So each weight is packed once per sampler store (16 output features per
panel, feature-minor: [P, K, 16]) and train/csrc/small_linear.cpp reads each panel once, in order, keeping a tile
of rows x 16 sums in registers. Same function as `F.linear` up to float rounding (a different order of the
sums). Above MAX_ROWS rows (the packed prefills of thousands of tokens) MKL's blocking wins, so `F.linear` runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from train import cpu_kernels

PANEL = 16  # output features per packed panel (train/csrc/small_linear.cpp)
MAX_ROWS = 256  # rows up to which the packed loop runs; more go to F.linear


def _padded_to_panels(tensor: torch.Tensor) -> torch.Tensor:
    """tensor [N, ...] with zeros appended along N up to P * 16 features, P = ceil(N / 16)."""
    missing = -tensor.shape[0] % PANEL
    return F.pad(tensor.detach(), (0, 0) * (tensor.dim() - 1) + (0, missing))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [P, K, 16], P = ceil(N / 16): panel p holds features 16p..16p+15, zero past N."""
    padded = _padded_to_panels(weight)  # [P*16, K]
    return padded.view(-1, PANEL, weight.shape[1]).transpose(1, 2).contiguous()


class PackedLinears:
    """`linear(module, x)` = F.linear(x, module.weight, module.bias) for an `nn.Linear`: packed and run by the
    compiled loop for float32 CPU inputs of at most MAX_ROWS rows while the kernels are available, F.linear
    otherwise. Packs on first use, again when the weight was changed in place since (its version counter), and
    keeps the packs (and the modules) until dropped: the sampler makes one per store, the same lifetime as the
    keys/values computed with those weights."""

    def __init__(self) -> None:
        # id(module) -> (module, weight version, packed weight [P, K, 16], packed bias [P*16] or empty)
        self._packs: dict[int, tuple[torch.nn.Linear, int, torch.Tensor, torch.Tensor]] = {}

    def linear(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N]."""
        weight, bias = module.weight, module.bias
        rows = x.numel() // x.shape[-1]
        if (rows > MAX_ROWS or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
                or not cpu_kernels.available()):
            return F.linear(x, weight, bias)
        version = weight._version + (0 if bias is None else bias._version)
        entry = self._packs.get(id(module))
        if entry is None or entry[0] is not module or entry[1] != version:
            packed_bias = x.new_empty(0) if bias is None else _padded_to_panels(bias)  # [P*16]
            entry = self._packs[id(module)] = (module, version, pack_weight(weight), packed_bias)
        out = cpu_kernels.extension().small_linear(x.reshape(rows, x.shape[-1]).contiguous(), entry[2], entry[3],
                                                   weight.shape[0])  # [rows, N]
        return out.view(*x.shape[:-1], weight.shape[0])
