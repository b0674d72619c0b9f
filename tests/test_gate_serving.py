"""Serving routed models: the storefront's hf: agent on a gate folder, and moe_gate.serve (global routing in
front of an OpenAI-compatible multi-LoRA server; here a real HTTP server on 127.0.0.1 that answers with the
adapter name it was asked for, standing in for vLLM)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from train.agents import HFAgent, VLLMAgent, render_prompt
from moe_gate import GateError, build_capability_model, save_gate
from moe_gate.serve import GlobalRouterFront, make_server
from moe_gate.smoke_test import make_random_adapter, randomise_gate
from train.policy import load_base_model

REPO = Path(__file__).resolve().parent.parent
TOOLS = [{"type": "function", "function": {"name": "find_order", "description": "Look up an order.",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def tiny_adapters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    def base():
        return load_base_model(str(tiny_model_dir))[0]

    folder = tmp_path_factory.mktemp("serve-adapters")
    return {"orders": make_random_adapter(base, folder / "orders", r=4, alpha=8, seed=1, std=0.3,
                                          targets=["q_proj", "v_proj", "down_proj"]),
            "refunds": make_random_adapter(base, folder / "refunds", r=2, alpha=2, seed=2, std=0.3,
                                           targets=["o_proj", "up_proj"])}


def _routed(tiny_model_dir, adapters, mode: str, seed: int):
    base, tokenizer = load_base_model(str(tiny_model_dir))
    model = build_capability_model(base, adapters, mode=mode).eval()
    randomise_gate(model, seed=seed, std=20.0)
    return model, tokenizer


def test_hf_agent_plays_a_routed_model_from_its_gate_folder(tiny_model_dir, tiny_adapters, tmp_path):
    model, tokenizer = _routed(tiny_model_dir, tiny_adapters, "token", seed=0)
    save_gate(model, tmp_path / "gate")
    messages = [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "Where is my order?"}]
    ids = tokenizer(render_prompt(tokenizer, messages, TOOLS), add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad(), model.record_routing() as record:
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=None)
    assert len({int(s) for slots in record.slots().values() for s in slots.flatten()}) > 1  # really routed
    expected = tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    plain = HFAgent(tiny_model_dir, max_new_tokens=6).respond(messages, TOOLS)
    for agent in (HFAgent(tmp_path / "gate", max_new_tokens=6), HFAgent(tiny_model_dir, tmp_path / "gate", max_new_tokens=6)):
        text = agent.respond(messages, TOOLS)
        assert expected.startswith(text) and agent.describe()["adapter"] == str(tmp_path / "gate")
    assert plain != expected  # the routed model is not the base model


@pytest.mark.slow  # ~5 s: a benchmark subprocess; the in-process gate-folder test above stays
def test_storefront_runs_a_routed_model_with_the_hf_agent(tiny_model_dir, tiny_adapters, tmp_path):
    model, _ = _routed(tiny_model_dir, tiny_adapters, "token", seed=0)
    save_gate(model, tmp_path / "gate")
    result = subprocess.run([sys.executable, "-m", "train.play", "--agent", f"hf:{tmp_path / 'gate'}",
                             "--tasks", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "r.json"),
                             "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    info = json.loads((tmp_path / "r.json").read_text())["info"]["agent_info"]
    assert info["adapter"] == str(tmp_path / "gate")


class FakeMultiLoRAServer:
    """`/v1/completions` and `/v1/chat/completions` answering "[<model>]": which adapter was asked for."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __enter__(self) -> "FakeMultiLoRAServer":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, **body})
                text = f"[{body['model']}]"
                choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
                if self.path.endswith("/chat/completions"):
                    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                payload = json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": body["model"],
                                      "choices": [choice]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def _serve(front: GlobalRouterFront, upstream: str) -> tuple[ThreadingHTTPServer, str]:
    server = make_server(front, upstream)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_serve_sends_each_request_to_the_adapter_the_in_process_router_chooses(tiny_model_dir, tiny_adapters, tmp_path):
    model, tokenizer = _routed(tiny_model_dir, tiny_adapters, "global", seed=3)
    questions = ["Where is my order?", "I want a refund for the blue mug.", "Cancel it now please", "hello",
                 "Which address do you have on file?", "The item arrived broken, what now?", "thanks, bye"]
    conversations = [[{"role": "system", "content": "You help customers."}, {"role": "user", "content": q}]
                     for q in questions]

    def in_process_slot(messages) -> str:
        ids = tokenizer(render_prompt(tokenizer, messages, TOOLS), add_special_tokens=False, return_tensors="pt")
        with torch.no_grad(), model.record_routing() as record:
            model(**ids)
        return model.slot_names[int(record.events[0].slots[0, 0])]

    for seed in range(50):  # a router under which these prompts go to different slots
        randomise_gate(model, seed=seed, std=300.0)
        with torch.no_grad():
            model.gate.proj.bias.zero_()
        expected = [in_process_slot(m) for m in conversations]
        if len(set(expected)) > 1:
            break
    else:
        pytest.fail("no router seed sends these prompts to different slots")
    save_gate(model, tmp_path / "gate")
    front = GlobalRouterFront(tmp_path / "gate", base_served_name="tiny-base")
    with FakeMultiLoRAServer() as upstream:
        server, url = _serve(front, upstream.url)
        try:
            agent = VLLMAgent(url, None, tiny_model_dir, timeout_s=30.0)
            assert agent.model == front.name
            answers = [agent.respond(messages, TOOLS) for messages in conversations]
            import openai

            chat = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY").chat.completions.create(
                model=front.name, messages=conversations[0], tools=TOOLS)
            with pytest.raises(openai.BadRequestError, match="streaming is not supported"):
                openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0).completions.create(
                    model=front.name, prompt="hi", stream=True)
        finally:
            server.shutdown()
            server.server_close()
    served = {"base": "tiny-base"}
    assert answers == [f"[{served.get(slot, slot)}]" for slot in expected]
    assert chat.choices[0].message.content == f"[{served.get(expected[0], expected[0])}]"
    assert all(r["max_tokens"] == 256 for r in upstream.requests if r["path"].endswith("/v1/completions"))


def test_serve_refuses_per_layer_gates(tiny_model_dir, tiny_adapters, tmp_path):
    model, _ = _routed(tiny_model_dir, tiny_adapters, "trajectory", seed=0)
    save_gate(model, tmp_path / "gate")
    with pytest.raises(GateError, match="cannot be served by one vLLM adapter per request"):
        GlobalRouterFront(tmp_path / "gate")
