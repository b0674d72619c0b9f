"""Bad input is refused at the door: every CLI checks its output path and numeric flags before any work,
exits 2 with `error: ...` on stderr and writes nothing. Also: games that cannot be built or reset.

Each CLI runs in-process (`main([...])`) with the function that starts the work replaced by a recorder, so
"the work did not start" is checked directly; one subprocess per CLI covers the real entry point.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import game_registry
import toy_games as toy
from benchmarks.storefront import run as storefront_run
from pipeline import calibrate_environment, recalibrate, validate_game
from common.io import check_output_path
from common.validation import InputError, check_number
from signals import restore_sigint
from train import agents as train_agents
from train import play

REPO = Path(__file__).resolve().parent.parent
SUBPROCESS_TIMEOUT = 120


# --------------------------------------------------------------------------------------------------
# Shared fixtures
# --------------------------------------------------------------------------------------------------
def _files(root: Path) -> list[tuple[str, bytes]]:
    """Every path under `root` with the content of each file: a snapshot to prove nothing was written."""
    return sorted((str(p.relative_to(root)), p.read_bytes() if p.is_file() else b"/") for p in root.rglob("*"))


@pytest.fixture
def unwritable_folder(tmp_path):
    """A folder where no file can be created. Root ignores permission bits, so root gets /sys instead."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        yield locked
        locked.chmod(0o755)  # let pytest clean up
        return
    if not Path("/sys").is_dir():
        pytest.skip("running as root without /sys: no folder that root cannot write to")
    yield Path("/sys")


@pytest.fixture
def bad_outputs(tmp_path, unwritable_folder):
    """(output path, part of the expected error) for each kind of output path a CLI must refuse."""
    folder = tmp_path / "existing_folder"
    folder.mkdir()
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("must stay as it is\n")
    return [
        (folder, "is a folder, not a file"),
        (a_file / "out.json", "a_file.txt is a file, not a folder"),
        (unwritable_folder / "trace_out.json", f"cannot create files in {unwritable_folder}"),
    ]


class Recorder:
    """Stands in for the function that starts a CLI's work; the tests assert it was never called."""

    def __init__(self, result=None):
        self.calls: list[tuple] = []
        self.result = result

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.result


def expect_refused(code: int, capsys, flag: str, message: str) -> None:
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}"), err
    assert message in err, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------------------
# The helpers in common/io.py
# --------------------------------------------------------------------------------------------------
def test_check_output_path_refuses_each_bad_kind(bad_outputs, tmp_path):
    before = _files(tmp_path)
    for path, message in bad_outputs:
        with pytest.raises(InputError, match=re.escape(message)):
            check_output_path(path, "--out")
    with pytest.raises(InputError, match="is a folder"):
        check_output_path(str(tmp_path / "not_yet") + os.sep, "--out")  # a trailing slash means a folder
    with pytest.raises(InputError, match="a_file.txt is a file"):
        check_output_path(tmp_path / "a_file.txt" / "deeper" / "out.json", "--out")
    with pytest.raises(InputError, match="--out is empty"):
        check_output_path("", "--out")
    assert _files(tmp_path) == before
    assert not (bad_outputs[2][0]).exists()


def test_an_output_over_an_input_is_refused_by_one_rule(tmp_path):
    """The same file by another name (a symlink, `..`) is one of the inputs; a folder output may not hold one; a
    file output beside an input, or an unset input, is fine."""
    from common.io import check_not_an_input, check_output_folder

    data = tmp_path / "data" / "results.json"
    data.parent.mkdir()
    data.write_text("{}")
    (tmp_path / "link.json").symlink_to(data)
    for output in (data, tmp_path / "link.json", tmp_path / "data" / ".." / "data" / "results.json"):
        with pytest.raises(InputError, match=r"is also the rollouts file: the command would overwrite what it reads"):
            check_output_path(output, "--out", [("the rollouts file", data)])
    with pytest.raises(InputError, match=r"--out .*/data holds --corpus \(.*results.json\)"):
        check_output_folder(tmp_path / "data", "--out", [("--corpus", data)])
    with pytest.raises(InputError, match="holds"):
        check_output_folder(tmp_path, "--out", [("--corpus", data)])  # any depth
    check_output_path(tmp_path / "data" / "out.json", "--out", [("the rollouts file", data), ("--config", None)])
    check_output_folder(tmp_path / "elsewhere", "--out", [("--corpus", data)])
    check_not_an_input(tmp_path / "data", "--out", [("--corpus", data)])  # a file output: only the same path


def test_check_output_path_accepts_new_files_missing_folders_and_overwrites(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    for path in (existing, tmp_path / "new.json", tmp_path / "runs" / "deep" / "new.json"):
        check_output_path(path, "--out")
    assert _files(tmp_path) == [("old.json", b"{}")]  # the check itself creates nothing


@pytest.mark.parametrize(
    "value, bounds, ok",
    [
        (0.5, dict(low=0.0, high=1.0), True),
        (1.0, dict(low=0.0, high=1.0, low_open=True), True),
        (0.0, dict(low=0.0, high=1.0, low_open=True), False),
        (1.0, dict(low=0.0, high=1.0, high_open=True), False),
        (math.nan, dict(low=0.0, high=1.0), False),
        (math.nan, dict(), False),
        (math.inf, dict(low=0.0), False),
        (-math.inf, dict(high=0.0), False),
        (1e300, dict(low=0.0), True),
        (-0.5, dict(low=0.0), False),
        (True, dict(), False),
    ],
)
def test_check_number(value, bounds, ok):
    if ok:
        assert check_number(value, "--x", **bounds) == value
    else:
        with pytest.raises(InputError, match=r"^--x must be a finite number.*, got "):
            check_number(value, "--x", **bounds)


def test_check_number_spells_out_the_range():
    with pytest.raises(InputError, match=re.escape("--t must be a finite number in (0, 1], got nan")):
        check_number(math.nan, "--t", 0.0, 1.0, low_open=True)
    with pytest.raises(InputError, match=re.escape("--s must be a finite number > 0, got inf")):
        check_number(math.inf, "--s", 0.0, low_open=True)


# --------------------------------------------------------------------------------------------------
# pipeline.validate_game
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def counted_game(monkeypatch):
    """A registered toy game whose make_env calls are counted: (name, calls)."""
    calls: list[int] = []
    spec = toy.make_spec(name="toy_vault_door")
    build = spec.make_env

    def make_env(config=None):
        calls.append(1)
        return build(config)

    spec.make_env = make_env
    toy.register_temporarily(monkeypatch, spec)
    return spec.name, calls


def test_validate_game_refuses_bad_json_output_before_building_the_game(counted_game, bad_outputs, tmp_path,
                                                                         capsys):
    name, calls = counted_game
    before = _files(tmp_path)
    for path, message in bad_outputs:
        code = validate_game.main([name, "--seeds", "5", "--fuzz-actions", "0", "--no-progress",
                                   "--json-output", str(path)])
        expect_refused(code, capsys, "--json-output", message)
    assert calls == [] and _files(tmp_path) == before


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "1.5"])
def test_validate_game_refuses_bad_max_baseline(counted_game, value, tmp_path, capsys):
    name, calls = counted_game
    out = tmp_path / "report.json"
    code = validate_game.main([name, f"--max-baseline={value}", "--json-output", str(out), "--no-progress"])
    expect_refused(code, capsys, "--max-baseline", "must be a finite number in (0, 1], got")
    assert calls == [] and not out.exists()


def test_validate_game_that_cannot_be_built_exits_2_before_any_check(monkeypatch, tmp_path, capsys):
    toy.register_temporarily(monkeypatch, toy.make_spec(toy.UnbuildableVault, name="toy_vault_unbuildable"))
    out = tmp_path / "report.json"
    code = validate_game.main(["toy_vault_unbuildable", "--seeds", "3", "--json-output", str(out), "--no-progress"])
    assert code == 2
    captured = capsys.readouterr()
    assert ("error: game 'toy_vault_unbuildable' cannot be built: make_env() raised RuntimeError: "
            "vault database file is missing") in captured.err
    assert "RESULT" not in captured.out and not out.exists()


def test_validate_game_fails_determinism_when_no_seed_can_be_reset(monkeypatch, tmp_path, capsys):
    toy.register_temporarily(monkeypatch, toy.make_spec(toy.UnresettableVault, name="toy_vault_unresettable"))
    out = tmp_path / "report.json"
    for seeds in ("1", "4"):  # one seed: nothing to compare and no distinct-share test to fall back on
        code = validate_game.main(["toy_vault_unresettable", "--seeds", seeds, "--fuzz-actions", "5",
                                   "--json-output", str(out), "--no-progress"])
        assert code == 1
        determinism = json.loads(out.read_text())["checks"]["determinism"]
        assert determinism["status"] == "FAIL"
        assert determinism["detail"].startswith(f"no seed could be reset ({seeds} tried)")
        assert "ValueError: seed 0 has no vault" in determinism["detail"]
        assert "FAIL  determinism" in capsys.readouterr().out


class OddSeedsUnresettableVault(toy.VaultGame):
    def reset(self, seed):
        if seed % 2:
            raise KeyError(f"seed {seed}")
        return super().reset(seed)


