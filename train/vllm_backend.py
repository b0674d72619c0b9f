"""Rollouts from vLLM servers (`VLLM_BASE_URLS`, `VLLM_MODEL`), with runtime LoRA loading.

- Prompts are token ids rendered with the chat template on the client, sent to `/v1/completions`, so the
  server's chat template and tool-call parser are never involved and the ids we train on are exactly the
  ids it continued. `return_tokens_as_token_ids` gives the sampled ids back (`token_id:N`) with their
  log-probs.
- One HTTP request per prompt, each with its own seed: a batched request shares one seed across its
  prompts, and the samples of a GRPO group (identical prompts) would then all be identical. The requests
  run concurrently; vLLM batches them on the server. The seeds derive from (seed, call, prompt index), so
  a resumed run asks for the same samples.
- Every sampling knob is sent explicitly (top_p 1, top_k off, no penalties): otherwise vLLM fills them from
  the model's generation_config.json (Qwen3 ships top_k=20, top_p=0.95), and the sampled distribution
  would no longer be the softmax(logits / temperature) that the trainer scores.
- The trainer re-scores every sequence sampled here (`logprobs_match_trainer` is False): vLLM computes in
  bf16 with other kernels, so its log-probs differ from the trainer's by numerical noise, and a batch whose
  old log-probs came from two sources (re-scored hinted samples, vLLM's for the rest) would clip on noise
  and treat the two halves differently. The reference trainer re-scores every sample too. vLLM's log-probs
  remain a diagnostic (`sampler_kl` in the metrics).
- The server must run with `--logprobs-mode processed_logprobs` when temperature != 1: vLLM's default
  returns log-probs of the raw logits, before temperature scaling. The trainer checks this at start
  (`probe`: one completion per server, scored by the trainer at the temperature and at 1) and stops with
  exit 2 when a server returns raw log-probs.
- Before the first update the LoRA is zero (B = 0), so sampling uses the base model. After each update
  the adapter is saved and loaded with `/v1/load_lora_adapter` under a fresh name per version
  (`<prefix>-v<N>`, the prefix unique to this backend): reloading under one name can serve stale
  prefix-cache blocks. The previous adapter is then unloaded and its files deleted. A 404 on the load
  endpoint means the server does not allow runtime updates (VLLM_ALLOW_RUNTIME_LORA_UPDATING).
- Timeouts, connection errors, 408, 429 and 5xx are retried with exponential backoff; when retries run
  out the backend raises `VLLMError`. A failed request never becomes an empty completion or a zero reward.
- Several servers (comma-separated URLs) share the prompts: each gets a contiguous slice, so the samples
  of one group land on one server and share its prefix cache. Every server gets every adapter.
- A request asks for at most the room its server's context leaves after the prompt (`max_model_len` from
  /v1/models, where the server gives it): one batched turn asks every episode for the largest remaining budget
  (train/episodes.py cuts each completion to its own), and vLLM refuses (400) prompt + max_tokens past its
  context. A prompt that fills the context is a VLLMError naming --max-model-len and max_episode_tokens.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from common.validation import InputError, check_url, env_number
from train.backends import Completion, RolloutBackend, SamplingParams
from train.distributed import world
from train.policy import Policy

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# What a request can raise when the server is down, restarting, or too slow: all worth retrying.
TRANSIENT_ERRORS = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, OSError)
RUNTIME_LORA_HINT = (
    "start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment and --enable-lora"
)


def _from_rank0(value: Any, world: int) -> Any:
    """Rank 0's `value` on every rank (a no-op without torchrun)."""
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class VLLMError(RuntimeError):
    """A vLLM request failed for good (after retries, or with a status that retrying cannot fix)."""


