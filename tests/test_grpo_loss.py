"""Tests for the GRPO math core (train/grpo_loss.py) and per-token logprobs (train/logprobs.py).

Numbers in the hand-computed tests are worked out in the comments next to them.
"""
from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

from train.grpo_loss import (
    LossNormaliser,
    RolloutBatch,
    group_advantages,
    grpo_loss,
    loss_normaliser,
)
from train.logprobs import logprobs_from_logits, token_logprobs

PAD_ID = 0


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    """A 1-layer random Qwen3 (no hub access)."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return Qwen3ForCausalLM(config).eval()


def one_token_batch(log_ratio: float, advantage: float) -> tuple[torch.Tensor, RolloutBatch]:
    """B=1, T=2 batch whose only loss token (column 1) has the given new - old log ratio."""
    old = torch.tensor([[0.0, -1.0]])
    new = torch.tensor([[0.0, -1.0 + log_ratio]], requires_grad=True)
    batch = RolloutBatch(
        input_ids=torch.tensor([[5, 6]]),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        loss_mask=torch.tensor([[0, 1]]),
        old_logprobs=old,
        advantages=torch.tensor([advantage]),
    )
    return new, batch


def random_batch(batch_size: int = 6, seq_len: int = 10, seed: int = 1) -> tuple[torch.Tensor, RolloutBatch]:
    """Random right-padded batch with a mix of loss/non-loss tokens; row 2 has no loss tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, seq_len + 1, (batch_size,), generator=gen)
    attention = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()  # [B, T]
    loss_mask = (torch.rand(batch_size, seq_len, generator=gen) < 0.6).long() * attention
    loss_mask[:, 0] = 0
    loss_mask[2] = 0
    input_ids = torch.randint(1, 64, (batch_size, seq_len), generator=gen) * attention
    old = (-torch.rand(batch_size, seq_len, generator=gen) * 3) * loss_mask
    new = (old + 0.3 * torch.randn(batch_size, seq_len, generator=gen)).requires_grad_(True)
    batch = RolloutBatch(input_ids, attention, loss_mask, old, torch.randn(batch_size, generator=gen))
    return new, batch


# ----------------------------------------------------------------------------------------------------------
# group_advantages


def test_group_advantages_scaled_matches_hand_computation():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0]])
    adv, keep = group_advantages(rewards, scale=True)
    # group 0: mean .5, deviations +-.5, population std .5 -> +-1
    # group 1: constant -> dropped, advantages exactly 0
    # group 2: mean .25, deviations (.75, -.25 x3), std sqrt((.5625 + 3 * .0625) / 4) = sqrt(.1875)
    s = math.sqrt(0.1875)
    expected = torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0] * 4, [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    assert keep.tolist() == [True, False, True]
    assert bool((adv[1] == 0).all())


def test_group_advantages_unscaled_and_unfiltered():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv, keep = group_advantages(rewards, scale=False, filter_constant_groups=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4]))
    assert keep.tolist() == [True, True]


def test_group_advantages_std_floor_and_constant_tolerance():
    # std of (0, 1e-4) is 5e-5 < floor 1e-3, so deviations +-5e-5 are divided by 1e-3 -> +-0.05.
    adv, keep = group_advantages(torch.tensor([[0.0, 1e-4]]), scale=True, std_floor=1e-3)
    torch.testing.assert_close(adv, torch.tensor([[-0.05, 0.05]]), atol=1e-6, rtol=0)
    assert keep.tolist() == [True]
    # Without the floor the same group would get +-1: make sure the floor is what produced 0.05.
    adv_small_floor, _ = group_advantages(torch.tensor([[0.0, 1e-4]]), scale=True, std_floor=1e-9)
    torch.testing.assert_close(adv_small_floor, torch.tensor([[-1.0, 1.0]]), atol=1e-4, rtol=0)
    # Rewards equal within 1e-8 count as constant.
    rewards = torch.tensor([[1.0, 1.0 + 1e-9]], dtype=torch.float64)
    adv, keep = group_advantages(rewards, scale=True)
    assert keep.tolist() == [False] and bool((adv == 0).all())


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="K >= 2"):
        group_advantages(torch.tensor([[1.0], [0.0]]), scale=True)
    with pytest.raises(ValueError, match=r"\[G, K\]"):
        group_advantages(torch.tensor([1.0, 0.0]), scale=True)
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(torch.tensor([[1.0, float("nan")]]), scale=True)
    with pytest.raises(ValueError, match="std_floor"):
        group_advantages(torch.tensor([[1.0, 0.0]]), scale=True, std_floor=0.0)


