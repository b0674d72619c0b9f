"""Model-backed agents that play tool-use games one conversation at a time (benchmarks/agents.py's `Agent`).

- `HFAgent(model_dir, adapter_dir=None, temperature=0.0, max_new_tokens=256)`: a local transformers
  causal LM (optionally with a PEFT adapter, or a routed model of Step 4: a moe_gate gate folder as
  `model_dir`, or as `adapter_dir` over the base in `model_dir`); the prompt is the tokenizer's chat
  template applied to the messages and tool schemas; generation stops at the tokenizer's eos or `<|im_end|>`.
  A routed model in trajectory/global mode decides once per episode: every turn's prompt is the whole
  conversation, and the model routes it from its first prompt (the rendered conversation through its first
  assistant header, i.e. the messages before the first assistant message with the generation prompt; encoded
  on its own so its tokens are the same on every turn), so turn k routes as turn 1 did.
- `VLLMAgent(base_url, model, tokenizer_dir)`: a vLLM (OpenAI-compatible) server's `/v1/completions`,
  with the chat template applied here on the client, so the server sees exactly the prompt an HFAgent
  would. Each turn samples with a seed derived from the episode's (`begin_episode`) and the turn, and, on a vLLM
  server (its model list says so), with the rollout backend's neutral top_p/top_k/penalties
  (train/vllm_backend.NEUTRAL_SAMPLING), as an hf: agent samples. Connection
  errors, timeouts and 5xx answers are retried with exponential backoff, then the call fails loudly; a key or a
  model the server refuses (401/403/404) is an InputError naming the flag to fix. Where the model list gives the
  context length (vLLM's `max_model_len`), each turn asks for at most the room left after the prompt (counted with
  the tokenizer), as an hf: agent caps its new tokens, and a conversation that fills it raises ContextFull.

`parse_agent_spec("hf:DIR[:ADAPTER]" | "vllm:URL")` builds one; `check_agent_spec` checks a spec before anything
is loaded; `any_agent` (`python -m train.play`) adds the environment's own players (expert, flawed:FLAW). Batched
backends for training live in train/backends.py; these agents handle one conversation at a time and aim at being
simple and correct.
"""
from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.agents import Agent, ContextFull, ServerError
from benchmarks.storefront import run as storefront_run
from common.chat_render import render_messages
from common.io import check_model_folder
from common.validation import InputError, check_url, env_number, nothing_listens
from game_registry import Game

IM_END = "<|im_end|>"
def _stop_strings(tokenizer: Any) -> list[str]:
    """End-of-turn markers: the tokenizer's eos and, when it knows it, `<|im_end|>`."""
    stops = [IM_END] if IM_END in tokenizer.get_vocab() else []
    if tokenizer.eos_token and tokenizer.eos_token not in stops:
        stops.append(tokenizer.eos_token)
    if not stops:
        raise ValueError("the tokenizer has neither an eos token nor <|im_end|>; generation could not stop")
    return stops


