"""train.evaluate: a task's samples are its trials — on the storefront, the customer's wordings (τ²-bench)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parent.parent


def _load(model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    return model, tokenizer


def test_storefront_samples_are_played_with_the_customers_wordings(tiny_model_dir):
    from benchmarks.storefront.config import StorefrontConfig
    from benchmarks.storefront.env import StorefrontGame
    from benchmarks.storefront.run import task_seed
    from train.evaluate import evaluate_model

    model, tokenizer = _load(tiny_model_dir)
    sims, hat = evaluate_model(model, tokenizer, "storefront", n_tasks=3, seed=1000, samples=3, temperature=0.0,
                               max_episode_tokens=2600)
    assert len(sims) == 9 and {s["trial"] for s in sims} == {0, 1, 2}
    game = StorefrontGame(StorefrontConfig())
    for sim in sims:
        # Each sample opens exactly as the game does for that task and wording (trial).
        expected = game.reset(int(sim["task_id"]), trial=sim["trial"])
        assert sim["messages"][1]["content"] == expected[1]["content"]
    openings = {}
    for sim in sims:
        openings.setdefault(sim["task_id"], set()).add(sim["messages"][1]["content"])
    assert any(len(texts) > 1 for texts in openings.values()), "greedy samples of a task must differ in wording"
    assert {str(task_seed(1000, i)) for i in range(3)} == {str(t) for t in openings}
    assert set(hat["all"]["pass_hat_k"]) <= {1, 2, 3} and hat["all"]["n_tasks"] == 3


def test_a_game_without_wordings_replays_the_same_opening(tiny_model_dir):
    from train.evaluate import evaluate_model

    import game_registry

    game_registry._import_game_file(REPO / "tests" / "games" / "capability_letter_density_game.py")
    model, tokenizer = _load(tiny_model_dir)
    sims, _ = evaluate_model(model, tokenizer, "capability_letter_density", n_tasks=2, seed=7, samples=2,
                             temperature=1.0, max_episode_tokens=400)
    assert len(sims) == 4
    by_task = {}
    for sim in sims:
        by_task.setdefault(sim["task_id"], []).append(sim["messages"][1]["content"])
    assert all(len(set(texts)) == 1 for texts in by_task.values())


def test_an_adapter_is_evaluated_merged_with_the_same_outputs(tiny_model_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    from train.evaluate import load_policy_model

    model, _ = _load(tiny_model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a non-zero adapter, so merging it changes the weights
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    peft_model.save_pretrained(str(tmp_path / "adapter"))

    merged, _ = load_policy_model(tiny_model_dir, tmp_path / "adapter")
    assert not isinstance(merged, PeftModel) and not any("lora" in n for n, _ in merged.named_parameters())
    plain, _ = load_policy_model(tiny_model_dir)
    unmerged = PeftModel.from_pretrained(_load(tiny_model_dir)[0], str(tmp_path / "adapter")).eval()
    ids = torch.randint(0, plain.config.vocab_size, (2, 12))
    with torch.no_grad():
        expected = unmerged(ids).logits
        assert torch.allclose(merged(ids).logits, expected, atol=1e-4)
        assert not torch.allclose(plain(ids).logits, expected, atol=1e-3)  # the adapter matters


# --------------------------------------------------------------------------------------------------
# A run that survives its process (issue 45): the journal keeps each batch, then the sampler's state
# --------------------------------------------------------------------------------------------------
DEMO_AGENT = REPO / "assets/demo_base_agent"


def _run(out: Path, *flags: str) -> int:
    from train.evaluate import main

    return main(["--model", str(DEMO_AGENT), "--tasks", "3", "--samples", "1", "--temperature", "1.0",
                 "--seed", "4000", "--max-episode-tokens", "1600", "--out", str(out), *flags])


def _episodes(out: Path) -> list:
    import json

    return [(s["task_id"], s["trial"], s["reward_info"]["reward"], s["messages"])
            for s in json.loads(out.read_text())["simulations"]]


@pytest.mark.slow  # ~4 s: three evaluation runs (kill and resume)
def test_an_interrupted_evaluation_continues_to_the_same_results_at_temperature_1(tmp_path, monkeypatch):
    import json

    import pytest

    from common.cli import Interrupted
    from train import evaluate

    monkeypatch.setattr(evaluate, "EVAL_BATCH_SIZE", 1)  # 3 episodes, one a batch
    clean = tmp_path / "clean.json"
    assert _run(clean) == 0
    real = evaluate.run_episodes
    calls = []

    def stopping_at_the_third_batch(*args, **kwargs):
        calls.append(len(args[1]))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "results.json"
    monkeypatch.setattr(evaluate, "run_episodes", stopping_at_the_third_batch)
    with pytest.raises(Interrupted, match="2 scored episodes are kept in"):
        _run(out)
    journal = Path(f"{out}.partial.jsonl")
    assert not out.exists() and journal.exists()
    # a run killed after its second batch's episodes, before that batch's sampler state: the batch is played again
    lines = journal.read_text().splitlines()
    last_mark = max(i for i, line in enumerate(lines) if '"mark"' in line)
    journal.write_text("\n".join(lines[:last_mark]) + "\n")
    calls.clear()
    assert _run(out) == 0
    assert calls == [1, 1]  # the second batch again, then the third; the first is not played again
    assert _episodes(out) == _episodes(clean)  # every episode once, each as an uninterrupted run played it
    assert not journal.exists()
    assert len(json.loads(out.read_text())["simulations"]) == 3


def test_an_evaluation_journal_refuses_a_second_process_and_other_settings(tmp_path, monkeypatch, capsys):
    from benchmarks.results_journal import ResultsJournal
    from train import evaluate

    loads = []
    monkeypatch.setattr(evaluate, "load_policy_model", lambda *a: loads.append(a) or (_ for _ in ()).throw(
        KeyboardInterrupt))
    out = tmp_path / "results.json"
    with ResultsJournal(out, {"another": "run"}):  # a second process holds the results file's journal
        assert _run(out) == 2
    assert "is in use by another run of the same results file" in capsys.readouterr().err
    assert _run(out) == 2  # that run's journal, with other settings, is left for it
    err = capsys.readouterr().err
    assert "holds a run with other settings" in err and len(err.strip().splitlines()) == 1
    assert loads == [] and not out.exists()


@pytest.mark.slow  # ~4 s: three collection runs (kill and resume)
def test_collected_rollouts_survive_a_server_that_fails_for_good_and_continue_to_the_same_rollouts(tmp_path,
                                                                                                   monkeypatch, capsys):
    """train.collect_rollouts keeps its batches as train.evaluate does (train/batch_journal.py): a server failing
    for good at the third batch ends the run with one line and exit 1, the rerun plays only that batch, and the
    rollouts (T=1) equal an uninterrupted run's."""
    import json

    from train import collect_rollouts
    from train.vllm_backend import VLLMError

    def collect(out: Path) -> int:
        return collect_rollouts.main(["--game", "storefront", "--model", str(DEMO_AGENT), "--seeds", "3",
                                      "--samples", "1", "--seed-start", "5000", "--max-episode-tokens", "1600",
                                      "--out", str(out)])

    monkeypatch.setattr(collect_rollouts, "ROLLOUT_BATCH_SIZE", 1)
    clean = tmp_path / "clean.json"
    assert collect(clean) == 0
    real, calls = collect_rollouts.run_episodes, []

    def failing_at_the_third_batch(*args, **kwargs):
        calls.append(len(args[1]))
        if len(calls) == 3:
            raise VLLMError("http://127.0.0.1:9: the server failed after 5 attempts")
        return real(*args, **kwargs)

    monkeypatch.setattr(collect_rollouts, "run_episodes", failing_at_the_third_batch)
    out = tmp_path / "rollouts.json"
    capsys.readouterr()
    assert collect(out) == 1
    err = capsys.readouterr().err
    assert "2 rollouts are kept in" in err and "run the same command again" in err and "Traceback" not in err, err
    assert not out.exists()
    calls.clear()
    assert collect(out) == 0
    assert calls == [1]  # only the batch the server failed
    rollouts = [(s["task_id"], s["reward_info"]["reward"], s["messages"]) for s in json.loads(out.read_text())[
        "simulations"]]
    assert rollouts == [(s["task_id"], s["reward_info"]["reward"], s["messages"])
                        for s in json.loads(clean.read_text())["simulations"]]
    assert not Path(f"{out}.partial.jsonl").exists()
