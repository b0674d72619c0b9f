"""GRPO trainer on the tiny model: rollouts, bookkeeping, learning, resume, DDP, rollout collection."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import game_registry
from common.validation import InputError
from train.__main__ import main as train_main
from train.backends import HFBackend, SamplingParams
from train.collect_rollouts import main as collect_main
from train.config import GRPOConfig, load_config
from train.episodes import ChatTokenizer, EpisodeRequest, rescored_under_base_prompt, run_episodes
from train.grpo import GRPOTrainer
from train.policy import LoraPolicy, load_base_model

from tracking_readback import (GRPO_NAMES, assert_same_series, expected_series, rows,
                               tensorboard_scalars, tensorboard_texts)

REPO = Path(__file__).resolve().parent.parent
GAMES_DIR = REPO / "tests" / "games"
GAME = "capability_letter_density"
# LoRA on lm_head too: a random-init model's logits barely react to adapters deeper down, and the
# tests need reward to move within a few iterations.
FAST = ["--groups_per_iteration", "6", "--group_size", "4", "--lora_r", "4", "--learning_rate", "3e-2",
        "--lora_target_modules", "[q_proj, v_proj, lm_head]", "--max_episode_tokens", "128"]


@pytest.fixture(scope="module")
def letter_game():
    game_registry._import_game_file(GAMES_DIR / f"{GAME}_game.py")
    return game_registry.get_game(GAME)


@pytest.fixture(scope="module")
def vault_spec():
    import toy_games

    return toy_games.make_spec(max_turns=4)


def _env() -> dict[str, str]:
    return {**os.environ, "TRACE_GAMES_DIRS": str(GAMES_DIR), "PYTHONPATH": str(REPO)}


def _cli_in_process(main, argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of a CLI's `main(argv)` run in this process.

    For the runs that must stop before training: a subprocess would spend its ~3 s importing torch and
    transformers, which this process has already done. `main` returns what the CLI exits with.
    """
    capsys.readouterr()  # drop what earlier code printed
    code = main(argv)
    return code, capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Backend and episodes
# ------------------------------------------------------------------------------------------------
def test_hf_backend_greedy_matches_generate_and_logprobs_match_a_full_forward(tiny_model_dir):
    model, tokenizer = load_base_model(str(tiny_model_dir))
    prompts = [tokenizer("hello there")["input_ids"], tokenizer("a much longer prompt about orders")["input_ids"]]
    backend = HFBackend(model, tokenizer.pad_token_id, seed=0)
    completions = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    for prompt, completion in zip(prompts, completions):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
        assert completion.token_ids == reference[0, len(prompt):].tolist()
    sampled = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0))
    for prompt, completion in zip(prompts, sampled):
        ids = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        expected = logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1)[len(prompt) - 1 :]
        assert torch.allclose(expected, torch.tensor(completion.logprobs), atol=1e-4)


def test_episode_tokens_are_the_rendered_conversation_and_mask_marks_sampled_tokens(tiny_model_dir, vault_spec):
    model, tokenizer = load_base_model(str(tiny_model_dir))
    chat = ChatTokenizer(tokenizer)
    backend = HFBackend(model, tokenizer.pad_token_id, seed=1)
    requests = [EpisodeRequest(seed=s, sample_idx=0, hinted=False) for s in range(3)]
    episodes = run_episodes(vault_spec, requests, backend, chat, temperature=1.0, max_episode_tokens=600)
    for ep in episodes:
        assert ep.termination_reason in {"done", "max_turns", "max_tokens"}
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs)
        assert ep.loss_mask[: ep.prompt_len] == [0] * ep.prompt_len
        assert ep.n_generated > 0
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask) if m == 0)
        # the prompt is exactly the template's render of the opening messages
        prompt_text = tokenizer.decode(ep.token_ids[: ep.prompt_len])
        assert prompt_text == chat.render(ep.conversation[: ep.n_prompt_messages], ep.tools, True)


def test_hinted_episode_is_rescored_with_the_base_prompt_and_the_same_tail(tiny_model_dir, letter_game):
    model, tokenizer = load_base_model(str(tiny_model_dir))
    chat = ChatTokenizer(tokenizer)
    backend = HFBackend(model, tokenizer.pad_token_id, seed=0)
    (ep,) = run_episodes(letter_game, [EpisodeRequest(7, 0, hinted=True)], backend, chat,
                         temperature=1.0, max_episode_tokens=128)
    assert letter_game.hint_prompt in tokenizer.decode(ep.token_ids[: ep.prompt_len])
    ids, mask, prompt_len = rescored_under_base_prompt(ep, letter_game, chat)
    assert letter_game.hint_prompt not in tokenizer.decode(ids[:prompt_len])
    assert ids[prompt_len:] == ep.token_ids[ep.prompt_len :] and mask[prompt_len:] == ep.loss_mask[ep.prompt_len :]


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("group_size", 1, "group_size must be >= 2"),
        ("hint_fraction", 1.0, "hint_fraction"),
        ("clip_eps", 0.0, "clip_eps"),
        ("loss_agg", "mean", "loss_agg"),
        ("learning_rate", -1.0, "learning_rate"),
        ("temperature", 0.0, "temperature"),
        ("dtype", "fp8", "dtype"),
    ],
)
def test_config_rejects_bad_values_with_the_fix(field, value, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**{field: value})


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 1.0e-4\ngroup_size: 4\n")
    config = load_config(path, {"learning_rate": "3e-3", "lora_target_modules": "[q_proj]", "kl_beta": "0.1"}, game="g")
    assert (config.learning_rate, config.group_size, config.lora_target_modules, config.kl_beta) == (3e-3, 4, ["q_proj"], 0.1)
    with pytest.raises(InputError, match="unknown option --lr"):
        load_config(None, {"lr": "1"})
    with pytest.raises(InputError, match="expects int"):
        load_config(None, {"group_size": "four"})
    path.write_text("bogus: 1\n")
    with pytest.raises(InputError, match="unknown keys"):
        load_config(path)


