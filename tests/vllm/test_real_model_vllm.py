"""SmolLM2-135M on a REAL vLLM server: the adapter `make test-real`'s GRPO iteration saved, loaded at runtime.

Run by scripts/test_vllm.sh's SmolLM2 step, which serves the converted model (.cache/models/smollm2-135m) and
sets TRACE_VLLM_REAL_ADAPTER; skipped in the tiny-model step. Checks that the PEFT folder the trainer wrote
loads through /v1/load_lora_adapter, that the served adapter's log-probs are PEFT's in process (so vLLM
applies this adapter to this architecture correctly) and differ from the base model's, and that the vllm:
agent (client-side Hermes rendering of the tool-less ChatML template) plays a storefront turn.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from train.backends import SamplingParams
from train.episodes import ChatTokenizer
from train.vllm_backend import VLLMBackend

pytestmark = pytest.mark.skipif(not os.environ.get("TRACE_VLLM_REAL_ADAPTER"),
                                reason="the SmolLM2 step of `make test-vllm` sets TRACE_VLLM_REAL_ADAPTER")
# float32 on both sides over 30 layers; vLLM's CPU kernels sum in a different order than PyTorch's.
LOGPROB_ATOL = 5e-3


def _post(url: str, payload: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@torch.no_grad()
def _logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log softmax(logits) of each completion token at temperature 1, in process. [len(completion)]"""
    ids = torch.tensor([prompt + completion])  # [1, P + C]
    logits = model(input_ids=ids).logits[0, :-1].float()  # [P + C - 1, V]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)[len(prompt) - 1:]


def test_the_grpo_adapter_loads_at_runtime_and_changes_the_outputs_as_peft_does(real_server, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(os.environ["TRACE_VLLM_REAL_ADAPTER"])
    tokenizer = AutoTokenizer.from_pretrained(str(real_server.model_dir))
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(real_server.model_dir), dtype=torch.float32), str(adapter)).eval()
    name = f"grpo-smollm2-{uuid.uuid4().hex[:6]}"
    status, body = _post(f"{real_server.url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter)})
    assert status == 200, body
    try:
        prompt = ChatTokenizer(tokenizer).prompt_ids(
            [{"role": "system", "content": "Answer with vowels."}, {"role": "user", "content": "Say: idea unit"}], [])
        served = VLLMBackend([real_server.url], name, adapter_dir=tmp_path, max_retries=1, timeout=120, seed=5)
        completions = served.generate([prompt] * 3, SamplingParams(max_new_tokens=12, temperature=1.0))
        base = VLLMBackend([real_server.url], real_server.model, adapter_dir=tmp_path, max_retries=1, timeout=120)
        greedy_base = base.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
        greedy_tuned = served.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
    finally:
        assert _post(f"{real_server.url}/v1/unload_lora_adapter", {"lora_name": name})[0] == 200
    shifts = []
    for completion in completions:
        with_adapter = _logprobs(model, prompt, completion.token_ids)
        with model.disable_adapter():
            without = _logprobs(model, prompt, completion.token_ids)
        vllm_logprobs = torch.tensor(completion.logprobs)
        assert torch.allclose(vllm_logprobs, with_adapter, atol=LOGPROB_ATOL), (vllm_logprobs - with_adapter).abs().max()
        shifts.append(float((with_adapter - without).abs().max()))
    print(f"SmolLM2 + GRPO adapter on vLLM: log-prob shift vs base (max per sample) {[f'{s:.3f}' for s in shifts]}; "
          f"greedy: base {tokenizer.decode(greedy_base.token_ids)!r}, adapter {tokenizer.decode(greedy_tuned.token_ids)!r}")
    assert max(shifts) > 20 * LOGPROB_ATOL, f"the adapter barely moved the log-probs: {shifts}"


def test_the_vllm_agent_plays_a_storefront_turn_with_tools_rendered_on_the_client(real_server):
    from train.agents import VLLMAgent, render_prompt
    from game_registry import get_game

    agent = VLLMAgent(real_server.url, real_server.model, real_server.model_dir, max_new_tokens=48)
    game = get_game("storefront").make()
    messages, tools = game.reset(3), game.get_tool_schemas()
    assert "<tools>" in render_prompt(agent.tokenizer, messages, tools)
    text = agent.respond(messages, tools)
    assert isinstance(text, str) and text.strip()
    print(f"vllm: agent's first storefront turn: {text[:120]!r}")
