"""The built-in target benchmark: a small τ²-bench-style store.

db.py (data model, generation, hashing) · tools.py (the agent's tools) · policy.py (system prompt) ·
tasks.py (seeded tasks in four families) · user_sim.py (scripted customer) · env.py (the Game) ·
game.py (registers `storefront`) · flaws.py (planted-failure experts) · run.py (CLI).
"""