def test_determinism_reports_seeds_that_could_not_be_reset():
    determinism = validate_game.validate(toy.make_spec(OddSeedsUnresettableVault), seeds=6, fuzz_actions=0)[
        "checks"]["determinism"]
    assert determinism["detail"].startswith("3/6 seeds reproduce; distinct initial messages 100.0%; "
                                            "3 seeds could not be reset (e.g. seed 1, reset: KeyError")
    assert determinism["unreset_seeds"] == 3


def test_determinism_catches_a_reset_that_raises_only_sometimes():
    first_tries: set[int] = set()

    class FlakyResetVault(toy.VaultGame):
        def reset(self, seed):
            if seed % 2 and seed not in first_tries:  # the first reset of an odd seed raises, later ones work
                first_tries.add(seed)
                raise TimeoutError("database not ready")
            return super().reset(seed)

    determinism = validate_game.validate(toy.make_spec(FlakyResetVault), seeds=4, fuzz_actions=0)["checks"][
        "determinism"]
    assert determinism["status"] == "FAIL"
    assert "seed 1: initial messages differ between two resets" in determinism["detail"]
    assert "2/4 seeds reproduce" in determinism["detail"]


def test_validate_survives_a_make_env_that_raises_after_the_first_instance():
    calls: list[int] = []

    def make_env(config=None):
        calls.append(1)
        if len(calls) > 1:
            raise OSError("out of file handles")
        return toy.VaultGame(config)

    spec = toy.make_spec(name="toy_vault_flaky_build")
    spec.make_env = make_env
    report = validate_game.validate(spec, seeds=3, fuzz_actions=5)
    assert not report["passed"]
    checks = report["checks"]
    for name in ("oracle", "baselines", "determinism", "fuzz", "protocol", "tool_schemas"):
        assert checks[name]["status"] == "FAIL", name
        assert "OSError: out of file handles" in checks[name]["detail"], name
    assert "make_env" in checks["oracle"]["detail"] and "make_env" in checks["fuzz"]["detail"]


def test_validate_game_subprocess_reports_an_unbuildable_game(tmp_path):
    games = tmp_path / "games"
    games.mkdir()
    (games / "capability_unbuildable_door_game.py").write_text(UNBUILDABLE_GAME_FILE)
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.validate_game", "capability_unbuildable_door", "--json-output", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
        env={**os.environ, "TRACE_GAMES_DIRS": str(games)},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: game 'capability_unbuildable_door' cannot be built: make_env() raised RuntimeError: " \
           "no product catalogue" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


# --------------------------------------------------------------------------------------------------
# python game_registry.py --list
# --------------------------------------------------------------------------------------------------
UNBUILDABLE_GAME_FILE = '''
from game_registry import GameSpec, register_game


def make_env(config=None):
    raise RuntimeError("no product catalogue")


register_game(GameSpec(name="capability_unbuildable_door", make_env=make_env, capability="nothing"))
'''