def _load_tokenizer(folder: str | Path) -> Any:
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: model/tokenizer folder not found")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if not tokenizer.chat_template:
        raise ValueError(f"{folder}: the tokenizer has no chat template; the agent needs one to build prompts")
    return tokenizer


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The generation prompt: chat template over messages and tools, ending with the assistant header (tools
    in Hermes style when the template cannot render them: common/chat_render.py, shared with the trainer)."""
    return render_messages(tokenizer, messages, tools, add_generation_prompt=True)


def _routed_gate_dir(model_dir: str, adapter_dir: str | None) -> str | None:
    """The gate folder (moe_gate's gate_config.json) among `hf:MODEL_DIR[:ADAPTER_DIR]`, if there is one."""
    for folder in (adapter_dir, model_dir):
        if folder and (Path(folder) / "gate_config.json").is_file():
            return folder
    return None


class HFAgent(Agent):
    """A local transformers model (+ optional PEFT adapter) generating one turn at a time."""

    def __init__(self, model_dir: str | Path, adapter_dir: str | Path | None = None, temperature: float = 0.0,
                 max_new_tokens: int = 256, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model_dir, self.adapter_dir = str(model_dir), (str(adapter_dir) if adapter_dir else None)
        self.temperature, self.max_new_tokens, self.device = temperature, max_new_tokens, device
        gate = _routed_gate_dir(self.model_dir, self.adapter_dir)
        if gate is not None:  # a routed model (Step 4): base + capability adapters + gate
            from moe_gate import load_capability_model
            from moe_gate.model_builder import read_gate_config

            base_dir = self.model_dir if gate == self.adapter_dir else read_gate_config(gate)["base_model"]["name_or_path"]
            self.tokenizer = _load_tokenizer(base_dir)
            model, _ = load_capability_model(gate, base_model=base_dir, device=device)
            self.model_dir, self.adapter_dir = base_dir, gate
        else:
            self.tokenizer = _load_tokenizer(model_dir)
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, local_files_only=True)
        if self.adapter_dir and gate is None:
            from peft import PeftModel

            if not Path(self.adapter_dir).is_dir():
                raise FileNotFoundError(f"{self.adapter_dir}: adapter folder not found")
            model = PeftModel.from_pretrained(model, self.adapter_dir)
        self.model = model.to(device).eval()
        # Routing once per episode (trajectory/global): the key is the conversation's first prompt, which the
        # model finds through the tokenizer's assistant header; "" for plain models and token routing.
        self._header_text = ""
        if gate is not None and model.mode != "token":
            from moe_gate.model_builder import assistant_header_ids, assistant_header_text

            self._header_text = assistant_header_text(self.tokenizer)
            model.set_assistant_header(assistant_header_ids(self.tokenizer))
        vocab = self.tokenizer.get_vocab()
        self.stop_ids = sorted({vocab[s] for s in _stop_strings(self.tokenizer) if s in vocab})
        config = getattr(model, "config", None)
        self.max_positions = int(getattr(config, "max_position_embeddings", None) or 10**9)
        self._torch = torch
        # What the weights are, not only where (as train.evaluate's journal records): a run's journal refuses to
        # continue with a model or adapter/gate folder trained again at the same path.
        from train.batch_journal import folder_fingerprint

        self.fingerprints = {"model": folder_fingerprint(self.model_dir),
                             "adapter": folder_fingerprint(self.adapter_dir)}

    def describe(self) -> dict[str, Any]:
        return {"implementation": "HFAgent", "model": self.model_dir, "adapter": self.adapter_dir,
                "fingerprints": self.fingerprints, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens}

    def begin_episode(self, game: Game, seed: int | None = None) -> None:
        if seed is not None and self.temperature > 0:  # reproducible sampling per episode
            self._torch.manual_seed(seed)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt's token ids. A model that routes once per episode gets the first prompt (through the first
        assistant header) encoded on its own and the rest after it, as the trainer's episodes are tokenized, so
        the first prompt's tokens, the routing key, are the same on every turn."""
        pieces = [prompt]
        if self._header_text:
            from moe_gate.model_builder import first_prompt_text

            first = first_prompt_text(prompt, self._header_text)
            pieces = [first, prompt[len(first) :]]
        return [i for piece in pieces if piece for i in self.tokenizer(piece, add_special_tokens=False)["input_ids"]]

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        from transformers import GenerationConfig

        torch = self._torch
        prompt = render_prompt(self.tokenizer, messages, tools)
        input_ids = torch.tensor([self.prompt_ids(prompt)], dtype=torch.long, device=self.device)  # [1, prompt_len]
        room = self.max_positions - input_ids.shape[1]  # positions past the model's context are not its trained ones
        if room < 1:
            raise ContextFull(f"the conversation is {input_ids.shape[1]} tokens; {self.model_dir}'s context is "
                              f"{self.max_positions}")
        sampling = self.temperature > 0
        config = GenerationConfig(
            max_new_tokens=min(self.max_new_tokens, room), do_sample=sampling,
            temperature=self.temperature if sampling else None, top_k=None, top_p=None,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0],
        )
        with torch.no_grad():
            output = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                         generation_config=config)  # [1, prompt_len + new]
        new_tokens = output[0, input_ids.shape[1]:].tolist()
        for index, token in enumerate(new_tokens):  # cut at the first end-of-turn token
            if token in self.stop_ids:
                new_tokens = new_tokens[:index]
                break
        return self.tokenizer.decode(new_tokens, skip_special_tokens=True)


