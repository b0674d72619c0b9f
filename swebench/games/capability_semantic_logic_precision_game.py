"""Scenario game `capability_semantic_logic_precision` (code repair that needs one precise logic edit). The
game itself is swebench/game.py; this file only registers it.

Not in the default game folders (it runs pytest in a sandbox per graded step, and the storefront-game tests
iterate over every default game): add this folder to TRACE_GAMES_DIRS:

    TRACE_GAMES_DIRS=swebench/games python -m pipeline.validate_game capability_semantic_logic_precision --seeds 20
    TRACE_GAMES_DIRS=swebench/games python -m train --game capability_semantic_logic_precision --model M \
        --game_overrides '{"scenarios_path": "pipeline/swebench/semantic_logic_precision/scenarios_parsed.json"}'
"""
from game_registry import register_game
from swebench.game import make_spec

register_game(make_spec("semantic_logic_precision"))
