"""A mix of games behind one `GameSpec`, so one GRPO run trains on several games (the gates of Step 4
learn to route across capabilities, so they train on all of them at once).

Seed s plays game `s % n` (in the order given) with instance seed s: GRPO groups share a seed, so every
group is one game, and consecutive groups cycle through the games. Each game keeps its own base prompt
(added when the episode starts) and its own turn limit (the mix ends an episode when its game's
`max_turns` is reached); the mix's per-turn token limit is the largest of the games'. Hint prompts are per
game, so the mix takes none (use hint_fraction 0); config overrides are given per game name (`overrides`).
The summary of each episode names its game under "game".
"""
from __future__ import annotations

from typing import Any

from common.validation import InputError
from game_registry import Action, Game, GameSpec, StepResult, check_game_overrides, prompt_variant


class MixedGame(Game):
    def __init__(self, specs: list[GameSpec], overrides: dict[str, dict[str, Any]] | None = None):
        self.specs = specs
        self.overrides = overrides or {}
        self.spec: GameSpec | None = None
        self.inner: Game | None = None
        self.turns = 0

    def _game(self) -> Game:
        if self.inner is None:
            raise RuntimeError("call reset(seed) first: the seed chooses which game of the mix is played")
        return self.inner

    def reset(self, seed: int) -> list[dict[str, Any]]:
        self.spec = self.specs[seed % len(self.specs)]
        self.inner = self.spec.make(**self.overrides.get(self.spec.name, {}))
        self.turns = 0
        return prompt_variant(self.inner.reset(seed), self.spec, hinted=False)

    def get_system_prompt(self) -> str:
        return self._game().get_system_prompt()

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return self._game().get_tool_schemas()

    def get_messages(self) -> list[dict[str, Any]]:
        return self._game().get_messages()

    def step(self, action: Action) -> StepResult:
        self.turns += 1
        return self._game().step(action)

    @property
    def done(self) -> bool:
        game = self._game()
        return game.done or self.turns >= self.spec.max_turns  # type: ignore[union-attr]

    def get_summary(self) -> dict[str, Any]:
        return {**self._game().get_summary(), "game": self.spec.name}  # type: ignore[union-attr]

    def oracle_response(self) -> str:
        return self._game().oracle_response()

    def write_tool_names(self) -> frozenset[str] | None:
        return self._game().write_tool_names()

    def auth_tool_names(self) -> frozenset[str] | None:
        return self._game().auth_tool_names()


def mixed_spec(specs: list[GameSpec], overrides: dict[str, dict[str, Any]] | None = None) -> GameSpec:
    """One spec that plays `specs` in turn by seed (see the module docstring); `overrides` maps a game's name
    to fields of its config (each is checked by building that game once)."""
    if len(specs) < 2:
        raise InputError("a game mix needs at least two games")
    overrides = dict(overrides or {})
    names = {spec.name for spec in specs}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise InputError(f"overrides name games outside the mix: {', '.join(unknown)}; the mix: {', '.join(sorted(names))}")
    for spec in specs:
        check_game_overrides(spec, overrides.get(spec.name, {}), "overrides")
    actions = {spec.extract_action for spec in specs}
    if len(actions) != 1:
        names = [f"{s.name}: {getattr(s.extract_action, '__name__', s.extract_action)}" for s in specs]
        raise InputError(f"the games of a mix must parse actions the same way, but they differ ({names}); "
                         "train them in separate runs")
    return GameSpec(
        name="mix_" + "_".join(spec.name.removeprefix("capability_") for spec in specs),
        make_env=lambda: MixedGame(specs, overrides),
        extract_action=actions.pop(),
        max_gen_tokens=max(spec.max_gen_tokens for spec in specs),
        max_turns=max(spec.max_turns for spec in specs),
    )
