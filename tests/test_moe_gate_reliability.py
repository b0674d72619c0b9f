"""moe_gate reliability: a saved gate does not override the caller's estimator, a refused gate leaves the base
untouched, the serving front answers malformed requests with a 400, "base" is never an adapter name, aLoRA
adapters are refused, a gate records its local base model by absolute path, and a router needs two slots.

Tiny and fast: the smoke test's 32-wide Qwen3 base and its two random adapters, built once for the module."""
from __future__ import annotations

import http.client
import json
import shutil
import threading
from pathlib import Path

import pytest
import torch

from common.validation import InputError
from moe_gate import GateError, TrajectoryGlobalRouter, build_capability_model, read_peft_adapter, save_gate
from moe_gate.model_builder import GATE_CONFIG, load_capability_model
from moe_gate.multi_lora import MultiLoRAGatedLinear
from moe_gate.smoke_test import make_adapters, make_tiny_base, randomise_gate, save_tiny_base
from train.gate_config import MoEGateConfig

@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """make_tiny_base() saved with a word-level tokenizer (vocab < 96) and a chat template: a base model folder."""
    return save_tiny_base(tmp_path_factory.mktemp("base") / "model")


def _wrapped(base: torch.nn.Module) -> list[str]:
    return [name for name, module in base.named_modules() if isinstance(module, MultiLoRAGatedLinear)]


def _hooks(base: torch.nn.Module) -> int:
    return sum(len(module._forward_pre_hooks) for module in base.modules())


# 1 ------------------------------------------------------------------------------------------------------------
def test_an_explicit_estimator_and_tau_win_over_the_saved_gates_and_are_recorded(adapters, tmp_path):
    """Router SFT saved "gumbel"; grpo_gater asks for straight-through: it must get it (and save it)."""
    save_gate(build_capability_model(make_tiny_base(), adapters, estimator="gumbel", tau=0.5), tmp_path / "sft")
    grpo = build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "sft", estimator="straight_through",
                                  tau=2.0)
    assert {(g.estimator, g.tau) for g in grpo.gate} == {("straight_through", 2.0)}
    save_gate(grpo, tmp_path / "grpo")
    recorded = json.loads((tmp_path / "grpo" / GATE_CONFIG).read_text())
    assert (recorded["estimator"], recorded["tau"]) == ("straight_through", 2.0)
    as_saved = build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "sft")  # no options: as saved
    assert {(g.estimator, g.tau) for g in as_saved.gate} == {("gumbel", 0.5)}
    save_gate(build_capability_model(make_tiny_base(), adapters, mode="global", soft=True), tmp_path / "soft")
    with pytest.raises(GateError, match="trained with soft=True, not soft=False"):
        build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "soft", soft=False)


# 2 ------------------------------------------------------------------------------------------------------------
def test_a_refused_gate_leaves_the_base_as_it_was_and_a_retry_on_it_works(adapters, tmp_path):
    save_gate(build_capability_model(make_tiny_base(), adapters), tmp_path / "gate")
    base = make_tiny_base()
    swapped = {"beta": adapters["beta"], "alpha": adapters["alpha"]}
    with pytest.raises(GateError, match="same adapters in the same order"):
        build_capability_model(base, swapped, gate=tmp_path / "gate")
    assert not _wrapped(base) and _hooks(base) == 0  # refused before the base was touched
    with pytest.raises(GateError, match="same adapters in the same order"):  # before any adapter folder is read
        build_capability_model(base, {"alpha": adapters["alpha"], "gamma": tmp_path / "missing"}, gate=tmp_path / "gate")
    build_capability_model(base, adapters, gate=tmp_path / "gate")  # the same base object, the right adapters

    other = make_tiny_base(seed=1)  # refused late, on the hash of its weights: restored all the same
    with pytest.raises(GateError, match="base model's weights differ"):
        build_capability_model(other, adapters, gate=tmp_path / "gate")
    assert not _wrapped(other) and _hooks(other) == 0
    assert all(parameter.requires_grad for parameter in other.parameters())
    assert _wrapped(build_capability_model(other, adapters))  # routable again (a fresh gate)