# ----------------------------------------------------------------------------------------------------------
# clipped surrogate


@pytest.mark.parametrize(
    "ratio, advantage, expected_loss, clipped",
    [
        # inside the clip range: loss = -ratio * A
        (1.1, 2.0, -2.2, False),
        (1.1, -2.0, 2.2, False),
        # A > 0, ratio above 1 + eps: min(1.5A, 1.2A) = 1.2A, clipped branch, no gradient
        (1.5, 2.0, -2.4, True),
        # A > 0, ratio below 1 - eps: min(0.5A, 0.8A) = 0.5A, unclipped branch (pessimistic bound keeps gradient)
        (0.5, 2.0, -1.0, False),
        # A < 0, ratio above 1 + eps: min(-3, -2.4) = -3, unclipped branch
        (1.5, -2.0, 3.0, False),
        # A < 0, ratio below 1 - eps: min(-1, -1.6) = -1.6, clipped branch, no gradient
        (0.5, -2.0, 1.6, True),
    ],
)
def test_clipped_surrogate_hand_computed(ratio, advantage, expected_loss, clipped):
    new, batch = one_token_batch(math.log(ratio), advantage)
    loss, stats = grpo_loss(new, batch, clip_eps=0.2, loss_agg="dapo")
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    loss.backward()
    # d(-ratio * A)/d new = -ratio * A on the unclipped branch, 0 on the clipped one.
    expected_grad = 0.0 if clipped else -ratio * advantage
    assert new.grad[0, 1].item() == pytest.approx(expected_grad, abs=1e-6)
    assert new.grad[0, 0].item() == 0.0
    assert stats["clip_fraction"] == (1.0 if clipped else 0.0)
    assert stats["ratio_mean"] == pytest.approx(ratio, abs=1e-6)
    # approx KL(old || new), k3: ratio - 1 - log ratio
    assert stats["approx_kl"] == pytest.approx(ratio - 1 - math.log(ratio), abs=1e-6)


def test_clip_eps_high_widens_only_the_upper_bound():
    new, batch = one_token_batch(math.log(1.25), 1.0)
    loss, stats = grpo_loss(new, batch, clip_eps=0.2, clip_eps_high=0.28, loss_agg="dapo")
    assert loss.item() == pytest.approx(-1.25, abs=1e-6)  # 1.25 < 1.28: not clipped
    assert stats["clip_high_fraction"] == 0.0
    new, batch = one_token_batch(math.log(1.25), 1.0)
    loss, stats = grpo_loss(new, batch, clip_eps=0.2, loss_agg="dapo")
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert stats["clip_high_fraction"] == 1.0


# ----------------------------------------------------------------------------------------------------------
# aggregation and KL


def aggregation_batch() -> tuple[torch.Tensor, RolloutBatch]:
    """3 sequences, ratio 1 everywhere, so every loss token's loss is -A of its sequence."""
    loss_mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
    old = torch.full((3, 4), -0.7) * loss_mask
    batch = RolloutBatch(
        input_ids=torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6]]),
        attention_mask=torch.ones(3, 4, dtype=torch.long),
        loss_mask=loss_mask,
        old_logprobs=old,
        advantages=torch.tensor([1.0, -2.0, 5.0]),
    )
    return old.clone().requires_grad_(True), batch


@pytest.mark.parametrize(
    "loss_agg, expected",
    [
        # per-token losses: seq0 (-1, -1), seq1 (2, 2, 2), seq2 none
        ("grpo", 0.5),  # sequence means -1 and 2, averaged over the 2 sequences with tokens
        ("dapo", 0.8),  # (-2 + 6) / 5 tokens
        ("dr_grpo", 1 / 3),  # (-2 + 6) / (3 sequences x max_tokens_norm 4)
    ],
)
def test_aggregations_hand_computed(loss_agg, expected):
    new, batch = aggregation_batch()
    loss, stats = grpo_loss(new, batch, loss_agg=loss_agg, max_tokens_norm=4)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["loss_tokens"] == 5.0


