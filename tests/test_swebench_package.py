"""swebench/ is both this repository's SWE-bench package and, once `pip install swebench` is done, the name of the
evaluation harness phases 1 and 6 run. Neither may hide the other: a stand-in harness is installed on PYTHONPATH
(a `swebench` package with its own __init__ and `harness.run_evaluation`) and both are imported from the
repository root and from elsewhere."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def installed_harness(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    harness = site / "swebench" / "harness"
    harness.mkdir(parents=True)
    (site / "swebench" / "__init__.py").write_text(
        '__version__ = "4.1.0"\nfrom swebench.harness.constants import KEY_INSTANCE_ID\n')
    (harness / "__init__.py").write_text("")
    (harness / "constants.py").write_text('KEY_INSTANCE_ID = "instance_id"\n')
    (harness / "run_evaluation.py").write_text(
        "from swebench.harness.constants import KEY_INSTANCE_ID\n"
        "if __name__ == '__main__':\n    print('stand-in harness', KEY_INSTANCE_ID)\n")
    return site


def python(args: list[str], cwd: Path, site: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_harness_runs_from_the_repository_root_beside_this_package(installed_harness):
    done = python(["-m", "swebench.harness.run_evaluation"], REPO, installed_harness)
    assert done.returncode == 0 and "stand-in harness instance_id" in done.stdout, done.stderr
    done = python(["-c", "import swebench.grading, swebench.scenario, swebench.harness.constants as c; "
                         "import swebench; print(c.KEY_INSTANCE_ID, swebench.__path__)"], REPO, installed_harness)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("instance_id") and str(REPO / "swebench") in done.stdout


def test_outside_the_repository_the_installed_harness_is_untouched(installed_harness, tmp_path):
    """As phase 6 runs it (cwd = its output folder): the harness's own __init__ runs, this package is absent."""
    done = python(["-c", "import swebench; print(swebench.__version__, swebench.KEY_INSTANCE_ID)"], tmp_path,
                  installed_harness)
    assert done.returncode == 0 and done.stdout.split() == ["4.1.0", "instance_id"], done.stderr


def test_phase_scripts_find_the_harness_only_when_it_is_installed(installed_harness):
    """This package's own folder must not pass for the harness in the phases' prerequisite check."""
    check = ("import sys; sys.path.insert(0, 'swebench/qwen3.6_self_trace'); import _common; "
             "print(_common.module_problem('swebench.harness.run_evaluation', 'pip install swebench'))")
    assert python(["-c", check], REPO, installed_harness).stdout.strip() == "None"
    missing = python(["-c", check], REPO, None)
    assert missing.returncode == 0 and "is not installed" in missing.stdout, missing.stderr


def test_pipeline_holds_no_swebench_code():
    """Steps 1-2's benchmark-agnostic tools stay in pipeline/; only artifacts go to pipeline/swebench/."""
    assert not [p for p in (REPO / "pipeline").rglob("*.py") if "swebench" in p.relative_to(REPO).parts]
    assert (REPO / "swebench" / "scenario.py").is_file() and (REPO / "swebench" / "__init__.py").is_file()
