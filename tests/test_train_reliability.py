"""python -m train's reliability around its run folder: resuming from an earlier checkpoint, config types, checks
before the model loads, a resume into a new folder that stopped early, damaged checkpoints and metrics lines, and
the saved config's reproduce command.

The fast tests build run folders by hand (train.checkpoint.save_checkpoint on a two-number "adapter") and stop
the CLI where the model would load; one slow test trains the tiny model through an interrupted resume."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.cli import INTERRUPTED, exit_code
from common.validation import InputError
from train import __main__ as train_cli
from train.checkpoint import (ABANDONED_NAME, check_resumable, latest_checkpoint, metrics_rows, plan_resume,
                              rank_state, save_checkpoint, set_aside_after)
from train.config import GRPOConfig, load_config, save_config
from train.grpo import GRPOTrainer, lr_factor_schedule

GAME = "capability_fake_game"
MODEL = "org/some-model"  # a hub id: left to the loader, which these tests never reach


class ModelLoaded(Exception):
    """Raised where the model would load: the command got past every input check."""


def _model_loaded(*args, **kwargs):
    raise ModelLoaded


@pytest.fixture
def no_model(monkeypatch):
    """The CLI with a game that needs no registry and no model: what would load raises ModelLoaded."""
    monkeypatch.setattr(train_cli, "lookup_game", lambda name: object())
    monkeypatch.setattr(train_cli, "check_game_overrides", lambda spec, overrides: None)
    monkeypatch.setattr(train_cli, "load_tokenizer", _model_loaded)
    monkeypatch.setattr(train_cli, "load_base_model", _model_loaded)
    for name in [n for n in os.environ if n.startswith("VLLM_")]:
        monkeypatch.delenv(name)


def _cli(argv: list, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = exit_code(train_cli.main, [str(a) for a in argv])
    except ModelLoaded:
        code = "model loaded"
    out, err = capsys.readouterr()
    return code, out, err


def _config(run: Path, **fields) -> GRPOConfig:
    values = {"game": GAME, "model": MODEL, "output_dir": str(run), "iterations": 20, "save_every": 10,
              "groups_per_iteration": 2, "group_size": 2, **fields}
    return GRPOConfig(**values)


def _checkpoint(run: Path, iteration: int, top_level: bool = False) -> Path:
    """A real checkpoint of a two-number "adapter" whose weights are the iteration number."""
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(2)
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def write_adapter(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.full((2,), float(iteration))}, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps({"iteration": iteration}))

    if top_level:
        write_adapter(run)
    return save_checkpoint(run / "checkpoints", iteration=iteration, write_adapter=write_adapter,
                           optimizer_state=optimizer.state_dict(), scheduler=scheduler, rank_states=[rank_state({})])


def _metrics_line(iteration: int) -> str:
    return json.dumps({"iteration": iteration, "mean_reward_all_episodes": iteration / 100}) + "\n"


def _rollout(run: Path, iteration: int) -> None:
    (run / "rollouts").mkdir(parents=True, exist_ok=True)
    (run / "rollouts" / f"iter_{iteration:06d}.json").write_text(json.dumps({"iteration": iteration}))


def _iterations(path: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in path.read_text().splitlines()]


def _run_folder(run: Path, done: int, checkpoints: list[int], **fields) -> Path:
    """A run folder as the trainer leaves it after `done` iterations with checkpoints at `checkpoints`."""
    run.mkdir(parents=True)
    save_config(_config(run, **fields), run / "config.yaml")
    for iteration in checkpoints:
        _checkpoint(run, iteration, top_level=iteration == checkpoints[-1])
    (run / "metrics.jsonl").write_text("".join(_metrics_line(i) for i in range(1, done + 1)))
    for iteration in range(1, done + 1):
        _rollout(run, iteration)
    return run


def _interrupted_after(run: Path, first: int, last: int):
    """Stands in for the training: iterations first..last leave their metrics line and rollouts, then Ctrl-C."""
    def train(*args, **kwargs):
        with open(run / "metrics.jsonl", "a") as handle:
            handle.write("".join(_metrics_line(i) for i in range(first, last + 1)))
        for iteration in range(first, last + 1):
            _rollout(run, iteration)
        raise KeyboardInterrupt
    return train


def _hint_command(err: str) -> list[str]:
    """The argv of the `python -m train ...` command that the interrupted line names."""
    line = [line for line in err.splitlines() if line.startswith("interrupted; ")][-1]
    return shlex.split(line.split("python -m train ", 1)[1])


# ------------------------------------------------------------------------------------------------------
# 1. Resuming from a checkpoint before the run's newest sets the later files aside
# ------------------------------------------------------------------------------------------------------
def test_resuming_an_earlier_checkpoint_sets_the_later_run_aside_and_its_hint_resumes_it(tmp_path, no_model,
                                                                                         monkeypatch, capsys):
    """A finished 20-iteration run resumed from iter_000010 and interrupted at 14: the hint's `--resume RUN` must
    continue at 14's checkpoint (10), not report the abandoned run's iter_000020 as finished."""
    run = _run_folder(tmp_path / "run", done=20, checkpoints=[10, 20])
    monkeypatch.setattr(train_cli, "load_tokenizer", _interrupted_after(run, 11, 14))
    code, out, err = _cli(["--resume", run / "checkpoints" / "iter_000010"], capsys)
    assert code == INTERRUPTED, err
    (aside,) = (run / ABANDONED_NAME).iterdir()
    assert "set aside what an earlier attempt wrote after it" in out and str(aside) in out, out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000010"]
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["iter_000020"]
    assert _iterations(run / "metrics.jsonl") == list(range(1, 15))
    assert _iterations(aside / "metrics.jsonl") == list(range(11, 21))  # the abandoned lines are kept, not cut
    assert sorted(p.name for p in (aside / "rollouts").iterdir()) == [f"iter_{i:06d}.json" for i in range(11, 21)]
    assert load_file(str(aside / "adapter_model.safetensors"))["w"].tolist() == [20.0, 20.0]
    assert load_file(str(run / "adapter_model.safetensors"))["w"].tolist() == [10.0, 10.0]  # iter_000010's again

    argv = _hint_command(err)
    assert argv == ["--resume", str(run)], err
    chosen = {}
    monkeypatch.setattr(train_cli, "_train", lambda config, spec, plan, vllm: chosen.update(plan=plan) or 0)
    code, out, err = _cli(argv, capsys)
    assert code == 0 and "finished" not in out, out + err
    assert chosen["plan"].checkpoint == run / "checkpoints" / "iter_000010" and chosen["plan"].done == 10
    assert _iterations(run / "metrics.jsonl") == list(range(1, 11))  # 11-14 of the interrupted attempt: aside too
    assert len(list((run / ABANDONED_NAME).iterdir())) == 2


def test_a_run_killed_between_checkpoints_keeps_the_lines_it_redoes(tmp_path):
    """Killed at 14 with its last checkpoint at 10 (and a last line cut short): the resume redoes 11-14, and the
    lines it replaces go aside instead of being dropped."""
    run = _run_folder(tmp_path / "run", done=14, checkpoints=[10])
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"iteration": 15, "mean_rew')
    aside = set_aside_after(run, 10)
    assert aside is not None and aside.parent == run / ABANDONED_NAME
    assert _iterations(run / "metrics.jsonl") == list(range(1, 11))
    assert (aside / "metrics.jsonl").read_text().splitlines()[-1] == '{"iteration": 15, "mean_rew'
    assert sorted(p.name for p in (aside / "rollouts").iterdir()) == [f"iter_{i:06d}.json" for i in range(11, 15)]
    assert not (aside / "checkpoints").exists() and (run / "adapter_model.safetensors").exists()
    assert set_aside_after(run, 10) is None  # nothing left to move


# ------------------------------------------------------------------------------------------------------
# 2. Every config field its declared type
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, text, expected", [
    ("micro_batch_size", "4.0", 4),  # a whole number written as a float is that number
    ("iterations", "1e3", 1000),
    ("lora_target_modules", "q_proj,v_proj", ["q_proj", "v_proj"]),
    ("lora_target_modules", "[q_proj, v_proj]", ["q_proj", "v_proj"]),
    ("report_to", "none", []),
    ("learning_rate", "1e-5", 1e-5),
])
def test_flags_become_their_fields_type(key, text, expected):
    assert getattr(load_config(None, {key: text}), key) == expected


@pytest.mark.parametrize("line, message", [
    ("save_every: 2.5", "save_every expects int (a whole number), got 2.5: write 2 or 3"),
    ("groups_per_iteration: 8.5", "groups_per_iteration expects int"),
    ("iterations: true", "iterations expects int"),
    ("micro_batch_size: four", "micro_batch_size expects int"),
    ("temperature: .nan", "temperature expects float"),
    ("fsdp: maybe", "fsdp expects true or false"),
    ("lora_target_modules: [1, 2]", "lora_target_modules expects a list of names"),
    ("model: 123", "model expects a string"),
    ("game_overrides: [1]", "game_overrides expects a mapping"),
])
def test_yaml_values_of_the_wrong_type_are_refused_naming_the_fix(line, message, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(line + "\n")
    with pytest.raises(InputError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: {message}"), caught.value


def test_yaml_integral_floats_load_as_ints_and_python_configs_are_typed_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("micro_batch_size: 4.0\ngroups_per_iteration: 8.0\niterations: 10.0\nlora_target_modules: q_proj\n")
    config = load_config(path)
    assert (config.micro_batch_size, config.groups_per_iteration, config.iterations) == (4, 8, 10)
    assert all(type(v) is int for v in (config.micro_batch_size, config.groups_per_iteration, config.iterations))
    assert config.lora_target_modules == ["q_proj"]
    with pytest.raises(InputError, match="save_every expects int"):
        GRPOConfig(save_every=2.5)


def test_a_fractional_flag_exits_2_before_any_work(tmp_path, no_model, capsys):
    code, _, err = _cli(["--game", GAME, "--model", MODEL, "--output_dir", tmp_path / "o", "--save_every", "2.5"],
                        capsys)
    assert code == 2 and err.strip() == "error: --save_every expects int (a whole number), got '2.5': write 2 or 3"
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------------------
# 3. vLLM settings, prompts and trackers are checked before the model loads
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env, flags, message", [
    ({"VLLM_BASE_URLS": "localhost:8000", "VLLM_MODEL": "m"}, [], "VLLM_BASE_URLS localhost:8000: needs a scheme"),
    ({"VLLM_BASE_URLS": "http://127.0.0.1:8000"}, [], "VLLM_MODEL is not"),
    ({"VLLM_BASE_URLS": "http://127.0.0.1:8000", "VLLM_MODEL": "m", "VLLM_REQUEST_TIMEOUT": "soon"}, [],
     "VLLM_REQUEST_TIMEOUT='soon' is not a number"),
    ({"VLLM_BASE_URLS": "http://127.0.0.1:8000", "VLLM_MODEL": "m", "VLLM_MAX_RETRIES": "-1"}, [],
     "VLLM_MAX_RETRIES='-1': must be an integer >= 0"),
    ({}, ["--fsdp", "true"], "--fsdp needs rollouts from vLLM servers"),
])
def test_bad_vllm_settings_exit_2_before_the_model_loads(env, flags, message, tmp_path, no_model, monkeypatch,
                                                         capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = _cli(["--game", GAME, "--model", MODEL, "--output_dir", tmp_path / "o", *flags], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (code, err)
    assert not (tmp_path / "o").exists()


def test_prompts_and_trackers_are_checked_before_the_model_loads(tmp_path, no_model, monkeypatch, capsys):
    calls: list[str] = []
    monkeypatch.setattr(train_cli, "load_tokenizer", lambda model: calls.append("tokenizer"))
    monkeypatch.setattr(train_cli, "ChatTokenizer", lambda tokenizer: None)
    monkeypatch.setattr(train_cli, "check_prompts_fit", lambda *args: calls.append("prompts"))

    def trackers(*args):
        calls.append("trackers")
        raise InputError("report_to: mlflow could not start a run at http://nowhere (refused)")

    monkeypatch.setattr(train_cli, "open_run_trackers", trackers)
    monkeypatch.setattr(train_cli, "load_base_model", lambda *args: calls.append("model"))
    code, _, err = _cli(["--game", GAME, "--model", MODEL, "--output_dir", tmp_path / "o"], capsys)
    assert code == 2 and "mlflow could not start a run" in err, err
    assert calls == ["tokenizer", "prompts", "trackers"]  # the model never loaded


# ------------------------------------------------------------------------------------------------------
# 4. A resume into a new folder that stopped before its first checkpoint can be run again
# ------------------------------------------------------------------------------------------------------
def test_a_resume_into_a_new_folder_stopped_before_its_first_checkpoint_reruns_as_its_hint_says(
        tmp_path, no_model, monkeypatch, capsys):
    run = _run_folder(tmp_path / "run", done=2, checkpoints=[2], iterations=2, save_every=2)
    new = tmp_path / "new"

    def start_then_stop(model):  # config.yaml and iteration 3 written in NEW, then Ctrl-C before iteration 4's checkpoint
        new.mkdir(exist_ok=True)
        save_config(load_config(run / "config.yaml", output_dir=str(new), iterations=5), new / "config.yaml")
        return _interrupted_after(new, 3, 3)()

    monkeypatch.setattr(train_cli, "load_tokenizer", start_then_stop)
    code, _, err = _cli(["--resume", run, "--output_dir", new, "--iterations", "5"], capsys)
    assert code == INTERRUPTED, err
    argv = _hint_command(err)
    assert argv == ["--resume", str(run / "checkpoints" / "iter_000002"), "--output_dir", str(new),
                    "--iterations", "5"], err
    assert "--overwrite" not in err
    chosen = {}
    monkeypatch.setattr(train_cli, "_train", lambda config, spec, plan, vllm: chosen.update(plan=plan) or 0)
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    assert chosen["plan"].done == 2 and chosen["plan"].config.output_dir == str(new)
    assert _iterations(new / "metrics.jsonl") == []  # iteration 3 of the stopped attempt: set aside, not lost
    (aside,) = (new / ABANDONED_NAME).iterdir()
    assert _iterations(aside / "metrics.jsonl") == [3] and (aside / "rollouts" / "iter_000003.json").exists()


def test_a_resume_into_a_folder_with_another_runs_lines_is_still_refused(tmp_path, no_model, capsys):
    run = _run_folder(tmp_path / "run", done=2, checkpoints=[2], iterations=2, save_every=2)
    other = tmp_path / "other"
    other.mkdir()
    save_config(_config(other, iterations=2, save_every=2), other / "config.yaml")
    (other / "metrics.jsonl").write_text(_metrics_line(1))  # a new run's first iteration, not this resume's
    code, _, err = _cli(["--resume", run, "--output_dir", other, "--iterations", "5"], capsys)
    assert code == 2 and "give a new empty folder" in err, err
    assert _iterations(other / "metrics.jsonl") == [1]


# ------------------------------------------------------------------------------------------------------
# 5. Checkpoints on disk before they are renamed in; damaged checkpoints and metrics lines
# ------------------------------------------------------------------------------------------------------
def _fsyncs_and_renames(monkeypatch) -> list[tuple[str, str]]:
    """The ("fsync", path) and ("replace", destination) calls made from now on, in order."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_checkpoint_files_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = _fsyncs_and_renames(monkeypatch)
    final = _checkpoint(tmp_path, 3)
    renamed = events.index(("replace", str(final)))
    synced = {Path(path).name for kind, path in events[:renamed] if kind == "fsync"}
    assert {"trainer_state.json", "trainer_state.safetensors", "adapter_model.safetensors",
            "adapter_config.json", "adapter"} <= synced, events
    assert ("fsync", str(tmp_path / "checkpoints")) in events[renamed:]  # the rename itself


