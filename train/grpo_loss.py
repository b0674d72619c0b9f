"""GRPO math: group-relative advantages and the clipped policy-gradient loss (no rollouts, no trainer loop).

One GRPO iteration, in the terms used here:

    1. For each of G prompts (tasks), sample K completions with the current ("old") policy and score them:
       rewards [G, K].
    2. `group_advantages(rewards)`: A = r - mean_group(r), optionally / max(std_group(r), std_floor).
       Groups whose K rewards are all equal carry no learning signal (every advantage is 0) and are dropped.
    3. Pack the kept completions into a `RolloutBatch` (token ids, masks, the old policy's per-token logprobs,
       one advantage per sequence).
    4. Recompute per-token logprobs with the policy being trained (`train.logprobs.token_logprobs`) and call
       `grpo_loss(new_logprobs, batch, normaliser=...)`; backward; step.

Choices (each is a knob in the literature; the defaults follow DeepSeekMath GRPO / TRL unless noted):

* Token alignment. Every [B, T] tensor is indexed by token: column t is about token t. `old_logprobs[b, t]` is
  log pi_old(input_ids[b, t] | input_ids[b, :t]). Column 0 has no prediction, so `loss_mask[:, 0]` must be 0
  (a RolloutBatch with a 1 there is rejected: that is almost always an off-by-one in the caller).
  `loss_mask` is 1 only on tokens the policy generated; prompts, tool observations and padding are 0 and get
  exactly zero gradient (masked entries are removed with `torch.where` *before* `exp`, so even garbage
  logprobs there cannot produce inf/NaN gradients).
* Advantage std is the population std (divide by K), floored at `std_floor` so near-constant groups do not
  explode. `scale=False` is Dr. GRPO's "no std normalisation" (removes the difficulty bias of dividing by std).
* Surrogate: per loss token, ratio = exp(new - old) and objective = min(ratio * A, clip(ratio, 1 - eps_low,
  1 + eps_high) * A); loss = -objective. `clip_eps_high` defaults to `clip_eps` (symmetric PPO clip); set it
  higher for DAPO's "clip-higher".
* Aggregation (`loss_agg`), all of the form loss = numerator / denominator:
    - "grpo":    sum over sequences of (mean over that sequence's loss tokens), / number of sequences that have
                 at least one loss token. Every sequence weighs the same whatever its length.
    - "dapo":    sum over all loss tokens / number of loss tokens. Every token weighs the same.
    - "dr_grpo": sum over all loss tokens / (number of sequences x `max_tokens_norm`), a constant, so the
                 gradient is neither length- nor batch-composition-dependent. "Number of sequences" counts all
                 sequences, including ones with no loss tokens (as TRL does).
* KL to a reference policy (off by default, `kl_beta=0`): the k3 estimator exp(ref - new) - (ref - new) - 1
  per loss token (unbiased for KL(new || ref), always >= 0), times beta, added to the per-token loss and
  aggregated the same way.
* Stats (python floats, over this batch's loss tokens): clip fractions (a token counts as clipped when the
  clipped branch is the active one, i.e. ratio < 1 - eps with A < 0, or ratio > 1 + eps with A > 0), mean
  ratio, approx KL(old || new) with the k3 estimator, mean KL to the reference.

Micro-batches and data parallelism. The denominators above are counts over the *whole optimisation step*.
If a step's batch is split into micro-batches (gradient accumulation) and/or across ranks, the trainer must:

    normaliser = loss_normaliser(all_micro_batches_of_this_rank)   # counts before any forward pass
    normaliser = normaliser.all_reduce()                            # DDP only: sum counts over ranks
    for mb in all_micro_batches_of_this_rank:
        loss, stats = grpo_loss(token_logprobs(model, ...), mb, normaliser=normaliser, ...)
        loss.backward()                                             # no extra division by accumulation steps
    optimizer.step()

Each micro-batch loss is its own numerator divided by the global denominator, so the accumulated gradient is
exactly the gradient of the one-big-batch loss. `all_reduce()` also records the world size so that the
denominator is divided by it: DDP *averages* gradients over ranks, and the mean of the rank gradients must equal
the global sum / global denominator. Without a normaliser, `grpo_loss` normalises by this batch alone.

Nothing here assumes one PEFT adapter: the loss takes tensors, so any parameters that produced `new_logprobs`
(a LoRA adapter, the gates of a multi-adapter router) receive the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

import torch

LossAgg = Literal["grpo", "dapo", "dr_grpo"]
LOSS_AGGREGATIONS: tuple[str, ...] = ("grpo", "dapo", "dr_grpo")

# Two rewards closer than this count as equal when deciding that a group is constant.
CONSTANT_GROUP_TOL = 1e-8


# ----------------------------------------------------------------------------------------------------------
# Advantages


def group_advantages(
    rewards: torch.Tensor,
    scale: bool,
    std_floor: float = 1e-3,
    filter_constant_groups: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages.

    Args:
        rewards: [G, K] float, K sampled completions for each of G prompts.
        scale: divide by max(population std of the group, std_floor) (GRPO) or not (Dr. GRPO).
        std_floor: lower bound on the std used for scaling (> 0).
        filter_constant_groups: mark groups whose rewards are all equal (within 1e-8) as not kept.

    Returns:
        advantages [G, K] fp32 (exactly 0 in dropped groups) and keep [G] bool (all True when not filtering).
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a [G, K] tensor (groups x samples per group); got {shape}.")
    if rewards.shape[1] < 2:
        raise ValueError(
            f"rewards has K={rewards.shape[1]} sample per group; group-relative advantages need K >= 2 "
            "(sample several completions per prompt)."
        )
    if not std_floor > 0:
        raise ValueError(f"std_floor must be > 0 (it prevents division by zero); got {std_floor}.")
    rewards = rewards.float()
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; fix the reward function (failed episodes should score 0).")

    mean = rewards.mean(dim=1, keepdim=True)  # [G, 1]
    advantages = rewards - mean  # [G, K]
    if scale:
        std = rewards.std(dim=1, unbiased=False, keepdim=True)  # [G, 1], population std
        advantages = advantages / std.clamp(min=std_floor)

    spread = rewards.max(dim=1).values - rewards.min(dim=1).values  # [G]
    constant = spread <= CONSTANT_GROUP_TOL
    if filter_constant_groups:
        keep = ~constant
        advantages = torch.where(keep.unsqueeze(1), advantages, torch.zeros_like(advantages))
    else:
        keep = torch.ones_like(constant)
    return advantages, keep


# ----------------------------------------------------------------------------------------------------------
# Batches


@dataclass
class RolloutBatch:
    """B sequences ready for the loss. Column t of every [B, T] tensor is about token t (see module docstring).

    Fields:
        input_ids: [B, T] long, prompt + generated + observation tokens, padded.
        attention_mask: [B, T], 1 on real tokens, 0 on padding.
        loss_mask: [B, T], 1 on tokens the policy generated (trained on), 0 elsewhere; column 0 must be 0.
        old_logprobs: [B, T] float, log pi_old(token t | tokens < t); entries where loss_mask is 0 are ignored
            (0 by convention).
        advantages: [B] float, one advantage per sequence (broadcast over its tokens).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T]; got shape {tuple(self.input_ids.shape)}.")
        shape = tuple(self.input_ids.shape)
        for name in ("attention_mask", "loss_mask", "old_logprobs"):
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"RolloutBatch.{name} has shape {got}; it must match input_ids {shape}.")
        if tuple(self.advantages.shape) != (shape[0],):
            raise ValueError(
                f"RolloutBatch.advantages has shape {tuple(self.advantages.shape)}; it must be [B] = ({shape[0]},), "
                "one advantage per sequence."
            )
        if not self.old_logprobs.is_floating_point() or not self.advantages.is_floating_point():
            raise ValueError("RolloutBatch.old_logprobs and .advantages must be float tensors.")
        if shape[1] > 0 and bool(self.loss_mask[:, 0].bool().any()):
            raise ValueError(
                "RolloutBatch.loss_mask[:, 0] must be 0: column t holds the logprob of token t given tokens < t, "
                "and token 0 has no prediction. This usually means loss_mask is shifted by one position."
            )
        if bool((self.loss_mask.bool() & ~self.attention_mask.bool()).any()):
            raise ValueError("RolloutBatch.loss_mask is 1 on a padding position (attention_mask 0); mask it out.")

    @property
    def num_sequences(self) -> int:
        """B, including sequences with no loss tokens."""
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """A copy with every tensor on `device`."""
        return RolloutBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            old_logprobs=self.old_logprobs.to(device),
            advantages=self.advantages.to(device),
        )

    def split(self, micro_batch_size: int) -> list["RolloutBatch"]:
        """Consecutive row slices of at most `micro_batch_size` sequences (for gradient accumulation)."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1; got {micro_batch_size}.")
        return [
            RolloutBatch(
                input_ids=self.input_ids[i : i + micro_batch_size],
                attention_mask=self.attention_mask[i : i + micro_batch_size],
                loss_mask=self.loss_mask[i : i + micro_batch_size],
                old_logprobs=self.old_logprobs[i : i + micro_batch_size],
                advantages=self.advantages[i : i + micro_batch_size],
            )
            for i in range(0, self.num_sequences, micro_batch_size)
        ]


# ----------------------------------------------------------------------------------------------------------
# Normalisation over a whole optimisation step


@dataclass(frozen=True)
class LossNormaliser:
    """Counts over one whole optimisation step, from which each aggregation's denominator is derived.

    sequences: all sequences (dr_grpo); active_sequences: sequences with >= 1 loss token (grpo);
    tokens: loss tokens (dapo); world_size: number of ranks whose gradients DDP averages (denominators are
    divided by it so the averaged gradient equals the global one; 1 without DDP).
    """

    sequences: int
    active_sequences: int
    tokens: int
    world_size: int = 1

    def __post_init__(self) -> None:
        if min(self.sequences, self.active_sequences, self.tokens) < 0:
            raise ValueError(f"LossNormaliser counts must be >= 0; got {self}.")
        if self.active_sequences > self.sequences:
            raise ValueError(f"LossNormaliser.active_sequences > sequences in {self}; count them on the same batches.")
        if self.world_size < 1:
            raise ValueError(f"LossNormaliser.world_size must be >= 1; got {self.world_size}.")

    def __add__(self, other: "LossNormaliser") -> "LossNormaliser":
        if self.world_size != other.world_size:
            raise ValueError("Cannot add LossNormalisers with different world_size; add counts before all_reduce().")
        return LossNormaliser(
            sequences=self.sequences + other.sequences,
            active_sequences=self.active_sequences + other.active_sequences,
            tokens=self.tokens + other.tokens,
            world_size=self.world_size,
        )

    def denominator(self, loss_agg: str, max_tokens_norm: int | None = None) -> float:
        """The number the summed loss is divided by for `loss_agg` (global count / world_size)."""
        _check_loss_agg(loss_agg, max_tokens_norm)
        if loss_agg == "grpo":
            count = float(self.active_sequences)
        elif loss_agg == "dapo":
            count = float(self.tokens)
        else:  # dr_grpo
            count = float(self.sequences) * float(max_tokens_norm)  # type: ignore[arg-type]
        return count / self.world_size

    def all_reduce(self, group: object | None = None, device: torch.device | str | None = None) -> "LossNormaliser":
        """Sum counts over all ranks of `group` and record the world size. Identity when not distributed.

        `device` must suit the backend (a CUDA device for NCCL); defaults to CUDA when available, else CPU.
        Every rank must call this (it is a collective).
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self
        if self.world_size != 1:
            raise ValueError("LossNormaliser.all_reduce() called twice; call it once on the local counts.")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        counts = torch.tensor([self.sequences, self.active_sequences, self.tokens], dtype=torch.long, device=device)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
        sequences, active, tokens = (int(c) for c in counts.tolist())
        return LossNormaliser(sequences, active, tokens, world_size=dist.get_world_size(group))