class VLLMAgent(Agent):
    """A model served by vLLM (`vllm serve`), prompted through `/v1/completions`.

    A request that fails by connection, timeout, 429 or 5xx is retried `max_retries` times after bounded
    exponential backoff with full jitter (delay k: uniform in [0, min(max_delay, backoff x 2^k)], so clients that
    failed together do not come back together); then ServerError, which the runner records as an episode not
    scored. 401/403 (the key) and 404 (the model name or the URL) are not retried: InputError, at the first
    request. The defaults come from the environment as for the rollout backend: VLLM_REQUEST_TIMEOUT (120 s),
    VLLM_MAX_RETRIES (5), VLLM_RETRY_BACKOFF (1 s); 30 s is the longest wait.
    """

    MAX_DELAY_S = 30.0

    def __init__(self, base_url: str, model: str | None, tokenizer_dir: str | Path, temperature: float = 0.0,
                 max_new_tokens: int = 256, timeout_s: float | None = None, max_retries: int | None = None,
                 backoff_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
                 api_key: str | None = None, api_key_env: str | None = None) -> None:
        import openai

        from train.vllm_backend import NEUTRAL_SAMPLING, request_seed

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        timeout_s = env_number("VLLM_REQUEST_TIMEOUT", float, 120.0) if timeout_s is None else timeout_s
        self.max_retries = env_number("VLLM_MAX_RETRIES", int, 5) if max_retries is None else max_retries
        self.backoff_s = env_number("VLLM_RETRY_BACKOFF", float, 1.0) if backoff_s is None else backoff_s
        if not (timeout_s > 0 and self.max_retries >= 0 and self.backoff_s >= 0):
            raise ValueError(f"timeout must be > 0, retries >= 0 and backoff >= 0; got {timeout_s}, "
                             f"{self.max_retries}, {self.backoff_s}")
        self._jitter = random.Random()  # not the episode's seed: waiting never changes what is sampled
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.tokenizer = _load_tokenizer(tokenizer_dir)
        self.stop = _stop_strings(self.tokenizer)
        self._sleep = sleep
        self._openai = openai
        self._api_key_env = api_key_env  # the variable the key came from, named when the server refuses it
        self._request_seed = request_seed
        self._episode_seed: int | None = None
        self._turn = 0
        # Retries are ours (below), so that the policy is visible and testable.
        # `api_key`: the endpoint's key (a hosted model), read by the caller from the variable the user named;
        # without one, "EMPTY" (vLLM's convention), so the client never falls back to $OPENAI_API_KEY.
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                    max_retries=0)
        # The served models are listed first, with or without --model: a refused key or a wrong URL stops the run
        # before any episode, and the listing says whether the server is vLLM.
        served = self._with_retries(lambda: self.client.models.list().data, "list models")
        if not served and not model:
            raise RuntimeError(f"vLLM server {self.base_url} serves no model; pass the model name explicitly")
        self.model = model or served[0].id
        # Every sampling knob as the rollout backend sends it (top_p 1, top_k off, no penalties), else vLLM fills
        # them from the model's generation_config and samples another distribution than an hf: agent's. Another
        # OpenAI-compatible host (a hosted model) gets only the standard fields: it may refuse vLLM's.
        self.is_vllm = any(getattr(entry, "owned_by", None) == "vllm" for entry in served)
        self._sampling = dict(NEUTRAL_SAMPLING) if self.is_vllm else {}
        # Prompt + max_tokens past the server's context is refused (vLLM: HTTP 400); where the list gives it, each
        # turn asks for the room left instead. None (another host): max_new_tokens, and its refusal is ContextFull.
        self.max_model_len = served_context_length(served, self.model)

    def describe(self) -> dict[str, Any]:
        return {"implementation": "VLLMAgent", "base_url": self.base_url, "model": self.model,
                "temperature": self.temperature, "max_new_tokens": self.max_new_tokens,
                "sampling": self._sampling}

    def _with_retries(self, request: Callable[[], Any], what: str) -> Any:
        openai = self._openai
        last_error: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._sleep(self._jitter.uniform(0.0, min(self.MAX_DELAY_S, self.backoff_s * 2 ** (attempt - 1))))
            try:
                return request()
            except (openai.APIConnectionError, openai.APITimeoutError) as err:  # APITimeoutError subclasses it
                last_error = err
            except openai.APIStatusError as err:
                if err.status_code == 400 and "context length" in str(err.message).lower():  # vLLM's words
                    raise ContextFull(f"vLLM server {self.base_url}: {err.message}") from err
                if err.status_code in (401, 403, 404):  # every request would get the same: the command is wrong
                    raise self._refused(err.status_code, what, str(err.message)) from None
                if err.status_code < 500 and err.status_code != 429:  # a bad request will not get better
                    raise RuntimeError(f"vLLM server {self.base_url}: {what} failed with HTTP {err.status_code}: "
                                       f"{err.message}") from err
                last_error = err
        raise ServerError(f"vLLM server {self.base_url}: {what} failed after {self.max_retries + 1} attempts: "
                          f"{type(last_error).__name__}: {last_error}") from last_error

    def _refused(self, status: int, what: str, message: str) -> InputError:
        """The one-line error for an answer no retry changes: a key refused (401/403), a model or path unknown (404)."""
        server = f"vLLM server {self.base_url}: {what} failed with HTTP {status} ({' '.join(message.split())[:200]})"
        if status == 404:
            model = getattr(self, "model", None)  # not yet set while the served models are listed
            fix = "fix the URL (it usually ends in /v1)"
            return InputError(f"{server}; " + (f"it does not serve the model {model!r}: pass --model with a name "
                                                f"listed at {self.base_url}/models, or {fix}" if model else fix))
        fix = (f"check that ${self._api_key_env} (--api-key-env) holds a key valid for this server" if self._api_key_env
               else "the server wants a key: export it in a variable and name it with --api-key-env NAME")
        return InputError(f"{server}; {fix}")

    def begin_episode(self, game: Game, seed: int | None = None) -> None:
        # Turn k of the episode samples with a seed derived from (seed, k): reproducible per episode, and two
        # episodes (tasks, trials) never share their draws; without a seed the server draws its own.
        self._episode_seed, self._turn = seed, 0

    def max_tokens_for(self, prompt: str) -> int:
        """max_new_tokens, or less: the room the server's context leaves after `prompt` (ContextFull when none).
        The prompt is counted as vLLM's /v1/completions counts a text prompt: with its special tokens."""
        if self.max_model_len is None:
            return self.max_new_tokens
        prompt_tokens = len(self.tokenizer(prompt)["input_ids"])
        room = self.max_model_len - prompt_tokens
        if room < 1:
            raise ContextFull(f"the conversation is {prompt_tokens} tokens; {self.model}'s context at {self.base_url} "
                              f"is {self.max_model_len} (max_model_len)")
        return min(self.max_new_tokens, room)

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        prompt = render_prompt(self.tokenizer, messages, tools)
        max_tokens = self.max_tokens_for(prompt)
        seed = {} if self._episode_seed is None else {"seed": self._request_seed(self._episode_seed, self._turn, 0)}
        self._turn += 1
        response = self._with_retries(lambda: self.client.completions.create(
            model=self.model, prompt=prompt, max_tokens=max_tokens, temperature=self.temperature,
            stop=self.stop, extra_body=self._sampling, **seed), "completion")
        return response.choices[0].text


