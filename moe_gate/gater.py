"""Gates that choose a capability slot: one per decoder layer (`LayerCapabilityGater`) or one for the
whole model (`TrajectoryGlobalRouter`).

A gate is `Linear(hidden, S)` with bias (S = slots: "base" plus the N adapters), zero-initialised, so
every slot starts equally likely (and the top-1 tie goes to slot 0, i.e. the untouched base model). It
reads the hidden state detached: the gate learns where to route, it never pushes the backbone.

Choosing (`select`):
- inference (eval mode, or no gradient: `torch.no_grad()`/`inference_mode()`, even in train mode): hard top-1,
  gate value exactly 1 on the chosen slot, so a gate saved with `gumbel` never samples while it generates.
- training, `straight_through`: forward value is the hard one-hot, gradient is that of the softmax
  (g = onehot + p - p.detach(), written so the forward value is exactly 0/1).
- training, `gumbel`: `F.gumbel_softmax(logits, tau, hard=True)`: a sampled one-hot with the
  Gumbel-softmax gradient. Sampling differs from the top-1 used at inference.
- soft (the global router's soft mode): the softmax itself.

"Training" is the gate module's train mode (`model.train()`) with gradients enabled: the estimator only acts in a
loop that runs the routed model in train mode and backpropagates a loss through the gate values. A routed model
is built in eval mode (`build_capability_model`), as a `from_pretrained` model is. Neither of the repository's gate
trainers uses Gumbel: router SFT (train/train_router_sft.py) runs the model in eval mode (hard top-1) and fits the
gate logits themselves with a cross-entropy, so the estimator and tau change nothing there, and gate GRPO
(train/grpo_gater.py) refuses `gumbel` (its rollouts are top-1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

GRANULARITIES = ("token", "trajectory")
ESTIMATORS = ("straight_through", "gumbel")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        from moe_gate.multi_lora import GateError

        raise GateError(f"{name} must be one of {list(allowed)}, got {value!r}")


@dataclass
class Selection:
    """Gate values and chosen slots for a batch of logits [..., S]."""

    weights: torch.Tensor | None  # [..., S]: 0/1 (straight-through, Gumbel) or probabilities; None: plain top-1
    slots: torch.Tensor  # [...] long: the top-1 (or sampled) slot


def select(logits: torch.Tensor, *, training: bool, estimator: str = "straight_through", tau: float = 1.0,
           soft: bool = False) -> Selection:
    """Turn gate logits [..., S] into gate values (see the module docstring for the rules).

    At inference (top-1) `weights` is None: the chosen slot's value is exactly 1 and the others 0. Without
    gradients (`torch.no_grad()`) a hard gate is at inference whatever `training` says: nothing could learn from
    the estimator, and Gumbel would sample the choice.
    """
    if not soft and not (training and torch.is_grad_enabled()):  # inference top-1: nothing to compute
        return Selection(None, logits.argmax(dim=-1))
    probs = torch.softmax(logits.float(), dim=-1)  # [..., S]
    if soft:
        return Selection(probs, probs.argmax(dim=-1))
    if estimator == "gumbel":  # training with gradients (inference returned above)
        weights = F.gumbel_softmax(logits.float(), tau=tau, hard=True, dim=-1)  # [..., S] one-hot
        return Selection(weights, weights.argmax(dim=-1))
    slots = logits.argmax(dim=-1)  # [...]
    hard = F.one_hot(slots, logits.shape[-1]).to(probs.dtype)  # [..., S]
    return Selection(hard + (probs - probs.detach()), slots)  # value exactly 0/1, softmax gradient


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the positions where mask is 1: hidden [B, T, H], mask [B, T] -> [B, H]."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # [B, T, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class _ZeroInitGate(nn.Module):
    """`Linear(hidden, S)` with bias, zero-initialised (uniform routing at start), read on detached inputs."""

    def __init__(self, hidden_size: int, n_slots: int) -> None:
        if n_slots < 2:
            from moe_gate.multi_lora import GateError

            raise GateError(f"a gate needs at least 2 slots to choose from, got {n_slots}: give two or more adapters, "
                            "or keep the base slot (include_base_slot: true) beside one adapter")
        super().__init__()
        self.proj = nn.Linear(hidden_size, n_slots, bias=True)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    @property
    def n_slots(self) -> int:
        return self.proj.out_features

    def pooled_logits(self, hidden: torch.Tensor, pool_mask: torch.Tensor | None) -> torch.Tensor:
        """[B, T, H] (detached, + mask [B, T], default all ones) -> logits [B, S] of the masked mean."""
        if pool_mask is None:
            pool_mask = torch.ones(hidden.shape[:2], device=hidden.device)
        return self.proj(masked_mean(hidden, pool_mask))  # [B, S]


class LayerCapabilityGater(_ZeroInitGate):
    """One decoder layer's gate: `Linear(hidden, S)`, zero-initialised, on the detached layer input.

    `granularity="token"` routes every token from its own hidden state; `"trajectory"` routes the whole
    sequence from the mean hidden state over the prompt (the model keeps that decision for the rest of
    the generation). Parameters: (hidden + 1) * S.
    """

    def __init__(self, hidden_size: int, n_slots: int, *, granularity: str = "token",
                 estimator: str = "straight_through", tau: float = 1.0):
        _check_choice("granularity", granularity, GRANULARITIES)
        _check_choice("estimator", estimator, ESTIMATORS)
        super().__init__(hidden_size, n_slots)  # refuses fewer than 2 slots
        self.granularity, self.estimator, self.tau = granularity, estimator, tau

    def forward(self, hidden: torch.Tensor, pool_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Gate logits: token granularity [B, T, H] -> [B, T, S]; trajectory [B, T, H] + mask [B, T] -> [B, S]."""
        hidden = hidden.detach().to(self.proj.weight.dtype)
        if self.granularity == "token":
            return self.proj(hidden)  # [B, T, S]
        return self.pooled_logits(hidden, pool_mask)

    def select(self, logits: torch.Tensor) -> Selection:
        return select(logits, training=self.training, estimator=self.estimator, tau=self.tau)