def test_list_shows_an_unbuildable_game_with_a_question_mark(monkeypatch, capsys):
    monkeypatch.setattr(game_registry, "_DISCOVERED", True)
    monkeypatch.setattr(game_registry, "_REGISTRY", {})
    game_registry.register_game(toy.make_spec(name="toy_vault_listed"))
    game_registry.register_game(toy.make_spec(toy.UnbuildableVault, name="toy_vault_broken"))
    assert game_registry.main(["--list"]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()  # sorted by name: the broken game first, the one after it still listed
    assert re.fullmatch(r"toy_vault_broken\s+toy_arithmetic\s+\?\s+12", lines[1])
    assert re.fullmatch(rf"toy_vault_listed\s+toy_arithmetic\s+{len(toy.VAULT_TOOL_SCHEMAS)}\s+12", lines[2])
    assert ("warning: game 'toy_vault_broken' cannot be built or list its tools: RuntimeError: "
            "vault database file is missing") in captured.err
    assert captured.err.rstrip().endswith("error: 1 game(s) could not be built: toy_vault_broken")


def test_list_subprocess_keeps_listing_past_an_unbuildable_game(tmp_path):
    games = tmp_path / "games"
    games.mkdir()
    (games / "capability_unbuildable_door_game.py").write_text(UNBUILDABLE_GAME_FILE)
    result = subprocess.run([sys.executable, "game_registry.py", "--list"], cwd=REPO, capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT, env={**os.environ, "TRACE_GAMES_DIRS": str(games)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert re.search(r"^capability_unbuildable_door\s+nothing\s+\?\s+12$", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^storefront\s", result.stdout, re.MULTILINE)  # the games after it are still listed
    assert "RuntimeError: no product catalogue" in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------------
# pipeline/calibrate_environment.py
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def rollouts_file(tmp_path):
    sims = [{"id": f"{t}-{i}", "task_id": t, "sample_idx": i, "reward_info": {"reward": float((t + i) % 2)}}
            for t in range(4) for i in range(4)]
    path = tmp_path / "rollouts.json"
    path.write_text(json.dumps({"info": {}, "tasks": [], "simulations": sims}))
    return path


def test_calibrate_refuses_bad_json_output_before_reading_rollouts(rollouts_file, bad_outputs, tmp_path, monkeypatch,
                                                                    capsys):
    reads = Recorder()
    monkeypatch.setattr(calibrate_environment, "load_json", reads)
    before = _files(tmp_path)
    for path, message in bad_outputs:
        code = calibrate_environment.main([str(rollouts_file), "--json-output", str(path)])
        expect_refused(code, capsys, "--json-output", message)
    assert reads.calls == [] and _files(tmp_path) == before


@pytest.mark.parametrize(
    "flags, flag, message",
    [
        (["--success-threshold", "nan"], "--success-threshold", "in (0, 1], got nan"),
        (["--success-threshold", "0"], "--success-threshold", "in (0, 1], got 0.0"),
        (["--success-threshold=-inf"], "--success-threshold", "in (0, 1], got -inf"),
        (["--min-mean-reward", "nan"], "--min-mean-reward", "in [0, 1], got nan"),
        (["--max-frac-constant", "inf"], "--max-frac-constant", "in [0, 1], got inf"),
        (["--max-pass-at-k", "4=nan"], "the VALUE of --max-pass-at-k 4=VALUE", "in [0, 1], got nan"),
    ],
)
def test_calibrate_refuses_bad_numbers(rollouts_file, flags, flag, message, tmp_path, monkeypatch, capsys):
    reads = Recorder()
    monkeypatch.setattr(calibrate_environment, "load_json", reads)
    out = tmp_path / "calibration.json"
    code = calibrate_environment.main([str(rollouts_file), *flags, "--json-output", str(out)])
    expect_refused(code, capsys, flag, f"must be a finite number {message}")
    assert reads.calls == [] and not out.exists()


def test_calibrate_script_refuses_nan_threshold(rollouts_file, tmp_path):
    out = tmp_path / "calibration.json"
    result = subprocess.run(
        [sys.executable, "pipeline/calibrate_environment.py", str(rollouts_file), "--success-threshold", "nan",
         "--json-output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --success-threshold must be a finite number in (0, 1], got nan"
    assert not out.exists()


# --------------------------------------------------------------------------------------------------
# python -m pipeline.recalibrate
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def recal_game(monkeypatch):
    toy.register_temporarily(monkeypatch, toy.make_spec(name="toy_vault_recal_door"))
    lookups = Recorder()
    real_lookup_game = recalibrate.lookup_game

    def lookup_game(name):
        lookups(name)
        return real_lookup_game(name)

    monkeypatch.setattr(recalibrate, "lookup_game", lookup_game)
    return "toy_vault_recal_door", lookups


def test_recalibrate_refuses_bad_json_output_before_reading_anything(recal_game, rollouts_file, bad_outputs,
                                                                      tmp_path, capsys):
    name, lookups = recal_game
    before = _files(tmp_path)
    for path, message in bad_outputs:
        code = recalibrate.main(["--game", name, "--knob", "n_keys", "--rollouts", f"2={rollouts_file}",
                                 "--json-output", str(path)])
        expect_refused(code, capsys, "--json-output", message)
    assert lookups.calls == [] and _files(tmp_path) == before


@pytest.mark.parametrize("value", ["nan", "inf", "0", "1.5"])
def test_recalibrate_refuses_bad_success_threshold(recal_game, rollouts_file, value, tmp_path, capsys):
    name, lookups = recal_game
    out = tmp_path / "decision.json"
    code = recalibrate.main(["--game", name, "--knob", "n_keys", "--rollouts", f"2={rollouts_file}",
                             "--success-threshold", value, "--json-output", str(out)])
    expect_refused(code, capsys, "--success-threshold", "must be a finite number in (0, 1], got")
    assert lookups.calls == [] and not out.exists()


@pytest.mark.parametrize("band", ["nan,0.5", "0.2,nan", "nan,nan", "-inf,0.5"])
def test_recalibrate_refuses_nan_band(recal_game, rollouts_file, band, tmp_path, capsys):
    name, lookups = recal_game
    out = tmp_path / "decision.json"
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses the value: exit 2, usage + error on stderr
        recalibrate.main(["--game", name, "--knob", "n_keys", "--rollouts", f"2={rollouts_file}",
                          f"--band={band}", "--json-output", str(out)])
    assert exit_info.value.code == 2
    assert "error: argument --band: band needs finite numbers 0 <= LOW <= HIGH <= 1" in capsys.readouterr().err
    assert lookups.calls == [] and not out.exists()


# --------------------------------------------------------------------------------------------------
# python -m benchmarks.storefront.run
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def no_benchmark(monkeypatch):
    runs = Recorder(result=([], []))
    monkeypatch.setattr(storefront_run, "run_journaled", runs)
    return runs


def test_storefront_refuses_bad_out_before_running(no_benchmark, bad_outputs, tmp_path, capsys):
    before = _files(tmp_path)
    for path, message in bad_outputs:
        code = storefront_run.main(["--agent", "expert", "--tasks", "100000", "--out", str(path), "--no-progress"])
        expect_refused(code, capsys, "--out", message)
    assert no_benchmark.calls == [] and _files(tmp_path) == before


@pytest.mark.parametrize(
    "flags, flag, message",
    [
        (["--temperature", "nan"], "--temperature", "must be a finite number >= 0, got nan"),
        (["--temperature", "inf"], "--temperature", "must be a finite number >= 0, got inf"),
        (["--temperature=-0.5"], "--temperature", "must be a finite number >= 0, got -0.5"),
        (["--max-new-tokens", "0"], "--max-new-tokens", "must be >= 1, got 0"),
    ],
)
def test_storefront_refuses_bad_numbers(no_benchmark, flags, flag, message, tmp_path, capsys):
    out = tmp_path / "results.json"
    code = storefront_run.main(["--agent", "expert", "--tasks", "100000", "--out", str(out), "--no-progress", *flags])
    expect_refused(code, capsys, flag, message)
    assert no_benchmark.calls == [] and not out.exists()


def test_storefront_subprocess_refuses_a_folder_as_out_at_once(tmp_path):
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.storefront.run", "--agent", "expert", "--tasks", "100000",
         "--out", str(tmp_path), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: --out {tmp_path}: is a folder, not a file")
    assert time.perf_counter() - started < 60  # 100000 tasks would take many minutes
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------
# python bench/env_step.py
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def env_step(monkeypatch):
    """bench/env_step.py as a module (bench/ is not a package), with `measure` recorded."""
    spec = importlib.util.spec_from_file_location("bench_env_step_under_test", REPO / "bench" / "env_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.measured = Recorder()
    monkeypatch.setattr(module, "measure", module.measured)
    return module


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seconds", "nan"], "--seconds must be a finite number > 0, got nan"),
        (["--seconds", "inf"], "--seconds must be a finite number > 0, got inf"),
        (["--seconds", "0"], "--seconds must be a finite number > 0, got 0.0"),
        (["--seconds=-1"], "--seconds must be a finite number > 0, got -1.0"),
        (["--target", "nan"], "--target must be a finite number >= 0, got nan"),
        (["--target=-5"], "--target must be a finite number >= 0, got -5.0"),
    ],
)
def test_env_step_refuses_bad_numbers(env_step, flags, message, capsys):
    code = env_step.main([*flags, "--games", "storefront"])
    expect_refused(code, capsys, message.split()[0], message)
    assert env_step.measured.calls == []


def test_env_step_subprocess_refuses_nan_seconds():
    # Before the check, --seconds nan never ended (`elapsed >= nan` is always False): the timeout catches that.
    result = subprocess.run([sys.executable, "bench/env_step.py", "--seconds", "nan"], cwd=REPO, capture_output=True,
                            text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --seconds must be a finite number > 0, got nan"
    assert result.stdout == ""


# --------------------------------------------------------------------------------------------------
# python -m train.evaluate, python -m train.collect_rollouts (issue 28): checked before any model load
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def no_model_load(monkeypatch):
    """Model loads in train.evaluate and train.collect_rollouts replaced by recorders (tokenizers still load)."""
    from train import collect_rollouts, evaluate

    loads = Recorder()
    monkeypatch.setattr(evaluate, "load_policy_model", loads)
    monkeypatch.setattr(collect_rollouts, "load_base_model", loads)
    return loads


def _evaluate(model_dir, out, *flags):
    from train import evaluate

    return evaluate.main(["--model", str(model_dir), "--tasks", "2", "--out", str(out), *flags])


def _collect(model_dir, out, *flags):
    from train import collect_rollouts

    return collect_rollouts.main(["--game", "storefront", "--model", str(model_dir), "--seeds", "2", "--samples", "2",
                                  "--out", str(out), *flags])


def test_evaluate_unknown_game_exits_2_before_loading(tiny_model_dir, no_model_load, tmp_path, capsys):
    # Before: KeyError traceback after the model had loaded.
    out = tmp_path / "results.json"
    code = _evaluate(tiny_model_dir, out, "--game", "nope")
    expect_refused(code, capsys, "unknown game 'nope'", "registered games: ")
    assert no_model_load.calls == [] and not out.exists()


@pytest.mark.parametrize("run", [_evaluate, _collect])
@pytest.mark.parametrize("tokens, message", [
    ("-1", "--max-episode-tokens must be an integer >= 16, got -1"),
    ("0", "--max-episode-tokens must be an integer >= 16, got 0"),
    ("40", "no episode could generate a token and every one would score 0"),
])
def test_max_episode_tokens_below_the_prompt_exits_2(run, tokens, message, tiny_model_dir, no_model_load, tmp_path,
                                                     capsys):
    # Before: every episode scored 0 without a word (train exits 2 on the same: the same rule now).
    out = tmp_path / "results.json"
    code = run(tiny_model_dir, out, "--max-episode-tokens", tokens)
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert no_model_load.calls == [] and not out.exists()


def test_collect_rollouts_refuses_bad_out_before_loading(tiny_model_dir, no_model_load, bad_outputs, tmp_path,
                                                         capsys):
    # Before: every rollout was collected, then IsADirectoryError (or a write error) on the output.
    before = _files(tmp_path)
    for path, message in bad_outputs:
        expect_refused(_collect(tiny_model_dir, path), capsys, "--out", message)
    assert no_model_load.calls == [] and _files(tmp_path) == before


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_collect_rollouts_refuses_bad_temperature(value, tiny_model_dir, no_model_load, tmp_path, capsys):
    # Before: --temperature nan crashed in the sampler after the model had loaded.
    out = tmp_path / "rollouts.json"
    code = _collect(tiny_model_dir, out, f"--temperature={value}")
    expect_refused(code, capsys, "--temperature", "must be a finite number >= 0")
    assert no_model_load.calls == [] and not out.exists()


def test_model_folder_without_weights_exits_2(tiny_model_dir, no_model_load, tmp_path, capsys):
    broken = tmp_path / "model"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    for run in (_evaluate, _collect):
        code = run(broken, tmp_path / "results.json")
        expect_refused(code, capsys, "--model", "no weights")
    assert no_model_load.calls == [] and not (tmp_path / "results.json").exists()


# --------------------------------------------------------------------------------------------------
# The SWE-bench path: swebench.calibrate, phase3_synthesize.py, phase4_validate.py (issue 28)
# --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _script(path: str, name: str):
    """A script of the repository as a module (its folder is not a package: its sibling modules, such as the
    phases' `_common`, import as they do when the script is run by path, from the script's folder). Loaded once
    per name: the tests change its attributes only through monkeypatch, which puts them back."""
    folder = str((REPO / path).parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
    (["--temperature=-1"], "--temperature must be a finite number >= 0, got -1.0"),
    (["--max-episode-tokens", "10"], "--max-episode-tokens must be an integer >= 256, got 10"),
])
def test_swebench_calibrate_checks_numbers_before_any_rollout(flags, message, monkeypatch, tmp_path, capsys):
    # Before: --temperature nan wrote state.json, then crashed in the sampler.
    from swebench import calibrate

    rollouts = Recorder()
    monkeypatch.setattr(calibrate, "trainer_rollouts", rollouts)
    code = calibrate.main(["--capability", "semantic_logic_precision", "--model", "some/model", *flags,
                           "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out.json")])
    expect_refused(code, capsys, message.split()[0], message)
    assert rollouts.calls == [] and list(tmp_path.iterdir()) == []


def test_swebench_calibrate_refuses_a_work_folder_in_use(monkeypatch, tmp_path, capsys):
    from common.run_folder import claimed_run_folder
    from swebench import calibrate

    rollouts = Recorder()
    monkeypatch.setattr(calibrate, "trainer_rollouts", rollouts)
    with claimed_run_folder(tmp_path / "work", "--work-dir", fresh=False, command="python -m swebench.calibrate (1)"):
        code = calibrate.main(["--capability", "semantic_logic_precision", "--model", "some/model", "--work-dir",
                               str(tmp_path / "work"), "--out", str(tmp_path / "out.json"), "--unsafe-no-isolation"])
    expect_refused(code, capsys, "--work-dir",
                   f"is in use by another run (pid {os.getpid()}, `python -m swebench.calibrate (1)`")
    assert rollouts.calls == []


@pytest.mark.parametrize("flags, message", [
    (["--threshold", "nan"], "--threshold must be a finite number in [0, 1], got nan"),
    (["--threshold", "nan", "--model", "some/model"], "--threshold must be a finite number in [0, 1], got nan"),
    (["--samples", "0"], "--samples must be an integer >= 1, got 0"),
    (["--rounds", "9"], "--rounds must be an integer in [0, 5], got 9"),
    (["--workers", "0"], "--workers must be an integer >= 1, got 0"),
])
def test_phase3_checks_flags_before_generating(flags, message, monkeypatch, tmp_path, capsys):
    # Before: --threshold nan generated and self-tested 20 scenarios, then exited 2.
    from swebench import generate

    phase3 = _script("swebench/qwen3.6_self_trace/phase3_synthesize.py", "phase3_under_test")
    generated = Recorder(result=0)
    monkeypatch.setattr(generate, "main", generated)
    code = phase3.main(["--run-dir", str(tmp_path / "run"), "--capability", "semantic_logic_precision", *flags])
    expect_refused(code, capsys, message.split()[0], message)
    assert generated.calls == [] and list(tmp_path.iterdir()) == []


def test_phase3_refuses_a_run_dir_under_a_file(monkeypatch, tmp_path, capsys):
    from swebench import generate

    phase3 = _script("swebench/qwen3.6_self_trace/phase3_synthesize.py", "phase3_under_test")
    generated = Recorder(result=0)
    monkeypatch.setattr(generate, "main", generated)
    (tmp_path / "a_file").write_text("x")
    code = phase3.main(["--run-dir", str(tmp_path / "a_file" / "run")])
    expect_refused(code, capsys, "--run-dir", "a_file is a file, not a folder")
    assert generated.calls == []


@pytest.mark.parametrize("flags, message", [
    (["--fuzz-actions", "-1"], "--fuzz-actions must be an integer >= 0, got -1"),
    (["--workers", "0"], "--workers must be an integer >= 1, got 0"),
])
def test_phase4_checks_flags_before_self_testing(flags, message, monkeypatch, tmp_path, capsys):
    # Before: --fuzz-actions -1 self-tested every scenario, then a traceback in validate_game.
    from swebench import selftest

    phase4 = _script("swebench/qwen3.6_self_trace/phase4_validate.py", "phase4_under_test")
    tested = Recorder(result=[])
    monkeypatch.setattr(selftest, "self_test_many", tested)
    scenarios = tmp_path / "scenarios.json"
    scenarios.write_text("[]")
    code = phase4.main([str(scenarios), "--run-dir", str(tmp_path / "run"), *flags])
    expect_refused(code, capsys, message.split()[0], message)
    assert tested.calls == [] and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------------
# python -m demo.tau2 (issue 28)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--rho", "nan"], "rho must be in [0, 1] (got nan)"),
    (["--delta=-inf"], "delta must be in [-1, 1] (got -inf)"),
    (["--k", "0"], "k must be an integer >= 1 (got 0)"),
    (["--runs", "3", "--k", "5"], "--k 5 must be <= --runs 3"),
])
def test_demo_tau2_checks_thresholds_before_writing(flags, message, monkeypatch, tmp_path, capsys):
    # Before: --rho nan wrote 22 files (summary, candidates, labels, run files), then exited 2.
    from demo import tau2 as demo_tau2

    selection = Recorder()
    monkeypatch.setattr(demo_tau2, "run_selection", selection)
    code = demo_tau2.main(["--run-dir", str(tmp_path / "run"), *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert selection.calls == [] and list(tmp_path.iterdir()) == []


def test_demo_tau2_refuses_a_run_dir_that_cannot_be_created(monkeypatch, tmp_path, unwritable_folder, capsys):
    # Before: a traceback (NotADirectoryError / PermissionError) from the first write.
    from demo import tau2 as demo_tau2

    selection = Recorder()
    monkeypatch.setattr(demo_tau2, "run_selection", selection)
    (tmp_path / "a_file").write_text("x")
    for run_dir, message in ((tmp_path / "a_file" / "run", "a_file is a file, not a folder"),
                             (unwritable_folder / "run", "cannot create files in")):
        expect_refused(demo_tau2.main(["--run-dir", str(run_dir)]), capsys, "--run-dir", message)
    assert selection.calls == []


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("agent, flag, message", [
    ("hf:{weightless}", "--agent hf:", "no weights"),
    ("hf:{missing}", "--agent hf:", "folder not found"),
    ("vllm:localhost:8000", "--agent vllm:", "add http://"),
    ("vllm:http://127.0.0.1:{port}", "--agent vllm:", "no server listens at http://127.0.0.1:"),
])
def test_storefront_refuses_a_bad_agent_before_building_it(agent, flag, message, no_benchmark, tiny_model_dir,
                                                           tmp_path, capsys):
    # Before: hf:<folder without weights> gave a transformers traceback; a dead vllm: server one after ~34 s.
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_bytes((tiny_model_dir / "config.json").read_bytes())
    agent = agent.format(weightless=weightless, missing=tmp_path / "missing", port=_free_port())
    out = tmp_path / "results.json"
    started = time.monotonic()
    tokenizer = ["--tokenizer", str(tiny_model_dir)] if agent.startswith("vllm:") else []
    code = play.main(["--agent", agent, *tokenizer, "--tasks", "2", "--out", str(out), "--no-progress"])
    expect_refused(code, capsys, flag, message)
    assert time.monotonic() - started < 5
    assert no_benchmark.calls == [] and not out.exists()


@pytest.mark.parametrize("agent", ["hf:{model}", "expert", "flawed:wrong_refund_method"])
@pytest.mark.parametrize("flags, named", [
    (["--tokenizer", "{model}"], "--tokenizer"),
    (["--model", "served-name"], "--model"),
    (["--api-key-env", "HOME"], "--api-key-env"),
    (["--tokenizer", "{model}", "--model", "m"], "--tokenizer, --model"),
])
def test_storefront_refuses_server_flags_for_other_agents(agent, flags, named, no_benchmark, tiny_model_dir,
                                                          tmp_path, capsys):
    # Before: --tokenizer, --model and --api-key-env were accepted and ignored for hf:, expert and flawed: agents
    # (an hf: agent reads its own folder's tokenizer), and the journal recorded a tokenizer the run never used.
    out = tmp_path / "results.json"
    argv = ["--agent", agent, *flags, "--tasks", "2", "--out", str(out), "--no-progress"]
    code = play.main([arg.format(model=tiny_model_dir) for arg in argv])
    expect_refused(code, capsys, named, "read only by a vllm:URL agent")
    assert no_benchmark.calls == [] and not out.exists()


def test_tau2_run_refuses_server_flags_for_other_agents(tmp_path, capsys):
    from benchmarks import tau2_run

    out = tmp_path / "results.json"
    code = tau2_run.main(["--domain", "retail", "--agent", "expert", "--api-key-env", "HOME", "--out",
                          str(out), "--user-base-url", "http://127.0.0.1:9/v1", "--user-model", "m"])
    expect_refused(code, capsys, "--api-key-env", "read only by a vllm:URL agent")
    assert not out.exists()


def test_storefront_refuses_empty_kinds(no_benchmark, tmp_path, capsys):
    # Before: --kinds '' meant every kind.
    out = tmp_path / "results.json"
    code = storefront_run.main(["--agent", "expert", "--tasks", "2", "--kinds", "", "--out", str(out), "--no-progress"])
    expect_refused(code, capsys, "--kinds", "(none given)")
    assert no_benchmark.calls == [] and not out.exists()


# --------------------------------------------------------------------------------------------------
# bench/aggregate.py, bench/gate_overhead.py, bench/sft_step.py (issue 28), bench/game_success.py: one line, no
# traceback
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script, work, flags, message", [
    ("aggregate", "write_synthetic_runs", ["--runs", "0"], "--runs must be an integer >= 1, got 0"),
    ("aggregate", "write_synthetic_runs", ["--capabilities", "14"], "--capabilities must be an integer in [1, 13]"),
    ("gate_overhead", "make_random_adapter", ["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    ("gate_overhead", "make_random_adapter", ["--target", "nan"], "--target must be a finite number >= 0, got nan"),
    ("gate_overhead", "make_random_adapter", ["--shapes", "8x64", "2y8"],
     "--shapes: '2y8' is not ADAPTERSxRANK[:TARGET] (e.g. 2x8:0.9 or 8x64)"),
    ("gate_overhead", "make_random_adapter", ["--shapes", "2x8:-1"], "--shapes target in '2x8:-1' must be"),
    ("sft_step", "run", ["--batch-tokens", "1"],
     "--batch-tokens / --epochs: SFTConfig.batch_tokens must be an int >= 64"),
    ("sft_step", "run", ["--epochs", "inf"], "--epochs must be a finite number > 0, got inf"),
    ("game_success", "play", ["--episodes", "0"], "--episodes must be >= 1, got 0"),
    ("game_success", "play", ["--temperatures", "nan"], "--temperatures must lie in [0, 2], got [nan]"),
    ("game_success", "play", ["--model", "no/such/model"], "--model no/such/model: no config.json there"),
])
def test_bench_scripts_refuse_bad_flags(script, work, flags, message, monkeypatch, capsys):
    # Before: ValueError (aggregate --runs 0, sft_step --batch-tokens 1 after building the demonstrations) and
    # RuntimeError (gate_overhead --device tpu) tracebacks.
    module = _script(f"bench/{script}.py", f"bench_{script}_under_test")
    started = Recorder()
    monkeypatch.setattr(module, work, started)
    code = module.main(flags)
    expect_refused(code, capsys, message.split()[0], message)
    assert started.calls == []


def test_recalibrate_refuses_another_games_rollouts(recal_game, rollouts_file, tmp_path, capsys):
    # Before: rollouts recorded for another game were accepted (exit 0 or 1, a decision about the wrong game).
    name, _ = recal_game
    data = json.loads(rollouts_file.read_text())
    data["info"] = {"game": "storefront"}
    rollouts_file.write_text(json.dumps(data))
    out = tmp_path / "decision.json"
    code = recalibrate.main(["--game", name, "--knob", "n_keys", "--rollouts", f"2={rollouts_file}",
                             "--json-output", str(out)])
    expect_refused(code, capsys, str(rollouts_file), f"rollouts of game 'storefront', not of --game {name}")
    assert not out.exists()
    data["info"] = {"game": name}  # its own rollouts still pass
    rollouts_file.write_text(json.dumps(data))
    assert recalibrate.main(["--game", name, "--knob", "n_keys", "--rollouts", f"2={rollouts_file}"]) in (0, 1)


def test_a_missing_trace_games_dirs_entry_is_an_error(monkeypatch, tmp_path, capsys):
    # Before: the entry was skipped without a word, and its games were "unknown".
    missing = tmp_path / "no_such_games"
    monkeypatch.setenv("TRACE_GAMES_DIRS", os.pathsep.join([str(tmp_path), str(missing)]))
    monkeypatch.setattr(game_registry, "_DISCOVERED", False)
    monkeypatch.setattr(game_registry, "_REGISTRY", {})
    assert game_registry.main(["--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: TRACE_GAMES_DIRS names {missing}") and "not a folder" in err
    from game_registry import lookup_game

    with pytest.raises(InputError, match="TRACE_GAMES_DIRS names"):
        lookup_game("storefront")


# --------------------------------------------------------------------------------------------------
# Every entry point above with the same generic bad inputs (issue 28): a missing input file, an output that
# is a folder (or, for a command that writes a folder, a file), a NaN number. Exit 2, one line naming the
# value, no traceback, nothing written, and the work never started.
# --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _one_generated_scenario():
    from swebench import generate as swe_generate

    return swe_generate.generate_one("semantic_logic_precision", 0, size="small")


def _entry_points(tmp_path, tiny_model_dir, monkeypatch):
    """{name: (main, {kind: argv}, (module, attribute) of the work that must not start)}."""
    import demo.run as demo_run
    import train.__main__ as train_cli
    from benchmarks.storefront import demos as storefront_demos
    from pipeline import aggregate_capabilities, label_trajectories, labels_to_run, summarize
    from demo import tau2 as demo_tau2
    from swebench import scenario as swe_scenario
    from train import grpo_gater, routing_targets, sft, train_router_sft
    from swebench import calibrate as swe_calibrate
    from swebench import generate as swe_generate
    from swebench import selftest as swe_selftest
    from benchmarks import tau2_run, tau2_target
    from train import collect_rollouts, evaluate, models, tiny

    import render_pipeline

    game_registry.get_game("storefront")  # the real games first: registering the toy one stops discovery
    toy.register_temporarily(monkeypatch, toy.make_spec(name="toy_vault_generic_door"))
    monkeypatch.setenv("TRACE_TEST_KEY", "sk-test")
    summary = tmp_path / "summary.jsonl"
    summary.write_text("".join(json.dumps({"id": i, "passed": i.startswith("p"), "text": "t"}) + "\n"
                               for i in ("f1", "p1")))
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"candidates": [{"name": "tool_use", "description": "d"}]}))
    rollouts = tmp_path / "rollouts.json"
    rollouts.write_text(json.dumps({"info": {}, "tasks": [], "simulations": [
        {"id": "0", "task_id": 0, "sample_idx": 0, "reward_info": {"reward": 1.0},
         "messages": [{"role": "user", "content": "hi"}]}]}))
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    one_scenario = tmp_path / "one_scenario.json"
    swe_scenario.save_scenarios(one_scenario, [_one_generated_scenario()])
    scenarios = tmp_path / "scenarios.json"
    scenarios.write_text("[]")
    config = tmp_path / "storefront.yaml"
    config.write_text("forbidden_rate: 0.2\n")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"trajectory_id": "f1", "capability": "tool_use", "label": "LACKING"}) + "\n")
    run_file = tmp_path / "run_01.json"
    run_file.write_text("{}")
    corpus = tmp_path / "corpus" / "text.txt"
    corpus.parent.mkdir()
    corpus.write_text("hello\n")
    m, folder, a_file, out = tmp_path / "missing.json", tmp_path / "folder", tmp_path / "a_file", tmp_path / "out.json"
    phase3 = _script("swebench/qwen3.6_self_trace/phase3_synthesize.py", "phase3_generic")
    phase4 = _script("swebench/qwen3.6_self_trace/phase4_validate.py", "phase4_generic")
    sft_step = _script("bench/sft_step.py", "sft_step_generic")
    gate_overhead = _script("bench/gate_overhead.py", "gate_overhead_generic")
    lt = [str(summary), "--out", str(tmp_path / "labels"), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
          "--api-key-env", "TRACE_TEST_KEY", "--candidates", str(candidates), "--runs", "2", "--k", "1"]
    ev = ["--model", str(tiny_model_dir), "--tasks", "2", "--out", str(out)]
    cr = ["--game", "storefront", "--model", str(tiny_model_dir), "--seeds", "2", "--samples", "2", "--out", str(out)]
    sf = ["--agent", "expert", "--tasks", "2", "--out", str(out), "--no-progress"]
    tp = ["--agent", f"hf:{tiny_model_dir}", "--tasks", "2", "--out", str(out), "--no-progress"]
    t2 = ["--domain", "retail", "--agent", "expert", "--tasks", "2", "--user-base-url", "http://127.0.0.1:9/v1",
          "--user-model", "m", "--no-progress", "--out", str(out)]
    rc = ["--game", "toy_vault_generic_door", "--knob", "n_keys", "--rollouts", f"2={rollouts}", "--json-output",
          str(out)]
    rp = [str(REPO / "configs/capability_selection.yaml"), "--stage", "capability", "--out", str(tmp_path / "p.md")]
    sw = ["--capability", "semantic_logic_precision", "--model", "some/model", "--work-dir", str(tmp_path / "w"),
          "--out", str(out)]
    su = [str(rollouts), "--out", str(out)]
    ce = [str(rollouts), "--json-output", str(out)]
    ag = ["--runs", str(run_file), "--k", "1", "--export", str(out)]
    lr = [str(labels), "--outcomes", str(summary), "--attempt", "1", "--out", str(out)]
    tr = ["--game", "toy_vault_generic_door", "--model", str(tiny_model_dir), "--output_dir", str(tmp_path / "run")]
    st = ["--model", str(tiny_model_dir), "--data", str(summary), "--out", str(tmp_path / "sft")]
    dm = ["--n", "2", "--out", str(out)]
    sl = [str(scenarios), "--no-progress", "--out", str(out)]
    ge = ["--capability", "semantic_logic_precision", "--n", "1", "--no-progress", "--out", str(out)]
    vg = ["toy_vault_generic_door", "--json-output", str(out), "--no-progress"]
    entries = {
        "train": (train_cli.main, {
            "missing": [*tr, "--config", str(m)], "output": [*tr[:-1], str(a_file)],
            "nan": [*tr, "--temperature", "nan"]},
            (train_cli, "load_base_model")),
        "train.sft": (sft.main, {
            "missing": [*st[:3], str(m), *st[4:]], "output": [*st[:-1], str(a_file)], "nan": [*st, "--lr", "nan"],
            "over_input": [*st[:-1], str(tiny_model_dir)]}, (sft, "train_sft")),
        "train.grpo_gater": (grpo_gater.main, {"missing": ["--config", str(m)]}, (grpo_gater, "load_base_model")),
        "train.train_router_sft": (train_router_sft.main, {"missing": ["--config", str(m)]},
                                   (train_router_sft, "build_capability_model")),
        "train.routing_targets": (routing_targets.main, {"missing": ["--slot", f"2={m}"]},  # slot "2"
                                  (routing_targets, "reward_targets")),
        "storefront.demos": (storefront_demos.main, {
            "missing": [*dm, "--config", str(m)], "output": [*dm[:-1], str(folder)],
            "over_input": [*dm[:-1], str(config), "--config", str(config)]}, (storefront_demos, "make_demonstrations")),
        "swebench.scenario": (swe_scenario.main, {
            "missing": ["import-reference", str(m), "--capability", "semantic_logic_precision", "--out", str(out)],
            "output": ["import-reference", str(scenarios), "--capability", "semantic_logic_precision", "--out",
                       str(folder)]},
            (swe_scenario.reference_format, "convert_reference")),
        "swebench.selftest": (swe_selftest.main, {
            "missing": [str(m), *sl[1:]], "output": [*sl[:-1], str(folder)], "over_input": [*sl[:-1], str(scenarios)],
            "nan": [*sl, "--timeout", "nan"]},
            (swe_selftest, "self_test_many")),
        "swebench.generate": (swe_generate.main, {"output": [*ge[:-1], str(folder)]},
                              (swe_generate, "generate_one")),
        "validate_game": (validate_game.main, {
            "output": [vg[0], "--json-output", str(folder)], "nan": [*vg, "--probe-tolerance", "nan"]},
            (validate_game, "validate")),
        "demo": (demo_run.main, {"missing": ["--config", str(m), "--run-dir", str(tmp_path / "d")],
                                 "output": ["--profile", "fast", "--run-dir", str(a_file)]}, (demo_run, "Demo")),
        "pipeline._summarize": (summarize.main, {
            "missing": [str(m), *su[1:]], "output": [*su[:-1], str(folder)], "over_input": [*su[:-1], str(rollouts)],
            "nan": [*su, "--pass-threshold", "nan"]}, (summarize, "atomic_write_jsonl")),
        "calibrate_environment": (calibrate_environment.main, {
            "missing": [str(m), *ce[1:]], "output": [*ce[:-1], str(folder)], "over_input": [*ce[:-1], str(rollouts)],
            "nan": [*ce, "--success-threshold", "nan"]}, (calibrate_environment, "compute_metrics")),
        "aggregate_capabilities": (aggregate_capabilities.main, {
            "output": [*ag[:-1], str(folder)], "over_input": [*ag[:-1], str(run_file)], "nan": [*ag, "--rho", "nan"]},
            (aggregate_capabilities, "aggregate")),
        "labels_to_run": (labels_to_run.main, {
            "missing": [str(m), *lr[1:]], "output": [*lr[:-1], str(folder)], "over_input": [*lr[:-1], str(labels)]},
            (labels_to_run, "atomic_write_json")),
        "label_trajectories": (label_trajectories.main, {
            "missing": [str(m), *lt[1:]], "output": [*lt, "--export", str(folder)], "nan": [*lt, "--rho", "nan"],
            "over_input": [*lt, "--export", str(summary)]},
            (label_trajectories, "ChatClient")),
        "train.evaluate": (evaluate.main, {
            "missing": [*ev, "--config", str(m)], "output": [*ev[:-1], str(folder)],
            "nan": [*ev, "--temperature", "nan"]}, (evaluate, "load_policy_model")),
        "train.collect_rollouts": (collect_rollouts.main, {
            "missing": [*cr[:3], str(m), *cr[4:]], "output": [*cr[:-1], str(folder)],
            "nan": [*cr, "--temperature", "nan"]}, (collect_rollouts, "load_base_model")),
        "storefront.run": (storefront_run.main, {
            "missing": [*sf, "--config", str(m)], "output": ["--agent", "expert", "--tasks", "2", "--out", str(folder)],
            "nan": [*sf, "--temperature", "nan"],
            "over_input": ["--agent", "expert", "--tasks", "2", "--config", str(config), "--out", str(config)]},
            (storefront_run, "run_journaled")),
        "train.play": (play.main, {  # a model agent: every check before the model is built
            "missing": [*tp, "--config", str(m)], "output": [*tp[:-3], "--no-progress", "--out", str(folder)],
            "nan": [*tp, "--temperature", "nan"],
            "over_input": [*tp[:-3], "--config", str(config), "--out", str(config)]},
            (train_agents, "parse_agent_spec")),
        "recalibrate": (recalibrate.main, {
            "missing": [*rc[:5], f"2={m}", *rc[6:]], "output": [*rc[:-1], str(folder)],
            "nan": [*rc, "--success-threshold", "nan"], "over_input": [*rc[:-1], str(rollouts)]},
            (recalibrate, "decide")),
        "render_pipeline": (render_pipeline.main, {
            "missing": [str(m), *rp[1:]], "output": [*rp[:-1], str(folder)],
            "nan": [*rp, "--run", "x", "--agent-timeout", "nan"]}, (render_pipeline, "atomic_write_text")),
        "demo_tau2": (demo_tau2.main, {"output": ["--run-dir", str(a_file)], "nan": ["--rho", "nan"]},
                      (demo_tau2, "run_selection")),
        "train.tiny": (tiny.main, {"missing": ["--out", str(tmp_path / "model"), "--corpus", str(m)],
                                   "output": ["--out", str(a_file)],
                                   "over_input": ["--corpus", str(corpus), "--out", str(corpus.parent)]},
                       (tiny, "build_tiny_model")),
        "train.models fetch": (models.main, {"output": ["fetch", "smollm2-135m", "--out", str(a_file / "m")]},
                               (models, "locate_gguf")),
        "swebench.calibrate": (swe_calibrate.main, {"output": [*sw[:-1], str(folder)],
                                                    "nan": [*sw, "--temperature", "nan"]},
                               (swe_calibrate, "trainer_rollouts")),
        "phase3_synthesize": (phase3.main, {"output": ["--run-dir", str(a_file)],
                                            "nan": ["--run-dir", str(tmp_path / "r"), "--threshold", "nan"]},
                              (swe_generate, "main")),
        "phase4_validate": (phase4.main, {"missing": [str(m), "--run-dir", str(tmp_path / "r")],
                                          "output": [str(scenarios), "--run-dir", str(a_file)]},
                            (swe_selftest, "self_test_many")),
        "bench/sft_step": (sft_step.main, {"missing": ["--model", str(m)], "nan": ["--epochs", "nan"]},
                           (sft_step, "run")),
        "bench/gate_overhead": (gate_overhead.main, {"nan": ["--target", "nan"]},
                                (gate_overhead, "make_random_adapter")),
        "tau2_target schemas": (tau2_target.main, {"output": ["schemas", "--out", str(folder)]},
                                (tau2_target, "write_tool_schemas")),
        "tau2_run": (tau2_run.main, {"output": [*t2[:-1], str(folder)], "nan": [*t2, "--user-temperature", "nan"]},
                     (tau2_run, "play_and_write")),
        **_more_entry_points(tmp_path, tiny_model_dir, one_scenario, summary),
    }
    # "ok": a command line each command accepts as a whole (its work would start): tests/test_cli_numeric_flags.py
    # adds one bad number at a time to it. Where the NaN case's command is valid without its NaN, that is the one.
    valid = {
        "train.sft": [*st[:3], str(chat), *st[4:]],
        "train.grpo_gater": ["--config", str(REPO / "configs/moe_gate.yaml"), "--model", str(tiny_model_dir),
                             "--output_dir", str(tmp_path / "gate")],
        "train.train_router_sft": ["--config", str(REPO / "configs/moe_gate.yaml")],
        "train.routing_targets": ["--slot", f"base={rollouts}"],
        "storefront.demos": dm,
        "swebench.scenario": ["import-reference", str(scenarios), "--capability", "semantic_logic_precision",
                              "--out", str(out)],
        "swebench.selftest": [str(one_scenario), "--no-progress", "--out", str(out)],
        "swebench.generate": ["--capability", "deep_call_graph_traversal", "--n", "1", "--no-progress",
                              "--out", str(out)],
        "demo": ["--profile", "fast", "--run-dir", str(tmp_path / "d")],
        "labels_to_run": [*lr, "--missing-as", "NA"],
        "render_pipeline": [*rp, "--run", "claude"],
        "train.tiny": ["--out", str(tmp_path / "model"), "--corpus", str(corpus)],
        "train.models fetch": ["fetch", "smollm2-135m", "--out", str(tmp_path / "m")],
        "tau2_target schemas": ["schemas", "--out", str(out)],
        "phase4_validate": [str(one_scenario), "--run-dir", str(tmp_path / "r")],
    }
    # "unknown": a game, capability, model, agent or profile name that does not exist
    nope = "nope_not_a_name"
    unknown = {
        "train": [*tr[:1], nope, *tr[2:]],
        "train.evaluate": [*ev, "--game", nope],
        "train.collect_rollouts": [*cr[:1], nope, *cr[2:]],
        "validate_game": [nope, *vg[1:]],
        "recalibrate": [*rc[:1], nope, *rc[2:]],
        "train.grpo_gater": [*valid["train.grpo_gater"], "--game", nope],
        "render_pipeline": [*rp, "--run", nope],
        "swebench.calibrate": [*sw[:1], nope, *sw[2:]],
        "swebench.generate": [*ge[:1], nope, *ge[2:]],
        "train.models fetch": ["fetch", nope, "--out", str(tmp_path / "m")],
        "storefront.run": [*sf[:1], nope, *sf[2:]],
        "train.play": [*tp[:1], nope, *tp[2:]],
        "demo": ["--profile", nope, "--run-dir", str(tmp_path / "d")],
        "tau2_target schemas": ["schemas", "--domains", nope, "--out", str(out)],
    }
    for name, (_, argvs, _) in entries.items():
        if name in unknown:
            argvs["unknown"] = unknown[name]
        if name in valid:
            argvs["ok"] = valid[name]
        elif "nan" in argvs and "ok" not in argvs:
            at = len(argvs["nan"]) - 1 - argvs["nan"][::-1].index("nan")
            argvs["ok"] = argvs["nan"][:at - 1] + argvs["nan"][at + 1:]
    return entries


