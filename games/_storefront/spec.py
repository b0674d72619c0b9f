"""The GameSpec every storefront game registers (`storefront_game_spec`), with its ablation probes."""
from __future__ import annotations

from typing import Any, Callable

from benchmarks.storefront.policy import POLICY
from game_registry import DifficultyKnob, Game, GameSpec, Policy, Probe

TARGET_BENCHMARK = "storefront"
# As the target: the longest expert turn (an address change) is ~110 tokens.
MAX_GEN_TOKENS = 160


def ablation_probes(ablations: dict[str, str]) -> tuple[Probe, ...]:
    """A probe per ablation a game declares ({name: what the expert lacks}): the policy plays
    `game.ablated_response(name)` (register them as `GameSpec.ablations`; validate_game holds each to
    pipeline.probes.ABLATION_LIMIT)."""
    def make_policy(name: str) -> Callable[[list[str]], Policy]:
        def policy_for_seed(oracle_texts: list[str]) -> Policy:
            def policy(turn: int, game: Game, rng: Any) -> str:
                return game.ablated_response(name)
            return policy
        return policy_for_seed

    return tuple(Probe(name=name, description=f"the expert that {lacks}", make_policy=make_policy(name))
                 for name, lacks in ablations.items())


def storefront_game_spec(game_class: type, config_class: type, capability: str, *, hint: str, max_turns: int,
                         difficulty_knobs: tuple[DifficultyKnob, ...], probes: tuple[Probe, ...] = ()) -> GameSpec:
    """The GameSpec of a storefront capability game (what every game file registers): named
    `capability_<capability>`, the storefront's written policy as its system prompt (a game may still write
    its own per config: `policy`), no base prompt, `hint` as the hint prompt, the target's turn length, the
    ablations and decision classes the game class declares (`ABLATIONS`, `DECISION_CLASSES`)."""
    return GameSpec(
        name=f"capability_{capability}",
        make_env=game_class,  # game_class(config), config None for the defaults
        system_prompt=POLICY,
        base_prompt="",
        hint_prompt=hint,
        max_gen_tokens=MAX_GEN_TOKENS,
        max_turns=max_turns,
        capability=capability,
        config_cls=config_class,
        target=TARGET_BENCHMARK,
        difficulty_knobs=difficulty_knobs,
        probes=probes,
        ablations=ablation_probes(game_class.ABLATIONS),
        decision_classes=game_class.DECISION_CLASSES,
    )
