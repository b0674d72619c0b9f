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
    otherwise. Packs on first use, again when a weight was changed in place since (its version counter), and
    keeps the packs (and the modules) until dropped: the sampler makes one per store, the same lifetime as the
    keys/values computed with those weights. `packed(*modules)` packs several layers that read the same input as
    one (their outputs concatenated: queries/keys/values, gate/up), for the fused decoding step."""

    def __init__(self) -> None:
        # module ids -> (modules, weight versions, packed weight [P, K, 16], packed bias [P*16] or empty)
        self._packs: dict[tuple[int, ...], tuple[tuple[torch.nn.Linear, ...], tuple[int, ...], torch.Tensor,
                                                 torch.Tensor]] = {}

    def packed(self, *modules: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight [P, K, 16], bias [P*16] or empty) of the modules' weights stacked along their outputs
        (N = the sum of their out_features, P = ceil(N / 16)): up to date with the weights' versions."""
        key = tuple(id(module) for module in modules)
        versions = tuple(module.weight._version + (0 if module.bias is None else module.bias._version)
                         for module in modules)
        entry = self._packs.get(key)
        if entry is None or any(a is not b for a, b in zip(entry[0], modules)) or entry[1] != versions:
            weight = torch.cat([module.weight.detach() for module in modules])  # [N, K]
            if all(module.bias is None for module in modules):
                bias = weight.new_empty(0)
            else:
                bias = _padded_to_panels(torch.cat([module.weight.new_zeros(module.out_features) if module.bias is None
                                                    else module.bias.detach() for module in modules]))  # [P*16]
            entry = self._packs[key] = (modules, versions, pack_weight(weight), bias)
        return entry[2], entry[3]

    def project(self, modules: tuple[torch.nn.Linear, ...], x: torch.Tensor) -> list[torch.Tensor]:
        """[F.linear(x, m.weight, m.bias) for m in modules] for layers reading the same x [..., K] (each [..., N_m]):
        one compiled call over their stacked pack where it applies (the outputs are views of its result)."""
        rows = x.numel() // x.shape[-1]
        if (rows > MAX_ROWS or x.dtype != torch.float32 or x.device.type != "cpu" or not cpu_kernels.available()
                or any(module.weight.dtype != torch.float32 for module in modules)):
            return [F.linear(x, module.weight, module.bias) for module in modules]
        packed_weight, packed_bias = self.packed(*modules)
        features = [module.out_features for module in modules]
        out = cpu_kernels.extension().small_linear(x.reshape(rows, x.shape[-1]).contiguous(), packed_weight,
                                                   packed_bias, sum(features))  # [rows, sum N]
        return list(out.view(*x.shape[:-1], sum(features)).split(features, dim=-1))

    def linear(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N]."""
        return self.project((module,), x)[0]
