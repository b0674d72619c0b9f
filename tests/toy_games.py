"""Small toy games for the validation, calibration and recalibration tests.

`VaultGame` follows the game protocol: the user asks for the total value of `n_keys` items; the agent
looks each item up with `lookup_item` and answers with `submit_total`, which counts only once every asked
item was looked up in an earlier turn (the prompt's "never guess a value"; it also keeps the reward-hacking
probes of `pipeline.probes` from winning by replaying the answer). The broken subclasses each break one rule
that `pipeline.validate_game` checks. Specs are built with `make_spec` and never registered, so
the global registry stays as the real games left it.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from game_registry import Action, DifficultyKnob, Game, GameSpec, StepResult, parse_hermes_action

VAULT_SYSTEM_PROMPT = (
    "You are a vault clerk. Look up every item the customer names with lookup_item, add their values, "
    "and answer with submit_total. Never guess a value."
)

VAULT_TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_item",
            "description": "Value of one item in the vault.",
            "parameters": {
                "type": "object",
                "properties": {"item_id": {"type": "string", "description": "Item id, e.g. 'IT-042'."}},
                "required": ["item_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit_total",
            "description": "Give the customer the total value; ends the conversation.",
            "parameters": {
                "type": "object",
                "properties": {"total": {"type": "integer"}},
                "required": ["total"],
            },
        },
    },
]

# A "target benchmark" tool list that contains the vault's tools and one more.
TARGET_TOOL_SCHEMAS: list[dict[str, Any]] = [
    *VAULT_TOOL_SCHEMAS,
    {
        "type": "function",
        "function": {
            "name": "transfer_to_human",
            "description": "Hand the conversation to a human.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]


@dataclass
class VaultConfig:
    n_keys: int = 2  # items the customer asks about (each needs one lookup): the difficulty knob
    n_items: int = 8  # items in the vault
    max_value: int = 500
    max_steps: int = 12

    def __post_init__(self) -> None:
        if not isinstance(self.n_keys, int) or self.n_keys < 1:
            raise ValueError(f"n_keys must be an int >= 1, got {self.n_keys!r}")
        if self.n_items < self.n_keys:
            raise ValueError(f"n_items ({self.n_items}) must be >= n_keys ({self.n_keys}); raise n_items")


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class VaultGame(Game):
    """A correct toy game."""

    def __init__(self, config: VaultConfig | None = None) -> None:
        self.config = config or VaultConfig()
        self._messages: list[dict[str, Any]] = []
        self._done = False
        self._reward = 0.0
        self._steps = 0
        self._next_call = 0

    # -- setup -------------------------------------------------------------------------------------
    def _rng(self, seed: int) -> random.Random:
        return random.Random(seed)

    def reset(self, seed: int) -> list[dict[str, Any]]:
        rng = self._rng(seed)
        ids = rng.sample(range(1000), self.config.n_items)
        self.items = {f"IT-{i:03d}": rng.randint(1, self.config.max_value) for i in ids}
        self.asked = rng.sample(sorted(self.items), self.config.n_keys)
        self.looked_up: list[str] = []
        self._known: set[str] = set()  # items looked up before the current turn
        self._done, self._reward, self._steps, self._next_call = False, 0.0, 0, 0
        self._messages = [
            {"role": "system", "content": self.get_system_prompt()},
            {"role": "user", "content": f"What is the total value of {', '.join(self.asked)}?"},
        ]
        return [dict(m) for m in self._messages]

    def get_system_prompt(self) -> str:
        return VAULT_SYSTEM_PROMPT

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(VAULT_TOOL_SCHEMAS))

    def get_messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self._messages]

    def write_tool_names(self) -> frozenset[str]:
        return frozenset({"submit_total"})

    def auth_tool_names(self) -> frozenset[str]:
        return frozenset()

    @property
    def done(self) -> bool:
        return self._done

    def get_summary(self) -> dict[str, Any]:
        return {"reward": self._reward, "steps": self._steps, "success": self._reward >= 1.0}

    # -- play --------------------------------------------------------------------------------------
    def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "lookup_item":
            item_id = arguments.get("item_id")
            if not isinstance(item_id, str):
                return "error: item_id must be a string"
            if item_id not in self.items:
                return f"error: no item {item_id[:40]!r}"
            self.looked_up.append(item_id)
            return json.dumps({"item_id": item_id, "value": self.items[item_id]})
        if name == "submit_total":
            total = arguments.get("total")
            if not isinstance(total, int) or isinstance(total, bool):
                return "error: total must be an integer"
            correct = total == sum(self.items[i] for i in self.asked) and set(self.asked) <= self._known
            self._reward = 1.0 if correct else 0.0
            self._done = True
            return "Submitted."
        return f"error: unknown tool {name[:40]!r}"

    def step(self, action: Action) -> StepResult:
        if self._done:
            return StepResult([], self._reward, True, {"error": "episode is over"})
        self._steps += 1
        self._known = set(self.looked_up)
        observation: list[dict[str, Any]]
        if action.kind == "tool_call":
            for call in action.tool_calls:
                call.id = f"call_{self._next_call}"
                self._next_call += 1
            self._messages.append(action.to_message())
            observation = []
            for call in action.tool_calls:
                content = self._run_tool(call.name, call.arguments)
                observation.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content})
                if self._done:
                    break
        else:
            self._messages.append(action.to_message())
            hint = f"error: {action.error}" if action.kind == "malformed" else "Please look it up and submit."
            observation = [{"role": "user", "content": hint}]
        self._messages.extend(observation)
        if self._steps >= self.config.max_steps:
            self._done = True
        return StepResult(observation, self._reward if self._done else 0.0, self._done)

    def oracle_response(self) -> str:
        for item_id in self.asked:
            if item_id not in self.looked_up:
                return tool_call_text("lookup_item", {"item_id": item_id})
        return tool_call_text("submit_total", {"total": self._oracle_total()})

    def _oracle_total(self) -> int:
        return sum(self.items[i] for i in self.asked)


# -- broken variants: each breaks exactly one rule ----------------------------------------------------
class NondeterministicVault(VaultGame):
    """Draws the instance from an unseeded generator."""

    _unseeded = random.Random()

    def _rng(self, seed: int) -> random.Random:
        return random.Random(self._unseeded.random())


class OutOfBoundsVault(VaultGame):
    """Charges -0.1 per lookup step (a per-step reward below 0); the final reward is fine."""

    def step(self, action: Action) -> StepResult:
        result = super().step(action)
        if not result.done:
            result.reward = -0.1
        return result


class SeedBlindVault(VaultGame):
    """Ignores the seed: every episode is the same instance."""

    def _rng(self, seed: int) -> random.Random:
        return random.Random(0)


class BadSummaryVault(VaultGame):
    """Its summary lacks "success"."""

    def get_summary(self) -> dict[str, Any]:
        return {"reward": self._reward, "steps": self._steps}


class FragileVault(VaultGame):
    """Crashes on a malformed action (reads a tool call that is not there)."""

    def step(self, action: Action) -> StepResult:
        if action.kind == "malformed":
            _ = action.tool_calls[0].name  # IndexError: the bug the fuzz check must catch
        return super().step(action)


class WrongOracleVault(VaultGame):
    """The oracle adds one to the total."""

    def _oracle_total(self) -> int:
        return super()._oracle_total() + 1


class GenerousVault(VaultGame):
    """Any plain reply wins: the do-nothing baseline scores 1."""

    def step(self, action: Action) -> StepResult:
        if action.kind == "reply" and not self._done:
            self._steps += 1
            self._messages.append(action.to_message())
            self._reward, self._done = 1.0, True
            return StepResult([], 1.0, True)
        return super().step(action)


class AnyTotalVault(VaultGame):
    """Any integer total wins: the random-tool baseline scores high."""

    def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "submit_total" and isinstance(arguments.get("total"), int):
            self._reward, self._done = 1.0, True
            return "Submitted."
        return super()._run_tool(name, arguments)


class RenamedToolVault(VaultGame):
    """Offers a tool the target benchmark does not have."""

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        schemas = super().get_tool_schemas()
        schemas[1]["function"]["name"] = "submit_sum"
        return schemas


class UnbuildableVault(VaultGame):
    """Cannot even be built: the constructor (so make_env) raises."""

    def __init__(self, config: VaultConfig | None = None) -> None:
        raise RuntimeError("vault database file is missing")


class UnresettableVault(VaultGame):
    """Builds, but every reset raises."""

    def reset(self, seed: int) -> list[dict[str, Any]]:
        raise ValueError(f"seed {seed} has no vault")


def register_temporarily(monkeypatch: Any, spec: GameSpec) -> None:
    """Make `spec` visible to get_game for one test (pytest's monkeypatch undoes it), without importing the
    real game files (which other work may be changing)."""
    import game_registry

    monkeypatch.setattr(game_registry, "_DISCOVERED", True)
    monkeypatch.setitem(game_registry._REGISTRY, spec.name, spec)


def make_spec(game_cls: type[VaultGame] = VaultGame, name: str = "toy_vault", target: str = "", **kw: Any) -> GameSpec:
    """A GameSpec for one of the toy games (not registered)."""

    def make_env(config: VaultConfig | None = None) -> VaultGame:
        return game_cls(config)

    return GameSpec(
        name=name,
        make_env=make_env,
        extract_action=kw.pop("extract_action", parse_hermes_action),
        system_prompt=VAULT_SYSTEM_PROMPT,
        max_turns=kw.pop("max_turns", 12),
        capability="toy_arithmetic",
        config_cls=VaultConfig,
        target=target,
        difficulty_knobs=kw.pop("difficulty_knobs", (DifficultyKnob("n_keys", "increase", (1, 2, 3, 4, 5, 6, 7, 8)),)),
        **kw,
    )


def skilled_policy(follow_prob: float):
    """A seeded stand-in for a model: plays the oracle move with probability `follow_prob`, else a wrong one.

    Returns `policy(game, rng) -> text`. Its success rate falls as `n_keys` grows (about follow_prob**(n_keys+1)).
    """

    def policy(game: VaultGame, rng: random.Random) -> str:
        if rng.random() < follow_prob:
            return game.oracle_response()
        return tool_call_text("submit_total", {"total": -1})

    return policy