def _more_entry_points(tmp_path, tiny_model_dir, one_scenario, summary):
    """The benches, the SWE-bench phases and the small tools: {name: (main, {kind: argv, "ok": argv}, work)}."""
    import train.policy as policy
    from demo import base_agent
    from moe_gate import serve, smoke_test
    from pipeline import capabilities
    from pipeline import summarize as summarize_module

    m, folder, a_file, out = tmp_path / "missing.json", tmp_path / "folder", tmp_path / "a_file", tmp_path / "out.json"
    nope = "nope_not_a_name"
    bench = {name: _script(f"bench/{name}.py", f"{name}_generic") for name in (
        "aggregate", "game_success", "grpo_step", "rollout_backends", "scenario_selftest", "grpo_learning",
        "env_step", "copy_probe")}
    phase = {n: _script(f"swebench/qwen3.6_self_trace/{f}.py", f"{f}_generic") for n, f in (
        (1, "phase1_baseline"), (2, "phase2_capability_mining"), (5, "phase5_train"), (6, "phase6_final_eval"))}
    run_dir = tmp_path / "demo_run"
    (run_dir / "base" / "model").mkdir(parents=True)
    selected = tmp_path / "selected.json"
    selected.write_text(json.dumps([{"skill": "tool_use", "status": "PENDING", "mean_delta": 0.3}]))
    gate = tmp_path / "serve_gate"
    gate.mkdir()
    (gate / "gate_config.json").write_text("{}")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    baseline = tmp_path / "phase1_summary.json"
    baseline.write_text("{}")
    gs = ["--model", str(tiny_model_dir), "--episodes", "1", "--out", str(out)]
    cp = ["--model", str(tiny_model_dir), "--demonstrations", "1", "--out", str(out)]
    gp = ["--model-dir", str(tiny_model_dir), "--iterations", "1", "--groups", "1", "--group-size", "2",
          "--micro-batch", "2", "--max-episode-tokens", "4096"]
    gl = ["--run_dir", str(run_dir), "--out", str(tmp_path / "learning")]
    p1 = ["--run-dir", str(tmp_path / "swe_run"), "--workers", "2"]
    p2 = [str(summary), "--run-dir", str(tmp_path / "swe_run")]
    p5 = ["--capability", "semantic_logic_precision", "--model", str(tiny_model_dir), "--scenarios",
          str(one_scenario), "--allow-cpu", "--output-dir", str(tmp_path / "adapter_out")]
    p6 = ["--adapter", str(adapter), "--baseline", str(baseline), "--run-dir", str(tmp_path / "swe_run")]
    return {
        "bench/aggregate": (bench["aggregate"].main, {"ok": ["--runs", "2", "--trajectories", "10"]},
                            (bench["aggregate"], "write_synthetic_runs")),
        "bench/game_success": (bench["game_success"].main, {
            "missing": [*gs, "--config", str(m)], "output": [*gs[:-1], str(folder)],
            "nan": [*gs, "--temperatures", "nan"], "ok": gs}, (policy, "load_base_model")),
        "bench/copy_probe": (bench["copy_probe"].main, {
            "missing": [*cp, "--config", str(m)], "output": [*cp[:-1], str(folder)], "ok": cp},
            (policy, "load_base_model")),
        "bench/grpo_step": (bench["grpo_step"].main, {
            "missing": ["--model-dir", str(m), *gp[2:]], "nan": [*gp, "--learning-rate", "nan"],
            "unknown": [*gp, "--game", nope], "ok": gp}, (bench["grpo_step"], "run_both")),
        "bench/rollout_backends": (bench["rollout_backends"].main, {
            "missing": ["--model", str(m)], "nan": ["--model", str(tiny_model_dir), "--target", "nan"],
            "ok": ["--model", str(tiny_model_dir)]}, (bench["rollout_backends"], "run")),
        "bench/scenario_selftest": (bench["scenario_selftest"].main, {
            "nan": ["--n", "2", "--target", "nan"], "ok": ["--n", "2", "--workers", "1"]},
            (bench["scenario_selftest"], "self_test_many")),
        "bench/grpo_learning": (bench["grpo_learning"].main, {
            "missing": ["--run_dir", str(m), *gl[2:]], "output": [*gl[:-1], str(a_file)], "ok": gl},
            (bench["grpo_learning"], "trainable_games")),
        "bench/env_step": (bench["env_step"].main, {
            "nan": ["--games", "storefront", "--seconds", "nan"], "unknown": ["--games", nope],
            "ok": ["--games", "storefront", "--seconds", "0.1"]}, (bench["env_step"], "measure")),
        "pipeline.capabilities": (capabilities.main, {
            "missing": ["--file", str(m), "next"], "ok": ["--file", str(selected), "next"]},
            (capabilities, "next_pending")),
        "moe_gate.serve": (serve.main, {
            "missing": ["--gate", str(m), "--upstream", "http://127.0.0.1:9"],
            "ok": ["--gate", str(gate), "--upstream", "http://127.0.0.1:9"]}, (serve, "GlobalRouterFront")),
        "moe_gate.smoke_test": (smoke_test.main, {"output": ["--keep", str(a_file)], "ok": []},
                                (smoke_test, "run_checks")),
        "demo.base_agent": (base_agent.main, {
            "missing": ["check", "--config", str(m)], "output": ["ship", "--run-dir", str(run_dir), "--to",
                                                                   str(a_file / "agent")],
            "ok": ["check", "--config", str(REPO / "configs/demo.yaml")]}, (base_agent, "shipped_status")),
        "phase1_baseline": (phase[1].main, {
            "missing": [*p1, "--config", str(m)], "output": ["--run-dir", str(a_file)], "ok": p1},
            (phase[1], "agent_prerequisites")),
        "phase2_capability_mining": (phase[2].main, {  # a missing trajectory: summarize's own sweep
            "output": [*p2[:-1], str(a_file)], "nan": [*p2, "--rho", "nan"], "ok": p2},
            (summarize_module, "main")),
        "phase5_train": (phase[5].main, {
            "missing": [*p5[:5], str(m), *p5[6:]], "output": [*p5[:-1], str(a_file)],
            "unknown": ["--capability", nope, *p5[2:]], "ok": p5}, (phase[5], "run")),
        "phase6_final_eval": (phase[6].main, {
            "missing": ["--adapter", str(m), *p6[2:]], "output": [*p6[:-1], str(a_file)], "ok": p6},
            (phase[6], "agent_prerequisites")),
    }


