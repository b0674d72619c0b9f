"""Shared-prefix (cascade) attention over a slot-per-row KV store: the in-process sampler's decoding layout.

Why: decoding on CPU is bound by reading keys/values. In a rollout batch every row starts with the same system
prompt (policy + tool signatures, ~380 of a storefront episode's 500-1,100 tokens), and the padded layout
(`HFBackend(kv_layout="padded")`) stored and read it once per row, copied every kept row's cache into a new
one at each call, and copied the whole batch whenever rows left it. Here:

- **The shared prefix** (the longest prefix common to all prompts of a call) is stored once per layer,
  `[1, Hkv, P, D]`. Each forward attends to it with one product for all rows (`[1, Hkv, G*A*Lq, D]` queries),
  reading it once, and separately to each row's own suffix; the two partial attentions are merged by their
  log-sum-exps: o = o_p * exp(lse_p - lse) + o_s * exp(lse_s - lse), lse = logaddexp(lse_p, lse_s)
  (the combination cascade / shared-prefix attention kernels use). Exact up to float rounding.
- **Suffixes live in slots** of one pool per layer, `[S, Hkv, C, D]`, a row's columns starting at 0 (position
  P + column). A row keeps its slot across calls: the next turn of an episode writes its new tokens after the
  ones it holds, in place. Rows that stop simply leave the decoding batch; no cache is ever re-laid out, so there
  are no per-call or per-drop copies. Copies happen only where a row really needs another row's columns: the
  identical prompts of a GRPO group (the part after the prefix is prefilled once and copied) and a prompt that
  continues a slot another prompt already continues. The pool grows (one copy) when a call needs more slots or
  columns than it has.
- Decoding steps on the CPU (every row one new token) run the compiled kernel of train/decode_attention.py:
  one call per layer for all rows, each (row, head) reading the prefix (from cache: it is the same for all)
  and exactly its own filled columns, the two partial attentions merged by the same log-sum-exp combination
  in C++ (64-row storefront GRPO rollouts: 1.2-1.3x faster than the per-row calls below, same samples).
- Otherwise (prefills, other devices, `use_kernel=False`, no compiler) attention to each row's suffix is one
  call per row over exactly its filled columns (views of its slot, no padding read), decoding rows in
  neighbouring slots joined while little padding is read, and the prefix one product for all rows. On CPU
  these use the fused kernel that also returns the log-sum-exp (`aten._scaled_dot_product_flash_attention_for_cpu`,
  what `scaled_dot_product_attention` runs on CPU); elsewhere a plain matmul/softmax (`_attend_reference`).

The layout plugs into any transformers model whose attention modules write through `cache.update(...)` and call
the registered attention interface (Llama, Qwen2/3, Mistral, ...): `SharedPrefixStep` is passed as the cache
(its `update` writes into the slots) and made the active step for the forward (`stepping`), which also switches
the model's attention implementation to ATTENTION_NAME; transformers builds no mask for an implementation it
has no mask function for, and the registered attention function reads the active step. Only full-attention
layers (no sliding window). A float32 Llama/Qwen2/Qwen3/Mistral model skips transformers' modules and runs as
plain tensor calls over the same step (train/lean_forward.py: the same computation, ~15% less time per decoding
step on the demo's agent), its projections and norms by the compiled kernels of train/cpu_kernels.py where they are
built (train/small_linear.py: weights packed once per store, read once per step; another ~15%), and each decoding
step as one compiled call over all layers (train/csrc/decode_step.cpp); `lean_forward=False` keeps transformers'
forward, `compiled_ops=False` torch's ops in it, `fused_step=False` the op-by-op decoding steps, `decode_kernel=False`
torch's kernels throughout.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from transformers import AttentionInterface

from train.decode_attention import decode_attention, kernel_applies
from train.lean_forward import LeanForward
from train.small_linear import PackedLinears
from train.sampling import choose_tokens, step_uniforms

ATTENTION_NAME = "trace_shared_prefix"
# Decoding rows in consecutive slots share one attention call while that reads at most this many padding columns
# per joined row: a call costs about as much as reading ~500 columns of a row (16 us at 6 x 32 heads, measured).
RUN_PADDING = 384
# Pool columns are allocated in multiples of this.
COLUMN_QUANTUM = 256
# A new pool has at least this many columns, and a full one doubles: a multi-turn episode grows turn by turn.
MIN_COLUMNS = 1024


def _attend_reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its log-sum-exp, plainly: query [B, H, M, D], keys/values [B, H, L, D], additive mask
    broadcastable to [B, H, M, L] -> output [B, H, M, D], lse [B, H, M] (float32)."""
    scores = torch.matmul(query.float(), keys.float().transpose(-1, -2)) * scale  # [B, H, M, L]
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, M]
    output = torch.matmul(torch.exp(scores - lse[..., None]), values.float())  # [B, H, M, D]
    return output.to(query.dtype), lse


