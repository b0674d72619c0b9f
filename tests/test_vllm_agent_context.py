"""A vLLM server's context length (`vllm serve --max-model-len`) against the vllm: agent and the rollout backend.

vLLM refuses (HTTP 400) a request whose prompt tokens + max_tokens exceed its max_model_len, and lists that length
with each base model at GET /v1/models (a runtime LoRA adapter's entry has none; its `parent` names the base).
The stand-ins below do the same, counting the prompt with the model's tokenizer as vLLM does (a text prompt with
its special tokens, vLLM's default for /v1/completions).

- The vllm: agent sends max_tokens shrunk to the room left, as the hf: agent caps its new tokens, instead of asking
  for a fixed max_new_tokens that the server refuses near the end of the context (the episode then ended
  "context_full" while the model still had room to answer); with no room left the episode ends "context_full"
  (scored as it stands) without a request. A host that lists no max_model_len is asked as before, its
  context-length 400 still ending the episode there.
- The rollout backend caps each request at its server's room: one batched turn asks every episode for the largest
  remaining budget (train/episodes.py cuts each completion to its own), so an episode near the end of a server
  started with --max-model-len = max_episode_tokens got a 400 and the whole training run stopped.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents import ContextFull
from benchmarks.storefront.env import StorefrontGame
from benchmarks.storefront.run import play_episode
from fake_openai_server import send_json
from train.agents import VLLMAgent, render_prompt
from train.backends import SamplingParams
from train.vllm_backend import VLLMBackend, VLLMError

REPLY = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "A1"}}\n</tool_call>'


def _too_long(limit: int, prompt_tokens: int, max_tokens: int) -> str | None:
    """vLLM's refusal (its own words, both forms), or None when the request fits."""
    if prompt_tokens >= limit:
        return (f"This model's maximum context length is {limit} tokens. However, your request has {prompt_tokens} "
                "input tokens. Please reduce the length of the input messages.")
    if prompt_tokens + max_tokens > limit:
        return (f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                f"length is {limit} tokens and your request has {prompt_tokens} input tokens ({max_tokens} > "
                f"{limit} - {prompt_tokens}). (parameter=max_tokens, value={max_tokens})")
    return None


class ContextServer:
    """/v1/models lists `models` (dicts); /v1/completions enforces `limit` on prompt + max_tokens (None: never).

    `count(prompt)` gives a request's prompt tokens (a text prompt: the tokenizer's count; token ids: their
    number); a request that fits is answered `REPLY` as text or `reply_ids` as vLLM's `token_id:N` tokens."""

    def __init__(self, models: list[dict[str, Any]], limit: int | None, count: Any, reply_ids: tuple[int, ...] = (5, 6)
                 ) -> None:
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: Any) -> None:
                send_json(self, code, body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's protocol
                self._answer(200, {"object": "list", "data": models})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                prompt_tokens = count(body["prompt"])
                refusal = None if limit is None else _too_long(limit, prompt_tokens, body["max_tokens"])
                if refusal is not None:  # vLLM's ErrorResponse
                    return self._answer(400, {"error": {"message": refusal, "type": "BadRequestError",
                                                        "param": "max_tokens", "code": 400}})
                ids = list(reply_ids)[: body["max_tokens"]]
                choice = {"index": 0, "text": REPLY, "finish_reason": "stop", "logprobs": None}
                if isinstance(body["prompt"], list):
                    choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}
                    choice["finish_reason"] = "length"
                self._answer(200, {"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                                   "choices": [choice],
                                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1,
                                             "total_tokens": prompt_tokens + 1}})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def completions(self) -> list[dict[str, Any]]:
        return list(self.requests)

    def __enter__(self) -> "ContextServer":
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _vllm_card(name: str, limit: int | None, owned_by: str = "vllm", parent: str | None = None) -> dict[str, Any]:
    card: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": owned_by, "root": name,
                            "parent": parent}
    if limit is not None:
        card["max_model_len"] = limit
    return card


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)


@pytest.fixture(scope="module")
def counter(tokenizer):
    # vLLM's /v1/completions: a text prompt is tokenized with its special tokens (add_special_tokens defaults to
    # True there); token ids are taken as they are.
    return lambda prompt: len(prompt) if isinstance(prompt, list) else len(tokenizer(prompt)["input_ids"])


@pytest.fixture
def opening(tokenizer, counter):
    """(game, opening messages, tools, the opening prompt's tokens as the server counts them)."""
    game = StorefrontGame()
    messages = game.reset(0)
    tools = game.get_tool_schemas()
    return game, messages, tools, counter(render_prompt(tokenizer, messages, tools))


# ----------------------------------------------------------------------------------------------
# The vllm: agent
# ----------------------------------------------------------------------------------------------

def test_the_vllm_agent_asks_for_the_room_left_not_for_a_refused_max_tokens(tiny_model_dir, counter, opening):
    game, messages, tools, prompt_tokens = opening
    limit = prompt_tokens + 5  # room for five new tokens, fewer than max_new_tokens
    with ContextServer([_vllm_card("served", limit)], limit, counter) as server:
        agent = VLLMAgent(server.url, "served", tiny_model_dir, max_new_tokens=256, timeout_s=5.0, max_retries=0)
        agent.begin_episode(game, seed=0)
        assert agent.respond(messages, tools) == REPLY  # answered, not refused: the episode goes on
        [request] = server.completions()
    assert request["max_tokens"] == 5


