"""Rollout backends: one interface, two implementations.

The GRPO loop and the rollout collector talk only to `RolloutBackend`:

    completions = backend.generate(prompts, params)   # prompts: token-id lists, one per active episode
    backend.sync_weights(policy, version)             # after each optimizer step

- `HFBackend` samples in process from the (PEFT-wrapped) policy being trained: all prompts of a turn go
  through one batched, KV-cached sampling loop. It is hand-written rather than `model.generate` because
  we need the sampling log-probs of exactly the sampled tokens, our own seeded `torch.Generator` (for
  bitwise resume) and no per-step logits-processor overhead, which dominates on tiny models.
  Between calls it keeps the keys/values of the sequences it produced (a prefix cache keyed by exact token
  ids): the next turn of an episode prefills only its new tokens, and a GRPO group's shared prompt is
  prefilled once. Its default KV layout (train/shared_prefix.py) stores the prefix all prompts of a call share
  once and each row's rest in a slot it keeps across turns; `kv_layout="padded"` is the earlier layout, kept
  for comparison (bench/rollout_backends.py measures both).
- `VLLMBackend` (train/vllm_backend.py) sends the same token ids to a vLLM server's `/v1/completions`.

Log-probs are those of the sampling distribution: log_softmax(logits / temperature). The trainer scores
with the same temperature. Whether the trainer can use a backend's log-probs as the PPO "old" log-probs
is the backend's `logprobs_match_trainer`: only the in-process sampler in fp32 runs the very model the
trainer scores with (its log-probs agree with a full forward to ~2e-5 on the demo's ~1,000-token storefront
episodes, in either layout); any other sampler (vLLM: bf16,
other kernels; in-process bf16: KV-cached decoding rounds differently) has its sequences re-scored by the
trainer, so that every old log-prob in a batch comes from one source and the step-0 ratio is exactly 1.
"""
from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from common.validation import InputError
from train.sampling import choose_tokens, step_uniforms
from train.shared_prefix import (MIN_SHARED_PREFIX, SharedPrefixSampler, base_config, common_prefix_lengths,
                                 supports_shared_prefix)

KV_LAYOUTS = ("shared_prefix", "padded")


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")


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


@dataclass
class PrefillStats:
    """What the in-process sampler's prefill passes cost, summed over `generate` calls."""

    prompt_tokens: int = 0  # tokens of every prompt passed to generate
    # Token positions run through the model before decoding (rows x columns: padding, shared prefixes and
    # recomputed columns included): the prefill's compute. Without the prefix cache, batch x longest prompt.
    prefill_tokens: int = 0


