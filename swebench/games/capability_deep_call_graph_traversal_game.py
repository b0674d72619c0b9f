"""Scenario game `capability_deep_call_graph_traversal` (code repair where the fix lies several calls below
the symptom). The game itself is swebench/game.py; this file only registers it.

Not in the default game folders (it runs pytest in a sandbox per graded step, and the storefront-game tests
iterate over every default game): add this folder to TRACE_GAMES_DIRS:

    TRACE_GAMES_DIRS=swebench/games python -m pipeline.validate_game capability_deep_call_graph_traversal --seeds 20
    TRACE_GAMES_DIRS=swebench/games python -m train --game capability_deep_call_graph_traversal --model M \
        --game_overrides '{"scenarios_path": "pipeline/swebench/deep_call_graph_traversal/scenarios_parsed.json"}'
"""
from game_registry import register_game
from swebench.game import make_spec

register_game(make_spec("deep_call_graph_traversal"))
