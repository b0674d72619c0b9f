"""Experiment tracking (train/tracking.py): bad input, failures mid-run, rank 0 only, and the wandb / trackio /
mlflow back-ends read back with their own readers (slow; skipped where the package is not installed).

TensorBoard's read-back tests sit beside each trainer's tests: test_grpo_train.py (python -m train, resume),
test_gate_training.py (router SFT, gate GRPO), test_demo.py (train.sft).
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import game_registry
from train.config import GRPOConfig, load_config, save_config
from train.tracking import MetricLogger, check_report_to, open_trackers

from tracking_readback import GRPO_NAMES, assert_same_series, expected_series, rows, tensorboard_scalars

REPO = Path(__file__).resolve().parent.parent
GAMES_DIR = REPO / "tests" / "games"
GAME = "capability_letter_density"
FAST = ["--groups_per_iteration", "3", "--group_size", "4", "--lora_r", "4", "--learning_rate", "3e-2",
        "--lora_target_modules", "[q_proj, v_proj, lm_head]", "--max_episode_tokens", "128"]
ACCEPTED = "accepted: tensorboard, wandb, trackio, mlflow"


@pytest.fixture(scope="module")
def letter_game():
    game_registry._import_game_file(GAMES_DIR / f"{GAME}_game.py")
    return game_registry.get_game(GAME)


def _run(main, argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------
# report_to values
# ------------------------------------------------------------------------------------------------------------
def test_report_to_takes_a_list_a_comma_separated_string_or_none(tmp_path):
    assert check_report_to("tensorboard,wandb") == ["tensorboard", "wandb"]
    assert check_report_to(["mlflow", "trackio", "mlflow"]) == ["mlflow", "trackio"]
    assert check_report_to("none") == [] and check_report_to(None) == [] and GRPOConfig().report_to == []
    config = load_config(None, {"report_to": "tensorboard"})
    assert config.report_to == ["tensorboard"]
    assert load_config(None, {"report_to": "[wandb, tensorboard]"}).report_to == ["wandb", "tensorboard"]
    save_config(config, tmp_path / "config.yaml")  # a run's saved config reruns it with the same trackers
    assert load_config(tmp_path / "config.yaml").report_to == ["tensorboard"]
    with pytest.raises(ValueError, match=f"unknown tracker 'tensorbord'; {ACCEPTED}"):
        GRPOConfig(report_to=["tensorbord"])
    with pytest.raises(ValueError, match="must be a list of tracker names"):
        GRPOConfig(report_to=[1])


# ------------------------------------------------------------------------------------------------------------
# Bad input: exit 2 before any model loads (the model path does not exist: loading it would fail differently)
# ------------------------------------------------------------------------------------------------------------
def _gate_config(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({"model": str(tmp_path / "no-model"), "output_dir": str(tmp_path / "gate"),
                                    "adapters": {"a": str(tmp_path / "no-adapter")}, "grpo": {"game": GAME}, **extra}))
    return path


def _clis(tmp_path: Path) -> dict[str, tuple]:
    """name -> (main, argv without --report_to) of every command that takes report_to."""
    from demo.run import main as demo_main
    from train.__main__ import main as train_main
    from train.grpo_gater import main as gater_main
    from train.sft import main as sft_main
    from train.train_router_sft import main as router_main

    data = tmp_path / "demos.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "Hello."}]}) + "\n")
    missing = str(tmp_path / "no-model")
    return {
        "train": (train_main, ["--game", GAME, "--model", missing, "--output_dir", str(tmp_path / "grpo")],
                  "--report_to"),
        "sft": (sft_main, ["--model", missing, "--data", str(data), "--out", str(tmp_path / "sft")], "--report_to"),
        "router_sft": (router_main, ["--config", str(_gate_config(tmp_path))], "--report_to"),
        "gate_grpo": (gater_main, ["--config", str(_gate_config(tmp_path))], "--report_to"),
        "demo": (demo_main, ["--profile", "fast", "--run-dir", str(tmp_path / "demo")], "--report-to"),
    }


@pytest.mark.parametrize("cli", ["train", "sft", "router_sft", "gate_grpo", "demo"])
def test_an_unknown_tracker_exits_2_naming_the_accepted_ones(cli, letter_game, tmp_path, capsys):
    main, argv, flag = _clis(tmp_path)[cli]
    code, err = _run(main, [*argv, flag, "tensorboard,tensorbord"], capsys)
    assert code == 2 and "unknown tracker 'tensorbord'" in err and ACCEPTED in err, err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("cli", ["train", "sft", "router_sft", "gate_grpo", "demo"])
@pytest.mark.parametrize("tracker, pip", [("wandb", "pip install wandb=="),
                                          ("tensorboard", "pip install tensorboard==")])
def test_a_tracker_whose_package_is_missing_exits_2_with_the_pip_command(cli, tracker, pip, letter_game, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, tracker, None)  # `import wandb` now raises ImportError, as when not installed
    main, argv, flag = _clis(tmp_path)[cli]
    code, err = _run(main, [*argv, flag, tracker], capsys)
    assert code == 2 and f"{tracker} needs the '{tracker}' package" in err and pip in err, err
    assert not (tmp_path / "demo").exists()


def test_a_config_file_report_to_is_checked_as_the_flag_is(tmp_path, capsys):
    from train.grpo_gater import main as gater_main

    code, err = _run(gater_main, ["--config", str(_gate_config(tmp_path, report_to=["comet"]))], capsys)
    assert code == 2 and "unknown tracker 'comet'" in err and ACCEPTED in err, err


# ------------------------------------------------------------------------------------------------------------
# Rank 0 only; a tracker failing mid-run
# ------------------------------------------------------------------------------------------------------------
def test_only_rank_0_opens_trackers(tmp_path):
    logger = open_trackers(["tensorboard"], tmp_path / "r1", kind="grpo", config={}, rank=1)
    logger.log_scalars({"loss": 1.0}, step=1)
    logger.close()
    assert not logger and not (tmp_path / "r1").exists()
    logger = open_trackers(["tensorboard"], tmp_path / "r0", kind="grpo", config={}, rank=0)
    logger.log_scalars({"loss": 1.0}, step=1)
    logger.close()
    assert tensorboard_scalars(tmp_path / "r0" / "tb") == {"loss": [(1, 1.0)]}


def test_a_tracker_failing_mid_run_is_one_warning_and_training_goes_on(tiny_model_dir, letter_game, tmp_path, capsys,
                                                                      monkeypatch):
    """The disk fills up after the first iteration: TensorBoard's writer raises OSError (its writer thread re-raises
    a failed write on the next call). The run warns once, finishes, and metrics.jsonl has every iteration."""
    from torch.utils.tensorboard import SummaryWriter

    from train.__main__ import main as train_main

    add_scalar = SummaryWriter.add_scalar

    def full_disk(self, tag, value, global_step=None, *args, **kwargs):
        if global_step is not None and global_step >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return add_scalar(self, tag, value, global_step, *args, **kwargs)

    monkeypatch.setattr(SummaryWriter, "add_scalar", full_disk)
    out = tmp_path / "run"
    code, err = _run(train_main, ["--game", GAME, "--model", str(tiny_model_dir), "--output_dir", str(out),
                                  "--iterations", "3", "--save_every", "3", "--report_to", "tensorboard", *FAST],
                     capsys)
    assert code == 0, err[-3000:]
    assert err.count("warning: tensorboard") == 1 and "No space left on device" in err, err[-3000:]
    assert [r["iteration"] for r in rows(out / "metrics.jsonl")] == [1, 2, 3]
    logged = tensorboard_scalars(out / "tb")
    assert {name: [s for s, _ in series] for name, series in logged.items()} == {name: [1] for name in logged}
    assert_same_series(logged, expected_series(rows(out / "metrics.jsonl")[:1], GRPO_NAMES, "iteration"), float32=True)


def test_a_failed_tracker_is_dropped_and_the_others_go_on(tmp_path, capsys):
    class Broken:
        failures = (ConnectionError,)
        closed = 0

        def log_config(self, run_name, config):
            pass

        def log_scalars(self, scalars, step):
            raise ConnectionError("server gone")

        def close(self):
            Broken.closed += 1

    class Kept(Broken):
        failures = ()
        logged: list = []

        def log_scalars(self, scalars, step):
            Kept.logged.append((step, scalars))

        def close(self):
            pass

    logger = MetricLogger({"mlflow": Broken(), "tensorboard": Kept()})
    for step in (1, 2, 3):
        logger.log_scalars({"loss": float(step), "kl": None, "skipped": float("nan")}, step)
    logger.close()
    err = capsys.readouterr().err
    assert err.count("warning") == 1
    assert "warning: mlflow: logging step 1 failed (ConnectionError: server gone)" in err
    assert Kept.logged == [(1, {"loss": 1.0}), (2, {"loss": 2.0}), (3, {"loss": 3.0})]  # None and NaN left out
    assert Broken.closed == 1  # released once when dropped


# ------------------------------------------------------------------------------------------------------------
# wandb (offline), trackio, mlflow: the same read-back as TensorBoard's, where their package installs
# ------------------------------------------------------------------------------------------------------------
def _grpo_twice(train, tmp_path: Path, tracker: str) -> Path:
    """2 iterations, then the run resumed from its checkpoint to 4: the series must be 1..4, each step once."""
    out = tmp_path / "run"
    argv = ["--game", GAME, "--output_dir", str(out), "--save_every", "2", "--report_to", tracker, *FAST]
    train([*argv, "--iterations", "2"])
    train([*argv, "--iterations", "4", "--resume", str(out)])
    assert [r["iteration"] for r in rows(out / "metrics.jsonl")] == [1, 2, 3, 4]
    return out


def _in_process(tiny_model_dir: Path, capsys):
    from train.__main__ import main as train_main

    def train(argv: list[str]) -> None:
        code, err = _run(train_main, [*argv, "--model", str(tiny_model_dir)], capsys)
        assert code == 0, err[-3000:]

    return train


@pytest.mark.slow  # ~15 s: wandb starts its core process per run
def test_wandb_offline_run_files_hold_the_metrics_jsonl_series(tiny_model_dir, letter_game, tmp_path, capsys,
                                                               monkeypatch):
    pytest.importorskip("wandb")
    from tracking_readback import wandb_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: an offline run must not need a login
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = _grpo_twice(_in_process(tiny_model_dir, capsys), tmp_path, "wandb")
    state = json.loads((out / "tracking.json").read_text())
    # run.finish() returns before wandb's core process has written everything to the offline file (seen under
    # load: the resumed run's steps arrived a moment later), so read until the last step is there, at most 60 s.
    deadline = time.time() + 60
    series, runs = wandb_history(out, state["wandb_id"])
    while len(series.get("episodes_total", [])) < 4 and time.time() < deadline:
        time.sleep(0.5)
        series, runs = wandb_history(out, state["wandb_id"])
    assert_same_series(series, expected_series(rows(out / "metrics.jsonl"), GRPO_NAMES, "iteration"))
    assert [run["name"] for run in runs] == [state["run_name"]] * 2  # the resumed run continues the same run
    assert runs[0]["config"]["learning_rate"] == 0.03 and runs[0]["config"]["game"] == GAME
    assert runs[1]["config"] == {}  # the config is logged once


@pytest.mark.slow  # ~15 s: three processes (trackio reads its store's folder when it is imported)
def test_trackio_local_store_holds_the_metrics_jsonl_series(tiny_model_dir, letter_game, tmp_path):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "TRACKIO_PROJECT": "trace-test",
           "TRACE_GAMES_DIRS": str(GAMES_DIR), "PYTHONPATH": str(REPO)}

    def train(argv: list[str]) -> None:
        done = subprocess.run([sys.executable, "-m", "train", *argv, "--model", str(tiny_model_dir)], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    out = _grpo_twice(train, tmp_path, "trackio")
    name = json.loads((out / "tracking.json").read_text())["run_name"]
    read = ("import json, sys\nfrom trackio.sqlite_storage import SQLiteStorage as S\n"
            "print(json.dumps({'runs': S.get_runs('trace-test'), 'logs': S.get_logs('trace-test', sys.argv[1]), "
            "'config': S.get_run_config('trace-test', sys.argv[1])}))")
    done = subprocess.run([sys.executable, "-c", read, name], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    store = json.loads(done.stdout.strip().splitlines()[-1])
    assert store["runs"] == [name]
    series: dict[str, list] = {}
    for log in store["logs"]:
        for key, value in log.items():
            if key not in ("step", "timestamp"):
                series.setdefault(key, []).append((log["step"], value))
    assert_same_series(series, expected_series(rows(out / "metrics.jsonl"), GRPO_NAMES, "iteration"))
    assert store["config"]["learning_rate"] == 0.03 and store["config"]["game"] == GAME


@pytest.mark.slow  # ~20 s: MLflow creates its SQLite store
def test_mlflow_run_holds_the_metrics_jsonl_series(tiny_model_dir, letter_game, tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = _grpo_twice(_in_process(tiny_model_dir, capsys), tmp_path, "mlflow")
    from mlflow.tracking import MlflowClient

    state = json.loads((out / "tracking.json").read_text())
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(state["mlflow_run_id"])
    series = {name: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, name),
                                                       key=lambda m: (m.step, m.timestamp))]
              for name in run.data.metrics}
    assert_same_series(series, expected_series(rows(out / "metrics.jsonl"), GRPO_NAMES, "iteration"))
    assert run.info.run_name == state["run_name"] and run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.03" and run.data.params["game"] == GAME
    (experiment,) = [e for e in client.search_experiments() if e.name == "trace"]
    assert len(client.search_runs([experiment.experiment_id])) == 1  # the resumed run continued the same run


def test_gate_configs_report_to_serves_both_commands_and_grpo_can_override_it():
    from train.gate_config import MoEGateConfig

    config = MoEGateConfig(adapters={"a": "x"}, report_to="tensorboard")
    assert config.report_to == ["tensorboard"] and config.grpo_config().report_to == ["tensorboard"]
    overridden = MoEGateConfig(adapters={"a": "x"}, report_to=["tensorboard"], grpo={"report_to": []})
    assert overridden.grpo_config().report_to == []
    with pytest.raises(ValueError, match=f"unknown tracker 'neptune'; {ACCEPTED}"):
        MoEGateConfig(adapters={"a": "x"}, report_to=["neptune"])
