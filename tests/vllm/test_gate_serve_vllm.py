"""moe_gate.serve in front of the REAL vLLM server (make test-vllm): a hard global router picks an adapter per
request from the prompt, and the server answers under that adapter exactly as if asked for it directly."""
from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from typing import Any

import pytest
import torch

from moe_gate import build_capability_model, save_gate
from moe_gate.serve import GlobalRouterFront, make_server
from moe_gate.smoke_test import make_random_adapter, randomise_gate
from train.policy import load_base_model

PROMPTS = ["Where is my order?", "I want a refund for the blue mug.", "Cancel it now please", "hello",
           "Which address do you have on file?", "The item arrived broken, what now?", "thanks, bye"]


def _post(url: str, payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read()), dict(response.headers)


def _post_text(url: str, payload: dict[str, Any]) -> str:
    """POST for vLLM's LoRA endpoints, which answer in plain text."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read().decode()


def _completion(url: str, model: str, prompt: str) -> tuple[str, dict[str, str]]:
    body, headers = _post(f"{url}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 8,
                                                     "temperature": 0.0, "seed": 0})
    return body["choices"][0]["text"], headers


def test_serve_routes_each_request_to_the_adapter_the_router_chooses(real_server, tmp_path):
    model_dir = str(real_server.model_dir)
    names = [f"orders-{uuid.uuid4().hex[:6]}", f"refunds-{uuid.uuid4().hex[:6]}"]
    adapters = {name: make_random_adapter(lambda: load_base_model(model_dir)[0], tmp_path / name, r=4, alpha=8,
                                          seed=index + 1, std=0.5, targets=["q_proj", "v_proj"])
                for index, name in enumerate(names)}
    for name, path in adapters.items():  # the server holds every adapter under its slot name
        _post_text(f"{real_server.url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    base, tokenizer = load_base_model(model_dir)
    model = build_capability_model(base, adapters, mode="global").eval()

    def in_process_slot(prompt: str) -> str:
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad(), model.record_routing() as record:
            model(**ids)
        return model.slot_names[int(record.events[0].slots[0, 0])]

    for seed in range(50):  # a router that sends these prompts to more than one slot
        randomise_gate(model, seed=seed, std=300.0)
        with torch.no_grad():
            model.gate.proj.bias.zero_()
        expected = [in_process_slot(p) for p in PROMPTS]
        if len(set(expected)) > 1:
            break
    else:
        pytest.fail("no router seed sends these prompts to different slots")
    save_gate(model, tmp_path / "gate")
    front = GlobalRouterFront(tmp_path / "gate", base_model=model_dir, base_served_name=real_server.model)
    server = make_server(front, real_server.url)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        routed = [_completion(url, front.name, prompt) for prompt in PROMPTS]
        direct = [_completion(real_server.url, front.upstream_model(slot), prompt)[0]
                  for prompt, slot in zip(PROMPTS, expected)]
        base_answers = [_completion(real_server.url, real_server.model, prompt)[0] for prompt in PROMPTS]
    finally:
        server.shutdown()
        server.server_close()
        for name in names:
            _post_text(f"{real_server.url}/v1/unload_lora_adapter", {"lora_name": name})
    assert [headers["X-Routed-Slot"] for _, headers in routed] == expected
    assert [text for text, _ in routed] == direct  # the server answered under the chosen adapter
    adapted = [text for text, slot in zip(direct, expected) if slot != "base"]
    assert adapted and any(a != b for a, b, slot in zip(direct, base_answers, expected) if slot != "base")