# The generic sweep: each entry point, the file it runs and the kinds of bad input it gets. The entry points
# left out (NOT_IN_SWEEP, below) say where their bad input is tested instead, or why not; a new command-line
# file is in neither, and test_every_command_line_file_is_swept_or_says_where_it_is_tested names it.
SWEEP = {
    "train": ("train/__main__.py", "missing output nan"),
    "train.sft": ("train/sft.py", "missing output nan over_input"),
    "train.grpo_gater": ("train/grpo_gater.py", "missing"),
    "train.train_router_sft": ("train/train_router_sft.py", "missing"),
    "train.routing_targets": ("train/routing_targets.py", "missing"),
    "storefront.demos": ("benchmarks/storefront/demos.py", "missing output over_input"),
    "swebench.scenario": ("swebench/scenario.py", "missing output"),
    "swebench.selftest": ("swebench/selftest.py", "missing output over_input nan"),
    "swebench.generate": ("swebench/generate.py", "output"),
    "validate_game": ("pipeline/validate_game.py", "output nan"),
    "demo": ("demo/run.py", "missing output"),
    "pipeline._summarize": ("pipeline/summarize.py", "missing output over_input nan"),
    "calibrate_environment": ("pipeline/calibrate_environment.py", "missing output over_input nan"),
    "aggregate_capabilities": ("pipeline/aggregate_capabilities.py", "output over_input nan"),
    "labels_to_run": ("pipeline/labels_to_run.py", "missing output over_input"),
    "label_trajectories": ("pipeline/label_trajectories.py", "missing output nan over_input"),
    "train.evaluate": ("train/evaluate.py", "missing output nan"),
    "train.collect_rollouts": ("train/collect_rollouts.py", "missing output nan"),
    "storefront.run": ("benchmarks/storefront/run.py", "missing output nan over_input"),
    "train.play": ("train/play.py", "missing output nan over_input"),
    "recalibrate": ("pipeline/recalibrate.py", "missing output nan over_input"),
    "render_pipeline": ("render_pipeline.py", "missing output nan"),
    "demo_tau2": ("demo/tau2.py", "output nan"),
    "train.tiny": ("train/tiny.py", "missing output over_input"),
    "train.models fetch": ("train/models.py", "output"),
    "swebench.calibrate": ("swebench/calibrate.py", "output nan"),
    "phase3_synthesize": ("swebench/qwen3.6_self_trace/phase3_synthesize.py", "output nan"),
    "phase4_validate": ("swebench/qwen3.6_self_trace/phase4_validate.py", "missing output"),
    "bench/sft_step": ("bench/sft_step.py", "missing nan"),
    "bench/gate_overhead": ("bench/gate_overhead.py", "nan"),
    "tau2_target schemas": ("benchmarks/tau2_target.py", "output"),
    "tau2_run": ("benchmarks/tau2_run.py", "output nan"),  # an unknown agent or domain: tests/test_tau2_run.py
    "bench/aggregate": ("bench/aggregate.py", ""),  # counts only: tests/test_cli_numeric_flags.py
    "bench/game_success": ("bench/game_success.py", "missing output nan"),
    "bench/copy_probe": ("bench/copy_probe.py", "missing output"),  # counts only: test_cli_numeric_flags.py
    "bench/grpo_step": ("bench/grpo_step.py", "missing nan"),
    "bench/rollout_backends": ("bench/rollout_backends.py", "missing nan"),
    "bench/scenario_selftest": ("bench/scenario_selftest.py", "nan"),
    "bench/grpo_learning": ("bench/grpo_learning.py", "missing output"),  # its games: the run folder's own
    "bench/env_step": ("bench/env_step.py", "nan"),
    "pipeline.capabilities": ("pipeline/capabilities.py", "missing"),  # it edits --file in place by design
    "moe_gate.serve": ("moe_gate/serve.py", "missing"),
    "moe_gate.smoke_test": ("moe_gate/smoke_test.py", "output"),
    "demo.base_agent": ("demo/base_agent.py", "missing output"),
    "phase1_baseline": ("swebench/qwen3.6_self_trace/phase1_baseline.py", "missing output"),
    "phase2_capability_mining": ("swebench/qwen3.6_self_trace/phase2_capability_mining.py", "output nan"),
    "phase5_train": ("swebench/qwen3.6_self_trace/phase5_train.py", "missing output"),
    "phase6_final_eval": ("swebench/qwen3.6_self_trace/phase6_final_eval.py", "missing output"),
}
# An entry point that reads a file gets it also empty and malformed (the missing file's place in the command),
# except where any text is a valid file.
FILE_KINDS = ("empty", "malformed", "binary")
# The entry points that take the name of a game, capability, model, agent or profile (the "unknown" case).
NAMED_THINGS = ("train", "train.evaluate", "train.collect_rollouts", "validate_game", "recalibrate",
                "train.grpo_gater", "render_pipeline", "swebench.calibrate", "swebench.generate",
                "train.models fetch", "storefront.run", "train.play", "demo", "tau2_target schemas",
                "bench/grpo_step", "bench/env_step", "phase5_train")