def served_context_length(served: list[Any], model: str) -> int | None:
    """The context length (prompt + new tokens) the model list gives for `model`: vLLM's `max_model_len`, on a
    runtime LoRA adapter's entry through its `parent` (vLLM lists it on base models only); None when not given
    (another OpenAI-compatible host, or a model not listed)."""
    entries = {getattr(entry, "id", None): entry for entry in served}
    entry, seen = entries.get(model), set()
    while entry is not None and entry.id not in seen:
        length = getattr(entry, "max_model_len", None)
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return length
        seen.add(entry.id)
        entry = entries.get(getattr(entry, "parent", None))
    return None


def parse_agent_spec(spec: str, *, temperature: float = 0.0, max_new_tokens: int = 256,
                     tokenizer_dir: str | None = None, model: str | None = None, api_key: str | None = None,
                     api_key_env: str | None = None) -> Agent:
    """Build a model agent from `hf:MODEL_DIR[:ADAPTER_DIR]` or `vllm:URL`.

    `vllm:` needs `tokenizer_dir` (the chat template is applied on the client); `model` defaults to the
    server's first model; `api_key` is sent to that server only (none: "EMPTY"), `api_key_env` names the variable
    it came from (in the error when the server refuses it). Raises ValueError for a malformed spec, FileNotFoundError
    for a missing folder.
    """
    kind, _, rest = spec.partition(":")
    if kind == "hf" and rest:
        model_dir, _, adapter = rest.partition(":")
        return HFAgent(model_dir, adapter or None, temperature=temperature, max_new_tokens=max_new_tokens)
    if kind == "vllm" and rest:
        if not tokenizer_dir:
            raise ValueError("a vllm: agent needs a tokenizer folder (--tokenizer DIR): the chat template is "
                             "applied on the client")
        return VLLMAgent(rest, model, tokenizer_dir, temperature=temperature, max_new_tokens=max_new_tokens,
                         api_key=api_key, api_key_env=api_key_env)
    raise ValueError(f"bad agent spec {spec!r}; use 'hf:MODEL_DIR[:ADAPTER_DIR]' or 'vllm:URL' (the environment's "
                     "own players: 'expert', 'flawed:FLAW')")


