"""Per-token log-probabilities of a sequence under a causal LM, in the layout the GRPO loss expects.

Alignment convention (shared with `train.grpo_loss.RolloutBatch`):

    out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])      for t >= 1
    out[b, 0] = 0                                               (nothing predicts the first token)

i.e. column t holds the logprob *of token t*, not of the token after it. The model's logits at position t-1
predict token t, so we take `logits[:, :-1]` and gather at `input_ids[:, 1:]`, then shift right by one column.
A value is only meaningful when both token t and its predecessor t-1 are real (attention_mask == 1); every other
entry (column 0, padding, the first real token of a left-padded row) is exactly 0, so right- and left-padded
copies of the same sequence give the same numbers for the same real tokens.

Positions: HF causal LMs number positions 0..T-1 by default regardless of the attention mask, so a left-padded
row starts its real tokens at position > 0. Rotary models (Qwen, Llama) do not care (RoPE only sees position
differences), but models with absolute position embeddings (GPT-2) do. We pass `position_ids =
cumsum(attention_mask) - 1` (clamped at 0), as `generate()` does, so the padding side never changes the result.

Memory: `log_softmax(logits)` would allocate a second [B, T, V] tensor in fp32 (and autograd keeps it for
backward). We use log p(y) = logit[y] - logsumexp(logits) instead: the gather is a [B, T] read, and the
logsumexp runs over chunks of the sequence in fp32. When gradients are needed, each chunk is wrapped in
activation checkpointing so autograd keeps only the model's own logits, not an fp32 copy per chunk; the chunk is
recomputed in backward. The model's logits themselves ([B, T, V] in the model dtype) are unavoidable without
reaching into the model's lm_head, which would not be model-agnostic (PEFT, routed multi-adapter models).

Only the tokens a caller uses: with `needed` ([B, T] bool, e.g. GRPO's loss mask: the sampled tokens, ~20% of a
tool-use episode) the model computes logits only at the positions that predict those tokens (transformers'
`logits_to_keep` as a boolean [B, T] mask: the body still runs on every position, the vocabulary projection and
the logsumexp only where a value is wanted) and every other entry is 0. Same values on the needed tokens.

Nothing here assumes a particular adapter setup: any `model(input_ids=..., attention_mask=..., position_ids=...)`
that returns an object with `.logits` of shape [B, T, V] works (HF causal LMs, PEFT-wrapped ones, custom wrappers).
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Sequence positions per logsumexp chunk. 1024 positions x 152k vocab x 4 bytes ~ 620 MB of fp32 per chunk for a
# Qwen-size vocabulary; small enough to fit next to the model, large enough to stay fast.
DEFAULT_CHUNK_TOKENS = 1024


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, 2, ... counted over real tokens only (padding gets 0). [B, T] long."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _check_ids_and_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T]; got shape {tuple(input_ids.shape)}. Add a batch dimension.")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}."
        )
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"input_ids must be an integer tensor (torch.long); got {input_ids.dtype}.")


def _chunk_logsumexp(logits_chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    # logits_chunk: [B, C, V] in the model dtype -> [B, C] fp32
    scaled = logits_chunk.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    return torch.logsumexp(scaled, dim=-1)


def _log_normaliser(logits: torch.Tensor, temperature: float, chunk_tokens: int) -> torch.Tensor:
    """logsumexp(logits / temperature) over the vocabulary in fp32, [..., V] -> [...], chunked along the positions
    (the second-to-last dimension). With gradients each chunk is checkpointed: backward recomputes its fp32 copy
    instead of keeping one per chunk alive."""
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    chunks = []
    for start in range(0, logits.shape[-2], chunk_tokens):
        chunk = logits[..., start : start + chunk_tokens, :]  # [..., C, V] view, no copy
        chunks.append(checkpoint(_chunk_logsumexp, chunk, temperature, use_reentrant=False) if needs_grad
                      else _chunk_logsumexp(chunk, temperature))
    return torch.cat(chunks, dim=-1) if chunks else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)


def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Per-token logprobs from already computed logits, using the alignment convention of this module.

    Args:
        logits: [B, T, V] next-token logits (position t predicts token t+1), any float dtype.
        input_ids: [B, T] token ids.
        attention_mask: [B, T], 1 on real tokens, 0 on padding.
        temperature: the sampling temperature; logits are divided by it (the policy that sampled at temperature
            tau is softmax(logits / tau), so its logprobs must be computed the same way).
        chunk_tokens: positions per fp32 logsumexp chunk (memory/speed trade-off only; results do not change).

    Returns:
        [B, T] fp32; out[:, t] = log p(token t | tokens < t), 0 where undefined (see module docstring).
    """
    _check_ids_and_mask(input_ids, attention_mask)
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [B, T, V] with [B, T] = input_ids shape {tuple(input_ids.shape)}; "
            f"got {tuple(logits.shape)}."
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1; got {chunk_tokens}.")
    batch, seq_len = input_ids.shape
    out = logits.new_zeros((batch, seq_len), dtype=torch.float32)  # [B, T]
    if seq_len < 2:
        return out

    pred_logits = logits[:, :-1]  # [B, T-1, V]; position t-1 predicts token t
    targets = input_ids[:, 1:].long()  # [B, T-1]
    # Target logit: a [B, T-1] gather, no vocabulary-sized copy.
    target_logits = pred_logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()  # [B, T-1]
    if temperature != 1.0:
        target_logits = target_logits / temperature

    log_norm = _log_normaliser(pred_logits, temperature, chunk_tokens)  # [B, T-1]

    token_lp = target_logits - log_norm  # [B, T-1]
    real = attention_mask.bool()
    defined = real[:, 1:] & real[:, :-1]  # [B, T-1]: token and its predecessor are both real
    # `where`, not multiply: padding logits may be garbage (even non-finite) and must not leak into values or grads.
    token_lp = torch.where(defined, token_lp, torch.zeros_like(token_lp))
    return torch.cat([out[:, :1], token_lp], dim=1)  # [B, T]