ANY_TEXT = {"train.tiny": "a --corpus file may be plain text"}
# An entry point that writes gets its output in a folder it cannot write to as well (the output case's path).
GENERIC_CASES = [(name, kind) for name, (_, kinds) in SWEEP.items()
                 for kind in kinds.split() + [k for k in FILE_KINDS if "missing" in kinds.split()
                                              and not (k == "malformed" and name in ANY_TEXT)]
                 + (["read_only"] if "output" in kinds.split() else [])
                 + (["unknown"] if name in NAMED_THINGS else [])]
BAD_FILE_TEXT = {"empty": b"", "malformed": b'{"not": json,\n  - [', "binary": bytes(range(256)) * 4}


@pytest.mark.parametrize("name, kind", GENERIC_CASES)
def test_every_entry_point_refuses_generic_bad_input(name, kind, tmp_path, tiny_model_dir, monkeypatch, capsys,
                                                     unwritable_folder):
    main, argvs, (module, work) = _entry_points(tmp_path, tiny_model_dir, monkeypatch)[name]
    (tmp_path / "folder").mkdir()
    (tmp_path / "a_file").write_text("keep me\n")
    started = Recorder()
    monkeypatch.setattr(module, work, started)
    capsys.readouterr()
    argv = argvs["missing" if kind in FILE_KINDS else "output" if kind == "read_only" else kind]
    if kind in FILE_KINDS:  # the same command with an empty, malformed or binary file where the missing one was
        bad = tmp_path / f"{kind}.json"
        bad.write_bytes(BAD_FILE_TEXT[kind])
        argv = [str(bad) if arg == str(tmp_path / "missing.json") else arg for arg in argv]
        argv = [f"2={bad}" if arg == f"2={tmp_path / 'missing.json'}" else arg for arg in argv]
    if kind == "read_only":  # the output case's path (a folder or a file there) moved into a read-only folder
        bad_outputs = (str(tmp_path / "folder"), str(tmp_path / "a_file"))
        argv = [arg.replace(arg, str(unwritable_folder / "trace_out")) if arg.startswith(bad_outputs) else arg
                for arg in argv]
    before = _files(tmp_path)
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusal
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    # one line, or argparse's own refusal of a value outside its choices: the usage, then one error line
    assert "Traceback" not in err and (len(lines) == 1 or kind == "unknown" and ": error: " in lines[-1]), err
    named = {"missing": "missing.json", "nan": "nan", "empty": "empty.json", "malformed": "malformed.json",
             "binary": "binary.json", "read_only": str(unwritable_folder), "unknown": "nope_not_a_name",
             "output": str(tmp_path / ("folder" if "folder" in argv[-1] else "a_file")),
             "over_input": f"{argv[-1]} {'holds' if name == 'train.tiny' else 'is also'}"
             }[kind]
    assert named in err, err
    assert started.calls == [] and _files(tmp_path) == before


