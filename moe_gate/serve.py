"""Serve a globally routed model at vLLM speed: route each request, let vLLM multi-LoRA generate.

    vllm serve BASE --enable-lora --max-loras 4 --lora-modules NAME=ADAPTER_DIR ... --port 8000
    python -m moe_gate.serve --gate GATE_DIR --upstream http://127.0.0.1:8000 [--port 8100]
    python -m train.play --agent vllm:http://127.0.0.1:8100 --tokenizer BASE ...

An OpenAI-compatible front (`/v1/models`, `/v1/completions`, `/v1/chat/completions`) in front of one vLLM
server that has every capability adapter loaded under its slot name (`--lora-modules NAME=DIR`, names as
in the gate's `gate_config.json`). For each request the gate's `TrajectoryGlobalRouter` picks the slot
from the conversation's first prompt (the mean input embedding of its tokens, the same decision the
in-process model makes) and the request goes upstream with `model` set to that adapter's name, or to the
base model for slot "base". The answer comes back unchanged, with the slot in the `X-Routed-Slot` header.

Routing is decided once per episode, keyed by the initial prompt's tokens: the request's text (a chat
request's messages rendered with the tokenizer's chat template and the generation prompt; a completion's
`prompt` as sent) up to and including its first assistant header (the template's generation prompt, e.g.
`<|im_start|>assistant\n`), tokenized on its own. That is the prompt of the conversation's first turn, which
every later turn's request starts with, so a multi-turn client gets the same slot on every turn without
any conversation id or server-side state (and the same window router SFT trains on: the tokens before the
first assistant token). A prompt without the header routes from all of its tokens.

Only the router runs here: the tokenizer and the embedding matrix (read from the base model's
safetensors, not the whole model). Only hard `global` gates serve this way: per-layer gates (`token`,
`trajectory`) choose a different adapter per layer or per token, which one vLLM LoRA per request cannot
express; serve those in process (`load_capability_model`, or `python -m train.play --agent hf:GATE_DIR`).
Models that scale their input embeddings (e.g. Gemma) are not supported: the router reads them unscaled.
Streaming requests are refused.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from jinja2 import TemplateError

from common.cli import exit_code
from common.chat_render import render_messages
from moe_gate.gater import TrajectoryGlobalRouter
from moe_gate.model_builder import (GATE_WEIGHTS, assistant_header_text, embedding_sha256, first_prompt_text,
                                    read_gate_config, read_gate_weights)
from moe_gate.multi_lora import GateError

_SKIPPED_MODEL_TYPES = ("gemma", "gemma2", "gemma3")  # embeddings scaled by sqrt(hidden) inside the model


CHAT_ROLES = ("system", "user", "assistant", "tool")


def check_chat_request(messages: Any, tools: Any) -> None:
    """GateError unless `messages` and `tools` have the OpenAI chat shape the renderer reads: messages a non-empty
    list of objects with a known string `role`, `content` a string, a list of parts or null, `tool_calls` a list
    of {"function": {"name": str, ...}}; `tools` a list of objects or left out. A request that passes renders, or
    its template refuses it; anything else failing while it renders is the server's fault."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise GateError('a chat request needs `messages`: a non-empty list of message objects, e.g. '
                        '[{"role": "user", "content": "..."}]')
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise GateError('`tools` must be a list of tool objects ({"type": "function", "function": {...}}) '
                        "or left out")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.get("role") not in CHAT_ROLES:
            raise GateError(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {message.get('role')!r}")
        content = message.get("content")
        if not (content is None or isinstance(content, str)
                or isinstance(content, list) and all(isinstance(part, dict) for part in content)):
            raise GateError(f"{where}.content must be a string, a list of content parts or null, got "
                            f"{type(content).__name__}")
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list) or not all(
                isinstance(call, dict) and isinstance(call.get("function"), dict)
                and isinstance(call["function"].get("name"), str) for call in calls):
            raise GateError(f'{where}.tool_calls must be a list of {{"function": {{"name": "...", "arguments": '
                            '...}} objects, or left out')


def _raised_in_the_template(err: BaseException) -> bool:
    """Whether `err` came out of the chat template's own code (jinja compiles a template string into frames named
    <template>): the template breaking on this request's data, not a fault of the server's code."""
    frame = err.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_filename == "<template>":
            return True
        frame = frame.tb_next
    return False


