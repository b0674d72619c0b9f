"""A one-turn toy game for trainer tests: the reward is the share of reply characters in "aeiou".

A random-init tiny model already scores above zero with spread inside every group, so GRPO has signal
from the first iteration and a few iterations move the mean reward. Discovered through
TRACE_GAMES_DIRS=tests/games.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from game_registry import Action, Game, GameSpec, StepResult, register_game

TARGET = set("aeiou")
SYSTEM = "Answer with vowels."


@dataclass
class LetterDensityConfig:
    n_words: int = 3

    def __post_init__(self) -> None:
        if self.n_words < 1:
            raise ValueError(f"n_words must be >= 1, got {self.n_words}")


class LetterDensityGame(Game):
    def __init__(self, config: LetterDensityConfig | None = None):
        self.config = config or LetterDensityConfig()
        self.messages: list[dict[str, Any]] = []
        self.reward, self.steps, self._done, self.seed = 0.0, 0, False, None

    def reset(self, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        words = " ".join(rng.choice(["apple", "echo", "idea", "oboe", "unit"]) for _ in range(self.config.n_words))
        self.messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Say: {words}"}]
        self.reward, self.steps, self._done, self.seed = 0.0, 0, False, seed
        return [dict(m) for m in self.messages]

    def get_system_prompt(self) -> str:
        return SYSTEM

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def get_messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.messages]

    def step(self, action: Action) -> StepResult:
        text = action.raw if isinstance(action.raw, str) else ""
        self.messages.append({"role": "assistant", "content": text})
        self.reward = sum(ch in TARGET for ch in text) / len(text) if text else 0.0
        self.steps += 1
        self._done = True
        return StepResult([], self.reward, True, {})

    @property
    def done(self) -> bool:
        return self._done

    def get_summary(self) -> dict[str, Any]:
        return {"reward": float(self.reward), "steps": self.steps, "success": self.reward >= 1.0, "seed": self.seed}

    def oracle_response(self) -> str:
        return "aeiou"


register_game(GameSpec(
    name="capability_letter_density",
    make_env=lambda config=None: LetterDensityGame(config),
    system_prompt=SYSTEM,
    hint_prompt="Hint: use only the letters a, e, i, o, u.",
    max_gen_tokens=2,
    max_turns=1,
    capability="letter_density",
    config_cls=LetterDensityConfig,
))