# --------------------------------------------------------------------------------------------------
# Issue 28's last cases: Ctrl-C in the storefront runner, outputs that would replace each other, conflicting flags
# --------------------------------------------------------------------------------------------------
def test_ctrl_c_ends_a_storefront_run_with_one_line_keeping_only_the_scored_episodes(tmp_path):
    import signal

    out, log = tmp_path / "r.json", tmp_path / "stderr.txt"
    with open(log, "w") as stderr_file:
        process = subprocess.Popen([sys.executable, "-m", "benchmarks.storefront.run", "--agent", "expert", "--tasks",
                                    "100000", "--out", str(out)], cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=stderr_file, env={**os.environ, "PYTHONPATH": str(REPO)},
                                   preexec_fn=restore_sigint)
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while "ep/s" not in log.read_text() and time.monotonic() < deadline:  # inside the run, past the imports
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=SUBPROCESS_TIMEOUT)
    stderr = log.read_text()
    assert process.returncode == 130, stderr[-2000:]
    # (the line may follow the progress bar's last redraw on the same terminal line)
    assert "Traceback" not in stderr and stderr.count("interrupted; ") == 1, stderr[-2000:]
    assert "scored episodes are kept in" in stderr and "run the same command again to continue" in stderr
    assert not out.exists() and Path(f"{out}.partial.jsonl").exists()  # no results file; the journal to continue


