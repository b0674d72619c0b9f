"""Registers the storefront benchmark as game `storefront` (imported by game_registry on discovery).

It is a target benchmark, not a capability game: `capability` and `target` are empty. Its tool schemas
are the ones capability games for this benchmark must reuse (`GameSpec.target = "storefront"`).
"""
from __future__ import annotations

from benchmarks.storefront.env import StorefrontConfig, StorefrontGame
from benchmarks.storefront.policy import HINT, POLICY
from benchmarks.storefront.probes import GUESS_STATUSES, NAME_EVERY_STATUS
from game_registry import GameSpec, register_game


def make_env(config: StorefrontConfig | None = None) -> StorefrontGame:
    """A fresh storefront game (default config when none is given)."""
    return StorefrontGame(config)


SPEC = register_game(GameSpec(
    name="storefront",
    make_env=make_env,
    system_prompt=POLICY,
    base_prompt="",
    hint_prompt=HINT,
    max_gen_tokens=160,  # the longest expert turn (an address change) is ~90 tokens with a 1k-vocab BPE
    max_turns=StorefrontConfig().max_steps,
    capability="",
    config_cls=StorefrontConfig,
    target="",
    probes=(NAME_EVERY_STATUS, GUESS_STATUSES),
))
