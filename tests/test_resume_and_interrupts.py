"""The training CLIs resume the run they are given, check before they spend, and end a Ctrl-C cleanly (issue 28).

- `--resume RUN` continues in RUN with RUN's saved config; a flag that differs from it exits 2 naming each
  difference; --iterations may extend but not shrink; a finished run says so; grpo_gater refuses --init_gate.
- Ctrl-C: one line `interrupted; <what to do next>`, exit 130, no traceback, every file old or complete.
- Ordinary mistakes (missing model, empty or wrong data, an output that is the input or cannot be created, a bad
  port, a broken gate file) exit 2 with one line before any model loads.
- Artifacts written through safetensors follow the umask.

Most checks run `main(argv)` in process (`exit_code(main, argv)` where the Ctrl-C line matters); one subprocess
gets a real SIGINT (slow).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import game_registry
from common.cli import INTERRUPTED, exit_code
from train.__main__ import main as train_main
from signals import restore_sigint

REPO = Path(__file__).resolve().parent.parent
GAMES_DIR = REPO / "tests" / "games"
GAME = "capability_letter_density"
FAST = ["--groups_per_iteration", "6", "--group_size", "4", "--lora_r", "4", "--learning_rate", "3e-2",
        "--lora_target_modules", "[q_proj, v_proj, lm_head]", "--max_episode_tokens", "128"]
COST = ["--groups_per_iteration", "6", "--group_size", "4", "--max_episode_tokens", "128"]  # FAST's share that sets cost


@pytest.fixture(scope="module", autouse=True)
def letter_game():
    """The test game, registered for this module only (other modules list every registered capability game)."""
    game_registry.discover_games()  # a copy taken before discovery would be restored empty, marked discovered
    registry, loaded = dict(game_registry._REGISTRY), set(game_registry._LOADED_FILES)
    game_registry._import_game_file(GAMES_DIR / f"{GAME}_game.py")
    yield game_registry.get_game(GAME)
    game_registry._REGISTRY.clear()
    game_registry._REGISTRY.update(registry)
    game_registry._LOADED_FILES.clear()
    game_registry._LOADED_FILES.update(loaded)


class NoModelLoad:
    """Stands in for load_base_model where the command must stop before any model loads."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("the model was loaded: the check came too late")


def _snapshot(root: Path) -> list[tuple[str, bytes | None, int]]:
    """Every path under `root` with its bytes and mode: proof that nothing was written."""
    return sorted((str(p.relative_to(root)), p.read_bytes() if p.is_file() else None, p.stat().st_mode)
                  for p in [root, *root.rglob("*")])


