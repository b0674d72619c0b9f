"""One GRPO iteration (1 group x 4, short token budgets) with LoRA on SmolLM2, through `python -m train`.

Two games: a storefront capability game (real tool prompts of ~1.1k tokens; a 135M model's four samples
usually score the same, so the iteration may skip its update) and the toy letter-density game of
tests/games (short prompts, rewards that always vary, so the update happens). Both save a PEFT adapter that
peft reloads; the letter-density adapter moves the model's log-probs, and it stays in .cache/real-test/ for
`make test-vllm`, which serves it with runtime LoRA loading (tests/vllm/test_real_model_vllm.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.real.conftest import ADAPTER_DIR

pytestmark = pytest.mark.real
REPO = Path(__file__).resolve().parents[2]


def _grpo(model_dir: Path, game: str, out: Path, max_episode_tokens: int, learning_rate: str) -> tuple[dict, float]:
    """Run one iteration; returns (its metrics line, seconds)."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "TRACE_GAMES_DIRS": str(REPO / "tests" / "games"), "PYTHONPATH": str(REPO)}
    env.pop("VLLM_BASE_URLS", None)  # sample in process
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "train", "--game", game, "--model", str(model_dir), "--iterations", "1",
         "--groups_per_iteration", "1", "--group_size", "4", "--lora_r", "8", "--micro_batch_size", "4",
         "--learning_rate", learning_rate, "--max_episode_tokens", str(max_episode_tokens), "--output_dir", str(out)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-4000:]
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics["n_episodes"] == 4 and metrics["gen_tokens"] > 0
    print(f"{game}: 1 GRPO iteration in {seconds:.0f} s (process), {metrics['seconds']:.0f} s (iteration); "
          f"reward {metrics['mean_reward']:.3f}, sampling {metrics['gen_tokens_per_s']:.1f} tok/s, training "
          f"{metrics['train_tokens_per_s']:.0f} tok/s, update {'skipped' if metrics['skipped_update'] else 'done'}")
    return metrics, seconds


def _reload(model_dir: Path, adapter_dir: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    loaded = {name: tensor for name, tensor in model.state_dict().items() if "lora_" in name}
    assert len(saved) == len(loaded) == 30 * 7 * 2  # 30 layers x 7 projections x (A, B)
    return model, saved


def test_one_grpo_iteration_on_a_storefront_capability_game_saves_an_adapter_peft_reloads(real_model_dir, tmp_path):
    out = tmp_path / "precondition"
    # The opening (policy + the storefront's full tool list as JSON schemas) is 1,739 SmolLM2 tokens (seed 0).
    metrics, _ = _grpo(real_model_dir, "capability_precondition_verification", out, 3072, "1e-3")
    _reload(real_model_dir, out)


def test_one_grpo_iteration_updates_an_adapter_that_changes_the_models_log_probs(real_model_dir):
    out = ADAPTER_DIR
    metrics, _ = _grpo(real_model_dir, "capability_letter_density", out, 256, "1e-2")
    assert metrics["skipped_update"] == 0.0 and metrics["grad_norm"] > 0
    model, saved = _reload(real_model_dir, out)
    assert any(float(t.abs().max()) > 0 for n, t in saved.items() if "lora_B" in n)  # B starts at zero
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_model_dir))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Say: idea unit"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]  # [1, T]
    with torch.no_grad():
        tuned = torch.log_softmax(model(input_ids=ids).logits[0, -1], -1)  # [V]
        with model.disable_adapter():
            plain = torch.log_softmax(model(input_ids=ids).logits[0, -1], -1)  # [V]
    shift = float((tuned - plain).abs().max())
    print(f"adapter log-prob shift at the first reply token: {shift:.4f}")
    assert shift > 1e-3