# ------------------------------------------------------------------------------------------------
# Learning
# ------------------------------------------------------------------------------------------------
def test_grpo_raises_reward_and_changes_only_lora_parameters(tiny_model_dir, letter_game, tmp_path):
    config = load_config(None, {"iterations": "8", "groups_per_iteration": "12", "group_size": "8", "lora_r": "8",
                                "learning_rate": "3e-2", "lora_target_modules": "[q_proj, v_proj, lm_head]",
                                "max_episode_tokens": "128", "save_every": "8"},
                         game=GAME, model=str(tiny_model_dir), output_dir=str(tmp_path / "out"))
    torch.manual_seed(config.seed)
    base, tokenizer = load_base_model(config.model)
    original = {name: p.detach().clone() for name, p in base.named_parameters()}
    policy = LoraPolicy.create(base, r=config.lora_r, alpha=config.lora_alpha, dropout=0.0,
                        target_modules=config.lora_target_modules)
    lora_before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    trainer = GRPOTrainer(config, letter_game, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
    trainer.run()

    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == list(range(1, 9))
    first, last = sum(m["mean_reward"] for m in metrics[:2]) / 2, sum(m["mean_reward"] for m in metrics[-2:]) / 2
    assert last > first + 0.08, [round(m["mean_reward"], 3) for m in metrics]

    for name, parameter in policy.model.named_parameters():
        if parameter.requires_grad:
            assert "lora_" in name
        else:
            key = name.replace("base_model.model.", "", 1).replace(".base_layer", "")
            assert torch.equal(parameter, original[key]), f"frozen parameter {name} changed"
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, lora_before[n])]
    assert any("lora_B" in n for n in changed)

    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert (out / "config.yaml").is_file() and (out / "checkpoints" / "iter_000008" / "trainer_state.json").is_file()
    rollouts = json.loads((out / "rollouts" / "iter_000008.json").read_text())
    assert len(rollouts["simulations"]) == 12 * 8
    assert {s["sample_idx"] for s in rollouts["simulations"]} == set(range(8))
    from peft import PeftModel

    fresh, _ = load_base_model(config.model)
    reloaded = PeftModel.from_pretrained(fresh, str(out))
    ids = torch.tensor([tokenizer("Say: apple")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, policy.model(ids).logits, atol=1e-5)


def _train_cmd(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "train", "--game", GAME, "--model", str(model_dir), "--output_dir", str(out),
            "--iterations", "4", "--save_every", "2", *FAST, *extra]


def _comparable(metrics_file: Path) -> list[dict]:
    timing = {"gen_tokens_per_s", "train_tokens_per_s", "seconds"}
    return [{k: v for k, v in json.loads(l).items() if k not in timing} for l in metrics_file.read_text().splitlines()]


@pytest.mark.slow  # 11-13 s: three runs in subprocesses, one killed
def test_killed_and_resumed_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(_train_cmd(tiny_model_dir, straight), env=_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    process = subprocess.Popen(_train_cmd(tiny_model_dir, killed), env=_env(), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / "iter_000002" / "trainer_state.json"
    deadline = time.time() + 240
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert marker.exists()
    resumed = subprocess.run(_train_cmd(tiny_model_dir, killed, "--resume", str(marker.parent)), env=_env(),
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed at iteration 2" in resumed.stdout

    a = load_file(str(straight / "adapter_model.safetensors"))
    b = load_file(str(killed / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed adapter differs"
    assert _comparable(straight / "metrics.jsonl") == _comparable(killed / "metrics.jsonl")


def test_report_to_tensorboard_mirrors_metrics_jsonl_and_a_resumed_run_continues_its_series(
        tiny_model_dir, letter_game, tmp_path, capsys):
    """`python -m train ... --report_to tensorboard`: TensorBoard's event files, read by its own EventAccumulator,
    hold exactly metrics.jsonl's numbers under the shared names. A run killed after iteration 3 and resumed from
    its iteration-2 checkpoint logs step 3 again: the reader must see each step once, with the resumed values."""
    out = tmp_path / "run"
    argv = ["--game", GAME, "--model", str(tiny_model_dir), "--output_dir", str(out), "--save_every", "2",
            "--report_to", "tensorboard", *FAST]
    code, err = _cli_in_process(train_main, [*argv, "--iterations", "3"], capsys)
    assert code == 0, err[-3000:]
    assert [s for s, _ in tensorboard_scalars(out / "tb")["reward/mean"]] == [1, 2, 3]
    run_name = json.loads((out / "tracking.json").read_text())["run_name"]
    code, err = _cli_in_process(train_main, [*argv, "--iterations", "4", "--resume",
                                             str(out / "checkpoints" / "iter_000002")], capsys)
    assert code == 0, err[-3000:]

    file_rows = rows(out / "metrics.jsonl")
    assert [r["iteration"] for r in file_rows] == [1, 2, 3, 4]
    assert [r["episodes_total"] for r in file_rows] == [24, 48, 72, 96]  # 6 groups x 4, counted across the resume
    logged = tensorboard_scalars(out / "tb")
    assert_same_series(logged, expected_series(file_rows, GRPO_NAMES, "iteration"), float32=True)
    assert {"loss", "grad_norm", "kl", "clip_ratio", "groups/constant_fraction", "episodes_total"} <= set(logged)
    (config_text,) = tensorboard_texts(out / "tb")["run/text_summary"]  # the run name and config, logged once
    assert config_text[0] == 0 and run_name in config_text[1] and "learning_rate: 0.03" in config_text[1]
    assert json.loads((out / "tracking.json").read_text())["run_name"] == run_name


@pytest.mark.slow  # ~10-20 s: the storefront game's prompts are ~2,800 tokens for the test tokenizer
def test_readme_grpo_tiny_command_with_tensorboard_logs_metrics_jsonl(tiny_model_dir, tmp_path):
    """The issue's command as written (smaller budget): its event files hold metrics.jsonl's scalars."""
    out = tmp_path / "pv"
    done = subprocess.run([sys.executable, "-m", "train", "--game", "capability_precondition_verification", "--model",
                           str(tiny_model_dir), "--config", "configs/grpo_tiny.yaml", "--report_to", "tensorboard",
                           "--output_dir", str(out), "--iterations", "2", "--groups_per_iteration", "1",
                           "--group_size", "2", "--save_every", "2"],
                          env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    file_rows = rows(out / "metrics.jsonl")
    assert [r["iteration"] for r in file_rows] == [1, 2]
    assert_same_series(tensorboard_scalars(out / "tb"), expected_series(file_rows, GRPO_NAMES, "iteration"),
                       float32=True)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # ~6 s: two torchrun processes (make test stays under 5 minutes)
def test_two_process_gloo_torchrun_completes_and_ranks_agree(tiny_model_dir, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={_free_port()}",
               "--master-addr=127.0.0.1", "-m", "train",
               "--game", GAME, "--model", str(tiny_model_dir), "--output_dir", str(tmp_path / "ddp"),
               "--iterations", "2", "--save_every", "2", "--report_to", "tensorboard", *FAST]
    result = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all 2 ranks agree on the trainable weights" in result.stdout
    rollouts = json.loads((tmp_path / "ddp" / "rollouts" / "iter_000002.json").read_text())
    assert len({s["task_id"] for s in rollouts["simulations"]}) == 6  # both ranks' groups gathered
    # only rank 0 reports to the trackers: one event file, each step once, metrics.jsonl's numbers
    assert len(list((tmp_path / "ddp" / "tb").glob("events.out.tfevents.*"))) == 1
    assert_same_series(tensorboard_scalars(tmp_path / "ddp" / "tb"),
                       expected_series(rows(tmp_path / "ddp" / "metrics.jsonl"), GRPO_NAMES, "iteration"), float32=True)


def test_bad_game_or_model_exits_2(tiny_model_dir, letter_game, tmp_path, capsys):
    code, err = _cli_in_process(train_main, ["--game", "capability_nope", "--model", str(tiny_model_dir)], capsys)
    assert code == 2 and "unknown game 'capability_nope'" in err
    code, err = _cli_in_process(train_main, ["--game", GAME, "--model", str(tmp_path / "missing"), "--output_dir",
                                             str(tmp_path / "o")], capsys)
    assert code == 2 and "model folder not found" in err, err


@pytest.mark.slow  # ~8 s, two training runs
def test_a_runs_saved_config_reruns_it_as_its_header_says(tiny_model_dir, letter_game, tmp_path, capsys):
    """config.yaml's header says `python -m train --output_dir NEW_FOLDER --config <it>`: that command must run
    without --game/--model."""
    code, err = _cli_in_process(train_main, ["--game", GAME, "--model", str(tiny_model_dir), *FAST, "--iterations",
                                             "1", "--output_dir", str(tmp_path / "first")], capsys)
    assert code == 0, err[-2000:]
    saved = tmp_path / "first" / "config.yaml"
    header = saved.read_text().splitlines()[0]
    assert header.endswith(f"python -m train --output_dir NEW_FOLDER --config {saved}"), header
    again = subprocess.run([sys.executable, "-m", "train", "--config", str(saved), "--output_dir",
                            str(tmp_path / "again")], env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "again" / "config.yaml").read_text().split("\n", 1)[1].replace("again", "first") == \
        saved.read_text().split("\n", 1)[1]
    code, err = _cli_in_process(train_main, ["--game", GAME], capsys)
    assert code == 2 and "no model: pass --model" in err, err


@pytest.mark.slow  # ~5 s: collects rollouts and calibrates a game end to end
def test_collect_rollouts_feeds_calibration(tiny_model_dir, tmp_path):
    out = tmp_path / "rollouts.json"
    result = subprocess.run([sys.executable, "-m", "train.collect_rollouts", "--game", GAME, "--model",
                             str(tiny_model_dir), "--seeds", "3", "--samples", "4", "--out", str(out)],
                            env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    sims = json.loads(out.read_text())["simulations"]
    assert sorted((s["task_id"], s["sample_idx"]) for s in sims) == [(str(t), k) for t in range(3) for k in range(4)]
    calibration = subprocess.run([sys.executable, "pipeline/calibrate_environment.py", str(out), "--json-output",
                                  str(tmp_path / "cal.json")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert calibration.returncode in (0, 1), calibration.stderr
    assert json.loads((tmp_path / "cal.json").read_text())["metrics"]["n_groups"] == 3


@pytest.mark.parametrize("loss_agg, kl_beta", [("dapo", 0.0), ("dr_grpo", 0.0), ("grpo", 0.2)])
def test_loss_aggregations_and_kl_run_through_the_trainer(tiny_model_dir, letter_game, tmp_path, loss_agg, kl_beta):
    config = load_config(None, {"iterations": "1", "groups_per_iteration": "4", "group_size": "4", "lora_r": "4",
                                "learning_rate": "3e-2", "lora_target_modules": "[q_proj, v_proj, lm_head]",
                                "max_episode_tokens": "128", "save_rollouts": "false"},
                         game=GAME, model=str(tiny_model_dir), output_dir=str(tmp_path), loss_agg=loss_agg,
                         kl_beta=kl_beta)
    torch.manual_seed(0)
    base, tokenizer = load_base_model(config.model)
    policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
    trainer = GRPOTrainer(config, letter_game, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
    metrics = trainer.run()
    assert metrics["skipped_update"] == 0.0 and metrics["grad_norm"] > 0
    assert ("kl_ref" in metrics) == (kl_beta > 0)
    assert not (tmp_path / "rollouts").exists()


def test_logprobs_after_a_shared_prefix_equal_full_sequence_logprobs_and_grads(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from train.logprobs import token_logprobs, token_logprobs_after_prefix

    torch.manual_seed(0)
    base, _ = load_base_model(str(tiny_model_dir))
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    prefix = torch.randint(5, 300, (15,))
    tails = torch.randint(5, 300, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    weights = torch.randn(3, 6)

    def grads(values):
        model.zero_grad()
        (values * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full = token_logprobs(model, torch.cat([prefix.expand(3, 15), tails], 1),
                          torch.cat([torch.ones(3, 15, dtype=torch.long), mask], 1))[:, 15:]
    full_grads = grads(full)
    shared = token_logprobs_after_prefix(model, prefix, tails, mask)
    shared_grads = grads(shared)
    assert torch.allclose(full, shared, atol=1e-5)
    assert full_grads.keys() == shared_grads.keys()
    assert all(torch.allclose(full_grads[n], shared_grads[n], atol=1e-5) for n in full_grads)


def test_shared_prefix_update_equals_the_plain_update(tiny_model_dir, letter_game, tmp_path):
    """Raw gradients before clipping and the optimizer: an Adam step from B = 0 is ~lr * sign(gradient) and
    would hide a gradient off by a factor. Same rollouts on both paths (same seeds), hinted samples included."""
    gradients = []
    for shared in (True, False):
        config = load_config(None, {"iterations": "1", "groups_per_iteration": "4", "group_size": "4",
                                    "lora_r": "4", "learning_rate": "3e-2", "micro_batch_size": "3",
                                    "hint_fraction": "0.25", "max_episode_tokens": "128", "save_rollouts": "false",
                                    "grad_clip": "1e9"},
                             game=GAME, model=str(tiny_model_dir), output_dir=str(tmp_path / str(shared)),
                             shared_prefix=shared)
        torch.manual_seed(0)
        base, tokenizer = load_base_model(config.model)
        policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
        trainer = GRPOTrainer(config, letter_game, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
        assert trainer.run()["skipped_update"] == 0.0  # the step leaves .grad as the update computed it
        gradients.append({n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad})
    assert gradients[0].keys() == gradients[1].keys()
    assert any(g.abs().max() > 1e-6 for g in gradients[1].values())
    for key in gradients[0]:
        torch.testing.assert_close(gradients[0][key], gradients[1][key], rtol=1e-4, atol=1e-7, msg=key)


# ------------------------------------------------------------------------------------------------
# Regressions
# ------------------------------------------------------------------------------------------------
def test_an_episode_near_its_budget_does_not_truncate_the_others(tiny_model_dir, letter_game):
    from train.episodes import start_episode

    model, tokenizer = load_base_model(str(tiny_model_dir))
    chat = ChatTokenizer(tokenizer)
    hinted, plain = EpisodeRequest(7, 0, hinted=True), EpisodeRequest(7, 1, hinted=False)
    hinted_prompt = start_episode(letter_game, letter_game.make(), hinted, chat).prompt_len
    plain_prompt = start_episode(letter_game, letter_game.make(), plain, chat).prompt_len
    assert hinted_prompt > plain_prompt + 1
    budget = hinted_prompt + 1  # the hinted episode may sample 1 token, the plain one max_gen_tokens (2)
    for seed in range(3):
        backend = HFBackend(model, tokenizer.pad_token_id, seed=seed)
        ep_hinted, ep_plain = run_episodes(letter_game, [hinted, plain], backend, chat, temperature=1.0,
                                           max_episode_tokens=budget)
        assert ep_hinted.n_generated == 1
        first = ep_plain.token_ids[plain_prompt]
        assert ep_plain.n_generated == letter_game.max_gen_tokens or first in chat.stop_token_ids


def test_rescored_old_logprobs_are_computed_without_lora_dropout(tiny_model_dir, letter_game, tmp_path):
    from train.grpo import Sequence

    config = load_config(None, {"groups_per_iteration": "1", "group_size": "2", "lora_dropout": "0.5",
                                "lora_target_modules": "[q_proj, v_proj, lm_head]"},
                         game=GAME, model=str(tiny_model_dir), output_dir=str(tmp_path))
    torch.manual_seed(0)
    base, tokenizer = load_base_model(config.model)
    policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.5, target_modules=config.lora_target_modules)
    for name, parameter in policy.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)  # so that dropout on the adapter input changes logits
    trainer = GRPOTrainer(config, letter_game, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
    ids = tokenizer("Say: apple and banana")["input_ids"]
    policy.model.train()  # as the previous iteration's update leaves it
    results = []
    for _ in range(2):
        seq = Sequence(list(ids), [0] + [1] * (len(ids) - 1), [0.0] * len(ids), 1.0)
        trainer._recompute_old_logprobs([seq])
        results.append(seq.old_logprobs)
    assert results[0] == results[1]
    assert policy.model.training  # mode restored


def test_reported_loss_is_not_summed_over_ppo_epochs(tiny_model_dir, letter_game, tmp_path):
    from train.grpo import Sequence

    losses = []
    for epochs in (1, 3):
        config = load_config(None, {"groups_per_iteration": "1", "group_size": "2", "learning_rate": "1e-12",
                                    "loss_agg": "dapo", "ppo_epochs": str(epochs)},
                             game=GAME, model=str(tiny_model_dir), output_dir=str(tmp_path))
        torch.manual_seed(0)
        base, tokenizer = load_base_model(config.model)
        policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
        trainer = GRPOTrainer(config, letter_game, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
        ids = tokenizer("Say: apple and banana")["input_ids"]
        sequences = [Sequence(list(ids), [0] + [1] * (len(ids) - 1), [-5.0] * len(ids), 1.0)]
        losses.append(trainer.update(sequences)["loss"])
    assert abs(losses[0]) > 1e-3
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_yaml_exponent_floats_are_read_as_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 1e-5\nstd_floor: 1e-3\n")  # YAML 1.1 reads these as strings
    config = load_config(path)
    assert (config.learning_rate, config.std_floor) == (1e-5, 1e-3)
    path.write_text("iterations: ten\n")
    with pytest.raises(InputError, match="iterations expects int"):
        load_config(path)


def test_misspelt_game_override_exits_2_before_training(tiny_model_dir, letter_game, tmp_path, capsys):
    code, err = _cli_in_process(train_main, ["--game", GAME, "--model", str(tiny_model_dir), "--output_dir",
                                             str(tmp_path / "o"), "--game_overrides", "{no_such_knob: 1}"], capsys)
    assert code == 2 and "no_such_knob" in err, err
    assert not (tmp_path / "o").exists()
    code, err = _cli_in_process(collect_main, ["--game", GAME, "--model", str(tiny_model_dir), "--game-overrides",
                                               '{"no_such_knob": 1}', "--out", str(tmp_path / "r.json")], capsys)
    assert code == 2 and "no_such_knob" in err, err
    assert not (tmp_path / "r.json").exists()


_DDP_STATS_SCRIPT = '''
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
import game_registry
from train.config import load_config
from train.grpo import GRPOTrainer, Sequence
from train.policy import LoraPolicy, load_base_model
from train.backends import HFBackend
from train.distributed import exit_worker

game_path, model_dir, out_dir = sys.argv[1:4]
if len(sys.argv) == 4:
    dist.init_process_group("gloo")
game_registry._import_game_file(Path(game_path))
spec = game_registry.get_game("capability_letter_density")
config = load_config(None, {"groups_per_iteration": "2", "group_size": "2", "learning_rate": "1e-12",
                            "loss_agg": "dapo", "micro_batch_size": "1"}, game=spec.name, model=model_dir,
                     output_dir=out_dir)
torch.manual_seed(0)
base, tokenizer = load_base_model(model_dir)
policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
trainer = GRPOTrainer(config, spec, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
texts = ["Say: apple and banana", "Say: kiwi"]
advantages = [1.0, -0.5]
sequences = []
for text, advantage in zip(texts, advantages):
    ids = tokenizer(text)["input_ids"]
    sequences.append(Sequence(list(ids), [0] + [1] * (len(ids) - 1), [-5.0] * len(ids), advantage))
rank = dist.get_rank() if dist.is_initialized() else 0
mine = sequences[rank::2] if dist.is_initialized() else sequences
stats = trainer.update(mine)
if rank == 0:
    print("STATS " + json.dumps(stats))
if dist.is_initialized():
    dist.destroy_process_group()
exit_worker(0)
'''


@pytest.mark.slow  # 8-10 s: a 2-rank torchrun beside a single-process run
def test_ddp_logged_loss_and_stats_describe_the_whole_step(tiny_model_dir, tmp_path):
    script = tmp_path / "ddp_stats.py"
    script.write_text(_DDP_STATS_SCRIPT)
    game = str(GAMES_DIR / f"{GAME}_game.py")

    def stats(result: subprocess.CompletedProcess) -> dict:
        assert result.returncode == 0, result.stderr[-3000:]
        (line,) = [l for l in result.stdout.splitlines() if l.startswith("STATS ")]
        return json.loads(line[len("STATS "):])

    single = stats(subprocess.run([sys.executable, str(script), game, str(tiny_model_dir), str(tmp_path / "a"),
                                   "single"], env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120))
    ddp = stats(subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                                f"--master-port={_free_port()}", "--master-addr=127.0.0.1", str(script), game,
                                str(tiny_model_dir), str(tmp_path / "b")],
                               env=_env(), cwd=REPO, capture_output=True, text=True, timeout=180))
    assert abs(single["loss"]) > 1e-3
    for key in ("loss", "ratio_mean", "approx_kl", "clip_fraction"):
        assert ddp[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow  # ~5 s: two torchrun workers start to refuse the config (make test stays under 5 minutes)
def test_fewer_groups_than_processes_exits_2(tiny_model_dir, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={_free_port()}",
               "--master-addr=127.0.0.1", "-m", "train", "--game", GAME, "--model", str(tiny_model_dir),
               "--output_dir", str(tmp_path / "o"), "--groups_per_iteration", "1", "--group_size", "2"]
    result = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "groups_per_iteration=1 is smaller than the 2 processes" in result.stderr
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------------
# Multi-turn episodes: observations are never trained on
# ------------------------------------------------------------------------------------------------
class RecordingBackend(HFBackend):
    """The in-process sampler, remembering every (prompt, completion) it produced."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records: list[tuple[list[int], list[int]]] = []

    def generate(self, prompts, params):
        completions = super().generate(prompts, params)
        self.records += [(list(p), list(c.token_ids)) for p, c in zip(prompts, completions)]
        return completions


def _sampled_positions(ep, records) -> list[int]:
    """Positions of `ep.token_ids` that the sampler produced, found from the sampler's own records."""
    positions: set[int] = set()
    for prompt, completion in records:
        end = len(prompt) + len(completion)
        if ep.token_ids[: len(prompt)] == prompt and ep.token_ids[len(prompt) : end] == completion:
            positions.update(range(len(prompt), end))
    return sorted(positions)


@pytest.fixture(scope="module")
def multi_turn_spec():
    """The vault game (tool observations and customer replies between turns), short turns for speed."""
    import toy_games

    return toy_games.make_spec(max_turns=3, max_gen_tokens=12)


def _multi_turn_episodes(model, tokenizer, spec, n_groups: int, group_size: int, seed: int = 0):
    backend = RecordingBackend(model, tokenizer.pad_token_id, seed=seed)
    requests = [EpisodeRequest(seed=g, sample_idx=k) for g in range(n_groups) for k in range(group_size)]
    # A budget no episode reaches: every completion is kept whole, so the records locate every sampled token.
    episodes = run_episodes(spec, requests, backend, ChatTokenizer(tokenizer), temperature=1.0,
                            max_episode_tokens=4000)
    return episodes, backend.records


def test_multi_turn_episode_masks_exactly_the_sampled_tokens(tiny_model_dir, multi_turn_spec):
    model, tokenizer = load_base_model(str(tiny_model_dir))
    episodes, records = _multi_turn_episodes(model, tokenizer, multi_turn_spec, n_groups=2, group_size=2)
    assert all(ep.n_turns > 1 for ep in episodes), "the test needs observations between turns"
    for ep in episodes:
        sampled = _sampled_positions(ep, records)
        assert [i for i, m in enumerate(ep.loss_mask) if m] == sampled  # observations and prompt are 0
        # every observation the game sent is in the masked tokens after the prompt, none in the sampled ones
        masked_text = tokenizer.decode([t for i, t in enumerate(ep.token_ids[ep.prompt_len :], ep.prompt_len)
                                        if not ep.loss_mask[i]])
        observations = [m["content"] for m in ep.conversation[ep.n_prompt_messages:] if m["role"] != "assistant"]
        assert observations and all(text in masked_text for text in observations)


@pytest.mark.parametrize("loss_agg, kl_beta", [("grpo", 0.0), ("dapo", 0.0), ("dr_grpo", 0.0), ("grpo", 0.3)])
def test_update_gradient_equals_a_hand_computed_one_on_multi_turn_episodes(tiny_model_dir, multi_turn_spec,
                                                                          tmp_path, loss_agg, kl_beta):
    """The trainer's raw gradient (before clipping and the optimizer) against the loss written out here from
    its definition, on the sampled positions found independently of the episode's loss mask:

        grpo:    -(1 / N_seq_with_tokens) sum_s A_s (1 / T_s) sum_t ratio_st     (+ beta k3 the same way)
        dapo:    -(1 / N_tokens) sum_s A_s sum_t ratio_st
        dr_grpo: -(1 / (N_seq x budget)) sum_s A_s sum_t ratio_st, budget = max_turns x max_gen_tokens (3 x 12)

    with ratio_st = exp(logp_st - old_st) = 1 at step 0 (old = the trainer's own log-probs).
    """
    from train.grpo import Sequence
    from train.logprobs import token_logprobs

    config = load_config(None, {"groups_per_iteration": "2", "group_size": "2", "micro_batch_size": "3",
                                "grad_clip": "1e9", "lora_target_modules": "[q_proj, v_proj, lm_head]",
                                "max_episode_tokens": "4000"},
                         game="toy_vault", model=str(tiny_model_dir), output_dir=str(tmp_path),
                         loss_agg=loss_agg, kl_beta=kl_beta)
    torch.manual_seed(0)
    base, tokenizer = load_base_model(config.model)
    policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
    if kl_beta:  # a non-zero adapter, so the policy differs from the reference (adapter disabled)
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.3)
    episodes, records = _multi_turn_episodes(policy.model, tokenizer, multi_turn_spec, n_groups=2, group_size=2)
    trainer = GRPOTrainer(config, multi_turn_spec, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))
    advantages = [1.0, -0.5, 0.25, -1.25]

    # by hand, first (the update's optimizer step moves the weights)
    positions = [_sampled_positions(ep, records) for ep in episodes]
    n_tokens = sum(len(p) for p in positions)
    budget = multi_turn_spec.max_turns * multi_turn_spec.max_gen_tokens
    policy.model.zero_grad()
    total = torch.zeros(())
    for ep, advantage, where in zip(episodes, advantages, positions):
        ids = torch.tensor([ep.token_ids])
        logp = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, where]  # [T_s]
        per_token = -advantage * torch.exp(logp - logp.detach())
        if kl_beta:
            with torch.no_grad(), policy.reference():
                ref = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, where]
            per_token = per_token + kl_beta * (torch.exp(ref - logp) - (ref - logp) - 1.0)
        if loss_agg == "grpo":
            total = total + per_token.mean() / len(episodes)  # every sequence has sampled tokens
        elif loss_agg == "dapo":
            total = total + per_token.sum() / n_tokens
        else:
            total = total + per_token.sum() / (len(episodes) * budget)
    total.backward()
    expected = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}

    policy.model.zero_grad()
    sequences = [Sequence(list(ep.token_ids), list(ep.loss_mask), [0.0] * len(ep.token_ids), a, ep.prompt_len)
                 for ep, a in zip(episodes, advantages)]
    trainer._recompute_old_logprobs(sequences)
    assert trainer.update(sequences)["skipped_update"] == 0.0  # .grad stays as computed before the step
    got = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-7, msg=name)
    assert any(g.abs().max() > 1e-6 for g in got.values())


# ------------------------------------------------------------------------------------------------
# Distributed runs where ranks have unequal work
# ------------------------------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (torchrun starts each worker in a session of its own, so killing
    torchrun's session would leave hung workers behind)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _run_session(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run `command`; past `timeout` kill it and all its descendants (torchrun's workers too) and fail, so a
    hang fails the test instead of hanging the suite."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(process.pid), process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command[:6])} ... did not finish in {timeout} s (a hang):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _torchrun(*args: str) -> list[str]:
    # --standalone: torchrun binds a free port itself (no window for another process to take a probed one)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


# The letter game, except that odd seeds score 0.5 whatever the reply: under 2 ranks with 2 groups, rank 1
# (group 1, an odd seed) has only constant groups and nothing to train on.
_HALF_CONSTANT_SCRIPT = '''
import dataclasses, sys
from pathlib import Path
import game_registry
from train.__main__ import main
from train.distributed import exit_worker

game_path, *argv = sys.argv[1:]
game_registry._import_game_file(Path(game_path))
letter = game_registry.get_game("capability_letter_density")
Letter = type(letter.make())

class OddSeedsConstant(Letter):
    def get_summary(self):
        summary = super().get_summary()
        if self.seed % 2:
            summary["reward"] = 0.5
        return summary

game_registry.register_game(dataclasses.replace(
    letter, name="capability_odd_seeds_constant", make_env=lambda config=None: OddSeedsConstant(config)))
exit_worker(main(["--game", "capability_odd_seeds_constant", *argv]))
'''


@pytest.fixture(scope="module")
def half_constant_ddp_run(tiny_model_dir, tmp_path_factory):
    """One iteration under 2 gloo ranks in which rank 1 has only constant groups; returns (result, output dir)."""
    tmp = tmp_path_factory.mktemp("half_constant")
    script = tmp / "half_constant.py"
    script.write_text(_HALF_CONSTANT_SCRIPT)
    out = tmp / "ddp"
    result = _run_session(
        _torchrun(str(script), str(GAMES_DIR / f"{GAME}_game.py"), "--model", str(tiny_model_dir),
                  "--output_dir", str(out), "--iterations", "1", "--groups_per_iteration", "2", "--group_size", "4",
                  "--lora_r", "4", "--learning_rate", "3e-2", "--lora_target_modules", "[q_proj, v_proj, lm_head]",
                  "--max_episode_tokens", "128"),
        timeout=240, env=_env(), cwd=REPO)
    return result, out


@pytest.mark.slow  # its fixture runs two processes (~9 s)
def test_ddp_rank_with_only_constant_groups_takes_part_in_the_update(half_constant_ddp_run):
    result, out = half_constant_ddp_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all 2 ranks agree on the trainable weights" in result.stdout
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics["frac_constant_groups"] == 0.5 and metrics["skipped_update"] == 0.0 and metrics["grad_norm"] > 0


@pytest.mark.slow  # shares half_constant_ddp_run with the test above
def test_resuming_with_another_number_of_processes_says_what_to_do(half_constant_ddp_run, tiny_model_dir, tmp_path):
    result, out = half_constant_ddp_run
    assert result.returncode == 0, result.stderr[-3000:]
    single = subprocess.run([sys.executable, "-m", "train", "--game", GAME, "--model", str(tiny_model_dir),
                             "--output_dir", str(tmp_path / "single"), "--resume", str(out)],
                            env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert single.returncode == 2, single.stderr[-2000:]
    assert "written by a run with 2 process(es); this run has 1" in single.stderr
    assert "torchrun --nproc_per_node=2" in single.stderr and "Traceback" not in single.stderr


def test_checkpoint_restores_each_ranks_own_random_state(tmp_path):
    from train.checkpoint import load_checkpoint, rank_state, save_checkpoint

    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]), lambda _: 1)
    states, draws = [], []
    for rank in range(2):  # two ranks whose streams have diverged
        torch.manual_seed(100 + rank)
        states.append(rank_state({}))
        draws.append(torch.rand(3))
        if torch.cuda.is_available():
            draws[-1] = torch.cat([draws[-1], torch.rand(3, device="cuda").cpu()])
    saved = save_checkpoint(tmp_path, iteration=1, write_adapter=lambda path: path.mkdir(),
                            optimizer_state={"state": {}, "param_groups": []}, scheduler=scheduler,
                            rank_states=states)
    for rank in (1, 0):
        torch.manual_seed(0)
        load_checkpoint(saved, scheduler=scheduler, rank=rank, world_size=2)
        again = torch.rand(3)
        if torch.cuda.is_available():
            again = torch.cat([again, torch.rand(3, device="cuda").cpu()])
        assert torch.equal(again, draws[rank]), f"rank {rank} did not get its own random state back"


# FSDP, two ranks, kl_beta > 0: rank 0 gets 2 sequences (2 micro-batches), rank 1 gets 1 (1 micro-batch + 1
# padding micro-batch). A padding micro-batch must run the same forwards as a real one (policy + reference).
_FSDP_UNEVEN_SCRIPT = '''
import json, sys
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
import game_registry
from train.backends import RolloutBackend
from train.config import load_config
from train.distributed import exit_worker
from train.grpo import GRPOTrainer, Sequence
from train.policy import LoraPolicy, load_base_model

class NoSampling(RolloutBackend):
    def generate(self, prompts, params):
        raise AssertionError("update() does not sample")

game_path, model_dir, out_dir = sys.argv[1:4]
dist.init_process_group("gloo", timeout=timedelta(seconds=90))  # a hang raises instead of waiting 30 min
game_registry._import_game_file(Path(game_path))
spec = game_registry.get_game("capability_letter_density")
config = load_config(None, {"groups_per_iteration": "2", "group_size": "2", "micro_batch_size": "1",
                            "kl_beta": "0.1", "learning_rate": "1e-3"},
                     game=spec.name, model=model_dir, output_dir=out_dir, fsdp=True)
torch.manual_seed(0)
base, tokenizer = load_base_model(model_dir)
policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
policy.shard()
trainer = GRPOTrainer(config, spec, policy, tokenizer, NoSampling())
texts = [["Say: apple and banana", "Say: kiwi"], ["Say: echo idea"]][dist.get_rank()]
sequences = []
for text, advantage in zip(texts, [1.0, -1.0]):
    ids = tokenizer(text)["input_ids"]
    sequences.append(Sequence(list(ids), [0] + [1] * (len(ids) - 1), [-5.0] * len(ids), advantage))
stats = trainer.update(sequences)
if dist.get_rank() == 0:
    print("STATS " + json.dumps(stats))
dist.destroy_process_group()
exit_worker(0)  # as `python -m train` ends: gloo's teardown at interpreter exit can abort a finished rank
'''


@pytest.mark.slow  # ~12 s, two processes; test_two_process_gloo_torchrun_completes_... stays in the default suite
def test_fsdp_with_kl_and_unequal_micro_batches_per_rank_finishes(tiny_model_dir, tmp_path):
    script = tmp_path / "fsdp_uneven.py"
    script.write_text(_FSDP_UNEVEN_SCRIPT)
    result = _run_session(_torchrun(str(script), str(GAMES_DIR / f"{GAME}_game.py"), str(tiny_model_dir),
                                    str(tmp_path / "o")), timeout=150, env=_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [l for l in result.stdout.splitlines() if l.startswith("STATS ")]
    stats = json.loads(line[len("STATS "):])
    assert stats["skipped_update"] == 0.0 and stats["grad_norm"] > 0 and "kl_ref" in stats


def _kill_when(process: subprocess.Popen, marker: Path, timeout: float = 240) -> None:
    """SIGKILL torchrun and its workers once `marker` exists."""
    deadline = time.time() + timeout
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    for pid in [*_descendants(process.pid), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=60)


# LoRA dropout makes each rank consume its own torch RNG stream (masks sized by its micro-batches): a resume
# that gave every rank rank 0's stream would train a different adapter.
DDP_RESUME = ["--iterations", "3", "--save_every", "1", "--lora_dropout", "0.1", "--groups_per_iteration", "4"]


@pytest.mark.slow  # 20-45 s on 2 shared cores: three 2-rank runs
def test_ddp_killed_and_resumed_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    def command(out: Path, *extra: str) -> list[str]:
        return _torchrun("-m", "train", "--game", GAME, "--model", str(tiny_model_dir), "--output_dir", str(out),
                         *FAST, *DDP_RESUME, *extra)

    done = _run_session(command(straight), timeout=300, env=_env(), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]

    process = subprocess.Popen(command(killed), env=_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / "iter_000001" / "trainer_state.json"
    _kill_when(process, marker)
    assert marker.exists()
    resumed = _run_session(command(killed, "--resume", str(marker.parent)), timeout=300, env=_env(), cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 1" in resumed.stdout

    a = load_file(str(straight / "adapter_model.safetensors"))
    b = load_file(str(killed / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed adapter differs"
    assert _comparable(straight / "metrics.jsonl") == _comparable(killed / "metrics.jsonl")



# ------------------------------------------------------------------------------------------------
# Bookkeeping: metrics, schedule, token budget
# ------------------------------------------------------------------------------------------------
def _letter_trainer(tiny_model_dir: Path, out: Path, spec, **overrides: str) -> GRPOTrainer:
    options = {"groups_per_iteration": "2", "group_size": "4", "lora_r": "4", "learning_rate": "3e-2",
               "lora_target_modules": "[q_proj, v_proj, lm_head]", "max_episode_tokens": "128", **overrides}
    config = load_config(None, options, game=spec.name, model=str(tiny_model_dir), output_dir=str(out))
    torch.manual_seed(config.seed)
    base, tokenizer = load_base_model(config.model)
    policy = LoraPolicy.create(base, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                               target_modules=config.lora_target_modules)
    return GRPOTrainer(config, spec, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))


def test_reward_metrics_are_over_base_prompt_episodes_and_all_episodes_separately(tiny_model_dir, letter_game,
                                                                                    tmp_path):
    trainer = _letter_trainer(tiny_model_dir, tmp_path, letter_game, hint_fraction="0.5", iterations="1")
    metrics = trainer.run()
    sims = json.loads((tmp_path / "rollouts" / "iter_000001.json").read_text())["simulations"]
    base = [s["reward_info"]["reward"] for s in sims if not s["hinted"]]
    every = [s["reward_info"]["reward"] for s in sims]
    assert len(base) == len(every) // 2 and metrics["n_base_episodes"] == len(base)
    assert metrics["mean_reward"] == pytest.approx(sum(base) / len(base))
    assert metrics["mean_reward_all_episodes"] == pytest.approx(sum(every) / len(every))
    assert metrics["mean_reward"] != pytest.approx(metrics["mean_reward_all_episodes"])  # the test can tell
    assert "success_rate" in metrics and "success_rate_all_episodes" in metrics


def test_run_says_when_every_episode_scores_0_after_an_iteration_that_scored(tiny_model_dir, letter_game, tmp_path,
                                                                            capsys):
    """A collapsed policy: no group has a reward spread, so GRPO cannot update its way back. run() must say so.

    The iterations' metrics are given (a real collapse cannot be produced on demand); what is tested is run()'s
    bookkeeping of the best iteration so far and the line it prints."""
    trainer = _letter_trainer(tiny_model_dir, tmp_path, letter_game, iterations="3")

    def metrics(iteration: int, reward: float) -> dict[str, float]:
        skipped = float(reward == 0.0)
        return {"iteration": iteration, "mean_reward": reward, "success_rate": reward,
                "mean_reward_all_episodes": reward, "frac_constant_groups": 1.0 if skipped else 0.5,
                "gen_tokens_per_s": 100.0, "skipped_update": skipped, "train_tokens_per_s": 100.0, "loss": 0.0,
                "grad_norm": 0.0 if skipped else 0.4}

    trainer.iteration = lambda i: metrics(i + 1, [0.4, 0.0, 0.0][i])
    trainer.run()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    assert len(lines) == 3 and "collapsed" not in lines[0]
    assert all("every episode scored 0 after iteration 1 averaged 0.400" in line for line in lines[1:]), lines


def test_logged_clip_ratio_and_kl_are_token_weighted_over_micro_batches(tiny_model_dir, letter_game, tmp_path):
    from train.grpo import Sequence, pad_batch
    from train.grpo_loss import grpo_loss

    trainer = _letter_trainer(tiny_model_dir, tmp_path, letter_game, micro_batch_size="1", learning_rate="1e-12",
                              shared_prefix="false")
    tokenizer = trainer.chat.tokenizer
    sequences = []  # a long and a short sequence in separate micro-batches; old log-probs far off, so ratios vary
    for text, advantage, old in (("Say: apple and banana and cherry and a long list of fruit", 1.0, -6.0),
                                 ("Say: kiwi", -1.0, -2.0)):
        ids = tokenizer(text)["input_ids"]
        sequences.append(Sequence(list(ids), [0] + [1] * (len(ids) - 1), [old] * len(ids), advantage))
    whole = pad_batch(sequences, tokenizer.pad_token_id, trainer.device)
    with torch.no_grad():
        expected = grpo_loss(trainer._logprobs(type("M", (), {"batch": whole, "prefix": None})()), whole)[1]
    stats = trainer.update(sequences)
    for key in ("approx_kl", "ratio_mean", "clip_fraction"):
        assert stats[key] == pytest.approx(expected[key], rel=1e-5), key


def test_warmup_schedule_resumes_and_does_not_step_without_an_update(tiny_model_dir, letter_game, multi_turn_spec,
                                                                   tmp_path):
    straight = _letter_trainer(tiny_model_dir, tmp_path / "a", letter_game, warmup_iterations="4",
                               iterations="3", save_every="1")
    straight.run()
    logged = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    lrs = [m["lr"] for m in logged]
    assert lrs == pytest.approx([3e-2 * k / 4 for k in (2, 3, 4)])  # the lr for the next update, after k updates
    assert logged[0]["grad_norm"] > 0 and f"grad norm {logged[0]['grad_norm']:.3g}" in straight.summary_line(logged[0])

    resumed = _letter_trainer(tiny_model_dir, tmp_path / "b", letter_game, warmup_iterations="4", iterations="3",
                              save_every="1")
    resumed.resume_from(tmp_path / "a" / "checkpoints" / "iter_000001")
    assert resumed.scheduler.state_dict() == json.loads(
        (tmp_path / "a" / "checkpoints" / "iter_000001" / "trainer_state.json").read_text())["scheduler"]
    resumed.run()
    lrs_b = [json.loads(l)["lr"] for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert lrs_b == pytest.approx(lrs[1:])
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(straight.optimizer.param_groups[0]["lr"])

    # The vault game with a random model: every reward is 0, every group constant, no optimizer step, so the
    # warm-up must not advance either (and torch must not warn about a scheduler stepping first).
    idle = _letter_trainer(tiny_model_dir, tmp_path / "c", multi_turn_spec, warmup_iterations="4",
                           max_episode_tokens="600", group_size="2")
    import warnings

    (tmp_path / "c").mkdir()  # run() makes it; iteration() alone appends metrics there
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        metrics = idle.iteration(0)
    assert metrics["skipped_update"] == 1.0 and metrics["frac_constant_groups"] == 1.0
    assert idle.scheduler.last_epoch == 0 and metrics["lr"] == pytest.approx(3e-2 / 4)
    assert "no update: every group's rewards were equal" in idle.summary_line(metrics)
    assert "collapsed" not in idle.summary_line(metrics)  # nothing ever scored: a hard game, not a collapse
    # All zeros after an iteration that scored: the line says the policy collapsed and what to change.
    # One all-zero iteration can be an unlucky draw (the skipped update leaves the policy as it was); two in a
    # row say the policy collapsed, and what to change.
    once = idle.summary_line(metrics, best_earlier=(3, 0.25), zero_streak=1)
    assert "every episode scored 0 after iteration 3 averaged 0.250: the policy is unchanged" in once
    assert "collapsed" not in once.split("whether")[0] and "learning_rate" not in once
    assert "every episode scored 0 after iteration 3 averaged 0.250 (2 iterations in a row): the policy has likely " \
        "collapsed" in idle.summary_line(metrics, best_earlier=(3, 0.25), zero_streak=2)
    # After a resume the best earlier iteration comes from metrics.jsonl, up to the resumed iteration only.
    rows = [{"iteration": 1, "mean_reward_all_episodes": 0.1}, {"iteration": 2, "mean_reward_all_episodes": 0.3},
            {"iteration": 3, "mean_reward_all_episodes": 0.0}, {"iteration": 4, "mean_reward_all_episodes": 0.9}]
    (tmp_path / "c" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert idle._best_logged_reward() is None  # a fresh run reads nothing
    idle.start_iteration = 3  # as resume_from(iter_000003) sets it; row 4 is from the run that was cut off
    assert idle._best_logged_reward() == (2, 0.3)


def test_a_prompt_longer_than_the_episode_budget_exits_2_before_training(tiny_model_dir, letter_game, tmp_path,
                                                                         capsys):
    code, err = _cli_in_process(train_main, ["--game", GAME, "--model", str(tiny_model_dir), "--output_dir",
                                             str(tmp_path / "o"), *FAST, "--max_episode_tokens", "16"], capsys)
    assert code == 2, err
    assert "max_episode_tokens is 16" in err and "Traceback" not in err
    import re

    (length,) = re.findall(r"opening prompt of \S+ is (\d+) tokens", err)
    assert int(length) > 16
    assert not (tmp_path / "o").exists()


def test_an_iteration_in_which_no_episode_generated_a_token_is_not_logged_as_a_normal_one(tiny_model_dir,
                                                                                         letter_game, tmp_path):
    # A later iteration whose prompts no longer fit (the start check only sees the first iteration's tasks).
    trainer = _letter_trainer(tiny_model_dir, tmp_path, letter_game, max_episode_tokens="16")
    with pytest.raises(InputError, match="no episode generated a token.*max_episode_tokens=16"):
        trainer.iteration(0)
    assert not (tmp_path / "metrics.jsonl").exists()
    assert trainer.scheduler.last_epoch == 0


def test_grpo_tiny_budget_fits_every_capability_games_opening_prompt(tiny_model_dir):
    """configs/grpo_tiny.yaml must leave room for at least one full turn after every game's longest opening
    prompt. Measured with the test tokenizer (vocabulary 400), which splits text into more tokens than the
    README's tiny model (vocabulary 1,024), so a budget that passes here also fits that model."""
    from transformers import AutoTokenizer

    from game_registry import get_game, list_games, prompt_variant

    budget = load_config(REPO / "configs" / "grpo_tiny.yaml").max_episode_tokens
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    games = [name for name in list_games() if name.startswith("capability_") and name != GAME]
    assert games
    for name in games:
        spec = get_game(name)
        game = spec.make()
        longest = max(len(chat.prompt_ids(prompt_variant(game.reset(seed), spec, hinted), game.get_tool_schemas()))
                      for seed in range(1_000_000, 1_000_008) for hinted in (False, True))
        assert longest + spec.max_gen_tokens <= budget, (name, longest, budget)


def test_a_hinted_iterations_first_step_is_on_policy(tiny_model_dir, letter_game, tmp_path):
    # Hinted samples are trained under the base prompt, so their old log-probs must be re-scored there: kept from
    # the hinted prompt, the first (on-policy) step's ratio was 1.05 with 2% of tokens clipped (an audit's mutation).
    trainer = _letter_trainer(tiny_model_dir, tmp_path, letter_game, hint_fraction="0.5", iterations="1",
                              ppo_epochs="1", minibatches_per_iteration="1", groups_per_iteration="4")
    metrics = trainer.run()
    assert metrics["n_base_episodes"] == 8  # of 16: half the samples were hinted (and trained under the base prompt)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["clip_fraction"] == 0.0
