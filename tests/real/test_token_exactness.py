"""Exact tokens with a real byte-level BPE and a real (tool-less ChatML) template: SmolLM2 on storefront.

Multi-turn storefront episodes are sampled in process; every backend call is recorded. Then:

- the ids the trainer scores (the episode's ids; a hinted episode's rescored under the base prompt) hold
  exactly the sampled ids at loss_mask 1 and nothing else there: observation and prompt tokens are masked,
  and a turn that ended on <|im_end|> trains that stop token;
- each prompt sent to the sampler is the episode's ids up to that turn (the context only ever grows);
- independently of the incremental bookkeeping, the episode's ids decode to the text the chat template
  renders for the whole conversation at once (assistant turns as sampled), so observation tokens carry
  exactly the template's text: a glue newline dropped, or a tool result rendered differently in the
  observation than in a prompt, fails here.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import pytest
import torch

from common.chat_render import render_messages, template_renders_tools
from game_registry import get_game
from train.backends import Completion, HFBackend, RolloutBackend, SamplingParams
from train.episodes import ChatTokenizer, EpisodeRequest, rescored_under_base_prompt, run_episodes

pytestmark = pytest.mark.real


class RecordingBackend(RolloutBackend):
    """Passes calls to `inner` and keeps every (prompt, completion) pair."""

    def __init__(self, inner: RolloutBackend):
        self.inner = inner
        self.calls: list[tuple[list[int], Completion]] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        completions = self.inner.generate(prompts, params)
        self.calls.extend((list(p), c) for p, c in zip(prompts, completions))
        return completions


class ExpertTokensBackend(RolloutBackend):
    """The game's expert as a policy: its text for the one active episode, as the real tokenizer encodes it,
    ended by <|im_end|>. Gives episodes with tool calls and tool results, which a 135M model rarely writes."""

    def __init__(self, chat: ChatTokenizer):
        self.chat = chat
        self.games: list = []  # filled by the spec's make_env wrapper, one game per episode

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if len(prompts) != 1 or len(self.games) != 1:
            raise RuntimeError("ExpertTokensBackend plays one episode at a time")
        ids = self.chat.encode(self.games[0].oracle_response()) + [self.chat.im_end_id]
        return [Completion(ids[: params.max_new_tokens], [0.0] * min(len(ids), params.max_new_tokens),
                           "stop" if len(ids) <= params.max_new_tokens else "length")]


THREE_REQUESTS = {"request_counts": (0.0, 0.0, 1.0)}


@pytest.fixture(scope="module")
def real_tokenizer(real_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(real_model_dir))


@pytest.fixture(scope="module", params=["smollm2", "expert"])
def episodes(request, real_model_dir, real_tokenizer):
    """(tokenizer, chat, spec, recording backend, episodes) of storefront episodes sampled by SmolLM2 itself
    (two: one base, one hinted) or played by the expert through the real tokenizer (one, with tool calls)."""
    tokenizer = real_tokenizer
    chat = ChatTokenizer(tokenizer)
    spec = get_game("storefront")
    if request.param == "smollm2":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(real_model_dir), dtype=torch.float32).eval()
        # Short turns so that three turns fit the time budget; cut turns (no <|im_end|>) exercise the glue too.
        spec = dataclasses.replace(spec, max_gen_tokens=40, max_turns=3)
        backend = RecordingBackend(HFBackend(model, tokenizer.pad_token_id, seed=3))
        requests = [EpisodeRequest(seed=11, sample_idx=0), EpisodeRequest(seed=12, sample_idx=0, hinted=True)]
    else:
        expert = ExpertTokensBackend(chat)

        def make_env(config=None, _make=spec.make_env):
            game = _make(config)
            expert.games.append(game)
            return game

        spec = dataclasses.replace(spec, make_env=make_env, max_gen_tokens=400)
        backend = RecordingBackend(expert)
        requests = [EpisodeRequest(seed=13, sample_idx=0, hinted=True)]
    # Customers with three requests: a reply closes one request and the customer goes on, so every episode
    # has several turns whatever the model writes (tool calls add tool results; bad calls, error notes).
    eps = run_episodes(spec, requests, backend, chat, temperature=1.0, max_episode_tokens=8192,
                       game_overrides=THREE_REQUESTS)
    return tokenizer, chat, spec, backend, eps


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    runs, start = [], None
    for index, flag in enumerate(mask + [0]):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            runs.append((start, index))
            start = None
    return runs


def test_the_template_is_the_models_own_and_cannot_render_tools(real_tokenizer):
    tokenizer = real_tokenizer
    assert "tools" not in tokenizer.chat_template  # so the Hermes fallback is what renders the storefront tools
    assert not template_renders_tools(tokenizer)


def test_episodes_are_multi_turn_with_tool_results_in_the_context(episodes):
    tokenizer, _, _, backend, eps = episodes
    if isinstance(backend.inner, ExpertTokensBackend):
        assert eps[0].summary["reward"] == 1.0
        assert sum(m["role"] == "tool" for m in eps[0].conversation) >= 3
        assert "<tool_response>" in tokenizer.decode(eps[0].token_ids)
    for ep in eps:
        assert ep.n_turns >= 2, (ep.termination_reason, ep.conversation[-2:])
        prompt_text = tokenizer.decode(ep.token_ids[: ep.prompt_len])
        print(f"seed {ep.request.seed}: {ep.n_turns} turns, {len(ep.token_ids)} tokens, roles "
              f"{[m['role'] for m in ep.conversation]}, {ep.termination_reason}")
        assert "<tools>" in prompt_text and '"name": "' in prompt_text and prompt_text.endswith("<|im_start|>assistant\n")


def test_each_prompt_sent_is_the_episode_so_far_and_the_sampled_ids_follow_it(episodes):
    _, _, _, backend, eps = episodes
    assert len(backend.calls) == sum(ep.n_turns for ep in eps)
    for prompt, completion in backend.calls:
        owners = [ep for ep in eps if ep.token_ids[: len(prompt)] == prompt]
        assert len(owners) == 1
        ep = owners[0]
        sampled = ep.token_ids[len(prompt): len(prompt) + len(completion.token_ids)]
        # The episode may have cut the completion to its own token limit; a cut keeps a prefix.
        assert sampled == completion.token_ids[: len(sampled)] and sampled
        assert ep.loss_mask[len(prompt): len(prompt) + len(sampled)] == [1] * len(sampled)


def test_the_trainer_scores_the_sampled_ids_with_observations_masked_and_the_stop_token_trained(episodes):
    _, chat, spec, backend, eps = episodes
    stops_trained = 0
    for ep in eps:
        sampled_turns = [c.token_ids for p, c in backend.calls if ep.token_ids[: len(p)] == p]
        if ep.request.hinted:  # what GRPOTrainer.sequences trains on for a hinted sample
            ids, mask, prompt_len = rescored_under_base_prompt(ep, spec, chat)
            assert ids[:prompt_len] != ep.token_ids[: ep.prompt_len]  # the hint is really gone
        else:
            ids, mask, prompt_len = ep.token_ids, ep.loss_mask, ep.prompt_len
        assert len(ids) == len(mask) and not any(mask[:prompt_len])
        runs = _runs(mask)
        assert [ids[a:b] for a, b in runs] == [t[: b - a] for t, (a, b) in zip(sampled_turns, runs)]
        assert len(runs) == ep.n_turns
        for (start, end), turn in zip(runs, sampled_turns):
            if turn[-1] == chat.im_end_id and end - start == len(turn):
                stops_trained += 1
                assert mask[end - 1] == 1 and ids[end - 1] == chat.im_end_id
            # Observation tokens (up to the next turn) are masked and begin by closing the turn.
            following = ids[end: next((a for a, _ in runs if a > start), len(ids))]
            assert all(m == 0 for m in mask[end: end + len(following)])
    assert stops_trained >= 1, "no sampled turn ended on <|im_end|>: the stop-token check did not run"


def test_the_ids_decode_to_the_template_render_of_the_whole_conversation(episodes):
    tokenizer, chat, _, backend, eps = episodes
    mismatched_retokenizations = 0
    for ep in eps:
        sampled_turns = [c.token_ids for p, c in backend.calls if ep.token_ids[: len(p)] == p]
        runs = _runs(ep.loss_mask)
        # The conversation as the model wrote it: each assistant turn's text exactly as sampled.
        messages, turn = [], 0
        for message in ep.conversation:
            if message["role"] == "assistant":
                start, end = runs[turn]
                text = tokenizer.decode(ep.token_ids[start:end], skip_special_tokens=False)
                messages.append({"role": "assistant", "content": text.removesuffix("<|im_end|>")})
                turn += 1
            else:
                messages.append(message)
        assert turn == ep.n_turns == len(sampled_turns)
        end_of_last_turn = runs[-1][1]
        whole = render_messages(tokenizer, messages, ep.tools, add_generation_prompt=False)
        decoded = tokenizer.decode(ep.token_ids, skip_special_tokens=False)
        if ep.termination_reason == "done" or end_of_last_turn == len(ep.token_ids):
            # Nothing follows the last turn; the render goes on with "<|im_end|>\n" (+ later messages).
            assert whole.startswith(decoded.removesuffix("<|im_end|>")), _first_difference(whole, decoded)
        else:
            with_prompt = render_messages(tokenizer, messages, ep.tools, add_generation_prompt=True)
            assert decoded == with_prompt, _first_difference(with_prompt, decoded)
        # The bookkeeping is not a re-tokenization: BPE merges across turn boundaries give other ids.
        retokenized = chat.encode(decoded)
        mismatched_retokenizations += retokenized != ep.token_ids
    print(f"episodes whose re-tokenized text differs from the sampled ids: {mismatched_retokenizations}/{len(eps)}")


def _first_difference(expected: str, got: str) -> str:
    index = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    return f"texts differ at {index}: expected {expected[index - 40: index + 40]!r}, got {got[index - 40: index + 40]!r}"
