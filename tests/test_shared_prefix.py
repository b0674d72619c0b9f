"""Shared-prefix attention (train/shared_prefix.py): the merged attention equals plain attention over the whole
sequence, and the sampler built on it gives the padded layout's episodes on the demo's base agent."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from game_registry import get_game
from train import shared_prefix
from train.backends import HFBackend, SamplingParams
from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes
from train.policy import load_base_model
from train.decode_attention import decode_attention, kernel_available
from train.shared_prefix import (SharedPrefixStep, SharedPrefixStore, _attend, _attend_reference,
                                 supports_shared_prefix)

REPO = Path(__file__).resolve().parent.parent
DEMO_AGENT = REPO / "assets/demo_base_agent"


def _store(n_kv: int, head_dim: int, prefix_len: int, lengths: list[int], seed: int = 0
           ) -> tuple[SharedPrefixStore, torch.Generator]:
    """A one-layer store: a random prefix and random keys/values in slots 0..len(lengths)-1 (plus a spare slot
    holding large values, which a wrong mask would read)."""
    generator = torch.Generator().manual_seed(seed)
    store = SharedPrefixStore()
    like = torch.empty((1, n_kv, 1, head_dim))
    store.reserve(1, like, len(lengths) + 1, max(lengths) + 8)
    keys, values = store.pool[0]
    keys.normal_(generator=generator)
    values.normal_(generator=generator)
    keys[len(lengths)] *= 50
    if prefix_len:
        store.prefix = [(torch.randn((1, n_kv, prefix_len, head_dim), generator=generator),
                         torch.randn((1, n_kv, prefix_len, head_dim), generator=generator))]
        store.prefix_ids = list(range(prefix_len))
    return store, generator


def _plain_attention(store: SharedPrefixStore, slot: int, columns: int, query: torch.Tensor, first: int,
                     scale: float) -> torch.Tensor:
    """Causal attention of query [Hq, n, D] (tokens at suffix columns first..first+n-1) over prefix + slot
    columns, computed over one concatenated sequence: [n, Hq, D]."""
    keys, values = store.pool[0]
    if store.prefix_len:
        prefix_keys, prefix_values = store.prefix[0]
        all_keys = torch.cat([prefix_keys[0], keys[slot, :, :columns]], 1)  # [Hkv, P + L, D]
        all_values = torch.cat([prefix_values[0], values[slot, :, :columns]], 1)
    else:
        all_keys, all_values = keys[slot, :, :columns], values[slot, :, :columns]
    groups = query.shape[0] // all_keys.shape[0]
    all_keys = all_keys.repeat_interleave(groups, 0)  # [Hq, P + L, D]
    all_values = all_values.repeat_interleave(groups, 0)
    n = query.shape[1]
    scores = query @ all_keys.transpose(-1, -2) * scale  # [Hq, n, P + L]
    seen = torch.arange(all_keys.shape[1])[None, :] <= store.prefix_len + first + torch.arange(n)[:, None]
    scores = scores.masked_fill(~seen, float("-inf"))
    return (scores.softmax(-1) @ all_values).transpose(0, 1)  # [n, Hq, D]


@pytest.mark.parametrize("path", ["kernel", "runs"])  # the compiled kernel; torch's kernel per run of rows
@pytest.mark.parametrize("prefix_len", [0, 23])
@pytest.mark.parametrize("groups", [1, 3])  # 3: grouped-query attention (3 query heads per key/value head)
def test_decoding_step_equals_plain_attention(prefix_len, groups, path):
    n_kv, head_dim, scale = 2, 32, 0.3
    lengths = [5, 9, 30, 31, 2, 400, 7]  # rows in consecutive slots join calls; 400 reads alone
    store, generator = _store(n_kv, head_dim, prefix_len, lengths)
    starts = [n - 1 for n in lengths]  # each row's new token is its last column
    slots = [3, 0, 1, 2, 4, 5, 6]  # one row out of slot order
    step = SharedPrefixStep(store, slots, starts, [1] * len(lengths), torch.device("cpu"),
                            use_kernel=path == "kernel")
    if path == "runs":
        assert len(step._plan_runs()) < len(lengths)  # some rows share a call (the padding rule)
    else:
        _require_kernel()
    query = torch.randn((len(lengths), n_kv * groups, 1, head_dim), generator=generator)  # [A, Hq, 1, D]
    got = step.attend(0, query, scale)  # [A, 1, Hq, D]
    for row, length in enumerate(lengths):
        expected = _plain_attention(store, slots[row], length, query[row], length - 1, scale)
        torch.testing.assert_close(got[row], expected, atol=2e-6, rtol=1e-5)
    if prefix_len:  # the prefix's share is really merged in: leaving it out changes the output
        assert not torch.allclose(step.attend(0, query, scale, use_prefix=False), got, atol=1e-3)


def _require_kernel() -> None:
    """The kernel's tests fail, not skip, where it was not built: the sampler would silently be slower."""
    if not kernel_available():
        pytest.fail("the compiled CPU kernels (train/cpu_kernels.py) are not available on this machine: "
                    "see the warning logged when it was built (a C++ compiler and ninja are needed), or set "
                    "TRACE_CPU_KERNELS=0 to run without them")