class TrajectoryGlobalRouter(_ZeroInitGate):
    """One router for the whole model: `Linear(hidden, S)` on the prompt's mean input embedding.

    The same decision (hard top-1, or soft weights with `soft=True`) applies to every layer and is kept
    for the whole generation. It reads only the embeddings, so a server can route a request before the
    model runs (see moe_gate/serve.py). Parameters: (hidden + 1) * S.
    """

    granularity = "trajectory"

    def __init__(self, hidden_size: int, n_slots: int, *, soft: bool = False, estimator: str = "straight_through",
                 tau: float = 1.0):
        _check_choice("estimator", estimator, ESTIMATORS)
        super().__init__(hidden_size, n_slots)  # refuses fewer than 2 slots
        self.soft, self.estimator, self.tau = soft, estimator, tau

    def forward(self, hidden: torch.Tensor, pool_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, H] (+ mask [B, T]) -> logits [B, S]."""
        return self.pooled_logits(hidden.detach().to(self.proj.weight.dtype), pool_mask)

    def select(self, logits: torch.Tensor) -> Selection:
        return select(logits, training=self.training, estimator=self.estimator, tau=self.tau, soft=self.soft)


def load_balance_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Switch-Transformer load balance: S * sum_i f_i * P_i over the tokens where mask is 1.

    logits [..., S]; f_i = share of tokens whose top-1 is i (no gradient), P_i = mean probability of i.
    Equals 1 when routing is uniform, S when every token goes to one slot.
    """
    n_slots = logits.shape[-1]
    flat = logits.reshape(-1, n_slots).float()  # [M, S]
    keep = torch.ones(flat.shape[0], device=flat.device) if mask is None else mask.reshape(-1).float()  # [M]
    total = keep.sum().clamp(min=1.0)
    probs = torch.softmax(flat, dim=-1)  # [M, S]
    share = (F.one_hot(flat.argmax(-1), n_slots).float() * keep[:, None]).sum(0) / total  # [S]
    mean_prob = (probs * keep[:, None]).sum(0) / total  # [S]
    return n_slots * (share.detach() * mean_prob).sum()
