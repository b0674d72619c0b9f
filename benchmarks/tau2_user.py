"""τ²-bench's customer: an LLM at any OpenAI-compatible endpoint playing a task's scenario.

The prompt and the stop rules are the `tau2` package's own (`tau2.user.user_simulator`): the system message is its
simulation guidelines with the task's `user_scenario`; the conversation is shown with the roles flipped (the
agent's words as "user", the customer's own as "assistant"); the customer ends the episode by writing `###STOP###`
(done), `###TRANSFER###` (handed to a human) or `###OUT-OF-SCOPE###`. As in τ²-bench, the agent opens with
"Hi! How can I help you today?" and the customer's first message answers it; that greeting is the customer's
context only (the agent's conversation starts with the customer's message).

Why not the package's `UserSimulator` class: it calls the model through litellm with its own retries and raises
on any failure. Here the call goes through `common.llm_client.ChatClient` (the project's retry policy: 429 and
5xx retried with backoff, a bad key or model refused at once), and a server that fails for good raises
`benchmarks.agents.ServerError`, which a runner records as an episode not scored, never as a reward of 0.

The key is read from the environment variable the user names (`UserEndpoint.api_key_env`) when the client is
built; only the variable's name is ever stored or written.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from benchmarks.agents import ServerError
from common.llm_client import ChatClient, RetriesExhausted, RetryPolicy
from common.validation import InputError, check_int, check_number, check_url

EMPTY_ANSWER_RETRIES = 2  # τ²-bench asks again when the model answers nothing; then the episode is not scored


@dataclass(frozen=True)
class UserEndpoint:
    """Where the customer model is served. `api_key_env`: the name of the variable holding its key (empty: the
    server needs none; "EMPTY" is sent). `max_tokens`: per customer message."""

    base_url: str
    model: str
    api_key_env: str = ""
    temperature: float = 0.0
    max_tokens: int = 512
    timeout_s: float = 120.0
    max_retries: int = 6

    def __post_init__(self) -> None:
        check_url(self.base_url if isinstance(self.base_url, str) else None, "the customer's base URL")
        if not isinstance(self.model, str) or not self.model:
            raise InputError("user model must name the served model (e.g. gpt-4.1 or the name vLLM serves)")
        if not isinstance(self.api_key_env, str):
            raise InputError(f"user api_key_env must be the name of an environment variable, got {self.api_key_env!r}")
        check_number(self.temperature, "user temperature", 0.0)
        check_number(self.timeout_s, "user timeout_s", 0.0, low_open=True)
        check_int(self.max_tokens, "user max_tokens", 1)
        check_int(self.max_retries, "user max_retries", 0)

    def api_key(self) -> str:
        """The key from the named variable ("EMPTY" when none is named); InputError when it is named but unset."""
        if not self.api_key_env:
            return "EMPTY"
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise InputError(f"the customer's key variable {self.api_key_env} is not set or empty; export "
                             f"{self.api_key_env}=<key> (the key itself never goes on the command line or in a file)")
        return key

    def client(self) -> ChatClient:
        where = f"${self.api_key_env}" if self.api_key_env else "the customer endpoint's key"
        return ChatClient(self.base_url, self.api_key(), self.model, key_source=where, timeout=self.timeout_s,
                          retry=RetryPolicy(max_retries=self.max_retries))


def user_system_prompt(task: Any) -> str:
    """τ²-bench's customer system prompt for `task` (its guidelines without user tools, and the task's scenario)."""
    from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

    return SYSTEM_PROMPT.format(global_user_sim_guidelines=get_global_user_sim_guidelines(use_tools=False),
                                instructions=task.user_scenario)


def stop_tokens() -> tuple[str, ...]:
    """The customer's ways to end the episode (τ²-bench's tokens)."""
    from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER

    return STOP, TRANSFER, OUT_OF_SCOPE


def agent_greeting() -> str:
    """The agent's opening line in τ²-bench, which the customer's first message answers."""
    from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE

    return DEFAULT_FIRST_AGENT_MESSAGE.content


class Tau2User:
    """One episode's customer: `opening()` once, then `reply(agent_text)` per agent message.

    `seed` is sent with every request (servers that honour it, such as vLLM, then sample reproducibly)."""

    def __init__(self, task: Any, client: ChatClient, endpoint: UserEndpoint, seed: int | None = None) -> None:
        self.client, self.endpoint, self.seed = client, endpoint, seed
        self.stops = stop_tokens()
        # The customer's view, roles flipped: what the agent says is "user", what the customer said is "assistant".
        self.history: list[dict[str, str]] = [{"role": "system", "content": user_system_prompt(task)}]
        self.stopped = False

    def opening(self) -> str:
        """The customer's first message (the answer to τ²-bench's greeting)."""
        if len(self.history) != 1:
            raise RuntimeError("Tau2User.opening() is the first message of an episode; it was already called")
        text, _ = self.reply(agent_greeting())
        return text

    def reply(self, agent_text: str) -> tuple[str, bool]:
        """(the customer's answer to `agent_text`, whether it ends the episode)."""
        if self.stopped:
            raise RuntimeError("the customer has ended the episode; start another with a new Tau2User")
        self.history.append({"role": "user", "content": agent_text})
        text = ""
        for _ in range(EMPTY_ANSWER_RETRIES + 1):
            try:
                result = self.client.complete(self.history, temperature=self.endpoint.temperature, seed=self.seed,
                                              max_tokens=self.endpoint.max_tokens)
            except RetriesExhausted as err:
                raise ServerError(f"the customer's server failed: {err}") from err
            text = result.text.strip()
            if text:
                break
        else:
            raise ServerError(f"the customer's model ({self.endpoint.model} at {self.endpoint.base_url}) answered "
                              f"nothing {EMPTY_ANSWER_RETRIES + 1} times")
        self.history.append({"role": "assistant", "content": text})
        self.stopped = any(token in text for token in self.stops)
        return text, self.stopped