@pytest.mark.parametrize("head_dim,query_scale", [(32, 1.0), (64, 1.0), (128, 1.0), (32, 30.0)])
def test_kernel_equals_reference_attention(head_dim, query_scale):
    """The kernel on a pool with garbage past each row's length and a prefix: plain softmax attention over the
    prefix's columns then the row's own, per query head (GQA: 2 query heads per key/value head). Lengths cover
    whole blocks of eight columns and tails; query_scale 30 spreads the scores over hundreds, so most weights
    underflow (the kernel's own exponential below -87)."""
    _require_kernel()
    generator = torch.Generator().manual_seed(head_dim + int(query_scale))
    slots_n, n_kv, columns, prefix_len = 5, 3, 64, 11
    keys = torch.randn((slots_n, n_kv, columns, head_dim), generator=generator)  # [S, Hkv, C, D]
    values = torch.randn((slots_n, n_kv, columns, head_dim), generator=generator)
    prefix_keys = torch.randn((n_kv, prefix_len, head_dim), generator=generator)  # [Hkv, P, D]
    prefix_values = torch.randn((n_kv, prefix_len, head_dim), generator=generator)
    slots, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 64, 17])
    query = torch.randn((3, 2 * n_kv, head_dim), generator=generator) * query_scale  # [A, Hq, D]
    out, lse = decode_attention(query, keys, values, slots, lengths, prefix_keys, prefix_values, 0.2)
    for row, (slot, length) in enumerate(zip(slots.tolist(), lengths.tolist())):
        all_keys = torch.cat([prefix_keys, keys[slot, :, :length]], 1).repeat_interleave(2, 0)  # [Hq, P+L, D]
        all_values = torch.cat([prefix_values, values[slot, :, :length]], 1).repeat_interleave(2, 0)
        scores = (all_keys @ query[row][:, :, None])[..., 0] * 0.2  # [Hq, P+L]
        torch.testing.assert_close(out[row], (scores.softmax(-1)[:, None, :] @ all_values)[:, 0], atol=2e-6,
                                   rtol=1e-5)
        torch.testing.assert_close(lse[row], scores.logsumexp(-1), atol=2e-6 * query_scale, rtol=1e-5)
    empty = prefix_keys[:, :0]
    no_prefix, _ = decode_attention(query, keys, values, slots, lengths, empty, empty, 0.2)
    assert not torch.allclose(no_prefix, out, atol=1e-3)  # the prefix's share is in the output
    keys[0, 0, 40] = float("nan")  # a poisoned key in row 1's columns shows in its output, not in the others'
    poisoned, _ = decode_attention(query, keys, values, slots, lengths, prefix_keys, prefix_values, 0.2)
    assert poisoned[1, :2].isnan().all() and not poisoned[[0, 2]].isnan().any() and not poisoned[1, 2:].isnan().any()


@pytest.mark.parametrize("prefix_len", [0, 17])
def test_packed_prefill_equals_plain_causal_attention(prefix_len):
    n_kv, head_dim, scale, groups = 2, 8, 0.25, 2
    held = [0, 12, 3]  # columns each slot holds before the step
    new = [6, 1, 9]  # tokens each row runs (packed into one sequence)
    store, generator = _store(n_kv, head_dim, prefix_len, [h + n for h, n in zip(held, new)])
    slots = [2, 0, 1]  # rows need not sit in slot order
    step = SharedPrefixStep(store, slots, held, new, torch.device("cpu"))
    assert step.packed
    query = torch.randn((1, n_kv * groups, sum(new), head_dim), generator=generator)  # [1, Hq, N, D]
    # the keys/values of the new tokens go into the slots first, as the model's cache.update does
    new_keys = torch.randn((1, n_kv, sum(new), head_dim), generator=generator)
    step.update(new_keys, new_keys * 2, 0)
    got = step.attend(0, query, scale)[0]  # [N, Hq, D]
    keys, values = store.pool[0]
    offset = 0
    for slot, start, n in zip(slots, held, new):
        torch.testing.assert_close(keys[slot, :, start : start + n], new_keys[0, :, offset : offset + n])
        torch.testing.assert_close(values[slot, :, start : start + n], 2 * new_keys[0, :, offset : offset + n])
        expected = _plain_attention(store, slot, start + n, query[0, :, offset : offset + n], start, scale)
        torch.testing.assert_close(got[offset : offset + n], expected, atol=2e-6, rtol=1e-5)
        offset += n


