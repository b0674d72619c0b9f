"""Rollout backends: one interface, two implementations.

The GRPO loop and the rollout collector talk only to `RolloutBackend`:

    completions = backend.generate(prompts, params)   # prompts: token-id lists, one per active episode
    backend.sync_weights(policy, version)             # after each optimizer step

- `HFBackend` samples in process from the (PEFT-wrapped) policy being trained: all prompts of a turn go
  through one batched, KV-cached sampling loop. It is hand-written rather than `model.generate` because
  we need the sampling log-probs of exactly the sampled tokens, our own seeded `torch.Generator` (for
  bitwise resume) and no per-step logits-processor overhead, which dominates on tiny models.
- `VLLMBackend` (train/vllm_backend.py) sends the same token ids to a vLLM server's `/v1/completions`.

Log-probs are those of the sampling distribution: log_softmax(logits / temperature). The trainer scores
with the same temperature. Whether the trainer can use a backend's log-probs as the PPO "old" log-probs
is the backend's `logprobs_match_trainer`: only the in-process sampler in fp32 runs the very model the
trainer scores with (its log-probs agree with a full forward to ~5e-7); any other sampler (vLLM: bf16,
other kernels; in-process bf16: KV-cached decoding rounds differently) has its sequences re-scored by the
trainer, so that every old log-prob in a batch comes from one source and the step-0 ratio is exactly 1.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import StaticCache


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, the stop token included when one was hit
    logprobs: list[float]  # sampling log-prob of each token in token_ids
    finish_reason: str  # "stop" (a stop token) or "length" (max_new_tokens)


class RolloutBackend(ABC):
    """Generates continuations of token-id prompts with the current policy."""

    # True only when the sampling log-probs are the trainer's own numbers (same weights, same kernels, fp32),
    # so the trainer may keep them as old log-probs; otherwise it re-scores every sequence.
    logprobs_match_trainer: bool = False

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order."""

    def sync_weights(self, policy: Any, version: int) -> None:
        """Make the backend sample from `policy`'s current weights (called after each update on every rank;
        `policy.save(dir)` is collective-safe). The in-process backend samples from the live model already."""

    def probe(self, prompt: Sequence[int], params: SamplingParams) -> list[tuple[str, Completion]]:
        """One completion of `prompt` from every server this backend samples from, as (server, completion),
        without advancing the sampling seeds (a resumed run must ask for the same samples). Used at start to
        check the log-probs a server returns; [] when there is nothing to check (in-process sampling)."""
        del prompt, params
        return []

    def close(self) -> None:
        """Release servers, adapters, memory."""

    def state_dict(self) -> dict[str, Any]:
        """RNG state and the like, saved with checkpoints so a resumed run samples identically."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


class HFBackend(RolloutBackend):
    """Batched sampling from an in-process Hugging Face causal LM (with or without LoRA)."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, *, seed: int = 0, max_batch_size: int = 256):
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @property
    def logprobs_match_trainer(self) -> bool:  # type: ignore[override]
        """fp32: the sampler's log-probs equal the trainer's full forward (to ~5e-7); bf16 rounds differently."""
        return next(self.model.parameters()).dtype == torch.float32

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch_size):
            out.extend(self._generate_batch(prompts[start : start + self.max_batch_size], params))
        return out

    @torch.no_grad()
    def _generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        batch, longest = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, longest), self.pad_token_id, dtype=torch.long, device=device)  # [B, P]
        attention_mask = torch.zeros((batch, longest), dtype=torch.long, device=device)  # [B, P]
        for row, prompt in enumerate(prompts):  # left padding: every row's next token is at the end
            input_ids[row, longest - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention_mask[row, longest - len(prompt) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        stop = torch.tensor(list(params.stop_token_ids) or [-1], device=device)

        # A preallocated (static) KV cache: a growing cache re-concatenates every layer's keys and values
        # at each step, which dominated decoding time on CPU.
        total = longest + params.max_new_tokens
        cache = StaticCache(config=self._config(), max_cache_len=total)
        full_mask = torch.cat(  # [B, P + N]; generated columns switch on as they are written
            [attention_mask, torch.zeros((batch, params.max_new_tokens), dtype=torch.long, device=device)], 1
        )
        output = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            use_cache=True, cache_position=torch.arange(longest, device=device),
        )
        logits = output.logits[:, -1, :]  # [B, V]
        next_position = position_ids[:, -1:] + 1  # [B, 1]
        tokens = torch.empty((batch, params.max_new_tokens), dtype=torch.long, device=device)  # [B, N]
        logprobs = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)  # [B, N]
        lengths = torch.full((batch,), params.max_new_tokens, dtype=torch.long, device=device)  # [B]
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # [B]
        for step in range(params.max_new_tokens):
            if params.temperature == 0:
                step_logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
                token = step_logprobs.argmax(dim=-1)  # [B]
            else:
                step_logprobs = torch.log_softmax(logits.float() / params.temperature, dim=-1)  # [B, V]
                token = torch.multinomial(step_logprobs.exp(), 1, generator=self.generator).squeeze(-1)  # [B]
            token = torch.where(finished, torch.full_like(token, self.pad_token_id), token)
            tokens[:, step] = token
            logprobs[:, step] = step_logprobs.gather(-1, token[:, None]).squeeze(-1)
            hit_stop = torch.isin(token, stop) & ~finished
            lengths = torch.where(hit_stop, torch.full_like(lengths, step + 1), lengths)
            finished |= hit_stop
            if bool(finished.all()) or step + 1 == params.max_new_tokens:
                break
            full_mask[:, longest + step] = 1
            output = self.model(
                input_ids=token[:, None], attention_mask=full_mask[:, : longest + step + 1],
                position_ids=next_position, cache=cache, use_cache=True,
                cache_position=torch.tensor([longest + step], device=device),
            )
            logits = output.logits[:, -1, :]
            next_position = next_position + 1
        if was_training:
            self.model.train()
        completions = []
        for row in range(batch):
            n = int(lengths[row])
            ids = tokens[row, :n].tolist()
            reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
            completions.append(Completion(ids, logprobs[row, :n].tolist(), reason))
        return completions

    def _config(self) -> Any:
        """The base model's config (through a PEFT wrapper if there is one)."""
        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return model.config

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
