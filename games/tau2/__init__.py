"""Capability games on τ²-bench's real domains (the `tau2` package), registered on demand
(`game_registry.ON_DEMAND_GAMES`): the kit is `games/tau2/kit.py`, each game one file beside it."""