def test_selftest_refuses_an_output_that_would_replace_the_input_or_the_other_output(tmp_path, capsys):
    from swebench.selftest import main

    scenarios = tmp_path / "s.json"
    scenarios.write_text("[]\n")
    shared = tmp_path / "out.json"
    for argv, flag in ((["--out", str(shared), "--report", str(shared)], "--report"),
                       (["--out", str(scenarios)], "--out"), (["--report", str(scenarios)], "--report")):
        assert main([str(scenarios), *argv, "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag}") and "Traceback" not in err, err
    assert scenarios.read_text() == "[]\n" and not shared.exists()


def test_demo_refuses_a_profile_and_a_config_together(tmp_path, capsys):
    from demo.run import main

    run_dir = tmp_path / "run"
    assert main(["--profile", "fast", "--config", "configs/demo.yaml", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --profile fast and --config configs/demo.yaml") and len(err.splitlines()) == 1
    assert not run_dir.exists()


def test_ctrl_c_in_the_demos_llm_labelers_stops_the_demo(tmp_path, monkeypatch):
    """label_trajectories, called in process by the demo's Step 1, turns Ctrl-C into exit 130: the demo must stop
    as interrupted, not report "labeling failed" and go on."""
    from types import SimpleNamespace

    from pipeline import label_trajectories
    from demo import selection as demo_select

    monkeypatch.setattr(label_trajectories, "main", lambda argv: label_trajectories.INTERRUPTED)
    settings = SimpleNamespace(labeler_url="http://127.0.0.1:9", labeler_model="m", labeler_api_key_env="KEY",
                               runs=10, k=8, rho=0.1, delta=0.2, propose=True)
    with pytest.raises(KeyboardInterrupt):
        demo_select._llm_labelers(tmp_path, settings)
    monkeypatch.setattr(label_trajectories, "main", lambda argv: 1)  # an API failure stays an error
    with pytest.raises(InputError, match="LLM labeling failed"):
        demo_select._llm_labelers(tmp_path, settings)


NOT_IN_SWEEP = {
    "pipeline/_summarize.py": "runs pipeline/summarize.py's main (swept)",
    "swebench/_sandbox_boot.py": "internal: started by the sandbox with its own protocol",
    "swebench/_sandbox_runner.py": "internal: started by the sandbox with its own protocol",
    "game_registry.py": "--list only; an unbuildable game file: test_list_subprocess_keeps_listing_past_...",
}


def _command_line_files() -> set[str]:
    """Every project file with an `if __name__ == "__main__":` (the files a person runs)."""
    import ast

    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    found = set()
    for path in files:
        if path.startswith("tests/"):
            continue
        for node in ast.parse((REPO / path).read_text()).body:
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                    and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
                found.add(path)
    return found


def test_every_command_line_file_is_swept_or_says_where_it_is_tested():
    listed = {file for file, _ in SWEEP.values()} | set(NOT_IN_SWEEP)
    found = _command_line_files()
    assert found - listed == set(), f"new command-line files: add them to the sweep (or NOT_IN_SWEEP): {found - listed}"
    assert listed - found == set(), f"listed but not command-line files (moved or removed?): {listed - found}"


@pytest.mark.slow  # ~40 s: one interpreter per command-line file
def test_every_command_line_file_runs_by_path_or_says_how_to_run_it(tmp_path):
    """`python path/to/file.py --help` from another folder: the usage (exit 0), or for the sandbox's internal
    scripts one line saying what starts them and what to run instead (exit 2); never a traceback."""
    from concurrent.futures import ThreadPoolExecutor

    def by_path(file: str) -> tuple[str, subprocess.CompletedProcess]:
        return file, subprocess.run([sys.executable, str(REPO / file), "--help"], cwd=tmp_path, capture_output=True,
                                    text=True, timeout=SUBPROCESS_TIMEOUT)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(by_path, sorted(_command_line_files())))
    problems = []
    for file, done in results:
        internal = file.startswith("swebench/_sandbox_")
        if internal:
            ok = done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "is internal" in done.stderr
        else:
            ok = done.returncode == 0 and "usage:" in done.stdout
        if not ok or "Traceback" in done.stderr:
            problems.append(f"{file}: exit {done.returncode}, {(done.stderr or done.stdout)[-300:]!r}")
    assert not problems, "\n".join(problems)
