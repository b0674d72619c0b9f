"""Layout: which folder may import which, read from every import statement of every module (top of file and
inside functions, by `ast`), and checked again at run time in fresh interpreters.

The rules (README "Layout"):
- environments (games/, benchmarks/, game_registry, swebench/'s scenario, generation, sandbox and grading
  modules) import no model stack (torch, transformers, peft, trl, vllm, accelerate) and none of train/,
  moe_gate/, pipeline/ or the demo: they can be played, graded and tested without a model;
- demo/ (the embedded experiment) sits on top of every step: nothing imports it;
- pipeline/ (Steps 1-2 tooling) imports neither train/ nor moe_gate/;
- moe_gate/ (Step 4's gates) imports none of the other steps, the environments or the demo (only common/);
- train/ imports neither pipeline/, swebench/ nor the demo;
- no import cycle between the project's modules; no module imports another top-level package's `_private`
  module or name.
"""
from __future__ import annotations

import ast
import functools
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


PROJECT = ("demo", "train", "moe_gate", "pipeline", "swebench", "benchmarks", "games", "common", "game_registry",
           "render_pipeline")
MODEL_STACK = ("torch", "transformers", "peft", "trl", "vllm", "accelerate")
# swebench/'s drivers that play scenarios with a model (model-driven calibration): the train side of swebench
SWEBENCH_DRIVERS = ("swebench.calibrate",)


