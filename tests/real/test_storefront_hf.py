"""SmolLM2 plays three storefront tasks through the `hf:` agent (the benchmark's own CLI); the valid
tool-call format rate is reported. A 135M model is not expected to solve them: this checks that a real
model, tokenizer and tool-less template go through the agent path end to end."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.agents import render_prompt
from game_registry import get_game

pytestmark = pytest.mark.real
REPO = Path(__file__).resolve().parents[2]


def test_the_hf_agent_prompt_lists_every_storefront_tool(real_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_model_dir))
    game = get_game("storefront").make()
    tools = game.get_tool_schemas()
    prompt = render_prompt(tokenizer, game.reset(1), tools)
    assert prompt.count("\n<tools>\n") == 1 and prompt.endswith("<|im_start|>assistant\n")
    assert all(f'"name": "{tool["function"]["name"]}"' in prompt for tool in tools)


def test_three_storefront_tasks_through_the_hf_agent(real_model_dir, tmp_path):
    out = tmp_path / "results.json"
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "train.play", "--agent", f"hf:{real_model_dir}", "--tasks", "3",
         "--max-new-tokens", "96", "--out", str(out), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(out.read_text())
    simulations, fmt = document["simulations"], document["info"]["format"]
    assert len(simulations) == 3
    assert all(any(m["role"] == "assistant" for m in sim["messages"]) for sim in simulations)
    assert fmt["turns"] == fmt["tool_call_turns"] + fmt["reply_turns"] + fmt["malformed_turns"] >= 3
    assert 0.0 <= fmt["valid_format_rate"] <= 1.0
    format_line = next(line for line in result.stderr.splitlines() if line.startswith("format:"))
    print(f"3 storefront tasks with {real_model_dir.name} in {seconds:.0f} s; {format_line}")