def test_an_adapter_written_at_the_top_of_a_run_is_on_disk_before_its_names_are(tmp_path, monkeypatch):
    from peft import LoraConfig

    from train.policy import write_peft_adapter

    events = _fsyncs_and_renames(monkeypatch)
    write_peft_adapter(LoraConfig(r=2, target_modules=["q_proj"]), {"w": torch.zeros(2)}, tmp_path / "run")
    renames = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    assert [Path(events[i][1]).name for i in renames] == ["adapter_config.json", "adapter_model.safetensors"]
    synced_first = {Path(path).name for kind, path in events[:renames[0]] if kind == "fsync"}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= synced_first, events
    assert ("fsync", str(tmp_path / "run")) in events[renames[-1]:], events  # the renames themselves


def test_a_damaged_newest_checkpoint_is_passed_over_with_a_warning(tmp_path, no_model, monkeypatch, capsys):
    run = _run_folder(tmp_path / "run", done=4, checkpoints=[2, 4], iterations=6, save_every=2)
    damaged = run / "checkpoints" / "iter_000004"
    (damaged / "trainer_state.json").write_bytes(b"")  # a power loss before the data reached the disk
    assert latest_checkpoint(run) == run / "checkpoints" / "iter_000002"
    assert f"warning: {damaged}/trainer_state.json: damaged (JSONDecodeError" in capsys.readouterr().err
    with pytest.raises(InputError, match="trainer_state.json: damaged"):
        check_resumable(damaged, 1)
    with pytest.raises(InputError, match="trainer_state.json: damaged"):
        plan_resume(damaged, {}, 1)  # named itself: no fallback

    chosen = {}
    monkeypatch.setattr(train_cli, "_train", lambda config, spec, plan, vllm: chosen.update(plan=plan) or 0)
    code, out, err = _cli(["--resume", run], capsys)
    assert code == 0 and chosen["plan"].done == 2 and "warning: " in err, err
    (aside,) = (run / ABANDONED_NAME).iterdir()
    assert (aside / "checkpoints" / "iter_000004").is_dir()  # kept, out of the way
    assert latest_checkpoint(run) == run / "checkpoints" / "iter_000002"  # no damaged one left to warn about
    assert "warning" not in capsys.readouterr().err