def _attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_attend_reference`'s result, by the fused CPU kernel where it applies."""
    if query.device.type == "cpu" and query.dtype == keys.dtype:
        output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, keys, values, attn_mask=mask, scale=scale)
        return output, lse.float()
    return _attend_reference(query, keys, values, mask, scale)


@dataclass
class SharedPrefixStore:
    """Keys/values kept between calls: the shared prefix once, and one slot per row for the rest."""

    prefix_ids: list[int] = field(default_factory=list)
    prefix: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer [1, Hkv, P, D]
    pool: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer [S, Hkv, C, D]
    held: list[list[int] | None] = field(default_factory=list)  # per slot: token ids after the prefix, None: free

    @property
    def prefix_len(self) -> int:
        return len(self.prefix_ids)

    @property
    def columns(self) -> int:
        return self.pool[0][0].shape[2] if self.pool else 0

    def reserve(self, n_layers: int, like: torch.Tensor, slots: int, columns: int) -> None:
        """At least `slots` slots of at least `columns` columns; existing slots keep their keys/values."""
        if self.pool and len(self.held) >= slots and self.columns >= columns:
            return
        new_slots = max(slots, len(self.held))
        new_columns = max(columns, 2 * self.columns if self.columns < columns else self.columns, MIN_COLUMNS)
        new_columns = -(-new_columns // COLUMN_QUANTUM) * COLUMN_QUANTUM
        _, n_kv, _, head_dim = like.shape
        grown = []
        for layer in range(n_layers):
            # zeros, not empty: a joined decoding call reads (masked) columns past a row's length, and masked
            # garbage that happens to be NaN or inf would still poison the softmax
            keys = like.new_zeros((new_slots, n_kv, new_columns, head_dim))  # [S, Hkv, C, D]
            values = like.new_zeros((new_slots, n_kv, new_columns, head_dim))
            if self.pool:
                old_keys, old_values = self.pool[layer]
                keys[: old_keys.shape[0], :, : old_keys.shape[2]] = old_keys
                values[: old_values.shape[0], :, : old_values.shape[2]] = old_values
            grown.append((keys, values))
        self.pool = grown
        self.held += [None] * (new_slots - len(self.held))

    def copy_slot(self, source: int, target: int, columns: int) -> None:
        """Columns [0, columns) of slot `source` into slot `target`."""
        for keys, values in self.pool:
            keys[target, :, :columns] = keys[source, :, :columns]
            values[target, :, :columns] = values[source, :, :columns]


class SharedPrefixStep:
    """One forward pass over some rows of a store: row r runs `new[r]` tokens, written from column `starts[r]`
    of slot `slots[r]`. Passed to the model as its cache (`update` writes the tokens' keys/values into the
    slots) and made the active step (the attention function reads it).

    Two shapes of the model's input: decoding (every row one token) is a batch [A, 1]; anything else is packed
    into one sequence [1, N] (N = sum of new), row r's tokens at `offsets[r]`, so a prefill runs no padding
    (left-padding rows to the longest tail ran a third more tokens through every layer on the storefront)."""

    def __init__(self, store: SharedPrefixStore, slots: Sequence[int], starts: Sequence[int], new: Sequence[int],
                 device: torch.device, use_kernel: bool = True):
        if not new or min(new) < 1:
            raise ValueError(f"every row of a step runs at least one token, got {list(new)}")
        self.store, self.slots, self.starts, self.new = store, list(slots), list(starts), list(new)
        self.packed = max(self.new) > 1
        self.offsets = list(itertools.accumulate(self.new, initial=0))[:-1] if self.packed else [0] * len(self.new)
        # tokens in the order of the model's input, row-major over [Bq, Lq] ([A, 1] decoding, [1, N] packed)
        rows = [r for r, n in enumerate(self.new) for _ in range(n)]
        columns = [start + i for start, n in zip(self.starts, self.new) for i in range(n)]
        self._slot_of = torch.tensor([self.slots[r] for r in rows], dtype=torch.long, device=device)  # [N]
        self._column_of = torch.tensor(columns, dtype=torch.long, device=device)  # [N] its column in the slot
        self._flat_columns: torch.Tensor | None = None  # [N*Hkv]: (token, kv head) -> row of a pool's [S*Hkv*C, D]
        self.use_kernel = use_kernel  # decoding steps attend by the compiled kernel where it applies
        self._runs: list[tuple[int, int, int, int]] | None = None  # planned at the first layer that needs them
        self._masks: dict[int, torch.Tensor | None] = {}  # per run: its mask, made at the first layer
        self._kernel_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # (slots [A], lengths [A]) for the kernel

    def model_input(self, tails: Sequence[Sequence[int]], device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
        """(input_ids, position_ids, logits_to_keep) for the rows' tokens: [A, 1] or packed [1, N]; logits of
        each row's last token."""
        prefix = self.store.prefix_len
        if not self.packed:
            input_ids = torch.tensor([[tail[0]] for tail in tails], dtype=torch.long, device=device)  # [A, 1]
            position_ids = torch.tensor([[prefix + start] for start in self.starts], device=device)  # [A, 1]
            return input_ids, position_ids, 1
        input_ids = torch.tensor([[token for tail in tails for token in tail]], dtype=torch.long, device=device)
        position_ids = (prefix + self._column_of)[None, :]  # [1, N]
        last = torch.tensor([offset + n - 1 for offset, n in zip(self.offsets, self.new)], device=device)  # [A]
        return input_ids, position_ids, last

    def _plan_runs(self) -> list[tuple[int, int, int, int]]:
        """(first row, end row, first slot, columns read) of each attention call over the suffixes. A row with
        several new tokens (packed) is a call of its own; rows with one new token each (decoding) whose slots
        follow each other join one call over the columns of the longest, as long as that reads at most
        RUN_PADDING more columns per joined row than the rows hold."""
        runs: list[tuple[int, int, int, int]] = []
        for row, (slot, start, n) in enumerate(zip(self.slots, self.starts, self.new)):
            length = start + n
            if not self.packed and runs:
                first, end, first_slot, columns = runs[-1]
                if end == row and slot == first_slot + (end - first):
                    padding = (end - first) * (length - columns) if length > columns else columns - length
                    if padding <= RUN_PADDING:
                        runs[-1] = (first, end + 1, first_slot, max(columns, length))
                        continue
            runs.append((row, row + 1, slot, length))
        return runs

    # transformers' Cache protocol, as far as the attention modules use it.
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.store.pool[layer_idx]  # [S, Hkv, C, D]
        slots, n_kv, columns, head_dim = keys.shape
        if self._flat_columns is None:  # one index_copy_ per tensor (advanced-index assignment was ~7x slower)
            heads = torch.arange(n_kv, device=keys.device)
            self._flat_columns = ((self._slot_of[:, None] * n_kv + heads[None, :]) * columns
                                  + self._column_of[:, None]).reshape(-1)  # [N*Hkv]
        # key_states [Bq, Hkv, Lq, D]: tokens in input order (row-major over [Bq, Lq]), each [Hkv, D]
        for pool, states in ((keys, key_states), (values, value_states)):
            pool.view(slots * n_kv * columns, head_dim).index_copy_(
                0, self._flat_columns, states.transpose(1, 2).reshape(-1, head_dim))
        return key_states, value_states

    def _run_mask(self, run: int, like: torch.Tensor, groups: int) -> torch.Tensor | None:
        """The additive mask of a run: several rows' one new token each: [k, 1, 1, C], each row's columns past
        its own length hidden; one row's several new tokens: [G*n, start+n], token i sees columns <= start + i
        (g-major rows like the grouped queries); None for one row's one new token (it sees all its columns)."""
        if run not in self._masks:
            first, end, _, columns = self._runs[run]
            n, start = self.new[first], self.starts[first]
            if end - first > 1:
                lengths = torch.tensor([self.starts[r] + 1 for r in range(first, end)], device=like.device)  # [k]
                allowed = torch.arange(columns, device=like.device)[None, :] < lengths[:, None]  # [k, C]
                mask = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device)
                self._masks[run] = mask.masked_fill_(~allowed, float("-inf"))[:, None, None, :]
            elif n == 1:
                self._masks[run] = None
            else:
                allowed = (torch.arange(start + n, device=like.device)[None, :]
                           <= start + torch.arange(n, device=like.device)[:, None])  # [n, start+n]
                mask = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device)
                self._masks[run] = mask.masked_fill_(~allowed, float("-inf")).repeat(groups, 1)  # [G*n, start+n]
        return self._masks[run]

    def _attend_by_kernel(self, layer_idx: int, query: torch.Tensor, scale: float, use_prefix: bool) -> torch.Tensor:
        """Decoding rows' attention to the prefix and their own columns, merged, in one kernel call (see
        train/csrc/decode_attention.cpp): query [A, Hq, 1, D] -> [A, 1, Hq, D]."""
        if self._kernel_rows is None:
            self._kernel_rows = (torch.tensor(self.slots, dtype=torch.long),
                                 torch.tensor([start + 1 for start in self.starts], dtype=torch.long))
        keys, values = self.store.pool[layer_idx]  # [S, Hkv, C, D]
        if use_prefix and self.store.prefix_len:
            prefix_keys, prefix_values = (part[0] for part in self.store.prefix[layer_idx])  # [Hkv, P, D]
        else:
            prefix_keys = prefix_values = keys.new_empty((keys.shape[1], 0, keys.shape[3]))
        batch, n_heads, _, head_dim = query.shape
        out, _ = decode_attention(query.reshape(batch, n_heads, head_dim), keys, values, *self._kernel_rows,
                                  prefix_keys, prefix_values, scale)  # [A, Hq, D]
        return out.to(query.dtype)[:, None]

    def attend(self, layer_idx: int, query: torch.Tensor, scale: float, use_prefix: bool = True,
               use_kernel: bool | None = None) -> torch.Tensor:
        """Attention output [Bq, Lq, Hq, D] for query [Bq, Hq, Lq, D] ([A, Hq, 1, D] decoding, [1, Hq, N, D]
        packed). Decoding rows attend to their suffixes by the compiled kernel where it applies
        (train/decode_attention.py), else by runs of torch's kernel. `use_prefix=False` leaves the prefix out and
        `use_kernel=False` takes the runs (default: the step's `use_kernel`; for tests: the merge must matter, the
        two paths agree)."""
        batch, n_heads, width, head_dim = query.shape
        keys, values = self.store.pool[layer_idx]  # [S, Hkv, C, D]
        n_kv = keys.shape[1]
        groups = n_heads // n_kv
        if use_kernel is None:
            use_kernel = self.use_kernel
        if not self.packed and use_kernel and kernel_applies(query, keys):
            return self._attend_by_kernel(layer_idx, query, scale, use_prefix)
        suffix_out = query.new_empty((batch, n_heads, width, head_dim))  # [Bq, Hq, Lq, D]; every entry written
        suffix_lse = query.new_empty((batch, n_heads, width), dtype=torch.float32)  # [Bq, Hq, Lq]
        if self._runs is None:
            self._runs = self._plan_runs()
        for run, (first, end, slot, columns) in enumerate(self._runs):
            rows = end - first
            if self.packed:  # one row's n tokens: [1, Hq, n, D] -> [1, Hkv, G*n, D] (heads kv*G + g share kv)
                n, offset = self.new[first], self.offsets[first]
                run_query = query[:, :, offset : offset + n].reshape(1, n_kv, groups * n, head_dim)
            else:  # k rows' one token each: [k, Hq, 1, D] -> [k, Hkv, G, D]
                run_query = query[first:end].reshape(rows, n_kv, groups, head_dim)
            out, lse = _attend(run_query, keys[slot : slot + rows, :, :columns], values[slot : slot + rows, :, :columns],
                               self._run_mask(run, query, groups), scale)
            if self.packed:
                suffix_out[:, :, offset : offset + n] = out.reshape(1, n_heads, n, head_dim)
                suffix_lse[:, :, offset : offset + n] = lse.reshape(1, n_heads, n)
            else:
                suffix_out[first:end] = out.reshape(rows, n_heads, 1, head_dim)
                suffix_lse[first:end] = lse.reshape(rows, n_heads, 1)
        return self._merge_prefix(layer_idx, query, suffix_out, suffix_lse, scale, use_prefix)

    def _merge_prefix(self, layer_idx: int, query: torch.Tensor, suffix_out: torch.Tensor, suffix_lse: torch.Tensor,
                      scale: float, use_prefix: bool) -> torch.Tensor:
        """The suffix attention (suffix_out [Bq, Hq, Lq, D], suffix_lse [Bq, Hq, Lq]) merged with the prefix's
        by their log-sum-exps -> [Bq, Lq, Hq, D]."""
        batch, n_heads, width, head_dim = query.shape
        if not (use_prefix and self.store.prefix_len):
            return suffix_out.to(query.dtype).transpose(1, 2)
        n_kv = self.store.prefix[layer_idx][0].shape[1]
        groups = n_heads // n_kv
        prefix_keys, prefix_values = self.store.prefix[layer_idx]  # [1, Hkv, P, D]
        # every token's queries at once: [Bq, Hkv, G, Lq, D] -> [1, Hkv, G*Bq*Lq, D]
        grouped = query.reshape(batch, n_kv, groups, width, head_dim).permute(1, 2, 0, 3, 4)
        prefix_out, prefix_lse = _attend(grouped.reshape(1, n_kv, groups * batch * width, head_dim),
                                         prefix_keys, prefix_values, None, scale)
        prefix_out = prefix_out.reshape(n_kv, groups, batch, width, head_dim).permute(2, 0, 1, 3, 4)
        prefix_out = prefix_out.reshape(batch, n_heads, width, head_dim)  # [Bq, Hq, Lq, D]
        prefix_lse = prefix_lse.reshape(n_kv, groups, batch, width).permute(2, 0, 1, 3).reshape(batch, n_heads, width)
        total = torch.logaddexp(prefix_lse, suffix_lse)  # [Bq, Hq, Lq]
        merged = (prefix_out * torch.exp(prefix_lse - total)[..., None]
                  + suffix_out * torch.exp(suffix_lse - total)[..., None])
        return merged.to(query.dtype).transpose(1, 2)  # [Bq, Lq, Hq, D]


_ACTIVE_STEP: contextvars.ContextVar[SharedPrefixStep | None] = contextvars.ContextVar("shared_prefix_step",
                                                                                     default=None)


def shared_prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention interface: the active step's shared-prefix attention (key/value are in its store)."""
    del key, value, attention_mask
    step = _ACTIVE_STEP.get()
    if step is None:
        raise ValueError(f"attention {ATTENTION_NAME!r} runs only inside HFBackend's shared-prefix sampler "
                         "(it reads the keys/values of the active SharedPrefixStep)")
    if dropout or kwargs.get("sliding_window"):
        raise ValueError(f"attention {ATTENTION_NAME!r} supports neither dropout nor sliding windows")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return step.attend(module.layer_idx, query, scale), None


AttentionInterface.register(ATTENTION_NAME, shared_prefix_attention)


def base_config(model: torch.nn.Module) -> Any:
    """The base model's config (through a PEFT wrapper if there is one)."""
    return model.get_base_model().config if hasattr(model, "get_base_model") else model.config


def supports_shared_prefix(model: torch.nn.Module) -> bool:
    """Every layer is full attention (the store has no sliding windows)."""
    config = base_config(model)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:  # transformers' per-layer mask kinds, where the model declares them
        return all(kind == "full_attention" for kind in layer_types)
    return not getattr(config, "sliding_window", None)


@contextlib.contextmanager
def stepping(model: torch.nn.Module, step: SharedPrefixStep) -> Iterator[None]:
    """Inside the block `step` is the active step and `model` attends with ATTENTION_NAME (restored after)."""
    config = base_config(model)
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    token = _ACTIVE_STEP.set(step)
    try:
        yield
    finally:
        _ACTIVE_STEP.reset(token)
        config._attn_implementation = before


# A prefix shared by all prompts of a call is stored apart only when at least this long.
MIN_SHARED_PREFIX = 16
# Entries of the token-equality tensor built at once when matching prompts against held sequences.
MATCH_CHUNK_ELEMENTS = 1 << 24


def common_prefix_lengths(queries: Sequence[Sequence[int]], keys: Sequence[Sequence[int]]) -> torch.Tensor:
    """[Q, K] number of leading tokens query q shares with key k (vectorised, in chunks of queries)."""
    out = torch.zeros((len(queries), len(keys)), dtype=torch.long)  # [Q, K]
    if not queries or not keys:
        return out
    width = min(max(len(q) for q in queries), max(len(k) for k in keys))
    if width == 0:
        return out
    key_ids = torch.full((len(keys), width), -1, dtype=torch.long)  # [K, W]; -1 never equals a query's -2
    for row, ids in enumerate(keys):
        key_ids[row, : min(len(ids), width)] = torch.tensor(list(ids[:width]), dtype=torch.long)
    chunk = max(1, MATCH_CHUNK_ELEMENTS // max(1, len(keys) * width))
    for first in range(0, len(queries), chunk):
        part = queries[first : first + chunk]
        query_ids = torch.full((len(part), width), -2, dtype=torch.long)  # [q, W]
        for row, ids in enumerate(part):
            query_ids[row, : min(len(ids), width)] = torch.tensor(list(ids[:width]), dtype=torch.long)
        differs = query_ids[:, None, :] != key_ids[None, :, :]  # [q, K, W]
        first_difference = differs.int().argmax(-1)  # [q, K]; 0 when nothing differs
        out[first : first + len(part)] = torch.where(differs.any(-1), first_difference, width)
    return out


@dataclass
class _Row:
    """One prompt of a call: where its keys/values go and what is already there."""

    slot: int
    cached: int  # columns of its slot (after the prefix) that already hold its tokens
    suffix: list[int]  # the prompt after the shared prefix
    copy_of: int | None = None  # index of an earlier identical prompt of the call: copy its slot after prefill


class SharedPrefixSampler:
    """The decoding loop over a `SharedPrefixStore` (see the module docstring). `sample` returns, per prompt,
    the sampled tokens and their log-probs; the store keeps each row's keys/values for the next call."""

    def __init__(self, pad_token_id: int, keep: bool = True, decode_kernel: bool = True, lean_forward: bool = True,
                 compiled_ops: bool = True, fused_step: bool = True):
        self.pad_token_id = pad_token_id
        self.keep = keep  # keep the rows' keys/values for the next call (the prefix cache)
        # the compiled kernels where they apply: decoding attention (train/decode_attention.py); with
        # `compiled_ops`, the lean forward's projections and norms (train/small_linear.py, train/csrc/rms_norm.cpp);
        # with `fused_step` too, each decoding step's layers in one call (train/csrc/decode_step.cpp)
        self.decode_kernel = decode_kernel
        self.compiled_ops = decode_kernel and compiled_ops
        self.fused_step = self.compiled_ops and fused_step
        self.lean_forward = lean_forward  # forward passes by train/lean_forward.py where it applies
        self._lean: LeanForward | None = None  # the current call's runner's, where it applies
        self.store = SharedPrefixStore()
        self._linears = PackedLinears()  # packed weights: made with the store, dropped with it
        self.prefill_tokens = 0  # rows x columns run through the model before decoding

    def clear(self) -> None:
        """Drop the keys/values and the packed weights (both were computed from the weights: the backend clears
        the sampler whenever they change)."""
        self.store = SharedPrefixStore()
        self._linears = PackedLinears()

    def sample(self, runner: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               temperature: float, stop_token_ids: Sequence[int], generator: torch.Generator, max_batch_size: int
               ) -> list[tuple[list[int], list[float]]]:
        device = next(runner.parameters()).device
        like = self._kv_like(runner, device)
        if not self.keep:
            self.clear()
        n_layers = int(base_config(runner).num_hidden_layers)
        # for this call only; with the compiled kernels, its projections by the packed loop (train/small_linear.py)
        self._lean = (LeanForward.of(runner, self._linears if self.compiled_ops else None, self.fused_step)
                      if self.lean_forward else None)
        try:
            self._ensure_prefix(runner, prompts, like, n_layers)
            rows = self._claim([list(p[self.store.prefix_len :]) for p in prompts], like, n_layers, max_new_tokens)
            out: list[tuple[list[int], list[float]]] = []
            for first in range(0, len(rows), max_batch_size):
                for row in rows[first : first + max_batch_size]:
                    if row.copy_of is not None and row.copy_of < first:  # its twin was prefilled in an earlier batch
                        self.store.copy_slot(rows[row.copy_of].slot, row.slot, len(row.suffix) - 1)
                        row.cached, row.copy_of = len(row.suffix) - 1, None
                out += self._decode(runner, rows[first : first + max_batch_size], first, max_new_tokens,
                                    temperature, stop_token_ids, generator, device)
        finally:
            self._lean = None
        return out

    def _kv_like(self, runner: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """An empty [1, Hkv, 1, D] tensor of the model's dtype: the shape of one column of one layer."""
        config = base_config(runner)
        n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return torch.empty((1, n_kv, 1, head_dim), dtype=next(runner.parameters()).dtype, device=device)

    def _forward(self, runner: torch.nn.Module, store: SharedPrefixStore, slots: Sequence[int],
                 starts: Sequence[int], tails: Sequence[Sequence[int]], device: torch.device, prefill: bool = True
                 ) -> torch.Tensor:
        """Run each row's `tails[r]` (written from column starts[r] of slots[r]); returns the logits of each row's
        last token [A, V]. `prefill`: count the tokens in `prefill_tokens` (a decoding step is not a prefill)."""
        lean = self._lean if self._lean is not None and self._lean.model is runner else None
        if not prefill and lean is not None and lean.fused:  # a decoding step: one token a row
            return lean.decode(store, list(slots), list(starts), [tail[0] for tail in tails])  # [A, V]
        step = SharedPrefixStep(store, slots, starts, [len(t) for t in tails], device, self.decode_kernel)
        input_ids, position_ids, keep = step.model_input(tails, device)
        if prefill:
            self.prefill_tokens += input_ids.numel()
        if lean is not None:
            logits = lean.forward(step, input_ids, position_ids, keep)  # [Bq, K, V]
        else:
            with stepping(runner, step):
                logits = runner(input_ids=input_ids, attention_mask=None, position_ids=position_ids, cache=step,
                                use_cache=True, logits_to_keep=keep).logits
        return logits[0] if step.packed else logits[:, -1, :]  # [A, V]

    def _ensure_prefix(self, runner: torch.nn.Module, prompts: Sequence[Sequence[int]], like: torch.Tensor,
                       n_layers: int) -> None:
        """Keep the stored prefix (and the rows) when every prompt continues it, or when there is none and the
        prompts share less than MIN_SHARED_PREFIX tokens; otherwise start a new store whose prefix is the longest
        one all prompts share."""
        store = self.store
        if store.prefix_len and all(len(p) > store.prefix_len and list(p[: store.prefix_len]) == store.prefix_ids
                                    for p in prompts):
            return
        first = list(prompts[0])
        shared = int(common_prefix_lengths([first], [list(p) for p in prompts]).min())
        shared = min(shared, min(len(p) for p in prompts) - 1)  # every prompt keeps a token to run
        if shared < MIN_SHARED_PREFIX:
            if store.prefix_len:
                self.store = SharedPrefixStore()
            return
        self.store = store = SharedPrefixStore()
        scratch = SharedPrefixStore()
        scratch.reserve(n_layers, like, 1, shared)
        self._forward(runner, scratch, [0], [0], [first[:shared]], like.device)
        store.prefix = [(keys[:1, :, :shared].clone(), values[:1, :, :shared].clone()) for keys, values in scratch.pool]
        store.prefix_ids = first[:shared]

    def _claim(self, suffixes: list[list[int]], like: torch.Tensor, n_layers: int, max_new_tokens: int
               ) -> list[_Row]:
        """A slot per prompt: the held row it continues in place where it can, else a free one (filled by copying
        the columns it shares with a held row, or with an identical prompt of this call after its prefill).
        Held rows no prompt continues are freed."""
        store = self.store
        distinct: dict[tuple[int, ...], int] = {}
        copy_of = [distinct.setdefault(tuple(s), i) for i, s in enumerate(suffixes)]
        primaries = [i for i in range(len(suffixes)) if copy_of[i] == i]
        held = [(slot, ids) for slot, ids in enumerate(store.held) if ids is not None]
        shared = common_prefix_lengths([suffixes[i] for i in primaries], [ids for _, ids in held])  # [U, K]
        # Greedy by shared length: a prompt takes its best held row in place if no longer match took it first.
        order = sorted(((int(shared[u, k]), u, k) for u in range(len(primaries)) for k in range(len(held))
                        if shared[u, k] > 0), reverse=True)
        in_place: dict[int, tuple[int, int]] = {}  # primary -> (slot, shared)
        best: dict[int, tuple[int, int]] = {}  # primary -> (slot, shared) of its best held row
        taken: set[int] = set()
        for length, u, k in order:
            best.setdefault(primaries[u], (held[k][0], length))
            if primaries[u] not in in_place and held[k][0] not in taken:
                in_place[primaries[u]] = (held[k][0], length)
                taken.add(held[k][0])
        # The rest of the primaries and every copy need a free slot.
        needs = [i for i in range(len(suffixes)) if i not in in_place]
        columns = max(len(s) for s in suffixes) + max_new_tokens
        store.reserve(n_layers, like, len(taken) + len(needs), columns)
        free = [slot for slot in range(len(store.held)) if slot not in taken]
        rows: list[_Row] = []
        copies: list[tuple[int, int, int]] = []  # (source slot, target slot, columns)
        next_free = iter(free)
        for i, suffix in enumerate(suffixes):
            if i in in_place:
                slot, length = in_place[i]
                rows.append(_Row(slot, min(length, len(suffix) - 1), suffix))
                continue
            slot = next(next_free)
            if copy_of[i] != i:
                rows.append(_Row(slot, 0, suffix, copy_of=copy_of[i]))
            elif i in best:
                source, length = best[i]
                length = min(length, len(suffix) - 1)
                copies.append((source, slot, length))
                rows.append(_Row(slot, length, suffix))
            else:
                rows.append(_Row(slot, 0, suffix))
        for source, target, length in copies:  # before any forward writes into a source in place
            store.copy_slot(source, target, length)
        store.held = [None] * len(store.held)
        for row in rows:
            store.held[row.slot] = row.suffix[: row.cached]
        return rows

    def _decode(self, runner: torch.nn.Module, rows: list[_Row], first: int, max_new_tokens: int,
                temperature: float, stop_token_ids: Sequence[int], generator: torch.Generator,
                device: torch.device) -> list[tuple[list[int], list[float]]]:
        """Prefill and decode the rows of one batch (`first`: index of rows[0] in the call)."""
        store = self.store
        batch = len(rows)
        primaries = [r for r, row in enumerate(rows) if row.copy_of is None]
        logits = self._forward(runner, store, [rows[r].slot for r in primaries], [rows[r].cached for r in primaries],
                               [rows[r].suffix[rows[r].cached :] for r in primaries], device)  # [U, V]
        position = {r: u for u, r in enumerate(primaries)}
        by_prompt = {first + r: r for r in primaries}
        expand = []
        for r, row in enumerate(rows):
            if row.copy_of is not None:
                source = rows[by_prompt[row.copy_of]]
                store.copy_slot(source.slot, row.slot, len(row.suffix))
                expand.append(position[by_prompt[row.copy_of]])
            else:
                expand.append(position[r])
        logits = logits[torch.tensor(expand, device=device)]  # [B, V]
        lengths = [len(row.suffix) for row in rows]  # columns each row's slot holds
        stop = set(stop_token_ids)
        sampled: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        alive = list(range(batch))  # rows still decoding, in batch order
        for step in range(max_new_tokens):
            uniforms = step_uniforms(batch, generator, device)  # [B]: one per row of the batch, every step
            tokens, token_logprobs = choose_tokens(logits, temperature, uniforms[torch.tensor(alive, device=device)])
            still = []
            for r, token, logprob in zip(alive, tokens.tolist(), token_logprobs.tolist()):
                sampled[r].append(token)
                logprobs[r].append(logprob)
                if token not in stop:
                    still.append((r, token))
            if not still or step + 1 == max_new_tokens:
                break
            alive = [r for r, _ in still]
            logits = self._forward(runner, store, [rows[r].slot for r in alive], [lengths[r] for r in alive],
                                   [[token] for _, token in still], device, prefill=False)  # [A, V]
            for r in alive:
                lengths[r] += 1
        for r, row in enumerate(rows):  # the prompt and the sampled tokens that went through the model
            store.held[row.slot] = row.suffix + sampled[r][: lengths[r] - len(row.suffix)]
        return [(sampled[r], logprobs[r]) for r in range(batch)]