def test_fused_kernel_and_reference_agree():
    generator = torch.Generator().manual_seed(1)
    query = torch.randn((3, 2, 4, 8), generator=generator)
    keys, values = torch.randn((3, 2, 11, 8), generator=generator), torch.randn((3, 2, 11, 8), generator=generator)
    mask = torch.zeros((3, 1, 1, 11))
    mask[1, ..., 7:] = float("-inf")
    out, lse = _attend(query, keys, values, mask, 0.4)
    ref_out, ref_lse = _attend_reference(query, keys, values, mask, 0.4)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-5)


def test_the_attention_refuses_to_run_outside_a_step():
    with pytest.raises(ValueError, match="shared-prefix sampler"):
        shared_prefix.shared_prefix_attention(torch.nn.Module(), torch.zeros(1, 1, 1, 2), None, None, None)


@pytest.mark.slow  # ~9 s: 48 whole storefront episodes; the default suite keeps the prefix cache's multi-turn
# parity (tests/test_prefix_cache.py) and the fused step's (tests/test_lean_forward.py)
def test_greedy_storefront_episodes_equal_the_padded_layout_on_the_demo_agent():
    """The demo's base agent plays 24 storefront tasks greedily with each layout: the same episodes token for
    token, and the same log-probs to 1e-4 (and those of a full forward, which the trainer uses)."""
    model, tokenizer = load_base_model(str(DEMO_AGENT))
    spec = get_game("storefront")
    overrides = yaml.safe_load((REPO / "configs/storefront/cpu_demo.yaml").read_text())
    chat = ChatTokenizer(tokenizer)
    requests = [EpisodeRequest(2_000_000 + task, 0) for task in range(24)]
    runs = {}
    for layout in ("padded", "shared_prefix"):
        backend = HFBackend(model, tokenizer.pad_token_id, seed=0, kv_layout=layout)
        runs[layout] = run_episodes(spec, requests, backend, chat, temperature=0.0, max_episode_tokens=1100,
                                    game_overrides=overrides)
    padded, shared = runs["padded"], runs["shared_prefix"]
    assert max(ep.n_turns for ep in shared) >= 3  # multi-turn: the kept slots are continued
    for a, b in zip(shared, padded, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.summary == b.summary
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    # the sampler's log-probs are the model's: a plain forward over the whole episode gives them
    episode = shared[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([episode.token_ids])).logits[0, :-1]  # [T-1, V]
    scored = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(episode.token_ids[1:])[:, None])[:, 0]
    sampled = torch.tensor(episode.logprobs[1:])
    generated = torch.tensor(episode.loss_mask[1:], dtype=torch.bool)
    torch.testing.assert_close(sampled[generated], scored[generated], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_other_architectures_with_grouped_query_attention_sample_the_same(family):
    """A Llama (SmolLM2's architecture: no q/k norms) and a Qwen2 model with 3 query heads per key/value head, random
    weights: both layouts give the same tokens and log-probs over two turns, prompts sharing a 24-token prefix."""
    import transformers

    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                 "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[family]
    torch.manual_seed(0)
    config = config_class(vocab_size=300, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512)
    model = model_class(config).eval()
    assert supports_shared_prefix(model)
    shared = [(7 * i) % 250 + 20 for i in range(24)]
    prompts = [shared + [30 + row] * (3 + row) for row in range(4)]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    runs = {}
    for layout in ("padded", "shared_prefix"):
        backend = HFBackend(model, 0, seed=5, kv_layout=layout)
        first = backend.generate(prompts, params)
        second = backend.generate([p + c.token_ids + [9, 10] for p, c in zip(prompts, first)], params)
        runs[layout] = first + second
    for a, b in zip(runs["shared_prefix"], runs["padded"], strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    assert model.config._attn_implementation != shared_prefix.ATTENTION_NAME  # switched back after each pass


@pytest.mark.slow  # ~4 s: a subprocess that samples with the kernels refused
def test_a_machine_that_cannot_build_the_kernel_samples_without_it(tmp_path):
    """No working compiler: one warning naming why, kernel_available() False, and a decoding step attends by
    torch's kernel with the same result (run in a fresh interpreter: the build is cached per process)."""
    script = (
        "import logging, torch; logging.basicConfig()\n"
        "from train import decode_attention\n"
        "from train.shared_prefix import SharedPrefixStep, SharedPrefixStore\n"
        "print('available', decode_attention.kernel_available())\n"
        "store = SharedPrefixStore(); store.reserve(1, torch.empty((1, 2, 1, 32)), 2, 16)\n"
        "store.pool[0][0].normal_(); store.pool[0][1].normal_()\n"
        "step = SharedPrefixStep(store, [0, 1], [3, 9], [1, 1], torch.device('cpu'))\n"
        "query = torch.randn((2, 2, 1, 32))\n"
        "print('same', torch.allclose(step.attend(0, query, 0.2), step.attend(0, query, 0.2, use_kernel=False)))\n")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "CXX": "/bin/false", "TRACE_CPU_KERNELS": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "available False" in result.stdout and "same True" in result.stdout
    assert result.stderr.count("CPU kernels not built") == 1