def check_agent_spec(spec: str, tokenizer_dir: str | None = None) -> None:
    """InputError for an `hf:` model folder without config or weights, a `vllm:` URL without a scheme, or a `vllm:`
    server where nothing listens; run before the agent is built (a model load, or ~30 s of connection retries)."""
    kind, _, rest = spec.partition(":")
    if kind == "hf" and rest:
        model_dir, _, adapter = rest.partition(":")
        for folder in (model_dir, adapter):
            if folder and not Path(folder).is_dir():
                raise InputError(f"--agent {spec}: {folder}: folder not found")
        if not any(folder and (Path(folder) / "gate_config.json").is_file() for folder in (model_dir, adapter)):
            check_model_folder(model_dir, "--agent hf:")  # a gate folder names its base model itself
    elif kind == "vllm" and rest:
        base = check_url(rest, "--agent vllm:").rstrip("/")
        if not tokenizer_dir:
            return  # the agent names the missing --tokenizer, a flag error, before any server is asked
        base = base if base.endswith("/v1") else base + "/v1"
        if nothing_listens(f"{base}/models"):  # anything else is left to the agent's retries
            raise InputError(f"--agent {spec}: no server listens at {base} (connection refused); start it "
                             "(vllm serve MODEL --port PORT) or fix the URL")


def any_agent(args: argparse.Namespace,
              environment_agent: Callable[[argparse.Namespace], Agent] = storefront_run.environment_agent) -> Agent:
    """`python -m train.play`'s agents: the environment's own (`environment_agent`: the storefront's expert and
    flawed:FLAW by default) and the model agents, each spec checked before a model is loaded or a server asked
    (InputError names the flag)."""
    if args.agent.partition(":")[0] not in ("hf", "vllm"):
        return environment_agent(args)
    check_agent_spec(args.agent, args.tokenizer)
    api_key = os.environ[args.api_key_env] if args.api_key_env else None  # checked set by the runner's CLI
    try:
        return parse_agent_spec(args.agent, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                tokenizer_dir=args.tokenizer, model=args.model, api_key=api_key,
                                api_key_env=args.api_key_env)
    except InputError:
        raise  # already names the fix (a vllm: server refusing the key or the model)
    # ValueError/OSError: a bad spec, a folder or file that is missing or unreadable; RuntimeError: VLLMAgent's
    # server refused, serves no model, or never answered
    except (ValueError, OSError, RuntimeError) as err:
        raise InputError(f"--agent {args.agent}: {err}") from None
