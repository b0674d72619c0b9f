"""Seeded scenario generators, one per capability: `generate_one(capability, seed)` is deterministic."""
from __future__ import annotations

from typing import Any, Callable

from swebench.generators import deep_call_graph, semantic_logic
from swebench.scenario import Scenario

GENERATORS: dict[str, Callable[..., Scenario]] = {
    deep_call_graph.CAPABILITY: deep_call_graph.generate,
    semantic_logic.CAPABILITY: semantic_logic.generate,
}


def check_capability(capability: str) -> None:
    if capability not in GENERATORS:
        raise ValueError(f"unknown capability {capability!r}; generators exist for: {', '.join(sorted(GENERATORS))}")


def generate_one(capability: str, seed: int, **options: Any) -> Scenario:
    """The scenario of `seed` for `capability` (options: call_depth, n_decoys for deep_call_graph_traversal;
    template for semantic_logic_precision; size, "small" or "large" (the default), for both)."""
    check_capability(capability)
    return GENERATORS[capability](seed, **options)


def generate_many(capability: str, n: int, seed: int = 0, **options: Any) -> list[Scenario]:
    """Scenarios for seeds seed .. seed+n-1."""
    return [generate_one(capability, s, **options) for s in range(seed, seed + n)]