# 3 ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def front_url(adapters, model_dir, tmp_path):
    from moe_gate.serve import GlobalRouterFront, make_server

    model = build_capability_model(make_tiny_base(), adapters, mode="global")
    randomise_gate(model, seed=0)
    save_gate(model, tmp_path / "gate")
    front = GlobalRouterFront(tmp_path / "gate", base_model=str(model_dir), base_served_name="tiny")
    server = make_server(front, "http://127.0.0.1:9")  # never reached: every request here is refused first
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield front, server.server_address[1]
    server.shutdown()
    server.server_close()


def _post(port: int, path: str, body: bytes, length: str | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)) if length is None else length)
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_serve_answers_malformed_requests_with_a_400_that_says_what_to_send(front_url):
    front, port = front_url
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "where is my order"}]
    cases = [
        (chat, b"[]", None, "must be a JSON object"),
        (chat, b'{"messages": []}', "12x", "Content-Length must be"),
        (chat, b'{"messages": "hi"}', None, "non-empty list of message objects"),
        (chat, b'{"messages": [1, 2]}', None, "non-empty list of message objects"),
        (chat, json.dumps({"messages": user, "tools": "find_order"}).encode(), None, "`tools` must be a list"),
        (chat, json.dumps({"messages": [{"role": "narrator", "content": "x"}] + user}).encode(), None,
         "messages[0].role must be one of system, user, assistant, tool, got 'narrator'"),
        (chat, json.dumps({"messages": [{"role": "assistant", "tool_calls": [1]}] + user}).encode(), None,
         "messages[0].tool_calls must be a list of"),
        (chat, json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), None,
         "messages[0].content must be a string, a list of content parts or null, got int"),
        ("/v1/completions", b'"hi"', None, "must be a JSON object"),
        ("/v1/completions", b"\xff\xfe{", None, "not valid JSON"),
    ]
    for path, body, length, message in cases:
        status, payload = _post(port, path, body, length)
        assert status == 400 and message in payload["error"]["message"], (body, payload)
    template = front.tokenizer.chat_template
    front.tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"  # the template's own refusal
    status, payload = _post(port, chat, json.dumps({"messages": user}).encode())
    assert status == 400 and "cannot render these messages: roles must alternate" in payload["error"]["message"]
    front.tokenizer.chat_template = "{{ messages[0]['content'] + 1 }}"  # breaks on this data, in the template
    status, payload = _post(port, chat, json.dumps({"messages": user}).encode())
    assert status == 400 and "cannot render these messages: can only concatenate" in payload["error"]["message"]
    front.tokenizer.chat_template = None  # a base whose tokenizer has no chat template: chat requests cannot render
    status, payload = _post(port, chat, json.dumps({"messages": user}).encode())
    assert status == 400 and "no chat template" in payload["error"]["message"]
    front.tokenizer.chat_template = template


def test_serve_answers_its_own_bug_with_a_500_and_logs_it(front_url, monkeypatch, capfd):
    front, port = front_url

    def broken_renderer(*args, **kwargs):
        raise TypeError("a bug in the renderer")

    monkeypatch.setattr("moe_gate.serve.render_messages", broken_renderer)
    status, payload = _post(port, "/v1/chat/completions", json.dumps({"messages": [{"role": "user",
                                                                                   "content": "hi"}]}).encode())
    assert status == 500 and "TypeError: a bug in the renderer" in payload["error"]["message"], payload
    assert "bug of moe_gate.serve" in payload["error"]["message"]
    assert "Traceback" in capfd.readouterr().err


