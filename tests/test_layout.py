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
    + ["game_registry", "swebench.game"])


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


def test_the_demo_is_its_own_package_and_its_loop_and_report_do_not_import_each_other():
    """The demo lives in pipeline/demo/ (apart from the benchmark-agnostic Step 1-2 tools), and its loop (which
    runs models) and its report (which only renders records) share trainable.py and plotting.py instead of
    reaching into each other, at import time or inside a function."""
    assert not list((REPO / "pipeline").glob("demo_*.py")) and not (REPO / "pipeline" / "rule_labeler.py").exists()
    import ast

    for module, other in (("loop", "report"), ("report", "loop")):
        tree = ast.parse((REPO / "pipeline" / "demo" / f"{module}.py").read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {f"{node.module}.{alias.name}" if node.module == "pipeline.demo" else node.module
                     for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert f"pipeline.demo.{other}" not in imported, module
        assert f"pipeline.demo.{other}" not in imported_after(f"import pipeline.demo.{module}"), module
