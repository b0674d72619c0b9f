"""Layout: environments never import the training package, and no step reaches into another's private module.

Each check runs in a fresh interpreter, so what one test imported cannot hide what another needs.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENT_MODULES = sorted(
    [f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py") if p.stem != "__init__"]
    + [f"benchmarks.storefront.{p.stem}" for p in (REPO / "benchmarks" / "storefront").glob("*.py")
       if p.stem != "__init__"]
    + ["game_registry", "pipeline.swebench.game"])


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{statement} failed:\n{result.stderr[-2000:]}")
    return set(result.stdout.split())


@pytest.mark.parametrize("module", ENVIRONMENT_MODULES)
def test_environments_do_not_import_train(module):
    loaded = imported_after(f"import {module}")
    assert not {m for m in loaded if m == "train" or m.startswith("train.")}, module


def test_game_files_do_not_import_train():
    loaded = imported_after("import game_registry; game_registry.discover_games()")
    assert "games._storefront_game_kit" in loaded or any(m.startswith("trace_games.") for m in loaded)
    assert not {m for m in loaded if m == "train" or m.startswith("train.")}


def test_no_other_step_imports_a_private_pipeline_module():
    """The trainer, the gates, the environments and the benches use only public modules (helpers they share
    live in common/); Step-1 drivers (swebench's phase scripts) may run Step 1's own commands."""
    offenders = []
    for folder in ("train", "moe_gate", "benchmarks", "games", "bench", "common"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "pipeline._" in text or "from pipeline import _" in text:
                offenders.append(str(path.relative_to(REPO)))
    for path in (REPO / "game_registry.py", REPO / "render_pipeline.py"):
        if "pipeline._" in path.read_text(encoding="utf-8"):
            offenders.append(path.name)
    assert not offenders, f"these import a private pipeline module: {offenders}"