def wanted_tokens(needed: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the tokens of `needed` that have a defined log-prob (the token and its predecessor real)."""
    if needed.shape != attention_mask.shape:
        raise ValueError(f"needed shape {tuple(needed.shape)} must equal attention_mask shape "
                         f"{tuple(attention_mask.shape)}.")
    real = attention_mask.bool()
    wanted = needed.bool() & real
    wanted[:, 0] = False  # nothing predicts the first token
    wanted[:, 1:] &= real[:, :-1]
    return wanted


def logprobs_at(
    selected_logits: torch.Tensor,
    wanted: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Per-token logprobs [B, T] fp32 from the logits of only the positions that predict the `wanted` tokens.

    Args:
        selected_logits: [N, V], N = wanted.sum(): the logits at position t - 1 for every wanted token t, in
            row-major order (what `logits_to_keep=wanted[:, 1:]` shifted left one column gives).
        wanted: [B, T] bool (see `wanted_tokens`); input_ids: [B, T].

    Returns:
        [B, T] fp32: log p(token t | tokens < t) where `wanted`, 0 elsewhere; differentiable in the logits.
    """
    n_wanted = int(wanted.sum())
    if selected_logits.dim() != 2 or selected_logits.shape[0] != n_wanted:
        raise ValueError(f"selected_logits must be [N, V] with N = {n_wanted} wanted tokens; got "
                         f"{tuple(selected_logits.shape)} (a model that ignores logits_to_keep returns [B, T, V]).")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    targets = input_ids[wanted].long()  # [N], row-major like the logits
    target_logits = selected_logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()  # [N]
    if temperature != 1.0:
        target_logits = target_logits / temperature
    values = target_logits - _log_normaliser(selected_logits, temperature, chunk_tokens)  # [N]
    out = torch.zeros(wanted.shape, dtype=torch.float32, device=selected_logits.device)  # [B, T]
    return out.masked_scatter(wanted, values)


def _predicting(wanted: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: position t - 1 for every wanted token t (the positions whose logits are needed)."""
    keep = torch.zeros_like(wanted)
    keep[:, :-1] = wanted[:, 1:]
    return keep


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    needed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logprob of each actual token of `input_ids` under `model`, [B, T] fp32 (column 0 and padding are 0).

    Runs one forward pass with padding-aware position ids and no KV cache. Gradients flow to whatever parameters
    of `model` require grad (a LoRA adapter, router gates, ...); call under `torch.no_grad()` for old/ref logprobs.
    With `needed` ([B, T] bool), logits are computed only where they predict a needed token and every other
    entry is 0 (module docstring). See the module docstring for the alignment convention and the memory strategy.
    """
    _check_ids_and_mask(input_ids, attention_mask)
    wanted = None if needed is None else wanted_tokens(needed, attention_mask)
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **({} if wanted is None else {"logits_to_keep": _predicting(wanted)}),
    )
    if wanted is not None:  # outputs.logits: [N, V], the positions that predict the wanted tokens
        return logprobs_at(outputs.logits, wanted, input_ids, temperature=temperature, chunk_tokens=chunk_tokens)
    logits = outputs.logits  # [B, T, V]
    return logprobs_from_logits(
        logits, input_ids, attention_mask, temperature=temperature, chunk_tokens=chunk_tokens
    )


def logits_after_prefix(
    model: torch.nn.Module, prefix_ids: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of B continuations of ONE shared prefix, running the prefix once: (the prefix's last logits
    [1, 1, V], continuation logits [B, T, V], or [N, V] at the positions of `keep` ([B, T] bool) only). The
    prefix's keys/values are repeated for every row, differentiably, so the prefix gets every row's gradient.
    prefix_ids: [P]; input_ids: [B, T] right-padded; attention_mask: [B, T]."""
    batch, seq_len = input_ids.shape
    prefix_len = prefix_ids.numel()
    prefix = model(input_ids=prefix_ids[None], use_cache=True, logits_to_keep=1)  # only its last position predicts
    cache = prefix.cache
    cache.batch_repeat_interleave(batch)  # [1, ...] -> [B, ...]
    full_mask = torch.cat([attention_mask.new_ones((batch, prefix_len)), attention_mask], dim=1)  # [B, P + T]
    positions = prefix_len + torch.arange(seq_len, device=input_ids.device).expand(batch, seq_len)  # [B, T]
    continuation = model(
        input_ids=input_ids, attention_mask=full_mask, position_ids=positions, cache=cache, use_cache=True,
        **({} if keep is None else {"logits_to_keep": keep}),
    )
    return prefix.logits, continuation.logits


def token_logprobs_after_prefix(
    model: torch.nn.Module,
    prefix_ids: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    needed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token logprobs of B continuations of ONE shared prefix, running the prefix once.

    GRPO groups share their prompt, which is most of each sequence in tool-use games; computing it once per
    group (with gradients flowing into it from every continuation) instead of once per sample cuts the
    update's compute by the group size on the shared part. Mathematically the same as `token_logprobs` on
    the concatenated sequences.

    Args:
        prefix_ids: [P] token ids shared by every row (P >= 1, no padding).
        input_ids: [B, T] continuations, right-padded; attention_mask: [B, T].
        needed: [B, T] bool or None: as in `token_logprobs` (logits only where they predict a needed token).

    Returns:
        [B, T] fp32; out[:, t] = log p(input_ids[:, t] | prefix, input_ids[:, :t]) on real tokens (on the
        needed ones with `needed`), else 0.
    """
    _check_ids_and_mask(input_ids, attention_mask)
    if prefix_ids.dim() != 1 or prefix_ids.numel() < 1:
        raise ValueError(f"prefix_ids must be a non-empty 1-D tensor; got shape {tuple(prefix_ids.shape)}.")
    batch = input_ids.shape[0]
    # The extended sequence puts the prefix's last token in front: its position 0 (the prefix's last logits)
    # predicts input_ids[:, 0], its position t predicts input_ids[:, t] from the continuation's position t - 1.
    ids = torch.cat([prefix_ids[-1:].expand(batch, 1), input_ids], dim=1)  # [B, 1 + T]
    mask = torch.cat([attention_mask.new_ones((batch, 1)), attention_mask], dim=1)  # [B, 1 + T]
    if needed is None:
        prefix_logits, continuation_logits = logits_after_prefix(model, prefix_ids, input_ids, attention_mask)
        last = prefix_logits[:, -1:].expand(batch, 1, prefix_logits.shape[-1])  # [B, 1, V]
        logits = torch.cat([last, continuation_logits], dim=1)  # [B, 1 + T, V]
        return logprobs_from_logits(logits, ids, mask, temperature=temperature, chunk_tokens=chunk_tokens)[:, 1:]
    wanted = wanted_tokens(torch.cat([needed.new_zeros((batch, 1)), needed], dim=1), mask)  # [B, 1 + T]
    keep = _predicting(wanted)  # [B, 1 + T]; column 0 is the prefix's last position
    prefix_logits, continuation_logits = logits_after_prefix(model, prefix_ids, input_ids, attention_mask,
                                                             keep=keep[:, 1:])  # [1, 1, V], [N', V]
    selected = continuation_logits  # [N, V] when no row needs the prefix's last position (GRPO: a prompt token)
    if bool(keep[:, 0].any()):  # row-major: a row's prefix position comes before its continuation's positions
        chunks = continuation_logits.split(keep[:, 1:].sum(dim=1).tolist())
        selected = torch.cat([torch.cat([prefix_logits[0, -1:], chunk]) if in_front else chunk
                              for chunk, in_front in zip(chunks, keep[:, 0].tolist())])
    return logprobs_at(selected, wanted, ids, temperature=temperature, chunk_tokens=chunk_tokens)[:, 1:]