def _load_embedding(model_dir: Path) -> torch.Tensor:
    """The input embedding matrix [V, H] from a model folder's safetensors (one or sharded), fp32."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = {key: model_dir / name for key, name in weight_map.items()}
    elif (model_dir / "model.safetensors").is_file():
        with safe_open(str(model_dir / "model.safetensors"), framework="pt") as handle:
            files = {key: model_dir / "model.safetensors" for key in handle.keys()}
    else:
        raise GateError(f"{model_dir}: no model.safetensors (or index) here; pass the base model's local folder "
                        "with --base-model")
    keys = [k for k in files if k.endswith("embed_tokens.weight")]
    if len(keys) != 1:
        raise GateError(f"{model_dir}: expected one *embed_tokens.weight tensor, found {keys}")
    with safe_open(str(files[keys[0]]), framework="pt") as handle:
        return handle.get_tensor(keys[0]).float()


class GlobalRouterFront:
    """Chooses the slot of a prompt with a saved global gate; knows each slot's upstream model name."""

    def __init__(self, gate_dir: str | Path, *, base_model: str | None = None, base_served_name: str | None = None):
        from transformers import AutoTokenizer

        config = read_gate_config(gate_dir)
        state = read_gate_weights(gate_dir)  # a broken file fails here, before the tokenizer and embeddings load
        if config["mode"] != "global" or config.get("soft"):
            raise GateError(f"{gate_dir}: mode {config['mode']!r}{' (soft)' if config.get('soft') else ''} cannot be "
                            "served by one vLLM adapter per request; serve a hard global gate here, or this gate in "
                            "process (load_capability_model / --agent hf:GATE_DIR)")
        base = config["base_model"]
        if base["model_type"] in _SKIPPED_MODEL_TYPES:
            raise GateError(f"{base['model_type']} scales its input embeddings; the serving router does not support it")
        model_dir = Path(base_model or base["name_or_path"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.header_text = assistant_header_text(self.tokenizer)  # where a conversation's first prompt ends
        self.embedding = _load_embedding(model_dir)  # [V, H]
        if "embedding_sha256" in base:  # the whole matrix, hashed as the in-process model hashes it
            same = embedding_sha256(self.embedding) == base["embedding_sha256"]
        else:  # a gate saved before that hash: its 4 x 8 probe patch is all there is to compare
            probe = torch.tensor(base["embedding_probe"])
            same = self.embedding.shape[1] == base["hidden_size"] and torch.allclose(
                self.embedding[: probe.shape[0], : probe.shape[1]], probe, rtol=1e-2, atol=1e-3)
        if not same:
            raise GateError(f"{model_dir}: not the base model the gate was trained on ({base['name_or_path']}: its "
                            "input embedding differs); pass that base model's folder with --base-model")
        self.slots: list[str] = list(config["slots"])
        self.router = TrajectoryGlobalRouter(base["hidden_size"], len(self.slots))
        try:
            self.router.load_state_dict(state)
        except RuntimeError as err:
            raise GateError(f"{gate_dir}: {GATE_WEIGHTS} does not fit its gate_config.json: {err}") from None
        self.router.eval()
        self.base_served_name = base_served_name or base["name_or_path"]
        self.name = f"routed:{Path(gate_dir).resolve().name}"

    @torch.no_grad()
    def slot_for_ids(self, token_ids: list[int]) -> str:
        """The slot of a prompt's tokens, pooled over all of them (pass the first prompt: slot_for_request)."""
        if not token_ids:
            raise GateError("an empty prompt cannot be routed")
        hidden = self.embedding[torch.tensor(token_ids)][None]  # [1, T, H]
        logits = self.router(hidden)  # [1, S]
        return self.slots[int(logits.argmax(-1))]

    def slot_for_request(self, path: str, body: dict[str, Any]) -> str:
        """The slot of a request, from its conversation's first prompt (see the module docstring)."""
        first = first_prompt_text(self.request_text(path, body), self.header_text)
        return self.slot_for_ids(self.tokenizer(first, add_special_tokens=False)["input_ids"])

    def request_text(self, path: str, body: dict[str, Any]) -> str:
        """The prompt text of a chat request (rendered, with the generation prompt) or a completion request."""
        if path.endswith("/chat/completions"):
            messages, tools = body.get("messages"), body.get("tools")
            check_chat_request(messages, tools)
            if not self.tokenizer.chat_template:
                raise GateError("the base model's tokenizer has no chat template, so chat requests cannot be "
                                "routed; send a /v1/completions request with the rendered prompt instead")
            try:
                text = render_messages(self.tokenizer, messages, tools, add_generation_prompt=True)
            except TemplateError as err:  # the template's own raise_exception, or a template that breaks on them
                raise GateError(f"the chat template cannot render these messages: {err}; fix the messages (roles, "
                                "order) or send a /v1/completions request with the rendered prompt") from None
            except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
                if not _raised_in_the_template(err):  # our renderer's fault on a well-formed request: a 500
                    raise
                raise GateError(f"the chat template cannot render these messages: {err}; send a /v1/completions "
                                "request with the rendered prompt instead") from None
        else:
            text = body.get("prompt")
            if isinstance(text, list):
                if len(text) != 1:
                    raise GateError("send one prompt per request: each prompt may route to another adapter")
                text = text[0]
            if not isinstance(text, str):
                raise GateError("the completion request needs a string `prompt`")
        return text

    def upstream_model(self, slot: str) -> str:
        return self.base_served_name if slot == "base" else slot


def make_server(front: GlobalRouterFront, upstream: str, host: str = "127.0.0.1", port: int = 0,
                timeout_s: float = 600.0) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) that routes with `front` and forwards to `upstream` (…/v1 or not)."""
    upstream = upstream.rstrip("/").removesuffix("/v1")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request below instead
            return

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

        def _error(self, status: int, message: str) -> None:
            self._send(status, json.dumps({"error": {"message": message, "type": "routing_error"}}).encode())

        def _json_body(self) -> dict[str, Any]:
            """The request body: a JSON object, else GateError saying what to send."""
            length = (self.headers.get("Content-Length") or "0").strip()
            if not length.isdecimal():
                raise GateError(f"Content-Length must be the body's size in bytes (a whole number), got {length!r}")
            raw = self.rfile.read(int(length))
            try:
                body = json.loads(raw or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise GateError(f"the request body is not valid JSON ({err}); send a JSON object") from None
            if not isinstance(body, dict):
                raise GateError(f"the request body must be a JSON object (with `messages` or `prompt`), got a JSON "
                                f"{type(body).__name__}")
            return body

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                models = [{"id": front.name, "object": "model", "owned_by": "moe_gate"}]
                self._send(200, json.dumps({"object": "list", "data": models}).encode())
            else:
                self._error(404, f"no route {self.path}; this front serves /v1/models, /v1/completions and "
                                 "/v1/chat/completions")

        def do_POST(self) -> None:
            path = self.path.rstrip("/")
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                body = self._json_body()
                if body.get("stream"):
                    raise GateError("streaming is not supported by the routing front; send stream: false")
                slot = front.slot_for_request(path, body)
            except GateError as err:  # the request's fault: a 400 with the message, never a dropped connection
                self._error(400, str(err))
                return
            except Exception as err:  # a bug here: logged whole (not hidden), and the client still gets an answer
                traceback.print_exc(file=sys.stderr)
                self._error(500, f"the routing front failed on this request ({type(err).__name__}: {err}); this is "
                                 "a bug of moe_gate.serve, not of the request: the traceback is in the server's log")
                return
            body["model"] = front.upstream_model(slot)
            request = urllib.request.Request(upstream + path, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    self._send(response.status, response.read(), {"X-Routed-Slot": slot})
            except urllib.error.HTTPError as err:  # the upstream's own error, passed on as it is
                self._send(err.code, err.read(), {"X-Routed-Slot": slot})
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                self._error(502, f"upstream {upstream} failed: {err}")

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_gate.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gate", required=True, help="gate folder of a hard global router (mode: global)")
    parser.add_argument("--upstream", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--base-model", default=None, help="base model folder (default: the one the gate names)")
    parser.add_argument("--base-served-name", default=None,
                        help="the upstream's name for the base model (default: the gate's base model path)")
    args = parser.parse_args(argv)
    try:
        if not 0 <= args.port <= 65535:
            raise GateError(f"--port must be in [0, 65535] (0: any free port), got {args.port}")
        if not (Path(args.gate) / "gate_config.json").is_file():
            raise GateError(f"--gate {args.gate}: no gate_config.json there; give the folder a Step-4 gate was saved "
                            "in (python -m train.train_router_sft / train.grpo_gater)")
        if not args.upstream.startswith(("http://", "https://")):
            raise GateError(f"--upstream {args.upstream}: give the vLLM server's URL with its scheme, e.g. "
                            f"http://{args.upstream.split('://')[-1]}")
        front = GlobalRouterFront(args.gate, base_model=args.base_model, base_served_name=args.base_served_name)
        server = make_server(front, args.upstream, args.host, args.port)
    except (GateError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"moe_gate.serve: {front.name} on http://{host}:{port}/v1, slots {front.slots} -> {args.upstream}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