def loss_normaliser(batches: Iterable[RolloutBatch]) -> LossNormaliser:
    """Counts over every micro-batch of one optimisation step on this rank (call `.all_reduce()` under DDP)."""
    sequences = active = tokens = 0
    for batch in batches:
        if not isinstance(batch, RolloutBatch):
            raise ValueError(f"loss_normaliser expects RolloutBatch objects; got {type(batch).__name__}.")
        per_seq = batch.loss_mask.bool().sum(dim=1)  # [B]
        sequences += batch.num_sequences
        active += int((per_seq > 0).sum())
        tokens += int(per_seq.sum())
    return LossNormaliser(sequences=sequences, active_sequences=active, tokens=tokens)


# ----------------------------------------------------------------------------------------------------------
# Loss


def _check_loss_agg(loss_agg: str, max_tokens_norm: int | None) -> None:
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGREGATIONS}; got {loss_agg!r}.")
    if loss_agg == "dr_grpo":
        if max_tokens_norm is None:
            raise ValueError(
                "loss_agg='dr_grpo' needs max_tokens_norm (a constant, usually the max completion length in tokens)."
            )
        if not max_tokens_norm > 0:
            raise ValueError(f"max_tokens_norm must be > 0; got {max_tokens_norm}.")


def _aggregate_sum(per_token: torch.Tensor, mask: torch.Tensor, loss_agg: str) -> torch.Tensor:
    """The numerator of `loss_agg`: per_token [B, T] (already 0 off the mask) -> scalar."""
    if loss_agg == "grpo":
        tokens_per_seq = mask.sum(dim=1)  # [B]
        per_seq_mean = per_token.sum(dim=1) / tokens_per_seq.clamp(min=1)  # [B]; 0 for sequences without tokens
        return per_seq_mean.sum()
    return per_token.sum()


