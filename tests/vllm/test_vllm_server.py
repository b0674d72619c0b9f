"""VLLMBackend against a REAL vLLM server (see conftest.py; `make test-vllm` starts one on a tiny model).

What the stub tests (tests/test_vllm_backend.py) cannot show: that vLLM really returns the sampled ids and
the log-probs the trainer computes (temperature included), that per-prompt seeds give distinct samples,
that a runtime-loaded LoRA is the adapter PEFT trained and changes the outputs, that two GRPO iterations
run through `python -m train` with rollouts from the server, and that guided JSON decoding works there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from train.backends import SamplingParams
from train.episodes import ChatTokenizer
from train.policy import LoraPolicy, load_base_model
from train.vllm_backend import VLLMBackend, VLLMError

REPO = Path(__file__).resolve().parents[2]
# float32 on both sides; vLLM's CPU kernels sum in a different order than PyTorch's.
LOGPROB_ATOL = 1e-3


def _post(url: str, payload: dict[str, Any] | None = None, timeout: float = 120) -> tuple[int, str]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _served_names(url: str) -> list[str]:
    status, body = _post(f"{url}/v1/models")
    assert status == 200, body
    return [entry["id"] for entry in json.loads(body)["data"]]


@pytest.fixture(scope="module")
def base(real_server):
    model, tokenizer = load_base_model(str(real_server.model_dir))
    model.eval()
    return model, tokenizer


def _prompt(tokenizer: Any, text: str) -> list[int]:
    chat = ChatTokenizer(tokenizer)
    messages = [{"role": "system", "content": "Answer with vowels."}, {"role": "user", "content": text}]
    return chat.prompt_ids(messages, [])


@torch.no_grad()
def _reference_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """log softmax(logits / T) of each completion token, computed in process. [len(completion)]"""
    ids = torch.tensor([prompt + completion])  # [1, P + C]
    logits = model(input_ids=ids).logits[0, :-1].float() / temperature  # [P + C - 1, V]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)[len(prompt) - 1 :]


def _backend(real_server, tmp_path: Path, **kwargs: Any) -> VLLMBackend:
    kwargs = {"max_retries": 1, "backoff": 0.5, "timeout": 120, **kwargs}
    return VLLMBackend([real_server.url], real_server.model, adapter_dir=tmp_path / "adapters", **kwargs)


# ------------------------------------------------------------------------------------------------
def test_sampled_ids_and_logprobs_are_those_of_the_model_at_each_temperature(real_server, base, tmp_path):
    model, tokenizer = base
    chat = ChatTokenizer(tokenizer)
    prompt = _prompt(tokenizer, "Say: apple echo idea")
    for temperature in (1.0, 0.7):
        params = SamplingParams(max_new_tokens=24, temperature=temperature, stop_token_ids=chat.stop_token_ids)
        completions = _backend(real_server, tmp_path, seed=1).generate([prompt] * 6, params)
        # one seed per prompt: the six samples of one prompt (a GRPO group) differ
        assert len({tuple(c.token_ids) for c in completions}) > 1
        for completion in completions:
            assert 0 < len(completion.token_ids) <= 24 and len(completion.logprobs) == len(completion.token_ids)
            reference = _reference_logprobs(model, prompt, completion.token_ids, temperature)
            served = torch.tensor(completion.logprobs)
            assert torch.allclose(served, reference, atol=LOGPROB_ATOL), (
                f"T={temperature}: max |vLLM - in-process| = {(served - reference).abs().max():.2e}; a gap that "
                "grows with |1 - T| means the server lacks --logprobs-mode processed_logprobs"
            )
        # the same backend seed asks for the same samples (a resumed run replays its rollouts)
        again = _backend(real_server, tmp_path, seed=1).generate([prompt] * 6, params)
        assert [c.token_ids for c in again] == [c.token_ids for c in completions]


def test_a_stop_token_ends_the_completion_and_is_returned(real_server, base, tmp_path):
    _, tokenizer = base
    prompt = _prompt(tokenizer, "Say: oboe")
    free = _backend(real_server, tmp_path, seed=5).generate([prompt], SamplingParams(max_new_tokens=6))[0]
    # the same seed samples the same tokens: make the third one (or the last, if fewer) a stop token
    stop_id = free.token_ids[min(2, len(free.token_ids) - 1)]
    stopped = _backend(real_server, tmp_path, seed=5).generate(
        [prompt], SamplingParams(max_new_tokens=6, stop_token_ids=(stop_id,))
    )[0]
    first_stop = free.token_ids.index(stop_id) + 1
    assert stopped.token_ids == free.token_ids[:first_stop] and stopped.finish_reason == "stop"
    assert free.finish_reason == "length" or free.token_ids[-1] in ChatTokenizer(tokenizer).stop_token_ids


def test_a_request_the_server_rejects_fails_at_once_with_its_message(real_server, base, tmp_path):
    _, tokenizer = base
    backend = _backend(real_server, tmp_path, max_retries=3, backoff=5.0)  # a retry would take > 5 s
    backend.check_servers()
    backend.max_model_len.clear()  # as for a server that lists no context length: max_tokens goes out as asked
    started = time.perf_counter()
    with pytest.raises(VLLMError, match="HTTP 400"):
        backend.generate([_prompt(tokenizer, "Say: unit")], SamplingParams(max_new_tokens=100_000))
    assert time.perf_counter() - started < 5


def test_max_tokens_past_the_servers_context_are_capped_to_the_room_left(real_server, base, tmp_path):
    # Before: a batched turn asked every episode for the largest budget, vLLM refused it (400) and training stopped.
    _, tokenizer = base
    backend = _backend(real_server, tmp_path)
    prompt = _prompt(tokenizer, "Say: unit")
    (completion,) = backend.generate([prompt], SamplingParams(max_new_tokens=100_000))
    limit = backend.max_model_len[backend.base_urls[0]]  # the server's max_model_len, from /v1/models
    assert 0 < limit < 100_000 and len(prompt) + len(completion.token_ids) <= limit


def test_lora_endpoint_answers_match_what_the_backend_expects(real_server, tmp_path):
    """The backend treats 'already been loaded' after a retried load as success and 404 on unload as done."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(real_server.model_dir)),
                           LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    path = tmp_path / "adapter"
    model.save_pretrained(str(path))
    name = f"contract-{uuid.uuid4().hex[:8]}"
    url = real_server.url
    assert _post(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})[0] == 200
    status, body = _post(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    assert status == 400 and "already been loaded" in body
    assert _post(f"{url}/v1/unload_lora_adapter", {"lora_name": name})[0] == 200
    assert _post(f"{url}/v1/unload_lora_adapter", {"lora_name": name})[0] == 404
    status, body = _post(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(tmp_path / "none")})
    assert status == 404 and json.loads(body) != {"detail": "Not Found"}, body  # not the missing-route 404
    assert name not in _served_names(url)