def test_kl_k3_value_and_weighting():
    # One sequence, two loss tokens, A = 0 so only the KL term remains.
    # ref - new = ln 2 -> 2 - ln 2 - 1 = 0.306853;  ref - new = -1 -> e^-1 + 1 - 1 = 0.367879
    new = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.0 + math.log(2.0), -3.0]])
    batch = RolloutBatch(
        input_ids=torch.tensor([[1, 2, 3]]),
        attention_mask=torch.ones(1, 3, dtype=torch.long),
        loss_mask=torch.tensor([[0, 1, 1]]),
        old_logprobs=new.detach().clone(),
        advantages=torch.tensor([0.0]),
    )
    kl = [2.0 - math.log(2.0) - 1.0, math.exp(-1.0)]
    loss, stats = grpo_loss(new, batch, kl_beta=0.5, ref_logprobs=ref, loss_agg="grpo")
    assert stats["kl_ref"] == pytest.approx(sum(kl) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * sum(kl) / 2, abs=1e-6)
    loss.backward()
    # d/dnew [exp(ref - new) - (ref - new) - 1] = 1 - exp(ref - new), times beta / 2 tokens
    expected_grad = [0.0, 0.25 * (1 - 2.0), 0.25 * (1 - math.exp(-1.0))]
    torch.testing.assert_close(new.grad[0], torch.tensor(expected_grad), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------------------
# masking


@pytest.mark.parametrize("loss_agg", ["grpo", "dapo", "dr_grpo"])
def test_masked_tokens_get_exactly_zero_gradient(loss_agg):
    new, batch = random_batch()
    with torch.no_grad():  # garbage in masked positions must not leak (no inf * 0 = NaN)
        new[batch.loss_mask == 0] = 500.0
    ref = torch.randn_like(new)
    loss, _ = grpo_loss(new, batch, loss_agg=loss_agg, max_tokens_norm=16, kl_beta=0.1, ref_logprobs=ref)
    assert torch.isfinite(loss)
    loss.backward()
    masked = batch.loss_mask == 0
    assert bool((new.grad[masked] == 0).all())
    assert bool((new.grad[~masked] != 0).any())


def test_changing_a_masked_observation_target_does_not_change_the_loss():
    model = tiny_model()
    # prompt (masked) | generated (loss) | observation token right after the generated ones (masked)
    ids = torch.tensor([[7, 8, 9, 10, 11, 12, 13]])
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0]])
    attention = torch.ones_like(ids)

    def loss_for(input_ids: torch.Tensor) -> float:
        with torch.no_grad():
            new = token_logprobs(model, input_ids, attention)
        old = torch.full_like(new, -4.0) * loss_mask  # fixed sampling logprobs: the loss depends on `new`
        batch = RolloutBatch(input_ids, attention, loss_mask, old, torch.tensor([1.5]))
        return grpo_loss(new, batch)[0].item()

    base = loss_for(ids)
    changed_observation = ids.clone()
    changed_observation[0, 6] = 40
    assert loss_for(changed_observation) == base
    # Control: changing a generated token's target must change the loss, or the test above proves nothing.
    changed_generated = ids.clone()
    changed_generated[0, 5] = 40
    assert loss_for(changed_generated) != base


# ----------------------------------------------------------------------------------------------------------
# token_logprobs