def _one_error_line(err: str, *parts: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and all(part in lines[0] for part in parts), err


def _run(main, argv: list, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = exit_code(main, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def done_run(tiny_model_dir, tmp_path_factory) -> Path:
    """A finished 2-iteration run (checkpoints at 1 and 2). Copy it before continuing it."""
    out = tmp_path_factory.mktemp("resume") / "run"
    code = train_main(["--game", GAME, "--model", str(tiny_model_dir), "--output_dir", str(out), "--iterations", "2",
                       "--save_every", "1", *FAST])
    assert code == 0
    return out


def test_a_new_run_into_a_finished_runs_folder_is_refused_before_the_model_loads(done_run, tiny_model_dir,
                                                                                  tmp_path, monkeypatch, capsys):
    """Without --resume the finished run is neither restarted over (metrics 1, 2, 1, 2) nor touched; --overwrite
    replaces it with one run's files."""
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    before = _snapshot(run)
    argv = ["--game", GAME, "--model", tiny_model_dir, "--output_dir", run, "--iterations", "2", "--save_every", "1",
            *FAST]
    monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
    code, _, err = _run(train_main, argv, capsys)
    _one_error_line(err, f"--output_dir {run} holds another run's files (adapter_config.json, adapter_model",
                    f"pass --resume {run} to continue it, pass --overwrite to replace it")
    assert code == 2 and _snapshot(run) == before
    monkeypatch.undo()
    code, _, err = _run(train_main, [*argv, "--overwrite"], capsys)
    assert code == 0, err
    iterations = [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert iterations == [1, 2]
    assert not (run / ".run.lock").exists()


def test_a_second_train_on_a_folder_in_use_exits_2_at_once(tiny_model_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    hold = ("import sys\nfrom common.run_folder import claimed_run_folder\n"
            "with claimed_run_folder(sys.argv[1], '--output_dir', fresh=False, command='python -m train (first)'):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
        code, _, err = _run(train_main, ["--game", GAME, "--model", tiny_model_dir, "--output_dir", run, *FAST],
                            capsys)
    finally:
        holder.communicate("", timeout=60)
    assert code == 2
    _one_error_line(err, f"--output_dir {run} is in use by another run (pid {holder.pid}, `python -m train (first)`")


# ------------------------------------------------------------------------------------------------------
# --resume RUN (python -m train)
# ------------------------------------------------------------------------------------------------------
def test_resume_continues_in_the_run_folder_with_its_saved_config(done_run, tiny_model_dir, tmp_path, monkeypatch,
                                                                  capsys):
    """The README's form: the run continues in RUN (not pipeline/adapters/<name>) with RUN's learning rate, LoRA
    rank and targets, which the command line does not repeat; --iterations extends it, and the start line says so."""
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    monkeypatch.chdir(tmp_path)  # where the default output folder would be
    code, out, err = _run(train_main, ["--game", GAME, "--model", tiny_model_dir, "--resume", run, "--iterations", "3",
                                       *COST], capsys)
    assert code == 0, err[-2000:]
    assert "resumed at iteration 2" in out and "iterations 2 -> 3" in out, out
    assert not (tmp_path / "pipeline").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert rows[-1]["lr"] == pytest.approx(3e-2)  # the saved learning rate, not the default 1e-5
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["iterations"] == 3 and saved["lora_r"] == 4 and saved["learning_rate"] == pytest.approx(3e-2)


def test_resume_needs_only_the_run_folder(done_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    code, out, err = _run(train_main, ["--resume", run / "checkpoints", "--iterations", "3"], capsys)
    assert code == 0, err[-2000:]
    assert [json.loads(l)["iteration"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


@pytest.mark.parametrize("flags, named", [
    (["--learning_rate", "0.5"], ["--learning_rate 0.5 (the run has 0.03)"]),
    (["--game", "capability_another"], ['--game "capability_another" (the run has "capability_letter_density")']),
    (["--model", "org/another-model"], ['--model "org/another-model"']),
    (["--learning_rate", "0.5", "--lora_r", "8", "--iterations", "5"], ["--learning_rate 0.5", "--lora_r 8 (the run has 4)"]),
])
def test_resume_refuses_flags_that_differ_from_the_saved_run(done_run, tiny_model_dir, flags, named, monkeypatch,
                                                             capsys):
    monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
    before = _snapshot(done_run)
    argv = ["--game", GAME, "--model", tiny_model_dir, "--resume", done_run, *flags]
    code, _, err = _run(train_main, argv, capsys)
    assert code == 2
    _one_error_line(err, *named, "a resume continues the run as")
    assert "--iterations" not in err.split("(only")[0]  # --iterations may change: not named as a difference
    assert _snapshot(done_run) == before


def test_resume_with_fewer_iterations_than_done_exits_2(done_run, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
    before = _snapshot(done_run)
    code, _, err = _run(train_main, ["--resume", done_run, "--iterations", "1"], capsys)
    assert code == 2
    _one_error_line(err, "--iterations 1", "already done 2 iterations", "above 2")
    assert _snapshot(done_run) == before


def test_resuming_a_finished_run_says_it_is_finished(done_run, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
    before = _snapshot(done_run)
    code, out, err = _run(train_main, ["--game", GAME, "--model", tiny_model_dir, "--resume", done_run], capsys)
    assert code == 0 and not err, err
    assert "finished, 2 of 2 iterations done; nothing to do" in out and "--iterations above 2" in out
    assert _snapshot(done_run) == before


def test_resume_into_another_folder_that_is_not_empty_exits_2(done_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    code, _, err = _run(train_main, ["--resume", done_run, "--iterations", "3", "--output_dir", other], capsys)
    assert code == 2
    _one_error_line(err, "a resume continues in its own run folder", "new empty folder")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------------------------------------------------
# --resume RUN (python -m train.grpo_gater)
# ------------------------------------------------------------------------------------------------------
GRPO_SMALL = {"game": GAME, "iterations": 1, "groups_per_iteration": 2, "group_size": 4, "learning_rate": 0.05,
              "max_episode_tokens": 128, "save_every": 1, "hint_fraction": 0.0}


@pytest.fixture(scope="module")
def gate_run(tiny_model_dir, tmp_path_factory) -> tuple[Path, dict]:
    """A finished 1-iteration gate GRPO run and the config it was started with."""
    from moe_gate.smoke_test import make_random_adapter
    from train.grpo_gater import main
    from train.policy import load_base_model

    folder = tmp_path_factory.mktemp("gate-run")
    adapter = make_random_adapter(lambda: load_base_model(str(tiny_model_dir))[0], folder / "cap", r=2, alpha=4,
                                  seed=0, targets=["q_proj", "v_proj"])
    config = {"model": str(tiny_model_dir), "adapters": {"cap": str(adapter)}, "output_dir": str(folder / "gate"),
              "grpo": dict(GRPO_SMALL)}
    (folder / "gate.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(folder / "gate.yaml")]) == 0
    return folder / "gate", config


def test_grpo_gater_resume_refuses_init_gate(gate_run, monkeypatch, capsys):
    from train.grpo_gater import main

    monkeypatch.setattr("train.grpo_gater.load_base_model", NoModelLoad())
    run, _ = gate_run
    code, _, err = _run(main, ["--resume", run, "--init_gate", run], capsys)
    assert code == 2
    _one_error_line(err, "--init_gate starts a new run", "pass one of them")


def test_grpo_gater_resume_refuses_a_changed_config(gate_run, tmp_path, monkeypatch, capsys):
    from train.grpo_gater import main

    monkeypatch.setattr("train.grpo_gater.load_base_model", NoModelLoad())
    run, config = gate_run
    before = _snapshot(run)
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({**config, "grpo": {**config["grpo"], "learning_rate": 0.5, "iterations": 3}}))
    code, _, err = _run(main, ["--config", changed, "--resume", run], capsys)
    assert code == 2
    _one_error_line(err, "grpo.learning_rate 0.5 (the run has 0.05)")
    assert "grpo.iterations" not in err.split("(only")[0]  # may change: not named as a difference
    assert _snapshot(run) == before


def test_grpo_gater_resumes_from_its_folder_alone_and_says_when_finished(gate_run, tmp_path, capsys):
    from train.grpo_gater import main

    run = tmp_path / "gate"
    shutil.copytree(gate_run[0], run)
    code, out, err = _run(main, ["--resume", run], capsys)
    assert code == 0 and "finished, 1 of 1 iterations done" in out and "--grpo_iterations above 1" in out, err
    code, out, err = _run(main, ["--resume", run, "--grpo_iterations", "2"], capsys)
    assert code == 0, err[-2000:]
    assert "iterations 1 -> 2" in out
    assert [json.loads(l)["iteration"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# ------------------------------------------------------------------------------------------------------
# Ctrl-C
# ------------------------------------------------------------------------------------------------------
def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _one_interrupted_line(code: int, err: str, *parts: str) -> None:
    assert code == INTERRUPTED
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("interrupted; ") and "Traceback" not in err, err
    assert all(part in lines[-1] for part in parts), err


def test_ctrl_c_in_train_says_how_to_resume(done_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    monkeypatch.setattr("train.grpo.GRPOTrainer._run_iterations", _interrupt)
    code, _, err = _run(train_main, ["--resume", run, "--iterations", "3"], capsys)
    _one_interrupted_line(code, err, f"resume with: python -m train --resume {run}")


def test_ctrl_c_in_grpo_gater_says_how_to_resume(gate_run, tmp_path, monkeypatch, capsys):
    from train.grpo_gater import main

    run = tmp_path / "gate"
    shutil.copytree(gate_run[0], run)
    monkeypatch.setattr("train.grpo.GRPOTrainer._run_iterations", _interrupt)
    code, _, err = _run(main, ["--resume", run, "--grpo_iterations", "2"], capsys)
    _one_interrupted_line(code, err, f"resume with: python -m train.grpo_gater --resume {run}")


def test_a_grpo_gater_resume_into_a_new_folder_stopped_early_reruns_as_its_hint_says(gate_run, tmp_path, monkeypatch,
                                                                                    capsys):
    from train.grpo_gater import main

    run, new = tmp_path / "gate", tmp_path / "continued"
    shutil.copytree(gate_run[0], run)
    monkeypatch.setattr("train.grpo.GRPOTrainer._run_iterations", _interrupt)
    code, _, err = _run(main, ["--resume", run, "--output_dir", new, "--grpo_iterations", "2"], capsys)
    _one_interrupted_line(code, err, f"no checkpoint in {new} yet")
    monkeypatch.undo()
    hint = err.strip().splitlines()[-1].split("python -m train.grpo_gater ", 1)[1]
    code, out, err = _run(main, shlex.split(hint), capsys)
    assert code == 0, err[-2000:]
    assert [json.loads(line)["iteration"] for line in (new / "metrics.jsonl").read_text().splitlines()] == [2]


def _router_config(tmp_path: Path, tiny_model_dir: Path) -> Path:
    from benchmarks.results import make_simulation, write_results
    from moe_gate.smoke_test import make_random_adapter
    from train.policy import load_base_model

    adapter = make_random_adapter(lambda: load_base_model(str(tiny_model_dir))[0], tmp_path / "cap", r=2, alpha=4,
                                  seed=0, targets=["q_proj", "v_proj"])
    simulations = [make_simulation(task_id=str(i), sample_idx=0, termination_reason="done", reward_info={"reward": 1.0},
                                   messages=[{"role": "user", "content": f"order {i}?"},
                                             {"role": "assistant", "content": "It ships today."}]) for i in range(3)]
    write_results(tmp_path / "rollouts.json", simulations)
    config = {"model": str(tiny_model_dir), "adapters": {"cap": str(adapter)}, "output_dir": str(tmp_path / "gate"),
              "sft": {"data": [{"path": str(tmp_path / "rollouts.json"), "label": "cap"}], "epochs": 2,
                      "validation_fraction": 0.0}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "c.yaml"


def test_ctrl_c_in_router_sft_keeps_the_previous_gate_and_its_metrics(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The interrupted run's epoch-1 metrics must not sit beside the previous run's gate (nor replace its metrics)."""
    import train.train_router_sft as router_sft

    config = _router_config(tmp_path, tiny_model_dir)
    code, _, err = _run(router_sft.main, ["--config", config], capsys)
    assert code == 0, err
    before = _snapshot(tmp_path / "gate")
    real = router_sft.train_router

    def one_epoch_then_ctrl_c(model, train, sft, *, log, **kwargs):
        def log_then_ctrl_c(metrics):
            log(metrics)  # (before the fix: a line in the metrics file it had emptied at start)
            raise KeyboardInterrupt

        return real(model, train, sft, log=log_then_ctrl_c, **kwargs)

    monkeypatch.setattr(router_sft, "train_router", one_epoch_then_ctrl_c)
    code, _, err = _run(router_sft.main, ["--config", config, "--overwrite"], capsys)  # set aside, then put back
    assert _snapshot(tmp_path / "gate") == before
    _one_interrupted_line(code, err, f"nothing written to {tmp_path / 'gate'}")


def _chat_records(path: Path, n: int = 4) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                      {"role": "assistant", "content": "Hello."}]}) + "\n"
                            for i in range(n)))
    return path


def test_ctrl_c_in_sft_leaves_the_output_as_it_was(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from train.sft import main

    monkeypatch.setattr("train.sft.train_sft", _interrupt)
    out = tmp_path / "sft"
    code, _, err = _run(main, ["--model", tiny_model_dir, "--data", _chat_records(tmp_path / "d.jsonl"), "--out", out,
                               "--batch-tokens", "128"], capsys)
    _one_interrupted_line(code, err, f"nothing saved to {out}")
    assert not list(out.rglob("*.safetensors")) and not (out / "sft_info.json").exists()


def test_ctrl_c_in_the_demo_says_the_completed_steps_are_kept(tmp_path, monkeypatch, capsys):
    from demo import run as demo

    monkeypatch.setattr(demo.Demo, "step", _interrupt)
    code, _, err = _run(demo.main, ["--profile", "fast", "--run-dir", tmp_path / "demo"], capsys)
    _one_interrupted_line(code, err, "the steps that completed are kept", "run the same command again")


@pytest.mark.slow  # ~8 s: a real training process, interrupted after its first iteration
def test_sigint_ends_python_m_train_at_once_with_one_line(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "TRACE_GAMES_DIRS": str(GAMES_DIR), "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "train", "--game", GAME, "--model", str(tiny_model_dir),
                                "--output_dir", str(out), "--iterations", "50", "--save_every", "1", *FAST],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=restore_sigint)
    deadline = time.time() + 240
    for line in process.stdout:  # the first progress line: the run is training
        if line.startswith("iter 1/") or time.time() > deadline:
            break
    process.send_signal(signal.SIGINT)
    started = time.time()
    _, err = process.communicate(timeout=60)
    assert time.time() - started < 20  # at once: not after the remaining iterations
    _one_interrupted_line(process.returncode, err, f"resume with: python -m train --resume {out}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]  # every line complete
    assert rows and rows[0]["iteration"] == 1


# ------------------------------------------------------------------------------------------------------
# Ordinary mistakes: one line, exit 2, before any model loads, nothing written
# ------------------------------------------------------------------------------------------------------
def test_sft_refuses_to_write_over_its_own_model(tiny_model_dir, tmp_path, capsys):
    from train.sft import main

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    before = _snapshot(model)
    code, _, err = _run(main, ["--model", model, "--data", _chat_records(tmp_path / "d.jsonl"), "--out", model],
                        capsys)
    assert code == 2
    _one_error_line(err, f"--out {model} is also --model", "write --out elsewhere")
    assert _snapshot(model) == before


@pytest.mark.parametrize("case", ["missing model", "empty data", "summary as data", "model is a file"])
def test_sft_ordinary_mistakes_exit_2_with_one_line(case, tiny_model_dir, tmp_path, capsys):
    from train.sft import main

    data = _chat_records(tmp_path / "d.jsonl")
    model: Path = tiny_model_dir
    if case == "missing model":
        model, expected = tmp_path / "no-model", "model folder not found"
    elif case == "model is a file":
        model, expected = data, "is a file, not a model folder"
    elif case == "empty data":
        data, expected = tmp_path / "empty.jsonl", "no records"
        data.write_text("")
    else:
        data, expected = tmp_path / "summary.jsonl", "record 1 has no `messages` list"
        data.write_text(json.dumps({"task_id": "1", "reward": 0.5}) + "\n")
    out = tmp_path / "out"
    code, _, err = _run(main, ["--model", model, "--data", data, "--out", out], capsys)
    assert code == 2
    _one_error_line(err, expected)
    assert not out.exists()


def _gate_config_file(tmp_path: Path, tiny_model_dir: Path, output_dir: Path) -> Path:
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({"model": str(tiny_model_dir), "adapters": {"cap": str(tmp_path / "cap")},
                                    "output_dir": str(output_dir), "grpo": dict(GRPO_SMALL),
                                    "sft": {"data": [{"path": str(tmp_path / "r.json"), "label": "cap"}]}}))
    return path


@pytest.mark.parametrize("cli", ["train", "train.sft", "train_router_sft", "grpo_gater", "demo", "smoke_test"])
def test_an_output_folder_that_cannot_be_created_exits_2_before_any_work(cli, tiny_model_dir, tmp_path, monkeypatch,
                                                                        capsys):
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("must stay as it is\n")
    target = a_file / "out"
    for where in ("train.__main__", "train.grpo_gater", "train.policy"):
        monkeypatch.setattr(f"{where}.load_base_model", NoModelLoad())
    if cli == "train":
        from train.__main__ import main
        argv = ["--game", GAME, "--model", tiny_model_dir, "--output_dir", target, *FAST]
    elif cli == "train.sft":
        from train.sft import main
        argv = ["--model", tiny_model_dir, "--data", _chat_records(tmp_path / "d.jsonl"), "--out", target]
    elif cli == "train_router_sft":
        from train.train_router_sft import main
        argv = ["--config", _gate_config_file(tmp_path, tiny_model_dir, target)]
    elif cli == "grpo_gater":
        from train.grpo_gater import main
        argv = ["--config", _gate_config_file(tmp_path, tiny_model_dir, target)]
    elif cli == "demo":
        from demo.run import main
        argv = ["--profile", "fast", "--run-dir", target]
    else:
        from moe_gate.smoke_test import main
        monkeypatch.setattr("moe_gate.smoke_test.run_checks", NoModelLoad())
        argv = ["--keep", target]
    code, _, err = _run(main, argv, capsys)
    assert code == 2
    _one_error_line(err, f"{a_file} is a file, not a folder")
    assert a_file.read_text() == "must stay as it is\n"


def test_train_with_a_model_folder_that_does_not_exist_exits_2_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("train.__main__.load_base_model", NoModelLoad())
    for model in (tmp_path / "no-model", "runs/no/such/model"):  # the second is no valid hub id either
        code, _, err = _run(train_main, ["--game", GAME, "--model", model, "--output_dir", tmp_path / "o"], capsys)
        assert code == 2
        _one_error_line(err, "model folder not found")
    assert not (tmp_path / "o").exists()


@pytest.fixture
def global_gate(tmp_path) -> Path:
    from moe_gate import build_capability_model, save_gate
    from moe_gate.smoke_test import make_adapters, make_tiny_base

    adapters = make_adapters(tmp_path / "adapters", make_tiny_base)
    return save_gate(build_capability_model(make_tiny_base(), adapters, mode="global"), tmp_path / "gate")


def test_serve_refuses_a_bad_port_or_upstream_and_a_broken_gate_file(global_gate, capsys):
    from moe_gate.serve import main

    code, _, err = _run(main, ["--gate", global_gate, "--upstream", "http://127.0.0.1:9", "--port", "-1"], capsys)
    assert code == 2
    _one_error_line(err, "--port must be in [0, 65535]")
    code, _, err = _run(main, ["--gate", global_gate, "--upstream", "localhost:8000"], capsys)
    assert code == 2
    _one_error_line(err, "with its scheme", "http://localhost:8000")
    (global_gate / "gate.safetensors").write_bytes(b"not a safetensors file at all")
    code, _, err = _run(main, ["--gate", global_gate, "--upstream", "http://127.0.0.1:9"], capsys)
    assert code == 2
    _one_error_line(err, "gate.safetensors: not a readable safetensors file")


def test_a_broken_gate_file_is_a_gate_error_when_building_the_model(global_gate):
    from moe_gate import GateError, build_capability_model
    from moe_gate.smoke_test import make_tiny_base

    adapters = {a["name"]: a["path"] for a in json.loads((global_gate / "gate_config.json").read_text())["adapters"]}
    (global_gate / "gate.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(GateError, match="not a readable safetensors file"):
        build_capability_model(make_tiny_base(), adapters, gate=global_gate, mode="global")


# ------------------------------------------------------------------------------------------------------
# File modes
# ------------------------------------------------------------------------------------------------------
@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_safetensors_artifacts_follow_the_umask(umask_027, tiny_model_dir, tmp_path):
    """Adapter, checkpoint, gate and SFT model: 0640 / 0750 under umask 027, as any other file (was 0600 / 0700)."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from moe_gate import build_capability_model, save_gate
    from moe_gate.smoke_test import make_adapters, make_tiny_base
    from train.checkpoint import rank_state, save_checkpoint
    from train.policy import write_peft_adapter
    from train.sft import save_model

    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    state = {"base_model.model.q_proj.lora_A.weight": torch.zeros(2, 4)}
    write_peft_adapter(lora, state, tmp_path / "adapter")
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([weight])
    checkpoint = save_checkpoint(tmp_path / "checkpoints", iteration=1,
                                 write_adapter=lambda path: write_peft_adapter(lora, state, path),
                                 optimizer_state=optimizer.state_dict(),
                                 scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: 1.0),
                                 rank_states=[rank_state({})])
    gate = save_gate(build_capability_model(make_tiny_base(), make_adapters(tmp_path / "adapters", make_tiny_base)),
                     tmp_path / "gate")
    save_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
               AutoTokenizer.from_pretrained(str(tiny_model_dir)), tmp_path / "sft", {"note": "test"})
    files = [tmp_path / "adapter" / "adapter_model.safetensors", checkpoint / "trainer_state.safetensors",
             checkpoint / "adapter" / "adapter_model.safetensors", gate / "gate.safetensors",
             tmp_path / "sft" / "model.safetensors", tmp_path / "adapters" / "alpha" / "adapter_model.safetensors"]
    assert {str(f.relative_to(tmp_path)): oct(_mode(f)) for f in files} == \
        {str(f.relative_to(tmp_path)): oct(0o640) for f in files}
    assert oct(_mode(checkpoint)) == oct(0o750) and oct(_mode(checkpoint / "adapter")) == oct(0o750)
