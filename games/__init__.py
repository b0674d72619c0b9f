"""Worked-example capability games (Step 2). Game files are discovered by `game_registry`, not imported here."""