def _two_numbers(folder: Path) -> None:
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "adapter_model.safetensors"))


def test_a_resume_with_more_iterations_takes_the_replanned_rate_from_its_first_step(tmp_path):
    """The optimizer state holds the old plan's decayed rate; the resumed run's first step must not use it."""
    short = _config(tmp_path / "run", iterations=4, save_every=2, lr_schedule="linear", learning_rate=1.0)
    longer = dataclasses.replace(short, iterations=8)

    def optimizer_and_schedule(config):
        param = torch.nn.Parameter(torch.zeros(2))
        optimizer = torch.optim.AdamW([param], lr=config.learning_rate)
        return param, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor_schedule(config))

    param, optimizer, scheduler = optimizer_and_schedule(short)
    steps = 2 * short.steps_per_iteration
    for _ in range(steps):
        param.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    checkpoint = save_checkpoint(tmp_path / "run" / "checkpoints", iteration=2, write_adapter=_two_numbers,
                                 optimizer_state=optimizer.state_dict(), scheduler=scheduler,
                                 rank_states=[rank_state({})])
    _, optimizer, scheduler = optimizer_and_schedule(longer)
    trainer = SimpleNamespace(  # what GRPOTrainer.resume_from touches besides the schedule: the model side
        scheduler=scheduler, optimizer=optimizer, rank=0, world_size=1, output_dir=tmp_path / "run",
        policy=SimpleNamespace(load_optimizer_state=lambda opt, state: opt.load_state_dict(state)),
        backend=SimpleNamespace(load_state_dict=lambda state: None, sync_weights=lambda policy, iteration: None))
    GRPOTrainer.resume_from(trainer, checkpoint)
    replanned, old = lr_factor_schedule(longer)(steps), lr_factor_schedule(short)(steps)
    assert old < replanned
    assert optimizer.param_groups[0]["lr"] == pytest.approx(replanned)
    assert scheduler.get_last_lr() == [pytest.approx(replanned)]
    save_config(short, tmp_path / "run" / "config.yaml")
    plan = plan_resume(tmp_path / "run", {"iterations": 8}, world_size=1)
    assert "linear learning-rate decay now ends at iteration 8" in "; ".join(plan.changes), plan.changes


