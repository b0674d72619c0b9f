"""The built-in target benchmark: a small τ²-bench-style store.

db.py (data model, generation, hashing) · tools.py (the agent's tools) · policy.py (system prompt) ·
config.py (the task mix) · tasks.py (seeded customers with one to three requests of mixed needs) ·
user_sim.py (the scripted customer, shared with the capability games) · communication.py (what counts as
telling the customer) · compliance.py (the policy's procedure) · env.py (the Game) · game.py (registers
`storefront`) · probes.py (storefront-specific reward-hacking probes) · flaws.py (planted-failure experts) ·
run.py (CLI).
"""
