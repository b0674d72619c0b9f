"""Agents that play tool-use games: `respond(messages, tools) -> str` (model text with Hermes tool calls).

- `Agent`: the interface every player implements (`begin_episode(game, seed)`, `respond`, `describe`); `respond`
  raises ContextFull when the conversation no longer fits the model, ServerError when its server fails for good.
- `ExpertAgent`: asks the game's oracle (`Game.oracle_response`), so it needs `begin_episode(game)`.

The environment side loads no models: the model-backed agents (a local transformers model, a vLLM server)
live in train/agents.py, beside the batched evaluation (train/evaluate.py), and `python -m train.play` plays the
storefront with any of them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from common.validation import InputError
from game_registry import Game


class ServerError(RuntimeError):
    """The agent's model server failed an episode after its retries (connection errors, timeouts, 429 and 5xx):
    the runner records the episode as not scored, never as a reward of 0, and a rerun plays it again."""


class ContextFull(RuntimeError):
    """The conversation no longer fits the agent model's context: the episode ends there (termination
    "context_full", as τ²-bench ends an agent that errs) and is scored as it stands."""


class Agent(ABC):
    """Produces the next assistant message of a conversation (an agent backed by a server raises ServerError
    when the server fails for good)."""

    def begin_episode(self, game: Game, seed: int | None = None) -> None:
        """Called once before each episode (agents that sample may reseed from `seed`)."""

    @abstractmethod
    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        """The model's text for the next assistant turn (tool calls as `<tool_call>{...}</tool_call>`)."""

    def describe(self) -> dict[str, Any]:
        """What this agent is, for the results file's `info`."""
        return {"implementation": type(self).__name__}


class ExpertAgent(Agent):
    """The game's own expert: `respond` returns `game.oracle_response()`."""

    def __init__(self) -> None:
        self._game: Game | None = None

    def begin_episode(self, game: Game, seed: int | None = None) -> None:
        self._game = game

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        if self._game is None:
            raise RuntimeError("ExpertAgent.respond() before begin_episode(game): the expert needs the game")
        return self._game.oracle_response()


# The runners' flags that only a served model reads (flag, argparse destination).
SERVED_MODEL_FLAGS = (("--tokenizer", "tokenizer"), ("--model", "model"), ("--api-key-env", "api_key_env"))


def check_served_model_flags(args: Any) -> None:
    """InputError for --tokenizer, --model or --api-key-env given with an agent other than `vllm:URL`.

    Only a served model reads them (an `hf:` agent loads its own folder's tokenizer; `expert` and `flawed:` load no
    model), and a flag accepted without effect lets a user believe a run used a tokenizer or key it never read.
    """
    if args.agent.partition(":")[0] == "vllm":
        return
    given = [flag for flag, name in SERVED_MODEL_FLAGS if getattr(args, name, None) not in (None, "")]
    if given:
        them = "it" if len(given) == 1 else "them"
        raise InputError(f"{', '.join(given)}: read only by a vllm:URL agent, --agent {args.agent} would ignore "
                         f"{them}; drop {them} (an hf: agent uses its own folder's tokenizer)")