def test_an_adapter_above_max_lora_rank_fails_at_once_naming_the_limit(real_server, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(real_server.model_dir)),
                           LoraConfig(r=1024, lora_alpha=1024, target_modules=["q_proj"]))  # above any --max-lora-rank
    backend = _backend(real_server, tmp_path, max_retries=3, backoff=5.0)
    started = time.perf_counter()
    with pytest.raises(VLLMError, match="max_lora_rank"):
        backend.sync_weights(LoraPolicy(model), 1)
    assert time.perf_counter() - started < 5


def test_two_grpo_iterations_through_the_server_and_the_served_adapter_changes_outputs(real_server, base, tmp_path):
    model, tokenizer = base
    out = tmp_path / "run"
    env = {**os.environ, "TRACE_GAMES_DIRS": str(REPO / "tests" / "games"), "PYTHONPATH": str(REPO),
           "VLLM_BASE_URLS": real_server.url, "VLLM_MODEL": real_server.model}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "train", "--game", "capability_letter_density", "--model", str(real_server.model_dir),
         "--iterations", "2", "--groups_per_iteration", "4", "--group_size", "4", "--lora_r", "8",
         "--learning_rate", "5e-2", "--max_episode_tokens", "256", "--output_dir", str(out)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-4000:]
    assert "backend VLLMBackend" in result.stdout
    print(f"two GRPO iterations through vLLM: {seconds:.1f} s")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2]
    assert all(m["n_episodes"] == 16 and m["gen_tokens"] > 0 and m["skipped_update"] == 0.0 for m in metrics)
    # The trainer re-scores every vLLM sample, so the first PPO ratio is 1 by construction; `sampler_kl`
    # (k3 KL between vLLM's sampling log-probs and the trainer's) is small only if iteration 2 sampled from
    # adapter v1, the weights the trainer held, and vLLM's log-probs are right (an adapter one lr 5e-2 step
    # stale gives ~2e-2, measured in process on the test's tiny model).
    for m in metrics:
        assert abs(m["ratio_mean"] - 1.0) < 1e-3, m
        assert m["sampler_kl"] < 1e-3, m
    adapters = sorted(p.name for p in (out / "vllm_adapters").iterdir())
    assert len(adapters) == 1 and adapters[0].endswith("-v2"), adapters  # v1's files deleted after unloading
    prefix = adapters[0].removesuffix("-v2")
    assert not [name for name in _served_names(real_server.url) if name.startswith(prefix)]  # both unloaded

    # Serve the trained adapter and compare with PEFT in process: vLLM applies it, and it moved the outputs.
    from peft import PeftModel

    trained = PeftModel.from_pretrained(model, str(out)).eval()
    backend = _backend(real_server, tmp_path, seed=11, adapter_prefix=f"check-{uuid.uuid4().hex[:8]}")
    backend.sync_weights(LoraPolicy(trained), 1)
    adapter_name = backend.served_model
    assert adapter_name in _served_names(real_server.url)
    prompt = _prompt(tokenizer, "Say: idea unit")
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    try:
        completions = backend.generate([prompt] * 4, params)
        greedy_adapter = backend.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0.0))[0]
    finally:
        backend.close()
    shifts = []
    for completion in completions:
        served = torch.tensor(completion.logprobs)
        with_adapter = _reference_logprobs(trained, prompt, completion.token_ids, 1.0)
        with trained.disable_adapter():
            without = _reference_logprobs(trained, prompt, completion.token_ids, 1.0)
        assert torch.allclose(served, with_adapter, atol=LOGPROB_ATOL), (served - with_adapter).abs().max()
        shifts.append(float((with_adapter - without).abs().max()))
    assert max(shifts) > 50 * LOGPROB_ATOL, f"the adapter barely moved the log-probs: {shifts}"
    base_backend = _backend(real_server, tmp_path)
    greedy_base = base_backend.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0.0))[0]
    print(f"adapter log-prob shift (max per sample): {[f'{s:.3f}' for s in shifts]}; greedy tokens "
          f"{'differ' if greedy_base.token_ids != greedy_adapter.token_ids else 'are the same'} with the adapter")
    assert adapter_name not in _served_names(real_server.url)  # close() unloaded it


def test_guided_json_decoding(real_server, base):
    """Structured output for the labeling step: `response_format` (chat and completions) and vLLM's own
    `structured_outputs` field both constrain the output. (vLLM 0.32 silently ignores the old `guided_json`.)"""
    schema = {
        "type": "object",
        "properties": {"label": {"type": "string", "enum": ["pass", "fail"]}, "score": {"type": "integer"}},
        "required": ["label", "score"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "label", "schema": schema}}
    common = {"model": real_server.model, "max_tokens": 80, "temperature": 1.0, "seed": 0}
    requests = [
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": "Label it."}], "response_format": response_format}),
        ("/v1/completions", {"prompt": "Label: ", "response_format": response_format}),
        ("/v1/completions", {"prompt": "Label: ", "structured_outputs": {"json": schema}}),
    ]
    for path, payload in requests:
        status, body = _post(f"{real_server.url}{path}", {**common, **payload})
        assert status == 200, body
        choice = json.loads(body)["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        value = json.loads(text)  # a random-init model writes valid JSON only because decoding is constrained
        assert set(value) == {"label", "score"} and value["label"] in ("pass", "fail"), (path, text)
        assert isinstance(value["score"], int), (path, text)
