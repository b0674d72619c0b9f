"""game_registry discovery after a game file fails to import: the error stays, the other games do not vanish."""
from __future__ import annotations

import sys

import pytest

import game_registry
from game_registry import GameImportError

GOOD_GAME = '''
from game_registry import GameSpec, register_game

register_game(GameSpec(name="capability_regrel_zzz", make_env=lambda config=None: None))
'''


@pytest.fixture()
def isolated_registry(tmp_path, monkeypatch):
    """Discovery over `tmp_path` only (no repository games, no built-in modules), undone afterwards."""
    monkeypatch.setattr(game_registry, "DEFAULT_GAME_DIRS", ())
    monkeypatch.setattr(game_registry, "BUILTIN_GAME_MODULES", ())
    monkeypatch.setattr(game_registry, "_DISCOVERED", False)
    monkeypatch.setattr(game_registry, "_REGISTRY", {})
    monkeypatch.setattr(game_registry, "_LOADED_FILES", set())
    monkeypatch.setattr(game_registry, "_FAILED_FILES", {}, raising=False)  # raising=False: absent before the fix
    monkeypatch.setenv("TRACE_GAMES_DIRS", str(tmp_path))
    yield tmp_path
    for name in ("trace_games.capability_regrel_aaa_game", "trace_games.capability_regrel_zzz_game"):
        sys.modules.pop(name, None)


def test_a_broken_game_file_fails_every_lookup_not_just_the_first(isolated_registry):
    # Sorted before the good file, and it registers its game before it fails: a second import would differ.
    (isolated_registry / "capability_regrel_aaa_game.py").write_text(
        GOOD_GAME.replace("regrel_zzz", "regrel_aaa") + "raise RuntimeError('half-written')\n", encoding="utf-8")
    (isolated_registry / "capability_regrel_zzz_game.py").write_text(GOOD_GAME, encoding="utf-8")
    for _ in range(2):  # before: the second lookup said "unknown game 'capability_regrel_zzz'"
        with pytest.raises(GameImportError, match="capability_regrel_aaa_game.py: failed to import game: "
                                                  "RuntimeError: half-written"):
            game_registry.get_game("capability_regrel_zzz")
    (isolated_registry / "capability_regrel_aaa_game.py").unlink()  # the broken file removed: the rest is found
    assert game_registry.get_game("capability_regrel_zzz").name == "capability_regrel_zzz"
