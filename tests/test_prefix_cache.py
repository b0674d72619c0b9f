"""HFBackend's prefix cache, in both KV layouts: the same samples as the padded layout without a cache, and the
prefill it saves is really saved."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from game_registry import get_game
from train.backends import HFBackend, SamplingParams, common_prefix_lengths
from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes, start_episode
from train.policy import load_base_model

REPO = Path(__file__).resolve().parent.parent


def _storefront():
    overrides = yaml.safe_load((REPO / "configs/storefront/cpu_demo.yaml").read_text())
    return get_game("storefront"), overrides


def _vault():
    import toy_games

    return toy_games.make_spec(max_turns=4), {}


def _lora(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a PEFT LoRA with non-zero weights (B starts at zero, which would change nothing)."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                  task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return peft_model


def _same_completions(got, expected):
    for a, b in zip(got, expected, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


LAYOUTS = ("padded", "shared_prefix")


# Temperature 1 samples from two numerically different paths agree token for token only until a draw lands
# within float rounding (~1e-7) of a cumulative-probability boundary (train/sampling.py): measured on the
# LoRA'd vault episodes, 3 of 3,685 draws within 1e-6 of one, and one exact tie that flips a token between
# the padded layout with and without its cache. The LoRA'd case, in the default suite, samples greedily.
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("game, peft, temperature", [
    pytest.param("storefront", False, 1.0, marks=pytest.mark.slow),  # ~8 s
    pytest.param("vault", False, 1.0, marks=pytest.mark.slow),  # ~3 s; vault-True stays
    ("vault", True, 0.0)])
def test_multi_turn_episodes_with_the_prefix_cache_equal_those_without(tiny_model_dir, game, peft, temperature,
                                                                       layout):
    model, tokenizer = load_base_model(str(tiny_model_dir))
    if peft:
        model = _lora(model)
    spec, overrides = _storefront() if game == "storefront" else _vault()
    chat = ChatTokenizer(tokenizer)
    requests = [EpisodeRequest(seed, sample) for seed in (3, 4) for sample in range(3)]  # 2 GRPO groups of 3
    runs = {}
    for cached in (False, True):
        backend = HFBackend(model, tokenizer.pad_token_id, seed=11, prefix_cache=cached,
                            kv_layout=layout if cached else "padded")
        prompt_len = len(start_episode(spec, spec.make(**overrides), requests[0], chat).token_ids)
        episodes = run_episodes(spec, requests, backend, chat, temperature=temperature,
                                max_episode_tokens=prompt_len + 600, game_overrides=overrides)
        runs[cached] = (episodes, backend.prefill_stats)
    (plain, plain_stats), (fast, fast_stats) = runs[False], runs[True]
    assert max(ep.n_turns for ep in plain) >= 2  # the cache is continued across turns
    for a, b in zip(fast, plain, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.n_turns == b.n_turns
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    assert fast_stats.prompt_tokens == plain_stats.prompt_tokens
    assert fast_stats.prefill_tokens * 3 < plain_stats.prefill_tokens


def _pair(model, layout="padded", **kw):
    """Two backends with the same seed: `layout` with the prefix cache, and the padded layout without it."""
    return (HFBackend(model, 0, seed=2, prefix_cache=True, kv_layout=layout, **kw),
            HFBackend(model, 0, seed=2, prefix_cache=False, kv_layout="padded", **kw))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefill_runs_only_what_no_cache_holds(tiny_model_dir, layout):
    model, _ = load_base_model(str(tiny_model_dir))
    fast, plain = _pair(model, layout)
    params = SamplingParams(max_new_tokens=5, temperature=1.0)  # no stop token: every row runs 5 steps
    prompt = [(7 * i) % 300 + 20 for i in range(40)]

    # A GRPO group: 4 identical prompts are prefilled once, on one row (shared-prefix layout: the first 39 tokens
    # as the shared prefix, the last one on one slot, copied to the other three).
    first = fast.generate([prompt] * 4, params)
    _same_completions(first, plain.generate([prompt] * 4, params))
    assert fast.prefill_stats.prefill_tokens == 40
    assert len({tuple(c.token_ids) for c in first}) > 1  # the rows still sample on their own

    # The next turn: each row continues its own sequence (prompt + 4 sampled tokens that went through the
    # model; the 5th was sampled last and never run) + 7 observation tokens: 1 + 7 new tokens per row.
    observation = [31, 32, 33, 34, 35, 36, 37]
    second = [prompt + c.token_ids + observation for c in first]
    _same_completions(fast.generate(second, params), plain.generate(second, params))
    assert fast.prefill_stats.prefill_tokens == 40 + 4 * 8

    # Row 0 continues only part of its kept sequence (an episode cut its completion to 2 tokens), row 1 all
    # of it; rows 2 and 3 are not continued (their cache is dropped). 3 new tokens on each row.
    replies = fast.generate(second, params)
    _same_completions(replies, plain.generate(second, params))
    before = fast.prefill_stats.prefill_tokens
    third = [second[0] + replies[0].token_ids[:2] + [60, 61, 62], second[1] + replies[1].token_ids + [40, 41]]
    _same_completions(fast.generate(third, params), plain.generate(third, params))
    assert fast.prefill_stats.prefill_tokens - before == 2 * 3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_distinct_prompts_sharing_a_prefix_prefill_it_once(tiny_model_dir, layout):
    model, _ = load_base_model(str(tiny_model_dir))
    fast, plain = _pair(model, layout)
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    shared = [(5 * i) % 300 + 20 for i in range(30)]
    prompts = [shared + [50 + t] * 10 for t in range(2) for _ in range(2)]  # 2 tasks x 2 samples, left-padded alike
    prompts.append(shared[:20] + [99] * 3)  # a shorter prompt sharing 20 tokens: left padding in the same batch
    _same_completions(fast.generate(prompts, params), plain.generate(prompts, params))
    # The 3 distinct prompts share 20 tokens, prefilled once on their own. Padded: then one pass over the last
    # 40 - 20 columns of 3 distinct rows; shared prefix: each distinct prompt's own 20, 20 and 3 tokens, packed.
    assert fast.prefill_stats.prefill_tokens == (20 + 3 * 20 if layout == "padded" else 20 + 20 + 20 + 3)
    assert plain.prefill_stats.prefill_tokens == 5 * 40


def _everything(prompts, layout):
    """Prefill tokens of a call that continues nothing (prompts sharing no prefix): padded rows x the longest
    prompt; shared prefix: every prompt's own tokens, packed."""
    return len(prompts) * max(len(p) for p in prompts) if layout == "padded" else sum(len(p) for p in prompts)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_changed_weights_are_never_continued(tiny_model_dir, layout):
    model, _ = load_base_model(str(tiny_model_dir))
    fast, plain = _pair(model, layout)
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    prompts = [[(3 * i + r) % 300 + 20 for i in range(30)] for r in range(3)]
    first = fast.generate(prompts, params)
    _same_completions(first, plain.generate(prompts, params))
    with torch.no_grad():  # an optimizer step, in place (no sync_weights call)
        for parameter in model.parameters():
            parameter.mul_(1.5)
    second = [p + c.token_ids + [40, 41] for p, c in zip(prompts, first)]
    before = fast.prefill_stats.prefill_tokens
    _same_completions(fast.generate(second, params), plain.generate(second, params))
    assert fast.prefill_stats.prefill_tokens - before == _everything(second, layout)  # all of it again
    # sync_weights drops the cache too
    third = [p + [42] for p in second]
    fast.sync_weights(None, 1)
    before = fast.prefill_stats.prefill_tokens
    _same_completions(fast.generate(third, params), plain.generate(third, params))
    assert fast.prefill_stats.prefill_tokens - before == _everything(third, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_disabled_lora_is_not_continued_with_the_lora_cache(tiny_model_dir, layout):
    model = _lora(load_base_model(str(tiny_model_dir))[0])
    fast, plain = _pair(model, layout)
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    prompts = [[(3 * i + r) % 300 + 20 for i in range(30)] for r in range(2)]
    first = fast.generate(prompts, params)
    _same_completions(first, plain.generate(prompts, params))
    second = [p + c.token_ids + [40] for p, c in zip(prompts, first)]
    before = fast.prefill_stats.prefill_tokens
    with model.disable_adapter():  # the base model: no tensor changes
        _same_completions(fast.generate(second, params), plain.generate(second, params))
    assert fast.prefill_stats.prefill_tokens - before == _everything(second, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_lora_policy_is_sampled_merged_and_re_merged_after_each_weight_change(tiny_model_dir, layout):
    model = _lora(load_base_model(str(tiny_model_dir))[0])
    merged = HFBackend(model, 0, seed=2, merge_lora=True, kv_layout=layout)
    live = HFBackend(model, 0, seed=2, merge_lora=False, kv_layout="padded")
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    prompts = [[(3 * i + r) % 300 + 20 for i in range(30)] for r in range(3)]
    _same_completions(merged.generate(prompts, params), live.generate(prompts, params))
    runner = merged._runner
    assert runner is not model and not any(hasattr(m, "lora_A") for m in runner.modules())  # really merged
    with torch.no_grad():  # an optimizer step on the adapter, in place
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(-2.0)
    _same_completions(merged.generate(prompts, params), live.generate(prompts, params))  # re-merged
    assert merged._runner is not runner
    with model.disable_adapter():  # the base model: sampled live, not through the merged copy
        _same_completions(merged.generate(prompts, params), live.generate(prompts, params))
        assert merged._runner is model


def test_a_lora_on_a_tied_lm_head_is_sampled_live(tiny_model_dir):
    """Merging a LoRA on lm_head into a model whose lm_head is tied to the embeddings would change both."""
    from peft import LoraConfig, get_peft_model

    model, _ = load_base_model(str(tiny_model_dir))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    sampler = HFBackend(model, 0, seed=2)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    prompts = [[(3 * i + r) % 300 + 20 for i in range(30)] for r in range(2)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # PEFT warns when asked to merge into a tied weight
        got = sampler.generate(prompts, params)
    assert sampler._runner is model
    _same_completions(got, HFBackend(model, 0, seed=2, merge_lora=False).generate(prompts, params))


def test_prefix_cache_off_prefills_everything_and_bounds_what_is_kept(tiny_model_dir):
    model, _ = load_base_model(str(tiny_model_dir))
    fast, plain = _pair(model, "padded", max_batch_size=2)
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    prompts = [[(11 * i + r) % 300 + 20 for i in range(12 + r)] for r in range(5)]
    _same_completions(fast.generate(prompts, params), plain.generate(prompts, params))
    assert plain.prefill_stats.prefill_tokens == 2 * 13 + 2 * 15 + 1 * 16  # chunks of 2: rows x longest
    assert len(fast._kept) == 3 and not plain._kept  # one entry per chunk of the last call, none without cache
    fast.generate([[1, 2, 3]], params)
    assert len(fast._kept) == 1  # sequences the call did not continue are dropped


def test_the_shared_prefix_layout_keeps_one_slot_per_continued_row(tiny_model_dir):
    model, _ = load_base_model(str(tiny_model_dir))
    fast, plain = _pair(model, "shared_prefix", max_batch_size=2)
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    prompts = [[(11 * i + r) % 300 + 20 for i in range(12 + r)] for r in range(5)]
    first = fast.generate(prompts, params)  # three decoding batches of at most 2 rows
    _same_completions(first, plain.generate(prompts, params))
    assert fast.prefill_stats.prefill_tokens == _everything(prompts, "shared_prefix")
    assert sum(ids is not None for ids in fast._shared.store.held) == 5
    second = [prompts[1] + first[1].token_ids + [7], prompts[3] + first[3].token_ids + [8, 9]]
    before = fast.prefill_stats.prefill_tokens
    _same_completions(fast.generate(second, params), plain.generate(second, params))
    # each continues its own slot: the last sampled token (never run) and the observation
    assert fast.prefill_stats.prefill_tokens - before == 2 + 3
    assert sum(ids is not None for ids in fast._shared.store.held) == 2  # rows the call did not continue are freed
    fast.generate([[1, 2, 3]], params)  # shares nothing with the stored rows: a new store
    assert sum(ids is not None for ids in fast._shared.store.held) == 1


def test_common_prefix_lengths():
    got = common_prefix_lengths([[1, 2, 3], [1, 2], [4]], [[1, 2, 3, 4], [1, 5], []])
    assert got.tolist() == [[3, 1, 0], [2, 1, 0], [0, 0, 0]]


@pytest.mark.parametrize("mode", ["token", "trajectory"])
def test_routed_gate_model_samples_the_same_with_the_cache(tmp_path, mode):
    """Token routing samples through the shared-prefix layout; trajectory routing cannot continue a cache and
    falls back to the padded layout, prefilling everything."""
    from moe_gate import build_capability_model
    from moe_gate.smoke_test import make_adapters, make_tiny_base, randomise_gate

    model = build_capability_model(make_tiny_base(), make_adapters(tmp_path, make_tiny_base), mode=mode).eval()
    randomise_gate(model, seed=3)
    fast, plain = _pair(model, "shared_prefix")
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    prompts = [[5, 17, 33, 8, 61, 2, 44, 9, 70, 12]] * 2 + [[3, 90, 41, 7, 25, 66]] * 2  # [B, T], left-padded rows
    first = fast.generate(prompts, params)
    _same_completions(first, plain.generate(prompts, params))
    second = [p + c.token_ids + [11, 12] for p, c in zip(prompts, first)]
    _same_completions(fast.generate(second, params), plain.generate(second, params))
    if mode == "token":  # each token routes on its own: the cache is used
        assert fast.prefill_stats.prefill_tokens < plain.prefill_stats.prefill_tokens
    else:  # the route is decided per sequence on the prefill pass: everything is prefilled
        assert fast.prefill_stats == plain.prefill_stats


def test_rows_that_stop_leave_the_batch_and_their_samples_stay_the_same(tiny_model_dir):
    """Finished rows are dropped from the decoding batch (and their keys/values kept for the next turn): the
    same greedy tokens and log-probs as a sampler that decodes every row to the end, with fewer rows run."""
    model = _lora(load_base_model(str(tiny_model_dir))[0])  # varied greedy tokens (the random base repeats one)
    prompts = [[(11 * i + 3 * row) % 300 + 20 for i in range(12 + row)] for row in range(8)]
    free = HFBackend(model, 0, prefix_cache=False).generate(prompts, SamplingParams(max_new_tokens=12, temperature=0))
    # Each row stops where it first emits a token of its own: rows finish at different steps.
    stops = tuple(sorted({c.token_ids[min(row, 9)] for row, c in enumerate(free)}))
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=stops)

    rows_run = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: rows_run.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        dropping = HFBackend(model, 0, prefix_cache=True, merge_lora=False)  # the hook counts the live model's rows
        first = dropping.generate(prompts, params)
        dropped_rows = list(rows_run)
        model.supports_row_dropping = False  # the reference: every row decodes until the last one stops
        rows_run.clear()
        keeping = HFBackend(model, 0, prefix_cache=True, merge_lora=False)
        _same_completions(first, keeping.generate(prompts, params))
        kept_rows = list(rows_run)
    finally:
        hook.remove()
        del model.supports_row_dropping
    lengths = sorted(len(c.token_ids) for c in first)
    assert lengths[0] < lengths[-1]  # rows did stop at different steps
    assert sum(dropped_rows) < sum(kept_rows) and min(dropped_rows) < len(prompts)

    # The next turn continues every row from the keys/values kept, dropped rows included.
    second = [p + c.token_ids + [40, 41, 42] for p, c in zip(prompts, first)]
    before = dropping.prefill_stats.prefill_tokens
    _same_completions(dropping.generate(second, params),
                      HFBackend(model, 0, prefix_cache=False).generate(second, params))
    # At most the stop token (sampled last, never run) + 3 observation tokens + a few recomputed columns per row.
    assert dropping.prefill_stats.prefill_tokens - before <= len(second) * (4 + max(lengths) - min(lengths))