@dataclass
class _CachedRows:
    """Keys/values of some token sequences, as rows of per-layer tensors, kept to be continued later."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [N, H, T, D]
    starts: list[int]  # column of each row's first token (rows are left-padded)
    token_ids: list[list[int]]  # per row: the tokens whose keys/values it holds, from its start column


class _FilledColumnsLayer(StaticLayer):
    """A static cache layer that hands attention only the columns filled so far.

    transformers' `StaticLayer` returns (and masks) all `max_cache_len` columns at every step, so each decoding
    step of a turn read the keys/values of the columns its longest completion might reach (prompt + up to
    max_new_tokens): reading the cache is what decoding costs on CPU. Storage stays preallocated; only the
    view handed to attention (and the mask's width) is trimmed to the filled columns.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        filled = int(self.cumulative_length)
        return keys[:, :, :filled], values[:, :, :filled]  # [B, H, filled, D]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return int(self.get_seq_length()) + query_length, 0


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """`model` in eval mode inside the block (no dropout while sampling), its training flag restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


class HFBackend(RolloutBackend):
    """Batched sampling from an in-process Hugging Face causal LM (with or without LoRA).

    KV layouts (`kv_layout`). "shared_prefix" (the default; train/shared_prefix.py): the prefix common to all
    prompts of a call (the system prompt and tool list of a rollout batch) is stored once and attended with one
    product for all rows, each row's rest lives in a slot it keeps across calls (the next turn writes in place),
    prefills are packed without padding, and rows that stop leave the decoding batch with no copy. Used when
    the model may continue a cache and drop rows (`supports_prefix_cache` and `supports_row_dropping`, true
    for plain models and token routing) and every layer is full attention; otherwise, and with "padded", the
    layout below. Both sample with one rule (train/sampling.py), so they give the same tokens up to float
    rounding (the parity tests run the demo's agent through both). On the CPU its decoding steps attend by a
    compiled kernel, all rows and the prefix in one call per layer (train/decode_attention.py; `decode_kernel=
    False`, or a machine where it cannot be built, keeps torch's kernel called row by row: same results), and a
    float32 Llama/Qwen/Mistral model runs as plain tensor calls instead of transformers' modules
    (train/lean_forward.py; `lean_forward=False` keeps transformers' forward: same results), its projections on
    a step's few rows and its norms by compiled kernels too (train/small_linear.py; `compiled_ops=False` keeps
    torch's ops there), each decoding step's layers in one compiled call (train/csrc/decode_step.cpp;
    `fused_step=False` keeps them op by op), `decode_kernel=False` turns every compiled kernel off.

    The padded layout's prefix cache (`prefix_cache=True`, the default). A multi-turn rollout calls `generate`
    once per turn with every episode's whole history, and a GRPO group sends the same prompt many times;
    prefilling all of it each time dominated rollout time (a ~2k-token storefront prompt x 16 rows x every turn).
    So:
    - after each call the backend keeps the keys/values of the sequences it just produced (prompt + the
      sampled tokens that went through the model), with their exact token ids. A prompt of the next call
      takes the longest cached sequence it shares a prefix with (a prefix only: an episode may cut a
      completion short, and the stop token sampled last was never run) and prefills only the rest.
      Only the last call's sequences are kept: whatever the next call does not continue is dropped, so the
      memory held between calls is one call's KV cache;
    - identical prompts in one call (a GRPO group's first turn) are prefilled once, on one row, and the
      cache rows are copied before decoding;
    - distinct prompts of one call that share a long prefix (the system prompt and tool schemas of
      different tasks) get that prefix prefilled once, on its own, and continue from it.
    The batch layout is the one without the cache (left padding to the longest prompt, positions counted
    from each row's first token), so a cached row's keys/values (computed at the same positions) are copied
    column for column into the new static cache, and one forward prefills the last U columns of every row,
    U being the longest uncached tail; a row whose tail is shorter recomputes a few cached columns, which
    gives the same values. Hand-written on top of transformers' `StaticCache` (filled with `Cache.update`,
    rows copied with `Cache.reorder_cache`) because transformers has no cross-call prefix cache for a
    hand-driven sampling loop; `generate`'s own cache cannot continue left-padded rows of different lengths.
    In either layout the cache is bypassed (and dropped) when the weights change (every parameter's and
    buffer's in-place version counter and storage, and PEFT's adapter switches, are compared at each call;
    `sync_weights` drops it too), when the model says it cannot continue a cache (`supports_prefix_cache`
    False, e.g. a router that decides per sequence) or when a layer's cache is not a plain static one (sliding
    window): those calls prefill everything. `prefill_stats` sums what the prefill passes cost.

    Decoding reads every row's keys/values at every step, so the padded layout runs only what is needed: rows
    that stopped leave the batch once they are a quarter of it (their keys/values are kept for the prefix
    cache), unless the model keeps per-row state between passes (`supports_row_dropping` False:
    trajectory/global routing), and attention sees only the cache columns filled so far (`_FilledColumnsLayer`).

    A PEFT LoRA policy is sampled through a copy with the adapter merged into its weights (`merge_lora=True`,
    the default; PEFT's `merge_and_unload`), re-made whenever the policy's weights change: an unmerged LoRA
    layer adds two matmuls and an add at every decoding step (measured: 8 groups x 8 storefront episodes on
    the demo's base agent, 19.5 s -> 16.6 s; the base model alone: 16.5 s). The same function to float
    rounding (~1e-7 in fp32); the live policy is sampled as is when an adapter is disabled, when a LoRA
    sits on a tied weight (lm_head tied to the embeddings: merging would change both), when its parameters
    are sharded (FSDP) or when it is not a PEFT model.
    """

    def __init__(self, model: torch.nn.Module, pad_token_id: int, *, seed: int = 0, max_batch_size: int = 256,
                 prefix_cache: bool = True, merge_lora: bool = True, kv_layout: str = "shared_prefix",
                 decode_kernel: bool = True, lean_forward: bool = True, compiled_ops: bool = True,
                 fused_step: bool = True):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {kv_layout!r}")
        self.kv_layout = kv_layout
        self._shared = SharedPrefixSampler(pad_token_id, keep=prefix_cache, decode_kernel=decode_kernel,
                                           lean_forward=lean_forward, compiled_ops=compiled_ops,
                                           fused_step=fused_step)
        self._shared_weights: list[tuple[Any, ...]] = []  # the weights the shared-prefix store was computed with
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.prefix_cache = prefix_cache
        self.merge_lora = merge_lora
        self._runner: torch.nn.Module = model  # what the forward passes of the current call run
        self._merged: tuple[list[tuple[Any, ...]], torch.nn.Module] | None = None  # (policy weights, merged copy)
        self.prefill_stats = PrefillStats()
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._kept: list[_CachedRows] = []  # the previous call's sequences
        self._kept_weights: list[tuple[Any, ...]] = []  # the weights they were computed with

    @property
    def logprobs_match_trainer(self) -> bool:  # type: ignore[override]
        """fp32: the sampler's log-probs equal the trainer's full forward (to ~2e-5); bf16 rounds differently."""
        return next(self.model.parameters()).dtype == torch.float32

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if not prompts:
            return []
        if self._shared_layout():
            return self._generate_shared(prompts, params)
        use_cache = self.prefix_cache and bool(getattr(self.model, "supports_prefix_cache", True))
        merge = self.merge_lora and self._mergeable()
        weights = self._weights_version() if use_cache or merge else []
        if not use_cache or weights != self._kept_weights:
            self._kept = []
        self._runner = self._merged_copy(weights) if merge else self.model
        sources = list(self._kept)
        produced: list[_CachedRows] = []
        out: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = prompts[start : start + self.max_batch_size]
            completions, rows = self._generate_batch(chunk, params, sources + produced if use_cache else None)
            out.extend(completions)
            produced.extend(rows)
        self._kept, self._kept_weights = (produced, weights) if use_cache else ([], [])
        return out

    def _shared_layout(self) -> bool:
        """The shared-prefix layout applies: chosen, the model may continue a cache and drop finished rows
        (token routing, plain models), and every layer is full attention."""
        return (self.kv_layout == "shared_prefix" and bool(getattr(self.model, "supports_prefix_cache", True))
                and bool(getattr(self.model, "supports_row_dropping", True)) and supports_shared_prefix(self.model))

    @torch.no_grad()
    def _generate_shared(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        merge = self.merge_lora and self._mergeable()
        weights = self._weights_version()
        if weights != self._shared_weights:
            self._shared.clear()
        self._runner = self._merged_copy(weights) if merge else self.model
        before = self._shared.prefill_tokens
        with _eval_mode(self._runner):
            samples = self._shared.sample(self._runner, prompts, params.max_new_tokens, params.temperature,
                                          params.stop_token_ids, self.generator, self.max_batch_size)
        self._shared_weights = weights
        self.prefill_stats.prompt_tokens += sum(len(p) for p in prompts)
        self.prefill_stats.prefill_tokens += self._shared.prefill_tokens - before
        stop = set(params.stop_token_ids)
        return [Completion(ids, logprobs, "stop" if ids and ids[-1] in stop else "length") for ids, logprobs in samples]

    def sync_weights(self, policy: Any, version: int) -> None:
        """The live model is sampled already; the kept keys/values were computed with the old weights."""
        del policy, version
        self.clear_prefix_cache()

    def clear_prefix_cache(self) -> None:
        """Drop the kept keys/values (the next call prefills everything)."""
        self._kept, self._kept_weights = [], []
        self._shared.clear()
        self._shared_weights = []

    def close(self) -> None:
        self.clear_prefix_cache()
        self._merged, self._runner = None, self.model

    def _mergeable(self) -> bool:
        """A PEFT LoRA model whose adapters are all enabled and whose parameters are plain local tensors."""
        if not hasattr(self.model, "merge_and_unload") or not hasattr(self.model, "peft_config"):
            return False
        layers = [m for m in self.model.modules() if hasattr(m, "_disable_adapters")]
        if not layers or any(m._disable_adapters for m in layers):
            return False
        if not all(type(p.data) is torch.Tensor for p in self.model.parameters()):
            return False
        # A LoRA on a tied weight (lm_head tied to the input embeddings) would be merged into both: not the same
        # function any more (PEFT warns about it). Such a policy is sampled live.
        uses = Counter(id(p) for _, p in self.model.named_parameters(remove_duplicate=False))
        return not any(uses[id(m.get_base_layer().weight)] > 1 for m in layers
                       if hasattr(m, "get_base_layer") and hasattr(m.get_base_layer(), "weight"))

    def _merged_copy(self, weights: list[tuple[Any, ...]]) -> torch.nn.Module:
        """The policy with its adapter merged, re-made when `weights` (the policy's version) changed."""
        if self._merged is None or self._merged[0] != weights:
            self._merged = None  # free the old copy before making the new one
            merged = copy.deepcopy(self.model).merge_and_unload().eval()
            merged.requires_grad_(False)
            self._merged = (weights, merged)
        return self._merged[1]

    def _weights_version(self) -> list[tuple[Any, ...]]:
        """What the model computes with: (storage address, in-place version counter) of every parameter and
        buffer (an optimizer step, a `load_state_dict` or swapped tensors change it) and the adapter switches
        of PEFT layers (`disable_adapter()`, `set_adapter()` change no tensor). Keys/values computed under
        another version are never reused."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        version: list[tuple[Any, ...]] = [(t.data_ptr(), t._version) for t in tensors]
        version += [(bool(m._disable_adapters), str(m.active_adapter))
                    for m in self.model.modules() if hasattr(m, "_disable_adapters")]
        return version

    @torch.no_grad()
    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, sources: list[_CachedRows] | None
    ) -> tuple[list[Completion], list[_CachedRows]]:
        """Completions of `prompts`, and (when `sources` is given: the prefix cache is on) the cache rows of
        the sequences produced, for the next call. `sources` are cached rows the prompts may continue."""
        if not prompts:
            return [], []
        with _eval_mode(self._runner):
            return self._sample(prompts, params, sources, next(self._runner.parameters()).device)

    def _sample(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, sources: list[_CachedRows] | None,
        device: torch.device,
    ) -> tuple[list[Completion], list[_CachedRows]]:
        batch, longest = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, longest), self.pad_token_id, dtype=torch.long, device=device)  # [B, P]
        attention_mask = torch.zeros((batch, longest), dtype=torch.long, device=device)  # [B, P]
        for row, prompt in enumerate(prompts):  # left padding: every row's next token is at the end
            input_ids[row, longest - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention_mask[row, longest - len(prompt) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        stop = torch.tensor(list(params.stop_token_ids) or [-1], device=device)
        self.prefill_stats.prompt_tokens += sum(len(p) for p in prompts)

        # A preallocated (static) KV cache: a growing cache re-concatenates every layer's keys and values
        # at each step, which dominated decoding time on CPU.
        total = longest + params.max_new_tokens
        cache = self._new_cache(total)
        if sources is not None and not all(type(layer) is _FilledColumnsLayer for layer in cache.layers):
            sources = None  # sliding-window (rolling) layers: columns do not map to positions one to one
        if sources is None:
            logits = self._prefill(cache, input_ids, attention_mask, position_ids, 0)  # [B, V]
        else:
            logits = self._prefill_from_cache(cache, prompts, input_ids, attention_mask, position_ids, sources)
        full_mask = torch.cat(  # [B, P + N]; generated columns switch on as they are written
            [attention_mask, torch.zeros((batch, params.max_new_tokens), dtype=torch.long, device=device)], 1
        )
        next_position = position_ids[:, -1:] + 1  # [A, 1]: rows still in the batch (A <= B)
        tokens = torch.empty((batch, params.max_new_tokens), dtype=torch.long, device=device)  # [B, N]
        logprobs = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)  # [B, N]
        lengths = torch.full((batch,), params.max_new_tokens, dtype=torch.long, device=device)  # [B]
        alive = torch.arange(batch, device=device)  # [A] original row of each row still decoding
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # [A]
        compact = bool(getattr(self.model, "supports_row_dropping", True))
        fed = 0  # sampled tokens that went through the model (their keys/values are in the cache)
        dropped: list[_CachedRows] = []  # keys/values of rows that left the batch early (prefix cache on)
        for step in range(params.max_new_tokens):
            uniforms = step_uniforms(batch, self.generator, device)  # [B]: one per row of the call, every step
            token, token_logprobs = choose_tokens(logits, params.temperature, uniforms[alive])  # [A], [A]
            token = torch.where(finished, torch.full_like(token, self.pad_token_id), token)
            tokens[alive, step] = token
            logprobs[alive, step] = token_logprobs
            hit_stop = torch.isin(token, stop) & ~finished
            lengths[alive[hit_stop]] = step + 1
            finished |= hit_stop
            if bool(finished.all()) or step + 1 == params.max_new_tokens:
                break
            # Rows that stopped leave the batch once they are a quarter of it: decoding cost is rows x cache
            # columns, and in a multi-turn batch most rows stop long before the longest one (measured on the
            # demo's storefront: 40% of row-steps were finished rows). Dropping copies the cache once.
            n_done = int(finished.sum())
            if compact and n_done and n_done * 4 >= len(alive):
                keep = (~finished).nonzero().squeeze(-1)  # [A'] positions within the batch
                if sources is not None:
                    gone = finished.nonzero().squeeze(-1)
                    dropped.append(self._rows_of(cache, gone, [int(alive[g]) for g in gone], prompts, tokens,
                                                 lengths, fed, longest))
                cache.reorder_cache(keep)
                alive, finished = alive[keep], finished[keep]
                full_mask, next_position, token = full_mask[keep], next_position[keep], token[keep]
            full_mask[:, longest + step] = 1
            output = self._runner(
                input_ids=token[:, None], attention_mask=full_mask[:, : longest + step + 1],
                position_ids=next_position, cache=cache, use_cache=True,
            )
            fed += 1
            logits = output.logits[:, -1, :]  # [A, V]
            next_position = next_position + 1
        completions = []
        for row in range(batch):
            n = int(lengths[row])
            ids = tokens[row, :n].tolist()
            reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
            completions.append(Completion(ids, logprobs[row, :n].tolist(), reason))
        if sources is None:
            return completions, []
        rows = self._rows_of(cache, torch.arange(len(alive), device=device), alive.tolist(), prompts, tokens,
                             lengths, fed, longest)
        return completions, dropped + [rows]

    @staticmethod
    def _rows_of(cache: StaticCache, positions: torch.Tensor, originals: list[int], prompts: Sequence[Sequence[int]],
                 tokens: torch.Tensor, lengths: torch.Tensor, fed: int, longest: int) -> _CachedRows:
        """The cache rows at `positions` (batch rows `originals`) as reusable cached sequences: each holds its
        prompt and the sampled tokens that went through the model (`fed` of them, at most its own length)."""
        whole = len(positions) == cache.layers[0].keys.shape[0]
        layers = [(layer.keys, layer.values) if whole else
                  (layer.keys.index_select(0, positions), layer.values.index_select(0, positions))
                  for layer in cache.layers]
        produced = [list(prompts[r]) + tokens[r, : min(int(lengths[r]), fed)].tolist() for r in originals]
        return _CachedRows(layers, [longest - len(prompts[r]) for r in originals], produced)

    def _prefill(
        self, cache: StaticCache, input_ids: torch.Tensor, attention_mask: torch.Tensor,
        position_ids: torch.Tensor, first: int,
    ) -> torch.Tensor:
        """Run columns `first:` of the left-padded batch through the model (the cache holds columns :first);
        returns the last column's logits [B, V]."""
        self.prefill_stats.prefill_tokens += input_ids.shape[0] * (input_ids.shape[1] - first)
        output = self._runner(
            input_ids=input_ids[:, first:], attention_mask=attention_mask, position_ids=position_ids[:, first:],
            cache=cache, use_cache=True, logits_to_keep=1,
        )
        return output.logits[:, -1, :]  # [B, V]

    def _prefill_from_cache(
        self, cache: StaticCache, prompts: Sequence[Sequence[int]], input_ids: torch.Tensor,
        attention_mask: torch.Tensor, position_ids: torch.Tensor, sources: list[_CachedRows],
    ) -> torch.Tensor:
        """Fill `cache` for every row of the batch, reusing cached keys/values; returns logits [B, V]."""
        batch, longest = input_ids.shape
        unique: dict[tuple[int, ...], int] = {}
        inverse = [unique.setdefault(tuple(p), len(unique)) for p in prompts]  # row -> unique prompt
        distinct = [list(p) for p in unique]  # [U] prompts
        sources = sources + self._shared_prefixes(distinct, sources, input_ids.device)
        entries = [(s, r) for s, rows in enumerate(sources) for r in range(len(rows.token_ids))]
        shared = common_prefix_lengths(distinct, [sources[s].token_ids[r] for s, r in entries])  # [U, E]
        nothing = torch.zeros(len(distinct), dtype=torch.long)  # [U]
        best_len, best = shared.max(-1) if entries else (nothing, nothing)  # [U], [U]
        lengths = [len(p) for p in distinct]
        # Every row runs at least its last token (its logits start the sampling).
        cached = [min(int(best_len[u]), lengths[u] - 1) for u in range(len(distinct))]
        tail = max(n - c for n, c in zip(lengths, cached))  # columns the prefill forward runs
        first = longest - tail  # columns :first come from the cache
        first_row: dict[int, int] = {}
        for row, u in enumerate(inverse):
            first_row.setdefault(u, row)
        rows = torch.tensor([first_row[u] for u in range(len(distinct))], device=input_ids.device)  # [U]
        if first > 0:
            self._copy_cached_columns(cache, distinct, [entries[int(b)] for b in best], sources, longest, first)
        logits = self._prefill(cache, input_ids[rows], attention_mask[rows], position_ids[rows], first)  # [U, V]
        if len(distinct) < batch:  # identical prompts: copy the prefilled rows
            expand = torch.tensor(inverse, device=input_ids.device)  # [B]
            cache.reorder_cache(expand)
            logits = logits[expand]  # [B, V]
        return logits

    def _shared_prefixes(
        self, distinct: list[list[int]], sources: list[_CachedRows], device: torch.device
    ) -> list[_CachedRows]:
        """Prefill, once each, the long prefixes that distinct prompts of this call share and no cached
        sequence covers (the system prompt and tool schemas of a turn-1 batch of several tasks).

        Clusters: the prompts sorted by token ids, cut where neighbours share fewer than MIN_SHARED_PREFIX
        tokens; in sorted order the prefix a cluster shares is the shortest shared prefix of neighbours.
        """
        if len(distinct) < 2:
            return []
        kept = [ids for rows in sources for ids in rows.token_ids]
        covered = common_prefix_lengths(distinct, kept).max(-1).values if kept else torch.zeros(len(distinct))  # [U]
        among = common_prefix_lengths(distinct, distinct)  # [U, U]
        order = sorted(range(len(distinct)), key=lambda u: distinct[u])
        clusters: list[tuple[list[int], int]] = []  # (members, shared length)
        members, shared = [order[0]], None
        for before, after in zip(order, order[1:]):
            common = int(among[before, after])
            if common >= MIN_SHARED_PREFIX:
                members.append(after)
                shared = common if shared is None else min(shared, common)
                continue
            if shared is not None:
                clusters.append((members, shared))
            members, shared = [after], None
        if shared is not None:
            clusters.append((members, shared))
        prefixes = []
        for members, shared in clusters:
            shared = min(shared, min(len(distinct[u]) for u in members) - 1)  # every prompt keeps a token to run
            if shared >= MIN_SHARED_PREFIX and shared > max(int(covered[u]) for u in members) + MIN_SHARED_PREFIX:
                prefixes.append(distinct[members[0]][:shared])
        if not prefixes:
            return []
        longest = max(len(p) for p in prefixes)
        input_ids = torch.full((len(prefixes), longest), self.pad_token_id, dtype=torch.long, device=device)  # [C, S]
        attention_mask = torch.zeros((len(prefixes), longest), dtype=torch.long, device=device)  # [C, S]
        for row, prefix in enumerate(prefixes):
            input_ids[row, longest - len(prefix) :] = torch.tensor(prefix, dtype=torch.long)
            attention_mask[row, longest - len(prefix) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [C, S]
        cache = self._new_cache(longest)
        self._prefill(cache, input_ids, attention_mask, position_ids, 0)
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        return [_CachedRows(layers, [longest - len(p) for p in prefixes], prefixes)]

    def _copy_cached_columns(
        self, cache: StaticCache, distinct: list[list[int]], chosen: list[tuple[int, int]],
        sources: list[_CachedRows], longest: int, first: int,
    ) -> None:
        """Write columns [0, first) of every distinct prompt's row from its cached source row (zeros on
        padding), through `Cache.update` (which also sets the cache length to `first`). Some row has columns
        there (first > 0 means a row is longer than the prefilled tail, so it shares that much with a source)."""
        # Per row, its cached columns are one contiguous run of its source row, shifted by the difference of
        # the two paddings: a slice copy per row (a gather over [rows, columns] indices cost 3x more).
        copies = []  # (destination row, first destination column, source, source row, first source column)
        for u, (s, r) in enumerate(chosen):
            row_start = longest - len(distinct[u])
            if row_start < first:  # the row has columns before `first`
                copies.append((u, row_start, sources[s], r, sources[s].starts[r]))
        for layer_index in range(len(cache.layers)):
            src_keys, src_values = copies[0][2].layers[layer_index]  # [N, H, T, D]
            keys = src_keys.new_zeros((len(distinct), src_keys.shape[1], first, src_keys.shape[3]))  # [U, H, F, D]
            values = src_values.new_zeros((len(distinct), src_values.shape[1], first, src_values.shape[3]))
            for u, row_start, source, r, src_start in copies:
                src_keys, src_values = source.layers[layer_index]
                width = first - row_start
                keys[u, :, row_start:first] = src_keys[r, :, src_start : src_start + width]
                values[u, :, row_start:first] = src_values[r, :, src_start : src_start + width]
            cache.update(keys, values, layer_index)

    def _new_cache(self, columns: int) -> StaticCache:
        """A static cache of `columns` columns whose plain layers attend over the filled columns only."""
        cache = StaticCache(config=base_config(self.model), max_cache_len=columns)
        cache.layers = [_FilledColumnsLayer(columns) if type(layer) is StaticLayer else layer for layer in cache.layers]
        return cache

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