def grpo_loss(
    new_logprobs: torch.Tensor,
    batch: RolloutBatch,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_agg: LossAgg = "grpo",
    kl_beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    max_tokens_norm: int | None = None,
    normaliser: LossNormaliser | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO loss for one (micro-)batch.

    Args:
        new_logprobs: [B, T] logprobs of `batch.input_ids` under the policy being trained (same alignment as
            `batch.old_logprobs`; differentiable).
        batch: the rollouts.
        clip_eps: lower clip, ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]; 0 < clip_eps < 1.
        clip_eps_high: upper clip (defaults to clip_eps).
        loss_agg: "grpo", "dapo" or "dr_grpo" (see module docstring).
        kl_beta: weight of the k3 KL penalty to `ref_logprobs` (>= 0; > 0 requires ref_logprobs).
        ref_logprobs: [B, T] reference-policy logprobs, same alignment.
        max_tokens_norm: the constant of "dr_grpo" (required for it).
        normaliser: counts over the whole optimisation step (see `loss_normaliser`); None = this batch alone.

    Returns:
        (loss, stats): scalar fp32 loss to minimise, and python-float diagnostics over this batch's loss tokens.
    """
    _check_loss_agg(loss_agg, max_tokens_norm)
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0 < eps_low < 1:
        raise ValueError(f"clip_eps must be in (0, 1) (the ratio is clipped at 1 - clip_eps); got {clip_eps}.")
    if not eps_high > 0:
        raise ValueError(f"clip_eps_high must be > 0; got {clip_eps_high}.")
    if not kl_beta >= 0:
        raise ValueError(f"kl_beta must be >= 0; got {kl_beta}.")
    if tuple(new_logprobs.shape) != tuple(batch.input_ids.shape):
        raise ValueError(
            f"new_logprobs shape {tuple(new_logprobs.shape)} must equal batch.input_ids shape "
            f"{tuple(batch.input_ids.shape)} (one logprob per token, column 0 unused)."
        )
    if not new_logprobs.is_floating_point():
        raise ValueError(f"new_logprobs must be a float tensor; got {new_logprobs.dtype}.")
    if kl_beta > 0 and ref_logprobs is None:
        raise ValueError(
            "kl_beta > 0 needs ref_logprobs (the reference policy's per-token logprobs); or set kl_beta=0."
        )
    if ref_logprobs is not None and tuple(ref_logprobs.shape) != tuple(new_logprobs.shape):
        raise ValueError(
            f"ref_logprobs shape {tuple(ref_logprobs.shape)} must equal new_logprobs shape {tuple(new_logprobs.shape)}."
        )

    local = loss_normaliser([batch])
    if normaliser is None:
        normaliser = local
    elif (
        normaliser.sequences < local.sequences
        or normaliser.active_sequences < local.active_sequences
        or normaliser.tokens < local.tokens
    ):
        raise ValueError(
            f"normaliser {normaliser} counts fewer sequences/tokens than this batch ({local}); compute it with "
            "loss_normaliser() over every micro-batch of the optimisation step, including this one."
        )

    mask = batch.loss_mask.bool()  # [B, T]
    new = new_logprobs.float()  # [B, T]
    old = batch.old_logprobs.to(new.dtype)  # [B, T]
    advantages = batch.advantages.to(new.dtype).unsqueeze(1)  # [B, 1]
    zeros = torch.zeros_like(new)

    # Masked entries are replaced before exp(): their gradient is exactly 0 and garbage there cannot overflow.
    log_ratio = torch.where(mask, new - old, zeros)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages  # [B, T]
    policy_per_token = torch.where(mask, -torch.minimum(unclipped, clipped), zeros)  # [B, T]

    denominator = normaliser.denominator(loss_agg, max_tokens_norm)
    # A zero denominator means no loss tokens anywhere, so every numerator is 0 too: divide by 1 instead.
    denominator = denominator if denominator > 0 else 1.0
    policy_loss = _aggregate_sum(policy_per_token, mask, loss_agg) / denominator
    loss = policy_loss

    stats: dict[str, float] = {}
    if ref_logprobs is not None:
        ref_minus_new = torch.where(mask, ref_logprobs.to(new.dtype) - new, zeros)  # [B, T]
        kl_per_token = torch.exp(ref_minus_new) - ref_minus_new - 1.0  # [B, T], k3 estimator, 0 off the mask
        if kl_beta > 0:
            loss = loss + kl_beta * _aggregate_sum(kl_per_token, mask, loss_agg) / denominator
        stats["kl_ref"] = _masked_mean(kl_per_token.detach(), mask)

    with torch.no_grad():
        low_clipped = mask & (ratio < 1.0 - eps_low) & (advantages < 0)  # [B, T]
        high_clipped = mask & (ratio > 1.0 + eps_high) & (advantages > 0)  # [B, T]
        approx_kl_old = ratio - 1.0 - log_ratio  # [B, T], k3 estimate of KL(old || new), 0 off the mask
        stats.update(
            policy_loss=float(policy_loss.detach()),
            clip_fraction=_masked_mean((low_clipped | high_clipped).float(), mask),
            clip_low_fraction=_masked_mean(low_clipped.float(), mask),
            clip_high_fraction=_masked_mean(high_clipped.float(), mask),
            ratio_mean=_masked_mean(ratio, mask),
            approx_kl=_masked_mean(approx_kl_old, mask),
            loss_tokens=float(local.tokens),
        )
    return loss, stats


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `values` [B, T] over mask [B, T] (0.0 when the mask is empty)."""
    count = int(mask.sum())
    if count == 0:
        return 0.0
    return float(torch.where(mask, values, torch.zeros_like(values)).sum() / count)


__all__ = [
    "LOSS_AGGREGATIONS",
    "LossNormaliser",
    "RolloutBatch",
    "group_advantages",
    "grpo_loss",
    "loss_normaliser",
]