def test_a_vllm_agent_without_room_ends_the_episode_context_full_without_asking(tiny_model_dir, counter, opening):
    game, messages, tools, prompt_tokens = opening
    with ContextServer([_vllm_card("served", prompt_tokens)], prompt_tokens, counter) as server:
        agent = VLLMAgent(server.url, "served", tiny_model_dir, timeout_s=5.0, max_retries=0)
        with pytest.raises(ContextFull, match=f"the conversation is {prompt_tokens} tokens"):
            agent.respond(messages, tools)
        assert server.completions() == []  # no request the server must refuse
        _, summary = play_episode(game, agent, seed=0)
    assert summary["termination_reason"] == "context_full" and summary["steps"] == 0 and summary["reward"] == 0.0


def test_a_long_vllm_episode_shrinks_its_turns_then_stops_context_full(tiny_model_dir, counter, opening):
    """Turn by turn the conversation grows: each request fits (the server never refuses), the last turns get
    fewer new tokens than max_new_tokens, and the episode ends context_full, scored as a failure, not a crash."""
    game, messages, tools, prompt_tokens = opening
    with ContextServer([_vllm_card("served", None)], None, counter) as server:  # where the second turn starts
        play_episode(game, VLLMAgent(server.url, "served", tiny_model_dir, timeout_s=5.0, max_retries=0), seed=0)
        second = counter(server.completions()[1]["prompt"])
    limit = second + 30  # the first turn gets its 64 tokens, the second 30, the third none
    with ContextServer([_vllm_card("served", limit)], limit, counter) as server:
        agent = VLLMAgent(server.url, "served", tiny_model_dir, max_new_tokens=64, timeout_s=5.0, max_retries=0)
        _, summary = play_episode(game, agent, seed=0)
        requests = server.completions()
    assert summary["termination_reason"] == "context_full" and summary["steps"] == 2, summary
    assert summary["reward"] < 1.0
    assert [request["max_tokens"] for request in requests] == [64, 30]  # nothing the server refuses was sent


def test_a_runtime_lora_is_bounded_by_its_base_models_context(tiny_model_dir, counter, opening):
    _, messages, tools, prompt_tokens = opening
    limit = prompt_tokens + 7
    cards = [_vllm_card("base", limit), _vllm_card("adapter", None, parent="base")]  # vLLM lists a LoRA so
    with ContextServer(cards, limit, counter) as server:
        agent = VLLMAgent(server.url, "adapter", tiny_model_dir, max_new_tokens=256, timeout_s=5.0, max_retries=0)
        assert agent.respond(messages, tools) == REPLY
        [request] = server.completions()
    assert request["max_tokens"] == 7 and request["model"] == "adapter"


def test_a_host_that_lists_no_context_length_is_asked_as_before(tiny_model_dir, counter, opening):
    game, messages, tools, prompt_tokens = opening
    with ContextServer([_vllm_card("served", None, owned_by="some-host")], None, counter) as server:
        agent = VLLMAgent(server.url, "served", tiny_model_dir, max_new_tokens=48, timeout_s=5.0, max_retries=0)
        assert agent.respond(messages, tools) == REPLY
        [request] = server.completions()
    assert request["max_tokens"] == 48 and counter(request["prompt"]) == prompt_tokens
    # Its own context-length refusal still ends the episode where it is (nothing to shrink against).
    with ContextServer([_vllm_card("served", None)], prompt_tokens + 3, counter) as server:
        agent = VLLMAgent(server.url, "served", tiny_model_dir, max_new_tokens=48, timeout_s=5.0, max_retries=0)
        with pytest.raises(ContextFull, match="maximum context length"):
            agent.respond(messages, tools)
        _, summary = play_episode(game, agent, seed=0)
    assert summary["termination_reason"] == "context_full" and summary["reward"] == 0.0


# ----------------------------------------------------------------------------------------------
# The rollout backend
# ----------------------------------------------------------------------------------------------

def _backend(url: str, tmp_path: Path) -> VLLMBackend:
    return VLLMBackend([url], "base", adapter_dir=tmp_path / "adapters", timeout=5.0, max_retries=0, backoff=0.0)


def test_the_rollout_backend_caps_each_request_at_its_servers_room(tmp_path, counter):
    limit = 32
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(2,))
    short, near_end = [3] * 10, [4] * (limit - 3)  # one batched turn: the longest budget goes to every prompt
    with ContextServer([_vllm_card("base", limit)], limit, counter) as server:
        completions = _backend(server.url, tmp_path).generate([short, near_end], params)
        sent = {len(request["prompt"]): request["max_tokens"] for request in server.completions()}
    assert sent == {10: 8, limit - 3: 3}
    assert [c.token_ids for c in completions] == [[5, 6], [5, 6]]


def test_a_rollout_prompt_that_fills_the_servers_context_fails_naming_the_fix(tmp_path, counter):
    limit = 32
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(2,))
    with ContextServer([_vllm_card("base", limit)], limit, counter) as server:
        with pytest.raises(VLLMError, match=f"{limit} tokens.*--max-model-len.*max_episode_tokens"):
            _backend(server.url, tmp_path).generate([[4] * limit], params)
        assert server.completions() == []


def test_a_rollout_server_that_lists_no_context_length_gets_max_new_tokens(tmp_path, counter):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(2,))
    with ContextServer([{"id": "base", "object": "model"}], None, counter) as server:
        _backend(server.url, tmp_path).generate([[4] * 100], params)
        [request] = server.completions()
    assert request["max_tokens"] == 8