def project_modules(root: Path = REPO) -> dict[str, Path]:
    """{dotted module name: file} for every module of the project's packages (not tests/, bench/ or the
    phase scripts of swebench/qwen3.6_self_trace/, which are scripts in a folder that is not a package)."""
    modules = {}
    for top in PROJECT:
        if (root / f"{top}.py").is_file():
            modules[top] = root / f"{top}.py"
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else ():
            parts = list(path.relative_to(root).with_suffix("").parts)
            if not all(part.isidentifier() for part in parts):
                continue  # not importable as a module (swebench/qwen3.6_self_trace/...)
            if "_sandbox_plugins" in parts:
                continue  # pytest plugins loaded inside the sandbox, by path
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@functools.lru_cache(maxsize=None)
def imports_of(name: str, path: Path, planted: str = "") -> list[tuple[str, str | None, int]]:
    """(dotted name imported, the imported name if `from X import name`, line) of every import in the file
    (with `planted` appended), at any depth (functions, try blocks), relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8") + planted)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            found.append((base, None, node.lineno))
            found += [(f"{base}.{alias.name}", alias.name, node.lineno) for alias in node.names]
    return found


def layer(module: str) -> str:
    """The layer a dotted name belongs to (third-party names: their top-level package)."""
    top = module.split(".")[0]
    if module == "demo" or module.startswith("demo."):
        return "demo"
    if module in SWEBENCH_DRIVERS or any(module.startswith(d + ".") for d in SWEBENCH_DRIVERS):
        return "swebench_driver"
    if top in ("games", "benchmarks", "game_registry", "swebench"):
        return "environment"
    return top


FORBIDDEN = {
    "environment": {*MODEL_STACK, "train", "moe_gate", "pipeline", "demo", "swebench_driver"},
    "pipeline": {"train", "moe_gate", "demo"},
    "moe_gate": {"train", "pipeline", "demo", "environment", "swebench_driver"},
    "train": {"pipeline", "demo", "swebench_driver"},
    "common": {"train", "moe_gate", "pipeline", "demo", "swebench_driver"},
}


def layout_violations(root: Path = REPO, planted: dict[str, str] | None = None) -> list[str]:
    """Every import that breaks a rule of the module docstring, and every import cycle, as readable lines;
    `planted` appends text to files ({path relative to root: text}) before they are read."""
    modules = project_modules(root)
    planted = planted or {}

    def resolve(dotted: str) -> str | None:  # the project module a dotted name lives in
        parts = dotted.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)

    problems, edges = [], {}
    for name, path in modules.items():
        edges[name] = set()
        for dotted, imported_name, line in imports_of(name, path, planted.get(str(path.relative_to(root)), "")):
            where = f"{path.relative_to(root)}:{line}"
            target = resolve(dotted)
            if target and target != name:
                edges[name].add(target)
            target_layer = layer(target or dotted)
            if target_layer in FORBIDDEN.get(layer(name), ()) or (target_layer == "demo" and layer(name) != "demo"):
                problems.append(f"{where}: {layer(name)} module {name} imports {dotted} ({target_layer})")
            other_package = dotted.split(".")[0] != name.split(".")[0] and dotted.split(".")[0] in PROJECT
            private = [part for part in dotted.split(".")[1:] if part.startswith("_") and not part.startswith("__")]
            if other_package and private:
                problems.append(f"{where}: {name} imports {dotted}, private to {dotted.split('.')[0]}")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in import_cycles(edges)]
    return sorted(set(problems))


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_every_import_of_every_module_follows_the_layout():
    problems = layout_violations()
    assert not problems, "layout violations:\n" + "\n".join(problems)


PLANTED = {  # (module file, line planted at the end of it, the violation it must produce)
    "environment imports the model stack": ("benchmarks/storefront/tasks.py", "def _planted():\n    import torch\n",
                                            "environment module benchmarks.storefront.tasks imports torch"),
    "environment imports train": ("games/capability_precondition_verification_game.py",
                                  "def _planted():\n    from train.agents import HFAgent\n", "imports train.agents"),
    "pipeline imports train": ("pipeline/aggregate_capabilities.py", "def _planted():\n    import train.grpo\n",
                               "pipeline module pipeline.aggregate_capabilities imports train.grpo (train)"),
    "pipeline imports the demo": ("pipeline/probes.py", "from demo import config as _c\n", "(demo)"),
    "moe_gate imports train": ("moe_gate/model_builder.py", "def _planted():\n    from train.policy import x\n",
                               "moe_gate module moe_gate.model_builder imports train.policy"),
    "train imports pipeline": ("train/grpo.py", "def _planted():\n    from pipeline.recalibrate import x\n",
                               "train module train.grpo imports pipeline.recalibrate"),
    "train imports swebench's driver": ("train/evaluate.py", "def _planted():\n    import swebench.calibrate\n",
                                        "imports swebench.calibrate (swebench_driver)"),
    "a private module of another package": ("train/evaluate.py",
                                            "def _planted():\n    from games._storefront.game import x\n",
                                            "private to games"),
    "a cycle": ("common/io.py", "def _planted():\n    import common.run_folder\n", "import cycle: common.io"),
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_planted_violation_of_each_kind_is_found(kind):
    """The check fails on each kind of bad import (the rules are not vacuous)."""
    file, line, expected = PLANTED[kind]
    problems = layout_violations(planted={file: "\n\n" + line})
    assert any(expected in problem for problem in problems), (kind, problems)


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{statement} failed:\n{result.stderr[-2000:]}")
    return set(result.stdout.split())


def models_loaded(loaded: set[str]) -> set[str]:
    """The model stack and the packages above the environments among loaded modules."""
    tops = (*MODEL_STACK, "train", "moe_gate", "pipeline")
    return {m for m in loaded if m.split(".")[0] in tops}


@pytest.mark.parametrize("module", ENVIRONMENT_MODULES)
def test_environments_load_no_model_stack(module):
    assert not models_loaded(imported_after(f"import {module}")), module


def test_game_files_load_no_model_stack():
    loaded = imported_after("import game_registry; game_registry.discover_games()")
    assert "games._storefront.game" in loaded or any(m.startswith("trace_games.") for m in loaded)
    assert not models_loaded(loaded)


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


@pytest.mark.slow  # ~5 s: two subprocesses import the demo's loop and report
def test_the_demo_is_its_own_package_and_its_loop_and_report_do_not_import_each_other():
    """The demo lives in demo/ (apart from the benchmark-agnostic Step 1-2 tools), and its loop (which
    runs models) and its report (which only renders records) share trainable.py and plotting.py instead of
    reaching into each other, at import time or inside a function."""
    assert not list((REPO / "pipeline").glob("demo_*.py")) and not (REPO / "pipeline" / "rule_labeler.py").exists()
    import ast

    for module, other in (("loop", "report"), ("report", "loop")):
        tree = ast.parse((REPO / "demo" / f"{module}.py").read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {f"{node.module}.{alias.name}" if node.module == "demo" else node.module
                     for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert f"demo.{other}" not in imported, module
        assert f"demo.{other}" not in imported_after(f"import demo.{module}"), module