def _http(url: str, payload: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
    """(status, body) of a POST (payload given) or GET; HTTP error statuses are returned, not raised."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="GET" if payload is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def request_seed(seed: int, call: int, index: int) -> int:
    """Sampling seed of prompt `index` in the `call`-th generate call: distinct, reproducible, 31 bits."""
    digest = hashlib.blake2b(f"{seed}/{call}/{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


# vLLM's sampling knobs at their neutral values, sent with every request: the distribution is softmax(logits /
# temperature) and nothing else. Left out, vLLM fills them from the model's generation_config.json (Qwen3: top_k
# 20, top_p 0.95), and the server would sample another distribution than the trainer scores.
NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0}


class VLLMBackend(RolloutBackend):
    """Samples from one or more vLLM OpenAI-protocol servers; the policy's LoRA is loaded at runtime."""

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        *,
        adapter_dir: str | Path,
        adapter_prefix: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_concurrent_requests: int = 64,
        seed: int = 0,
    ):
        if not base_urls:
            raise ValueError("VLLMBackend needs at least one server URL (VLLM_BASE_URLS=http://host:8000)")
        bad = [url for url in base_urls if not url.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"vLLM server URLs must start with http:// or https://, got {bad}")
        if not model:
            raise ValueError("VLLMBackend needs the served base model name (VLLM_MODEL)")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff < 0:
            raise ValueError(f"backoff must be >= 0 seconds, got {backoff}")
        if max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {max_concurrent_requests}")
        self.base_urls = [url.rstrip("/").removesuffix("/v1") for url in base_urls]
        self.base_model = model
        self.served_model = model  # the name requests use: the base model, then the latest adapter
        self.adapter_dir = Path(adapter_dir)
        # Unique per backend: two runs (or two torchrun ranks) on one server never share an adapter name,
        # and an adapter that a crashed run left loaded is never mistaken for ours.
        self.adapter_prefix = adapter_prefix or f"trace-{uuid.uuid4().hex[:8]}"
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.max_concurrent_requests = max_concurrent_requests
        self.seed = seed
        self.generate_calls = 0  # part of the checkpointed state: it picks the next seeds
        self.used_names: set[str] = set()  # adapter names this backend has loaded: never loaded twice
        self.max_model_len: dict[str, int] = {}  # server -> its context length (prompt + new tokens), where listed
        self._checked_servers = False

    # -- HTTP -----------------------------------------------------------------------------------
    def _request(
        self, base_url: str, path: str, payload: dict[str, Any] | None = None, *, retries: int | None = None,
        retry_status: frozenset[int] = RETRY_STATUS,
    ) -> tuple[int, str]:
        """(status, body) of the first answer that is not worth retrying; VLLMError when retries run out."""
        url = f"{base_url}{path}"
        retries = self.max_retries if retries is None else retries
        last_error = ""
        for attempt in range(retries + 1):
            try:
                status, body = _http(url, payload, self.timeout)
            except TRANSIENT_ERRORS as err:
                last_error = f"{type(err).__name__}: {err}; is the vLLM server running?"
            else:
                if status not in retry_status:
                    return status, body
                last_error = f"HTTP {status}: {body[:300]}"
            if attempt < retries:
                time.sleep(self.backoff * (2**attempt))
        raise VLLMError(f"{url}: failed after {retries + 1} attempts ({last_error})")

    def _post_ok(self, base_url: str, path: str, payload: dict[str, Any]) -> str:
        status, body = self._request(base_url, path, payload)
        if not 200 <= status < 300:
            raise VLLMError(f"{base_url}{path}: HTTP {status}: {body[:500]}")
        return body

    def check_servers(self) -> None:
        """Fail early, naming the server, when one does not serve the base model `VLLM_MODEL`."""
        for base_url in self.base_urls:
            status, body = self._request(base_url, "/v1/models")
            if status != 200:
                raise VLLMError(f"{base_url}/v1/models: HTTP {status}: {body[:300]}")
            try:
                entries = json.loads(body)["data"]
                served = [entry["id"] for entry in entries]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise VLLMError(f"{base_url}/v1/models: not an OpenAI model list ({err}): {body[:200]}") from None
            if self.base_model not in served:
                raise VLLMError(f"{base_url} serves {served}, not VLLM_MODEL={self.base_model!r}; set VLLM_MODEL to "
                                "the server's --served-model-name (default: its --model)")
            # vLLM gives each base model's max_model_len (adapters loaded later share it); another server may not.
            length = entries[served.index(self.base_model)].get("max_model_len")
            if isinstance(length, int) and not isinstance(length, bool) and length > 0:
                self.max_model_len[base_url] = length
        self._checked_servers = True

    # -- RolloutBackend -------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order; raises VLLMError rather than return a partial batch."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if not self._checked_servers:
            self.check_servers()
        call = self.generate_calls
        self.generate_calls += 1
        n_servers = len(self.base_urls)
        with ThreadPoolExecutor(max_workers=min(len(prompts), self.max_concurrent_requests)) as pool:
            futures: list[Future[Completion]] = [
                pool.submit(
                    self._complete, self.base_urls[index * n_servers // len(prompts)], list(prompt), params,
                    request_seed(self.seed, call, index),
                )
                for index, prompt in enumerate(prompts)
            ]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:  # a dead server: the prompts still queued are not sent
                    future.cancel()
                raise

    def probe(self, prompt: Sequence[int], params: SamplingParams) -> list[tuple[str, Completion]]:
        """One completion of `prompt` from each server, with fixed seeds outside the sampling sequence (the
        checkpointed `generate_calls` does not move, so a resumed run still asks for the same samples)."""
        if not self._checked_servers:
            self.check_servers()
        return [(base_url, self._complete(base_url, list(prompt), params, request_seed(self.seed, -1, index)))
                for index, base_url in enumerate(self.base_urls)]

    def max_tokens_for(self, base_url: str, prompt: list[int], params: SamplingParams) -> int:
        """`params.max_new_tokens`, or the room `base_url`'s context leaves after `prompt` when that is less;
        VLLMError when there is none (the server would refuse the request)."""
        limit = self.max_model_len.get(base_url)
        if limit is None:
            return params.max_new_tokens
        room = limit - len(prompt)
        if room < 1:
            raise VLLMError(f"{base_url}: a prompt of {len(prompt)} tokens leaves no room to generate in the server's "
                            f"context of {limit} tokens (max_model_len); serve the model with a larger --max-model-len "
                            "(at least max_episode_tokens) or lower max_episode_tokens")
        return min(params.max_new_tokens, room)

    def sampling_payload(self, prompt: list[int], params: SamplingParams, seed: int,
                         max_tokens: int | None = None) -> dict[str, Any]:
        """The `/v1/completions` body for one prompt (`max_tokens`: default `params.max_new_tokens`)."""
        return {
            "model": self.served_model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens if max_tokens is None else max_tokens,
            "temperature": params.temperature,
            **NEUTRAL_SAMPLING,
            "n": 1,
            "seed": seed,
            "logprobs": 0,  # the sampled token's log-prob only
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "return_tokens_as_token_ids": True,
        }

    def _complete(self, base_url: str, prompt: list[int], params: SamplingParams, seed: int) -> Completion:
        max_tokens = self.max_tokens_for(base_url, prompt, params)
        body = self._post_ok(base_url, "/v1/completions", self.sampling_payload(prompt, params, seed, max_tokens))
        try:
            choices = json.loads(body)["choices"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise VLLMError(f"{base_url}/v1/completions: not an OpenAI completion: {body[:300]}") from None
        if len(choices) != 1:
            raise VLLMError(f"{base_url}/v1/completions returned {len(choices)} choices for one prompt")
        completion = self.parse_choice(choices[0], base_url)
        if len(completion.token_ids) > max_tokens:
            raise VLLMError(f"{base_url}: {len(completion.token_ids)} tokens for max_tokens={max_tokens}")
        return completion

    @staticmethod
    def parse_choice(choice: dict[str, Any], base_url: str) -> Completion:
        """Completion from one OpenAI completion choice with `token_id:N` tokens and their log-probs."""
        logprobs = choice.get("logprobs") or {}
        tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
        if tokens is None or values is None:
            raise VLLMError(f"{base_url}: completion without token logprobs; is this a vLLM server?")
        if len(tokens) != len(values):
            raise VLLMError(f"{base_url}: {len(tokens)} tokens but {len(values)} log-probs")
        ids = []
        for token in tokens:
            if not isinstance(token, str) or not token.startswith("token_id:"):
                raise VLLMError(f"{base_url}: token {token!r} is not 'token_id:N'; the server ignored "
                                "return_tokens_as_token_ids (vLLM >= 0.6 needed)")
            ids.append(int(token.removeprefix("token_id:")))
        if any(value is None for value in values):
            raise VLLMError(f"{base_url}: a sampled token came back without a log-prob")
        reason = "stop" if choice.get("finish_reason") == "stop" else "length"
        return Completion(ids, [float(v) for v in values], reason)

    def sync_weights(self, policy: Policy, version: int) -> None:
        """Save the adapter as version `version`, load it on every server, unload the previous one.

        Under torchrun every rank calls this (saving is a collective under FSDP); rank 0 writes the files
        and talks to the servers, then tells the other ranks the new name (or the error).
        """
        if version == 0 and self.served_model == self.base_model:
            return  # the fresh LoRA is zero: the base model samples the same distribution
        rank, world_size = world()
        name = f"{self.adapter_prefix}-v{version}"
        if name in self.used_names:  # the same version twice (e.g. resumed in process): still a fresh name
            name = f"{name}-{len(self.used_names)}"
        name = _from_rank0(name, world_size)
        path = (self.adapter_dir / name).resolve()
        policy.save(path)
        error = None
        if rank == 0:
            try:
                for base_url in self.base_urls:
                    self._load_adapter(base_url, name, path)
                previous = self.served_model
                if previous in self.used_names:  # ours (not a base model or an adapter someone else loaded)
                    for base_url in self.base_urls:
                        self._unload_adapter(base_url, previous, retries=None)
                    shutil.rmtree(self.adapter_dir / previous, ignore_errors=True)
            except VLLMError as err:
                error = str(err)
        error = _from_rank0(error, world_size)
        if error is not None:
            raise VLLMError(error)
        self.used_names.add(name)
        self.served_model = name

    def _load_adapter(self, base_url: str, name: str, path: Path) -> None:
        url = f"{base_url}/v1/load_lora_adapter"
        # vLLM answers 500 for every adapter it cannot load (rank above --max-lora-rank, unsupported
        # modules): retrying would only delay that message.
        status, body = self._request(base_url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)},
                                     retry_status=RETRY_STATUS - {500})
        if 200 <= status < 300:
            return
        if status == 400 and "already been loaded" in body:
            return  # an earlier attempt of ours got through before timing out: names are never reused
        if status == 404:
            if _route_missing(body):
                raise VLLMError(f"{url} returned 404 (no such endpoint): {RUNTIME_LORA_HINT}")
            raise VLLMError(f"{url} returned 404 ({body[:300]}): the server could not read the adapter at {path}; "
                            "trainer and servers must share that filesystem path. (If the endpoint itself is "
                            f"missing: {RUNTIME_LORA_HINT}.)")
        raise VLLMError(f"{url}: HTTP {status}: {body[:500]}")

    def _unload_adapter(self, base_url: str, name: str, retries: int | None) -> None:
        status, body = self._request(base_url, "/v1/unload_lora_adapter", {"lora_name": name}, retries=retries)
        if not (200 <= status < 300 or status == 404):  # 404: not loaded (any more), which is the goal
            raise VLLMError(f"{base_url}/v1/unload_lora_adapter: HTTP {status}: {body[:500]}")

    def state_dict(self) -> dict[str, Any]:
        return {"generate_calls": torch.tensor([self.generate_calls], dtype=torch.long)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "generate_calls" in state:
            self.generate_calls = int(state["generate_calls"][0])

    def close(self) -> None:
        """Unload the adapter this backend loaded last (one attempt per server: at shutdown the server may
        be gone). An adapter name set from outside (`served_model = ...`) is left loaded."""
        if self.served_model not in self.used_names or world()[0] != 0:
            return
        for base_url in self.base_urls:
            try:
                self._unload_adapter(base_url, self.served_model, retries=0)
            except VLLMError:
                pass  # the adapter dies with the server; its files stay in adapter_dir
        self.served_model = self.base_model


def _route_missing(body: str) -> bool:
    """FastAPI's answer for an unregistered route: {"detail": "Not Found"}."""
    try:
        return json.loads(body) == {"detail": "Not Found"}
    except json.JSONDecodeError:
        return not body.strip()


@dataclass(frozen=True)
class VLLMSettings:
    """The vLLM servers to sample from, read and checked from the environment (`vllm_settings_from_env`)."""

    base_urls: tuple[str, ...]
    model: str
    timeout: float = 600.0
    max_retries: int = 5
    backoff: float = 1.0
    max_concurrent_requests: int = 64

    def backend(self, adapter_dir: Path, seed: int) -> VLLMBackend:
        """The backend (no request is sent until the first rollout)."""
        return VLLMBackend(list(self.base_urls), self.model, adapter_dir=adapter_dir, seed=seed, timeout=self.timeout,
                           max_retries=self.max_retries, backoff=self.backoff,
                           max_concurrent_requests=self.max_concurrent_requests)


def vllm_settings_from_env() -> VLLMSettings | None:
    """VLLMSettings when VLLM_BASE_URLS is set, else None (use the in-process backend). Checks the format only (no
    request): InputError naming the variable and the fix for a URL without scheme or host, a missing VLLM_MODEL,
    or a VLLM_* number that is not one or out of range. Call it before the model loads.

    VLLM_BASE_URLS: comma-separated server URLs; VLLM_MODEL: the served base model name. Optional:
    VLLM_REQUEST_TIMEOUT (seconds, 600), VLLM_MAX_RETRIES (5), VLLM_RETRY_BACKOFF (seconds, 1; doubles
    per retry), VLLM_MAX_CONCURRENT_REQUESTS (64).
    """
    urls = [u.strip() for u in os.environ.get("VLLM_BASE_URLS", "").split(",") if u.strip()]
    if not urls:
        return None
    for url in urls:
        check_url(url, "VLLM_BASE_URLS")
    model = os.environ.get("VLLM_MODEL", "").strip()
    if not model:
        raise InputError("VLLM_BASE_URLS is set but VLLM_MODEL is not: set it to the served base model name")
    settings = VLLMSettings(
        tuple(urls), model,
        timeout=env_number("VLLM_REQUEST_TIMEOUT", float, VLLMSettings.timeout),
        max_retries=env_number("VLLM_MAX_RETRIES", int, VLLMSettings.max_retries),
        backoff=env_number("VLLM_RETRY_BACKOFF", float, VLLMSettings.backoff),
        max_concurrent_requests=env_number("VLLM_MAX_CONCURRENT_REQUESTS", int, VLLMSettings.max_concurrent_requests),
    )
    for name, ok, rule, default in (
        ("VLLM_REQUEST_TIMEOUT", math.isfinite(settings.timeout) and settings.timeout > 0,
         "a finite number of seconds > 0", VLLMSettings.timeout),
        ("VLLM_MAX_RETRIES", settings.max_retries >= 0, "an integer >= 0", VLLMSettings.max_retries),
        ("VLLM_RETRY_BACKOFF", math.isfinite(settings.backoff) and settings.backoff >= 0,
         "a finite number of seconds >= 0", VLLMSettings.backoff),
        ("VLLM_MAX_CONCURRENT_REQUESTS", settings.max_concurrent_requests >= 1, "an integer >= 1",
         VLLMSettings.max_concurrent_requests),
    ):
        if not ok:
            raise InputError(f"{name}={os.environ.get(name)!r}: must be {rule}; fix or unset it (default {default})")
    return settings


def backend_from_env(adapter_dir: Path, seed: int) -> VLLMBackend | None:
    """A VLLMBackend when VLLM_BASE_URLS is set, else None (use the in-process backend); the settings and their
    checks are `vllm_settings_from_env`'s."""
    settings = vllm_settings_from_env()
    if settings is None:
        return None
    try:
        return settings.backend(adapter_dir, seed)
    except ValueError as err:
        raise InputError(f"vLLM settings from the environment: {err}") from None
