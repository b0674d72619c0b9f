"""VLLMBackend against a stub vLLM server (OpenAI protocol on 127.0.0.1, started inside the test).

The stub speaks just enough of vLLM's protocol: /v1/models, /v1/completions with `token_id:N` tokens and
log-probs, /v1/load_lora_adapter and /v1/unload_lora_adapter. It samples deterministically from a few
token ids picked by the request's seed, records every request, and can be told to fail the next requests
of a path (a status, or a delay past the client's timeout). tests/vllm/ runs the same backend against a
real vLLM server (`make test-vllm`).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from common.validation import InputError
from train.backends import SamplingParams
from train.policy import LoraPolicy
from train.vllm_backend import VLLMBackend, VLLMError, backend_from_env, request_seed

REPO = Path(__file__).resolve().parent.parent
BASE = "stub-base"
STOP = 2
LOGPROB = -0.5


class StubVLLM:
    """A threaded HTTP server imitating vLLM's OpenAI endpoints; see the module docstring."""

    def __init__(self, choices: list[int], *, allow_runtime_lora: bool = True):
        self.choices = choices  # token ids the stub samples from (by seed)
        self.allow_runtime_lora = allow_runtime_lora
        self.echo_prompt_tail = False  # start every completion with the prompt's last id (to trace routing)
        # (prompt ids, sampled ids, temperature) -> log-probs to report; None: LOGPROB for every token
        self.logprob_fn: Any = None
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.loaded: dict[str, str] = {}  # adapter name -> path
        self.loaded_weights: dict[str, str] = {}  # adapter name -> sha256 of its safetensors at load time
        self.faults: dict[str, list[Any]] = {}  # path -> queue of int status or ("delay", seconds)
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stub._handle(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                stub._handle(self, json.loads(self.rfile.read(length) or b"{}"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail_next(self, path: str, *faults: Any) -> None:
        self.faults.setdefault(path, []).extend(faults)

    def completions(self) -> list[dict[str, Any]]:
        return [body for path, body in self.requests if path == "/v1/completions"]

    # -- request handling ------------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler, body: dict[str, Any] | None) -> None:
        path = handler.path
        with self.lock:
            self.requests.append((path, body or {}))
            fault = self.faults[path].pop(0) if self.faults.get(path) else None
        if isinstance(fault, tuple):  # ("delay", seconds): answer too late, the client times out
            time.sleep(fault[1])
        elif fault is not None:
            return self._reply(handler, fault, {"error": {"message": "injected", "code": fault}})
        if path == "/v1/models":
            return self._reply(handler, 200, {"data": [{"id": name} for name in [BASE, *self.loaded]]})
        if path == "/v1/completions":
            return self._complete(handler, body or {})
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and not self.allow_runtime_lora:
            return self._reply(handler, 404, {"detail": "Not Found"})  # FastAPI: route not registered
        if path == "/v1/load_lora_adapter":
            return self._load(handler, body or {})
        if path == "/v1/unload_lora_adapter":
            if body["lora_name"] not in self.loaded:
                return self._reply(handler, 404, {"error": {"message": "cannot be found", "code": 404}})
            del self.loaded[body["lora_name"]]
            return self._reply(handler, 200, "Success")
        return self._reply(handler, 404, {"detail": "Not Found"})

    def _load(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        name, path = body["lora_name"], Path(body["lora_path"])
        if name in self.loaded:
            return self._reply(handler, 400, {"error": {"message": f"'{name}' has already been loaded."}})
        weights = path / "adapter_model.safetensors"
        if not (path / "adapter_config.json").is_file() or not weights.is_file():
            return self._reply(handler, 404, {"error": {"message": f"No adapter found for {path}", "code": 404}})
        self.loaded[name] = str(path)
        self.loaded_weights[name] = hashlib.sha256(weights.read_bytes()).hexdigest()
        return self._reply(handler, 200, f"Success: LoRA adapter '{name}' added successfully.")

    def _complete(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if body["model"] not in (BASE, *self.loaded):
            return self._reply(handler, 404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        choices = []
        for index, prompt in enumerate(prompts):
            # Deterministic "sampling": the seed picks a token; the prompt's last id is echoed first so
            # tests can tell which prompt a completion belongs to; the stop id ends it when it fits.
            token = self.choices[body["seed"] % len(self.choices)]
            ids = [prompt[-1], token, token, STOP] if self.echo_prompt_tail else [token, token, STOP]
            ids = ids[: body["max_tokens"]]
            finish = "stop" if ids[-1] in body.get("stop_token_ids", []) else "length"
            values = (self.logprob_fn(prompt, ids, body["temperature"]) if self.logprob_fn is not None
                      else [LOGPROB] * len(ids))
            choices.append({
                "index": index, "text": "", "finish_reason": finish,
                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": values,
                             "top_logprobs": [{f"token_id:{i}": v} for i, v in zip(ids, values)],
                             "text_offset": [0] * len(ids)},
            })
        return self._reply(handler, 200, {"id": "cmpl-stub", "object": "text_completion", "model": body["model"],
                                          "choices": choices})

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)


@pytest.fixture
def stub():
    server = StubVLLM(choices=[11, 12, 13])
    yield server
    server.close()


def _backend(urls: list[str], tmp_path: Path, **kwargs: Any) -> VLLMBackend:
    kwargs = {"max_retries": 2, "backoff": 0.01, "timeout": 5.0, **kwargs}
    return VLLMBackend(urls, BASE, adapter_dir=tmp_path / "adapters", **kwargs)


def _lora_model(seed: int = 0) -> torch.nn.Module:
    """A small PEFT model with non-zero LoRA weights, for sync_weights (which saves and loads it)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=2, target_modules=["0"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    return model


PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(STOP,))


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def test_completions_are_parsed_from_token_ids_with_logprobs_and_stop_reason(stub, tmp_path):
    backend = _backend([stub.url], tmp_path)
    (done,) = backend.generate([[5, 6, 7]], PARAMS)
    assert done.token_ids[-1] == STOP and len(done.token_ids) == 3 and done.token_ids[0] in stub.choices
    assert done.logprobs == [LOGPROB] * 3 and done.finish_reason == "stop"
    (cut,) = backend.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2, stop_token_ids=(STOP,)))
    assert len(cut.token_ids) == 2 and STOP not in cut.token_ids and cut.finish_reason == "length"
    body = stub.completions()[0]
    assert body["prompt"] == [5, 6, 7] and body["model"] == BASE and body["return_tokens_as_token_ids"] is True
    # every sampling knob explicit, so the server's generation_config defaults cannot change the distribution
    assert (body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (1.0, -1, 0.0, 1.0)
    assert body["stop_token_ids"] == [STOP] and body["max_tokens"] == 8 and body["logprobs"] == 0


def test_a_token_that_is_not_a_token_id_is_an_error():
    choice = {"finish_reason": "length", "logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}}
    with pytest.raises(VLLMError, match="return_tokens_as_token_ids"):
        VLLMBackend.parse_choice(choice, "http://x")
    with pytest.raises(VLLMError, match="without token logprobs"):
        VLLMBackend.parse_choice({"finish_reason": "stop", "logprobs": None}, "http://x")
    parsed = VLLMBackend.parse_choice(
        {"finish_reason": "stop", "logprobs": {"tokens": ["token_id:7", "token_id:2"], "token_logprobs": [-0.25, -1]}},
        "http://x",
    )
    assert parsed.token_ids == [7, 2] and parsed.logprobs == [-0.25, -1.0] and parsed.finish_reason == "stop"


def test_each_prompt_gets_its_own_reproducible_seed(stub, tmp_path):
    # A GRPO group is one prompt repeated: one shared seed would make all its samples identical.
    backend = _backend([stub.url], tmp_path, seed=7)
    backend.generate([[1, 2]] * 8, PARAMS)
    state_after_first_call = backend.state_dict()
    backend.generate([[1, 2]] * 8, PARAMS)
    seeds = [body["seed"] for body in stub.completions()]
    assert len(set(seeds)) == 16
    assert sorted(seeds[:8]) == sorted(request_seed(7, 0, i) for i in range(8))
    # a backend resumed from the checkpointed state asks for the same next seeds
    resumed = _backend([stub.url], tmp_path, seed=7)
    resumed.load_state_dict(state_after_first_call)
    stub.requests.clear()
    resumed.generate([[1, 2]] * 8, PARAMS)
    assert sorted(body["seed"] for body in stub.completions()) == sorted(seeds[8:])


def test_several_servers_share_the_prompts_and_results_keep_prompt_order(tmp_path):
    first, second = StubVLLM(choices=[11]), StubVLLM(choices=[12])
    try:
        backend = _backend([first.url, second.url + "/v1/"], tmp_path)
        first.echo_prompt_tail = second.echo_prompt_tail = True  # completions start with the prompt's last id
        prompts = [[100 + i] for i in range(6)]
        completions = backend.generate(prompts, SamplingParams(max_new_tokens=8))
        assert [c.token_ids[0] for c in completions] == [100 + i for i in range(6)]
        # contiguous halves: groups stay on one server (prefix cache)
        assert sorted(b["prompt"][0] for b in first.completions()) == [100, 101, 102]
        assert sorted(b["prompt"][0] for b in second.completions()) == [103, 104, 105]
        assert [c.token_ids[1] for c in completions] == [11, 11, 11, 12, 12, 12]
        backend.sync_weights(LoraPolicy(_lora_model()), 1)
        assert list(first.loaded) == list(second.loaded) == [backend.served_model]
    finally:
        first.close()
        second.close()


# ------------------------------------------------------------------------------------------------
# Adapters
# ------------------------------------------------------------------------------------------------
def test_each_version_is_loaded_under_a_fresh_name_and_the_previous_one_unloaded(stub, tmp_path):
    backend = _backend([stub.url], tmp_path)
    model = _lora_model()
    backend.sync_weights(LoraPolicy(model), 0)  # zero LoRA: nothing to load, sample the base model
    assert backend.served_model == BASE and not stub.loaded
    names = []
    for version in (1, 2, 3):
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.add_(1.0)
        backend.sync_weights(LoraPolicy(model), version)
        names.append(backend.served_model)
        assert list(stub.loaded) == [backend.served_model]  # the previous one is unloaded
        backend.generate([[1]], PARAMS)
        assert stub.completions()[-1]["model"] == backend.served_model
    assert len(set(names)) == 3 and all(n.startswith(backend.adapter_prefix) for n in names)
    assert [n.rsplit("-", 1)[-1] for n in names] == ["v1", "v2", "v3"]
    assert len(set(stub.loaded_weights.values())) == 3  # each load saw that version's weights
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == [names[-1]]  # old files deleted
    # the same version again (a resume in process) still gets a name never used before
    backend.sync_weights(LoraPolicy(model), 3)
    assert backend.served_model not in names and list(stub.loaded) == [backend.served_model]
    backend.close()
    assert not stub.loaded and backend.served_model == BASE


def test_two_backends_on_one_server_never_share_adapter_names(stub, tmp_path):
    one, two = _backend([stub.url], tmp_path), _backend([stub.url], tmp_path)
    one.sync_weights(LoraPolicy(_lora_model(0)), 1)
    two.sync_weights(LoraPolicy(_lora_model(1)), 1)
    assert one.served_model != two.served_model and len(stub.loaded) == 2


def test_404_on_load_says_to_allow_runtime_lora_updating(tmp_path):
    server = StubVLLM(choices=[11], allow_runtime_lora=False)
    try:
        backend = _backend([server.url], tmp_path)
        with pytest.raises(VLLMError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            backend.sync_weights(LoraPolicy(_lora_model()), 1)
        assert [p for p, _ in server.requests].count("/v1/load_lora_adapter") == 1  # a 404 is not retried
        assert backend.served_model == BASE
    finally:
        server.close()


def test_an_adapter_the_server_cannot_load_fails_at_once_with_its_message(stub, tmp_path):
    backend = _backend([stub.url], tmp_path, max_retries=3, backoff=5.0)  # a retry would take > 5 s
    stub.fail_next("/v1/load_lora_adapter", 500)  # vLLM's answer to e.g. a rank above --max-lora-rank
    started = time.perf_counter()
    with pytest.raises(VLLMError, match="HTTP 500.*injected"):
        backend.sync_weights(LoraPolicy(_lora_model()), 1)
    assert time.perf_counter() - started < 5 and backend.served_model == BASE


def test_a_load_that_timed_out_but_got_through_is_not_an_error(stub, tmp_path):
    backend = _backend([stub.url], tmp_path, timeout=0.3)
    stub.fail_next("/v1/load_lora_adapter", ("delay", 0.6))  # loads, but answers after the client gave up
    backend.sync_weights(LoraPolicy(_lora_model()), 1)
    assert list(stub.loaded) == [backend.served_model]


# ------------------------------------------------------------------------------------------------
# Failures: retried, then loud
# ------------------------------------------------------------------------------------------------
def test_503_then_success_is_retried(stub, tmp_path):
    backend = _backend([stub.url], tmp_path)
    stub.fail_next("/v1/completions", 503, 503)
    (completion,) = backend.generate([[3, 4]], PARAMS)
    assert completion.token_ids and len(stub.completions()) == 3


def test_a_timeout_is_retried(stub, tmp_path):
    backend = _backend([stub.url], tmp_path, timeout=0.3)
    stub.fail_next("/v1/completions", ("delay", 0.6))
    (completion,) = backend.generate([[3, 4]], PARAMS)
    assert completion.token_ids and len(stub.completions()) == 2


def test_persistent_5xx_fails_loudly_after_the_retries(stub, tmp_path):
    backend = _backend([stub.url], tmp_path, max_retries=2)
    stub.fail_next("/v1/completions", 500, 500, 500)
    with pytest.raises(VLLMError, match="failed after 3 attempts.*HTTP 500"):
        backend.generate([[3, 4]], PARAMS)


def test_connection_refused_fails_after_the_retries_never_as_an_empty_completion(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = _backend([f"http://127.0.0.1:{port}"], tmp_path, max_retries=2, backoff=0.01)
    started = time.perf_counter()
    with pytest.raises(VLLMError, match="failed after 3 attempts"):
        backend.generate([[1, 2]] * 4, PARAMS)
    assert time.perf_counter() - started < 5


def test_a_client_error_is_not_retried_and_names_the_server_message(stub, tmp_path):
    backend = _backend([stub.url], tmp_path)
    backend.served_model = "not-loaded"
    with pytest.raises(VLLMError, match="does not exist"):
        backend.generate([[1]], PARAMS)
    assert len(stub.completions()) == 1


def test_a_wrong_model_name_fails_early_listing_the_served_models(stub, tmp_path):
    backend = VLLMBackend([stub.url], "other-model", adapter_dir=tmp_path, max_retries=0)
    with pytest.raises(VLLMError, match=r"serves \['stub-base'\], not VLLM_MODEL='other-model'"):
        backend.generate([[1]], PARAMS)


# ------------------------------------------------------------------------------------------------
# Configuration from the environment
# ------------------------------------------------------------------------------------------------
def test_backend_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_BASE_URLS", raising=False)
    assert backend_from_env(tmp_path, seed=0) is None
    monkeypatch.setenv("VLLM_BASE_URLS", "http://a:8000, http://b:8000/v1")
    monkeypatch.delenv("VLLM_MODEL", raising=False)
    with pytest.raises(InputError, match="VLLM_MODEL"):
        backend_from_env(tmp_path, seed=0)
    monkeypatch.setenv("VLLM_MODEL", "m")
    monkeypatch.setenv("VLLM_MAX_RETRIES", "2")
    backend = backend_from_env(tmp_path, seed=3)
    assert backend.base_urls == ["http://a:8000", "http://b:8000"] and backend.max_retries == 2
    monkeypatch.setenv("VLLM_MAX_RETRIES", "-1")
    with pytest.raises(InputError, match="VLLM_MAX_RETRIES='-1': must be an integer >= 0"):
        backend_from_env(tmp_path, seed=0)
    monkeypatch.setenv("VLLM_MAX_RETRIES", "many")
    with pytest.raises(InputError, match="VLLM_MAX_RETRIES='many'"):
        backend_from_env(tmp_path, seed=0)
    with pytest.raises(ValueError, match="http://"):
        VLLMBackend(["localhost:8000"], "m", adapter_dir=tmp_path)


# ------------------------------------------------------------------------------------------------
# End to end: `python -m train` with rollouts from the stub
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~5 s: end to end through a subprocess
def test_grpo_iterations_through_python_m_train_sample_from_the_stub(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    # Vowel and consonant tokens, so rewards differ inside each group and every iteration updates.
    choices = [tokenizer.convert_tokens_to_ids(t) for t in ("a", "e", "x", "t")]
    assert tokenizer.unk_token_id not in choices
    server = StubVLLM(choices=choices)
    out = tmp_path / "run"
    env = {**os.environ, "TRACE_GAMES_DIRS": str(REPO / "tests" / "games"), "PYTHONPATH": str(REPO),
           "VLLM_BASE_URLS": server.url, "VLLM_MODEL": BASE, "VLLM_RETRY_BACKOFF": "0.01"}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "train", "--game", "capability_letter_density", "--model", str(tiny_model_dir),
             "--iterations", "2", "--groups_per_iteration", "2", "--group_size", "4", "--lora_r", "4",
             "--learning_rate", "1e-2", "--max_episode_tokens", "256", "--output_dir", str(out)],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=240,
        )
    finally:
        server.close()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backend VLLMBackend" in result.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2] and all(m["skipped_update"] == 0.0 for m in metrics)

    models = [body["model"] for body in server.completions()]
    assert len(models) == 2 * 2 * 4  # one request per episode (one turn each)
    first, second = models[:8], models[8:]
    assert set(first) == {BASE}  # iteration 1: the zero LoRA, i.e. the base model
    (v1,) = set(second)
    assert v1.endswith("-v1")
    loads = [body["lora_name"] for path, body in server.requests if path == "/v1/load_lora_adapter"]
    unloads = [body["lora_name"] for path, body in server.requests if path == "/v1/unload_lora_adapter"]
    assert loads == [v1, v1.removesuffix("-v1") + "-v2"]
    assert unloads == loads  # v1 after v2 was loaded; v2 at close
    assert not server.loaded
    # the adapter loaded last is the one the run saved
    final = hashlib.sha256((out / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert server.loaded_weights[loads[-1]] == final
    assert [p.name for p in (out / "vllm_adapters").iterdir()] == [loads[-1]]


# ------------------------------------------------------------------------------------------------
# The trainer with a vLLM backend: old log-probs from one source, processed log-probs checked at start
# ------------------------------------------------------------------------------------------------
def _letter_trainer(tiny_model_dir: Path, tmp_path: Path, server: StubVLLM, **overrides: str):
    """An in-process GRPOTrainer on the letter game whose rollouts come from `server`."""
    import game_registry
    from train.config import load_config
    from train.grpo import GRPOTrainer
    from train.policy import load_base_model

    game_registry._import_game_file(REPO / "tests" / "games" / "capability_letter_density_game.py")
    spec = game_registry.get_game("capability_letter_density")
    config = load_config(None, {"iterations": "1", "groups_per_iteration": "2", "group_size": "4", "lora_r": "4",
                                "learning_rate": "1e-2", "max_episode_tokens": "256", "save_rollouts": "false",
                                **overrides},
                         game=spec.name, model=str(tiny_model_dir), output_dir=str(tmp_path / "run"))
    torch.manual_seed(0)
    base, tokenizer = load_base_model(config.model)
    policy = LoraPolicy.create(base, r=4, alpha=8, dropout=0.0, target_modules=config.lora_target_modules)
    backend = _backend([server.url], tmp_path, seed=3)
    return GRPOTrainer(config, spec, policy, tokenizer, backend), tokenizer


def test_with_a_vllm_backend_every_old_logprob_is_the_trainers(tmp_path, tiny_model_dir):
    # The stub reports -0.5 for every token, far from the tiny model's log-probs: kept as old log-probs (as
    # they were for non-hinted samples), the step-0 ratio would not be 1 and clipping would act on the gap.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    server = StubVLLM(choices=[tokenizer.convert_tokens_to_ids(t) for t in ("a", "e", "x", "t")])
    try:
        trainer, _ = _letter_trainer(tiny_model_dir, tmp_path, server)
        metrics = trainer.run()
    finally:
        server.close()
    assert metrics["skipped_update"] == 0.0
    assert metrics["approx_kl"] < 1e-6 and metrics["clip_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["sampler_kl"] > 0.1  # the stub's numbers are logged as a diagnostic, not trained on


@pytest.mark.parametrize("processed", [True, False])
def test_a_server_that_returns_raw_logprobs_at_temperature_07_stops_the_run(tmp_path, tiny_model_dir, processed):
    from train.logprobs import token_logprobs

    server = StubVLLM(choices=[11, 12, 13])
    try:
        trainer, _ = _letter_trainer(tiny_model_dir, tmp_path, server, temperature="0.7")
        model = trainer.policy.model

        def logprobs(prompt: list[int], ids: list[int], temperature: float) -> list[float]:
            # what vLLM reports: after temperature with processed_logprobs, of the raw logits by default
            full = torch.tensor([prompt + ids])
            with torch.no_grad():
                values = token_logprobs(model, full, torch.ones_like(full),
                                        temperature=temperature if processed else 1.0)
            return values[0, len(prompt):].tolist()

        server.logprob_fn = logprobs
        if processed:
            trainer.check_sampler_logprobs()
        else:
            with pytest.raises(InputError, match="--logprobs-mode processed_logprobs"):
                trainer.run()
            assert not (tmp_path / "run").exists()  # stopped before writing anything
        assert len(server.completions()) == 1 and trainer.backend.generate_calls == 0  # seeds untouched
    finally:
        server.close()


@pytest.mark.slow  # ~5 s: a collection run against the vLLM stub
def test_collect_rollouts_with_a_server_loads_only_the_tokenizer(tmp_path, tiny_model_dir):
    """With VLLM_BASE_URLS set, the calibration collector renders prompts here and samples on the server: a
    model folder without weights (only the tokenizer) must be enough."""
    import shutil

    tokenizer_only = tmp_path / "tokenizer-only"
    shutil.copytree(tiny_model_dir, tokenizer_only)
    for weights in [*tokenizer_only.glob("*.safetensors"), *tokenizer_only.glob("*.bin")]:
        weights.unlink()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    server = StubVLLM(choices=[tokenizer.convert_tokens_to_ids(t) for t in ("a", "e", "x", "t")])
    out = tmp_path / "rollouts.json"
    env = {**os.environ, "TRACE_GAMES_DIRS": str(REPO / "tests" / "games"), "PYTHONPATH": str(REPO),
           "VLLM_BASE_URLS": server.url, "VLLM_MODEL": BASE, "VLLM_RETRY_BACKOFF": "0.01"}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "train.collect_rollouts", "--game", "capability_letter_density", "--model",
             str(tokenizer_only), "--seeds", "2", "--samples", "2", "--temperature", "1.0",
             "--max-episode-tokens", "256", "--out", str(out)],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    finally:
        server.close()
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(json.loads(out.read_text())["simulations"]) == 4
    assert len(server.completions()) == 4
