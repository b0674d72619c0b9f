"""The shipped base agent (demo/base_agent.py): it matches configs/demo.yaml, the demo uses it only when its
manifest matches the run's settings and its files are intact, and a build here is never thrown away for it."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from demo.config import base_settings
from demo.run import Demo
from demo.base_agent import MODEL_FILES, SHIPPED_DIR, file_sha256, ship, shipped_status
from demo.config import load_demo_config

REPO = Path(__file__).resolve().parents[1]


def test_shipped_agent_matches_configs_demo_yaml():
    """Fails when configs/demo.yaml's base section or its storefront config changes without a new shipped agent:
    rebuild (python -m demo --rebuild-base) and ship (python -m demo.base_agent ship)."""
    config = load_demo_config(REPO / "configs" / "demo.yaml")
    manifest, why = shipped_status(base_settings(config, config.storefront_config(REPO)))
    assert manifest is not None, why
    assert manifest["weights_sha256"] == file_sha256(SHIPPED_DIR / "model.safetensors")
    assert set(manifest["files"]) == set(MODEL_FILES)
    assert "--rebuild-base" in manifest["rebuild"]
    # lean: float32 safetensors of the 2.16M-parameter model, nothing else big
    assert sum(e["bytes"] for e in manifest["files"].values()) < 10_000_000


def _fake_run(run_dir: Path, settings: dict, weights: bytes = b"weights") -> None:
    """A completed base step as Demo.build_base leaves it (files with made-up bytes: shipping never loads them)."""
    model = run_dir / "base" / "model"
    model.mkdir(parents=True)
    for name in MODEL_FILES:
        (model / name).write_bytes(weights if name == "model.safetensors" else b"{}")
    selection = {"chats": 3, "steps": 2, "seconds": 1.0, "final_loss": 0.4, "log": [{"step": 1, "loss": 1.0}]}
    (model / "sft_info.json").write_text(json.dumps({"log": [{"step": 1, "loss": 2.0}], "openings": None,
                                                     "selection": selection}))
    figures = {"steps": 10, "final_loss": 0.5, "final_token_accuracy": 0.9, "tokens_per_s": 100.0, "parameters": 1,
               "demonstrations": 4, "demonstrations_failing_by_plant": 1, "log": [{"step": 1}], "openings": None,
               "selection": selection,
               "built": {"date": "2026-12-01", "commit": "abc1234", "machine": "test CPU", "python": "3",
                         "torch": "x"}}
    (run_dir / "base" / "step.json").write_text(json.dumps(
        {"step": "base", "fingerprint": "f", "complete": True, "settings": settings, "seconds": 5.0,
         "device": "cpu", "figures": figures}))


@pytest.fixture
def fast(tmp_path):
    config = load_demo_config(REPO / "configs" / "demo_fast.yaml")
    settings = json.loads(json.dumps(base_settings(config, config.storefront_config(REPO))))
    _fake_run(tmp_path / "built", settings)
    shipped = tmp_path / "shipped"
    manifest = ship(tmp_path / "built", shipped)
    return config, settings, shipped, manifest


def test_demo_uses_the_shipped_agent_when_its_manifest_matches(tmp_path, fast):
    config, settings, shipped, manifest = fast
    assert manifest["built"]["commit"] == "abc1234" and manifest["fingerprint"] and "log" not in manifest["figures"]
    demo = Demo(config, tmp_path / "run", fresh=False, profile="fast", shipped_dir=shipped)
    step_settings = demo.base_step_settings()
    assert step_settings == {**settings, "source": "shipped"}
    figures = demo.step("base", step_settings, (), demo.base)
    model = tmp_path / "run" / "base" / "model"
    assert (model / "model.safetensors").read_bytes() == b"weights"
    assert not (tmp_path / "run" / "base" / "init").exists()  # nothing was built
    assert figures["shipped"]["weights_sha256"] == manifest["weights_sha256"]
    assert figures["log"] == [{"step": 1, "loss": 2.0}] and figures["final_loss"] == 0.5
    # a late SFT stage: its figures shipped without its loss curve, which comes back from sft_info.json
    assert manifest["figures"]["selection"] == {"chats": 3, "steps": 2, "seconds": 1.0, "final_loss": 0.4}
    assert figures["selection"]["log"] == [{"step": 1, "loss": 1.0}] and "refresh" not in figures
    # the next run keeps the installed agent (same settings, same source): the step is up to date
    again = Demo(config, tmp_path / "run", fresh=False, profile="fast", shipped_dir=shipped)
    assert again.base_step_settings() == step_settings


def test_demo_builds_when_the_shipped_agent_does_not_match(tmp_path, fast, capsys):
    config, settings, shipped, manifest = fast
    other = dataclasses.replace(config, base=dataclasses.replace(config.base, epochs=config.base.epochs + 1))
    demo = Demo(other, tmp_path / "a", fresh=False, profile="fast", shipped_dir=shipped)
    assert "source" not in demo.base_step_settings() and demo.shipped_manifest is None
    assert "built from other settings (epochs differ)" in capsys.readouterr().out

    # a shipped file that does not match its manifest (a Git LFS pointer, a bad checkout): built here
    (shipped / "model.safetensors").write_bytes(b"weightz")
    demo = Demo(config, tmp_path / "b", fresh=False, profile="fast", shipped_dir=shipped)
    assert "source" not in demo.base_step_settings()
    assert "model.safetensors does not match its manifest's sha256" in capsys.readouterr().out
    (shipped / "model.safetensors").write_bytes(b"weights")

    # --rebuild-base: built here although the shipped agent matches
    demo = Demo(config, tmp_path / "c", fresh=False, profile="fast", rebuild_base=True, shipped_dir=shipped)
    assert "source" not in demo.base_step_settings()


def test_a_base_agent_built_here_is_kept(tmp_path, fast):
    config, settings, shipped, manifest = fast
    _fake_run(tmp_path / "run", settings, weights=b"built here")
    demo = Demo(config, tmp_path / "run", fresh=False, profile="fast", shipped_dir=shipped)
    assert demo.base_step_settings() == settings  # no "source": the build's fingerprint, as before shipping


def test_ship_refuses_what_is_not_a_build(tmp_path, fast):
    from common.validation import InputError

    config, settings, shipped, manifest = fast
    with pytest.raises(InputError, match="base step first"):
        ship(tmp_path / "nothing", tmp_path / "out")
    demo = Demo(config, tmp_path / "run", fresh=False, profile="fast", shipped_dir=shipped)
    demo.step("base", demo.base_step_settings(), (), demo.base)
    with pytest.raises(InputError, match="shipped one already"):
        ship(tmp_path / "run", tmp_path / "out")


def test_check_command_exit_codes():
    def check(config: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "demo.base_agent", "check", "--config", config], cwd=REPO,
                              capture_output=True, text=True, timeout=120)

    assert check("configs/demo.yaml").returncode == 0
    fast = check("configs/demo_fast.yaml")
    assert fast.returncode == 1 and "--rebuild-base" in fast.stdout