def naive_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Reference: full log_softmax then gather, shifted so column t is token t. [B, T]"""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)[:, :-1]  # [B, T-1, V]
    gathered = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    return torch.cat([torch.zeros_like(gathered[:, :1]), gathered], dim=1)


def test_token_logprobs_matches_naive_log_softmax_and_gradients():
    model = tiny_model()
    ids = torch.randint(1, 64, (3, 9), generator=torch.Generator().manual_seed(3))
    attention = torch.ones_like(ids)
    got = token_logprobs(model, ids, attention, chunk_tokens=3)  # several chunks, checkpointed
    reference = naive_logprobs(model(input_ids=ids).logits, ids)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    assert bool((got[:, 0] == 0).all())

    weights = torch.randn(3, 9)
    (got * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (naive_logprobs(model(input_ids=ids).logits, ids) * weights).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # inside peft
def test_token_logprobs_through_peft_lora_trains_only_the_adapter():
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(tiny_model(), lora)
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    got = token_logprobs(model, ids, mask)
    torch.testing.assert_close(got, naive_logprobs(model(input_ids=ids).logits, ids), atol=1e-5, rtol=0)
    got.sum().backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in n for n in trained)


@pytest.mark.parametrize("make_model", [lambda: tiny_model(), lambda: tiny_gpt2()], ids=["qwen3", "gpt2"])
@pytest.mark.parametrize("after_prefix", [False, True], ids=["plain", "after_prefix"])
def test_logprobs_of_the_needed_tokens_only_equal_the_full_ones_and_their_gradients(make_model, after_prefix):
    """With `needed` (GRPO's loss mask) the model computes logits only where they predict a needed token; the
    needed tokens' values and every parameter's gradient must equal the full computation's, the rest be 0 —
    rows with padding, a row with nothing needed, the prefix's last position needed on one row only."""
    from train.logprobs import token_logprobs_after_prefix

    model = make_model()  # eval: GPT-2's dropout would differ between the runs
    gen = torch.Generator().manual_seed(11)
    prefix = torch.randint(1, 64, (5,), generator=gen)
    ids = torch.randint(1, 64, (4, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[3, 3:] = 0
    needed = torch.rand(4, 7, generator=gen) < 0.5
    needed[2] = False  # nothing needed on this row
    needed[0, 0] = after_prefix  # predicted by the prefix's last position (a token of its own without a prefix)
    needed[1, 6] = True  # a padding token: never a value
    weights = torch.randn(4, 7, generator=gen)

    def run(**kw):
        model.zero_grad()
        if after_prefix:
            values = token_logprobs_after_prefix(model, prefix, ids, mask, temperature=0.7, chunk_tokens=3, **kw)
        else:
            values = token_logprobs(model, ids, mask, temperature=0.7, chunk_tokens=3, **kw)
        (values * weights).sum().backward()
        return values.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    wanted = needed & mask.bool()
    if not after_prefix:
        wanted[:, 0] = False
    weights = torch.where(wanted, weights, torch.zeros_like(weights))  # both runs differentiate the same sum
    full, full_grads = run()
    full = torch.where(wanted, full, torch.zeros_like(full))
    got, got_grads = run(needed=needed)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
    assert bool((got[~wanted] == 0).all()) and bool((got[wanted] != 0).all())
    assert got_grads.keys() == full_grads.keys()
    for name in full_grads:
        torch.testing.assert_close(got_grads[name], full_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    none, _ = run(needed=torch.zeros_like(needed))  # nothing needed (GRPO's padding micro-batch): zeros, backward runs
    assert bool((none == 0).all())


def test_logprobs_from_logits_temperature_and_chunking():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 7, 64, generator=gen, dtype=torch.bfloat16)
    ids = torch.randint(0, 64, (2, 7), generator=gen)
    mask = torch.ones_like(ids)
    for chunk in (1, 4, 100):
        got = logprobs_from_logits(logits, ids, mask, temperature=0.7, chunk_tokens=chunk)
        torch.testing.assert_close(got, naive_logprobs(logits, ids, temperature=0.7), atol=1e-5, rtol=0)


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    """A 1-layer random GPT-2: absolute position embeddings, so left padding needs correct position_ids."""
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()


@pytest.mark.parametrize("make_model", [tiny_model, tiny_gpt2], ids=["qwen3_rope", "gpt2_absolute_pos"])
def test_token_logprobs_left_and_right_padding_agree(make_model):
    model = make_model()
    gen = torch.Generator().manual_seed(5)
    lengths = [5, 8, 3]
    width = max(lengths)
    sequences = [torch.randint(1, 64, (n,), generator=gen) for n in lengths]
    right = torch.full((3, width), PAD_ID)
    left = torch.full((3, width), PAD_ID)
    right_mask = torch.zeros(3, width, dtype=torch.long)
    left_mask = torch.zeros(3, width, dtype=torch.long)
    for row, seq in enumerate(sequences):
        n = len(seq)
        right[row, :n], right_mask[row, :n] = seq, 1
        left[row, width - n :], left_mask[row, width - n :] = seq, 1
    right_lp = token_logprobs(model, right, right_mask)
    left_lp = token_logprobs(model, left, left_mask)
    for row, seq in enumerate(sequences):
        n = len(seq)
        alone = token_logprobs(model, seq[None, :], torch.ones(1, n, dtype=torch.long))[0]
        torch.testing.assert_close(right_lp[row, :n], alone, atol=1e-5, rtol=0)
        torch.testing.assert_close(left_lp[row, width - n :], alone, atol=1e-5, rtol=0)
        assert bool((right_lp[row, n:] == 0).all()) and bool((left_lp[row, : width - n + 1] == 0).all())


# ----------------------------------------------------------------------------------------------------------
# micro-batch / multi-rank equivalence


@pytest.mark.parametrize("loss_agg", ["grpo", "dapo", "dr_grpo"])
def test_micro_batch_gradients_sum_to_full_batch_gradient(loss_agg):
    new, batch = random_batch(batch_size=7)
    ref = (new.detach() + 0.2 * torch.randn_like(new)) * batch.loss_mask
    kwargs = dict(loss_agg=loss_agg, max_tokens_norm=12, kl_beta=0.05)
    full_loss, _ = grpo_loss(new, batch, ref_logprobs=ref, **kwargs)
    (full_grad,) = torch.autograd.grad(full_loss, new)

    micro = batch.split(3)  # 3 + 3 + 1 sequences
    normaliser = loss_normaliser(micro)
    accumulated = torch.zeros_like(new)
    total_loss = 0.0
    for i, mb in enumerate(micro):
        rows = slice(3 * i, 3 * i + mb.num_sequences)
        mb_new = new.detach()[rows].clone().requires_grad_(True)
        loss, _ = grpo_loss(mb_new, mb, ref_logprobs=ref[rows], normaliser=normaliser, **kwargs)
        loss.backward()
        accumulated[rows] += mb_new.grad
        total_loss += loss.item()
    torch.testing.assert_close(accumulated, full_grad, atol=1e-6, rtol=0)
    assert total_loss == pytest.approx(full_loss.item(), abs=1e-6)

    if loss_agg != "dr_grpo":  # control: per-micro-batch normalisation is NOT equivalent for these two
        naive = torch.zeros_like(new)
        for i, mb in enumerate(micro):
            rows = slice(3 * i, 3 * i + mb.num_sequences)
            mb_new = new.detach()[rows].clone().requires_grad_(True)
            grpo_loss(mb_new, mb, ref_logprobs=ref[rows], **kwargs)[0].backward()
            naive[rows] += mb_new.grad
        assert not torch.allclose(naive, full_grad, atol=1e-4)


@pytest.mark.parametrize("loss_agg", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_with_real_model_match_full_batch(loss_agg):
    model = tiny_model()
    _, batch = random_batch(batch_size=5, seq_len=8, seed=6)
    with torch.no_grad():
        old = token_logprobs(model, batch.input_ids, batch.attention_mask) * batch.loss_mask
    batch = RolloutBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, old, batch.advantages)
    # Move the policy away from the sampling policy so ratios != 1 and some tokens clip.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def step(batches: list[RolloutBatch], normaliser: LossNormaliser) -> dict[str, torch.Tensor]:
        model.zero_grad()
        for mb in batches:
            new = token_logprobs(model, mb.input_ids, mb.attention_mask)
            loss, _ = grpo_loss(new, mb, loss_agg=loss_agg, max_tokens_norm=8, normaliser=normaliser)
            loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    full = step([batch], loss_normaliser([batch]))
    micro = batch.split(2)
    accumulated = step(micro, loss_normaliser(micro))
    for name in full:
        torch.testing.assert_close(accumulated[name], full[name], atol=1e-6, rtol=1e-5, msg=name)


def test_simulated_ranks_average_to_full_batch_gradient():
    """DDP averages rank gradients; a world_size-aware normaliser makes that average the global gradient."""
    new, batch = random_batch(batch_size=8)
    full_loss, _ = grpo_loss(new, batch, loss_agg="dapo")
    (full_grad,) = torch.autograd.grad(full_loss, new)
    ranks = batch.split(4)  # rank 0: rows 0-3, rank 1: rows 4-7
    counts = loss_normaliser(ranks[:1]) + loss_normaliser(ranks[1:])  # what all_reduce(SUM) computes
    normaliser = LossNormaliser(counts.sequences, counts.active_sequences, counts.tokens, world_size=2)
    averaged = torch.zeros_like(new)
    for rank, rank_batch in enumerate(ranks):
        rows = slice(4 * rank, 4 * rank + 4)
        mb_new = new.detach()[rows].clone().requires_grad_(True)
        grpo_loss(mb_new, rank_batch, loss_agg="dapo", normaliser=normaliser)[0].backward()
        averaged[rows] += mb_new.grad / 2  # DDP's mean over 2 ranks (each rank holds zeros for other rows)
    torch.testing.assert_close(averaged, full_grad, atol=1e-6, rtol=0)


# Each rank is a fresh interpreter that imports only torch and train.grpo_loss (fast to start).
_RANK_SCRIPT = """
import sys, torch, torch.distributed as dist
from train.grpo_loss import RolloutBatch, loss_normaliser
rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]]) if rank == 0 else torch.tensor([[0, 1, 1, 1]])
ones = torch.ones_like(mask)
batch = RolloutBatch(ones, ones, mask, torch.zeros(mask.shape), torch.zeros(len(mask)))
n = loss_normaliser([batch]).all_reduce(device="cpu")
print(n.sequences, n.active_sequences, n.tokens, n.world_size)
dist.destroy_process_group()
"""


@pytest.mark.slow  # ~2 s: two gloo processes
def test_all_reduce_sums_counts_over_two_gloo_ranks():
    # rank 0: 2 sequences (1 active), 2 tokens; rank 1: 1 sequence, 3 tokens -> 3 sequences, 2 active, 5 tokens
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT, str(rank), str(port)],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank in range(2)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    assert [out.split() for out, _ in outputs] == [["3", "2", "5", "2"]] * 2
    assert LossNormaliser(3, 2, 5, world_size=2).denominator("dapo") == 2.5


# ----------------------------------------------------------------------------------------------------------
# validation


def test_input_validation_messages():
    new, batch = aggregation_batch()
    with pytest.raises(ValueError, match="loss_agg must be one of"):
        grpo_loss(new, batch, loss_agg="mean")
    with pytest.raises(ValueError, match="max_tokens_norm"):
        grpo_loss(new, batch, loss_agg="dr_grpo")
    with pytest.raises(ValueError, match="clip_eps"):
        grpo_loss(new, batch, clip_eps=0.0)
    with pytest.raises(ValueError, match="new_logprobs shape"):
        grpo_loss(new[:, :3], batch)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(new, batch, kl_beta=0.1)
    with pytest.raises(ValueError, match="counts fewer"):
        grpo_loss(new, batch, normaliser=LossNormaliser(sequences=1, active_sequences=1, tokens=1))
    with pytest.raises(ValueError, match=r"loss_mask\[:, 0\] must be 0"):
        RolloutBatch(batch.input_ids, batch.attention_mask, torch.ones(3, 4), batch.old_logprobs, batch.advantages)
    with pytest.raises(ValueError, match="advantages has shape"):
        RolloutBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.old_logprobs, torch.zeros(3, 1))
    with pytest.raises(ValueError, match="padding position"):
        RolloutBatch(batch.input_ids, torch.zeros(3, 4), batch.loss_mask, batch.old_logprobs, batch.advantages)


def test_batch_without_loss_tokens_gives_zero_loss():
    new, batch = aggregation_batch()
    empty = batch.split(1)[2]  # the sequence with no loss tokens
    for loss_agg in ("grpo", "dapo", "dr_grpo"):
        loss, stats = grpo_loss(new[2:].detach().requires_grad_(True), empty, loss_agg=loss_agg, max_tokens_norm=4)
        assert loss.item() == 0.0 and stats["loss_tokens"] == 0.0