# 4 ------------------------------------------------------------------------------------------------------------
def test_an_adapter_named_base_is_refused_even_without_a_base_slot(adapters):
    base = make_tiny_base()
    with pytest.raises(GateError, match="not 'base' .*reserved even with include_base_slot false"):
        build_capability_model(base, {"base": adapters["alpha"], "beta": adapters["beta"]}, include_base_slot=False)
    assert not _wrapped(base)
    with pytest.raises(InputError, match="'base' is the base model's name"):  # configs/moe_gate.yaml, before any load
        MoEGateConfig(adapters={"base": "a", "beta": "b"}, include_base_slot=False)


# 5 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option, value, refused", [
    ("alora_invocation_tokens", [5, 7], "alora_invocation_tokens=\\[5, 7\\].*retrain it without"),
    ("use_qalora", True, "use_qalora=True, which moe_gate does not implement"),
    ("use_dora", True, "use_dora=True"),
    ("target_parameters", ["mlp.experts.weight"], "target_parameters="),
    ("arrow_config", {"top_k": 2}, "arrow_config="),
    ("init_lora_weights", "pissa", "changes the base weights it was trained on.*path_initial_model_for_weight"),
    ("init_lora_weights", "olora", "changes the base weights"),
    ("lora_dropout", 0.1, None),  # training-time only
    ("init_lora_weights", "gaussian", None),  # the base unchanged
    ("alora_invocation_tokens", None, None),  # the field present but off: a plain LoRA
    ("use_qalora", False, None),
])
def test_a_lora_variant_or_a_base_changing_initialisation_is_refused(adapters, tmp_path, option, value, refused):
    folder = shutil.copytree(adapters["alpha"], tmp_path / "variant")
    config = json.loads((folder / "adapter_config.json").read_text())
    config[option] = value
    (folder / "adapter_config.json").write_text(json.dumps(config))
    if refused is None:
        assert read_peft_adapter("variant", folder).modules
        return
    with pytest.raises(GateError, match=refused):
        read_peft_adapter("variant", folder)


# 6 ------------------------------------------------------------------------------------------------------------
def test_a_gate_records_its_local_base_by_absolute_path_and_loads_from_elsewhere(adapters, model_dir, tmp_path,
                                                                               monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(model_dir.parent)
    base = AutoModelForCausalLM.from_pretrained(model_dir.name)  # a relative folder, as a command line gives it
    save_gate(build_capability_model(base, adapters), tmp_path / "gate")
    recorded = json.loads((tmp_path / "gate" / GATE_CONFIG).read_text())["base_model"]["name_or_path"]
    assert recorded == str(model_dir.resolve())
    monkeypatch.chdir(tmp_path)  # another working directory: the gate folder alone still loads
    model, _ = load_capability_model(tmp_path / "gate")
    assert model.slot_names == ["base", "alpha", "beta"]
    hub = make_tiny_base()
    hub.config._name_or_path = "Qwen/Qwen3-0.6B"  # not a local folder: kept as given
    save_gate(build_capability_model(hub, adapters), tmp_path / "hub")
    assert json.loads((tmp_path / "hub" / GATE_CONFIG).read_text())["base_model"]["name_or_path"] == "Qwen/Qwen3-0.6B"


# 7 ------------------------------------------------------------------------------------------------------------
def test_a_global_router_needs_two_slots_like_the_layer_gates(adapters):
    with pytest.raises(GateError, match="at least 2 slots"):
        TrajectoryGlobalRouter(8, 1)
    base = make_tiny_base()
    with pytest.raises(GateError, match="at least 2 slots.*include_base_slot"):
        build_capability_model(base, {"alpha": adapters["alpha"]}, mode="global", include_base_slot=False)
    assert not _wrapped(base) and _hooks(base) == 0  # refused before the base was touched
    with pytest.raises(InputError, match="at least 2 slots"):  # the config says so before any model loads
        MoEGateConfig(adapters={"alpha": "a"}, mode="global", include_base_slot=False)
