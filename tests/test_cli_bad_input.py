"""Bad input is refused at the door: every CLI checks its output path and numeric flags before any work,
exits 2 with `error: ...` on stderr and writes nothing. Also: games that cannot be built or reset.

Each CLI runs in-process (`main([...])`) with the function that starts the work replaced by a recorder, so
"the work did not start" is checked directly; one subprocess per CLI covers the real entry point.
"""
from __future__ import annotations

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
from common.io import InputError, check_number, check_output_path

REPO = Path(__file__).resolve().parent.parent
SUBPROCESS_TIMEOUT = 120


# --------------------------------------------------------------------------------------------------
# Shared fixtures
# --------------------------------------------------------------------------------------------------
def _files(root: Path) -> list[tuple[str, str]]:
    """Every path under `root` with the content of each file: a snapshot to prove nothing was written."""
    return sorted((str(p.relative_to(root)), p.read_text() if p.is_file() else "/") for p in root.rglob("*"))


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


def test_check_output_path_accepts_new_files_missing_folders_and_overwrites(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    for path in (existing, tmp_path / "new.json", tmp_path / "runs" / "deep" / "new.json"):
        check_output_path(path, "--out")
    assert _files(tmp_path) == [("old.json", "{}")]  # the check itself creates nothing


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
    real_get_game = recalibrate.get_game

    def get_game(name):
        lookups(name)
        return real_get_game(name)

    monkeypatch.setattr(recalibrate, "get_game", get_game)
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
    monkeypatch.setattr(storefront_run, "run_benchmark", runs)
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