def test_a_metrics_line_cut_short_is_skipped_by_the_readers(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(_metrics_line(1) + _metrics_line(2) + _metrics_line(3) + '{"iteration": 4, "me')
    assert [row["iteration"] for row in metrics_rows(run / "metrics.jsonl")] == [1, 2, 3]
    trainer = object.__new__(GRPOTrainer)  # only what _best_logged_reward reads
    trainer.output_dir, trainer.start_iteration = run, 3
    assert trainer._best_logged_reward() == (3, 0.03)
    (run / "metrics.jsonl").write_text(_metrics_line(1) + "garbage\n" + _metrics_line(3))
    with pytest.raises(InputError, match="line 2 is not a metrics line"):
        metrics_rows(run / "metrics.jsonl")


# ------------------------------------------------------------------------------------------------------
# 6. The saved config's header names a command that works
# ------------------------------------------------------------------------------------------------------
def test_the_saved_configs_reproduce_command_runs(tmp_path, no_model, capsys):
    run = _run_folder(tmp_path / "run", done=2, checkpoints=[2], iterations=2, save_every=2)
    header = (run / "config.yaml").read_text().splitlines()[0]
    command = shlex.split(header.split("Reproduce with: ", 1)[1])
    assert command[:3] == ["python", "-m", "train"]
    argv = [str(tmp_path / "again") if arg == "NEW_FOLDER" else arg for arg in command[3:]]
    code, _, err = _cli(argv, capsys)
    assert code == "model loaded", err  # past every check: a new run in the new folder
    assert _iterations(run / "metrics.jsonl") == [1, 2]


# ------------------------------------------------------------------------------------------------------
# The whole path with the tiny model
# ------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~15 s: a 4-iteration run, a resume from its first checkpoint interrupted, then resumed
def test_an_interrupted_resume_from_an_earlier_checkpoint_resumes_where_it_stopped(tiny_model_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    import game_registry

    game_registry.discover_games()
    registry, loaded = dict(game_registry._REGISTRY), set(game_registry._LOADED_FILES)
    game_registry._import_game_file(Path(__file__).parent / "games" / "capability_letter_density_game.py")
    try:
        run = tmp_path / "run"
        fast = ["--groups_per_iteration", "2", "--group_size", "4", "--lora_r", "4", "--learning_rate", "3e-2",
                "--lora_target_modules", "q_proj,v_proj", "--max_episode_tokens", "128", "--save_every", "2"]
        code, _, err = _cli(["--game", "capability_letter_density", "--model", tiny_model_dir, "--output_dir", run,
                             "--iterations", "4", *fast], capsys)
        assert code == 0, err[-3000:]
        real_iteration = GRPOTrainer.iteration

        def stop_at_4(self, iteration):
            if iteration == 3:
                raise KeyboardInterrupt
            return real_iteration(self, iteration)

        monkeypatch.setattr(GRPOTrainer, "iteration", stop_at_4)
        code, out, err = _cli(["--resume", run / "checkpoints" / "iter_000002"], capsys)
        assert code == INTERRUPTED, err[-3000:]
        assert _iterations(run / "metrics.jsonl") == [1, 2, 3]
        monkeypatch.undo()
        code, out, err = _cli(_hint_command(err), capsys)
        assert code == 0 and "resumed at iteration 2" in out, out + err[-3000:]
        assert _iterations(run / "metrics.jsonl") == [1, 2, 3, 4]
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "iter_000004"]
        asides = sorted((run / ABANDONED_NAME).iterdir())
        assert [_iterations(a / "metrics.jsonl") for a in asides] == [[3, 4], [3]]
    finally:
        game_registry._REGISTRY.clear()
        game_registry._REGISTRY.update(registry)
        game_registry._LOADED_FILES.clear()
        game_registry._LOADED_FILES.update(loaded)


def test_a_gate_configs_grpo_section_reads_yaml_text_as_a_train_config_does():
    """`grpo:` of a gate config is YAML: `learning_rate: 1e-3` arrives as text (YAML 1.1) and must read as the
    number, as in python -m train's own config file; a value that is not one is refused naming the section."""
    from train.gate_config import MoEGateConfig

    gate = MoEGateConfig(model="m", adapters={"a": "x"}, grpo={"learning_rate": "1e-3", "iterations": "2"})
    grpo = gate.grpo_config(game="capability_precondition_verification")
    assert grpo.learning_rate == 0.001 and grpo.iterations == 2
    bad = MoEGateConfig(model="m", adapters={"a": "x"}, grpo={"iterations": 2.5})
    with pytest.raises(InputError, match=r"grpo: iterations expects int .*write 2 or 3"):
        bad.grpo_config(game="capability_precondition_verification")
