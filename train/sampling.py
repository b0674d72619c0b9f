"""How the in-process sampler picks a token from logits: one rule for every KV layout.

Each decoding step draws one uniform number per row of the call (`torch.rand(rows)` from the backend's seeded
generator), whether or not the row is still decoding, and a decoding row takes the token where its cumulative
probability first reaches its number (inverse-CDF sampling). So the tokens a row samples depend on its own
probabilities and the seed only, not on which other rows are still in the batch: the padded and shared-prefix
layouts, which drop finished rows at different times, sample the same tokens (up to float rounding at a CDF
boundary). `torch.multinomial` over the live rows would consume its random stream differently in each.
"""
from __future__ import annotations

import torch


def step_uniforms(rows: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """[rows] numbers in (0, 1], one per row of the call (a number of 0 could pick a zero-probability token)."""
    return 1.0 - torch.rand(rows, generator=generator, device=device)


def choose_tokens(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [A], their sampling log-probs [A]) for logits [A, V]: greedy at temperature 0, otherwise the
    token whose cumulative probability first reaches uniforms [A] under softmax(logits / temperature)."""
    if temperature == 0:
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [A, V]
        tokens = logprobs.argmax(dim=-1)  # [A]
    else:
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # [A, V]
        cumulative = torch.cumsum(logprobs.exp(), dim=-1)  # [A, V]
        targets = uniforms[:, None] * cumulative[:, -1:]  # [A, 1]; scaled by the total, which rounds off 1
        tokens = torch.searchsorted(cumulative, targets).squeeze(-1).clamp(max=logits.shape[-1] - 1)  # [A]
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
