"""A real OpenAI-protocol HTTP server on 127.0.0.1 for the labeler tests (no mocks of the client).

`FakeOpenAIServer` is a `ThreadingHTTPServer` on port 0 in a daemon thread, implementing
`POST /v1/chat/completions` with a deterministic rule that reads the labeler's prompt:

- labeling requests (the last user message names the capabilities on the `Capabilities (...)` line):
  a capability is NA when the transcript contains `NA_<name>`, LACKING when it contains `MARK_<name>`,
  else PRESENT;
- proposal requests (Phase 1, "Propose N-M candidate capabilities"): one candidate per `MARK_<name>`
  seen in a failed trajectory, with that trajectory (and a passed one) as examples.

Scripted faults, consumed one per request: `faults` (a global queue, in arrival order) first, then
`faults_by_trajectory[id]` (per trajectory, so the script is independent of thread scheduling).
Kinds: "bad_json", "missing" (first capability left out), "bad_label", "429" and "503" (with
`Retry-After: <retry_after>`), "500", "drop" (socket closed without an answer), "hang:<s>" (answer after s
seconds), "block" (wait until `release` is set, then drop), "401", "404".

`responder(body) -> text`, when given, answers every chat request instead of the labeler's rule (a scripted
customer for τ²-bench's user simulator, tests/test_tau2_game.py); the faults apply to it as well.

Every request is recorded in `requests` (path, parsed body, whether the key matched, the fault used).
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

CAPABILITY_LINE = re.compile(r"^Capabilities \(the JSON keys of your answer\): (\[.*\])$", re.MULTILINE)
TRAJECTORY_ID = re.compile(r"^(?:=== )?Trajectory id: (.+)$", re.MULTILINE)
PROPOSE_BLOCK = re.compile(r"^=== Trajectory id: ([^\n]+)\nOutcome: (PASSED|FAILED)[^\n]*\n(.*?)(?=^=== |\Z)",
                           re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"MARK_([a-z0-9_]+[a-z0-9])")


def label_rule(transcript: str, names: list[str]) -> dict[str, dict[str, str]]:
    """The deterministic labeler: NA_<name> -> NA, MARK_<name> -> LACKING, else PRESENT."""
    labels = {}
    for name in names:
        if re.search(rf"\bNA_{re.escape(name)}\b", transcript):
            labels[name] = {"label": "NA", "reason": f"NA_{name} marker"}
        elif re.search(rf"\bMARK_{re.escape(name)}\b", transcript):
            labels[name] = {"label": "LACKING", "reason": f"MARK_{name} marker"}
        else:
            labels[name] = {"label": "PRESENT", "reason": "no marker"}
    return labels


def propose_rule(prompt: str) -> dict[str, Any]:
    """Candidates from the MARK_<name> markers of the failed trajectories shown."""
    failed: dict[str, list[str]] = {}
    passed_ids = []
    for traj_id, outcome, text in PROPOSE_BLOCK.findall(prompt):
        if outcome == "PASSED":
            passed_ids.append(traj_id.strip())
            continue
        for name in MARKER.findall(text):
            failed.setdefault(name, []).append(traj_id.strip())
    candidates = []
    for name in sorted(failed):
        examples = [{"task_id": failed[name][0], "reward": 0.0, "note": f"lacked {name}"}]
        if passed_ids:
            examples.append({"task_id": passed_ids[0], "reward": 1.0, "note": f"showed {name}"})
        candidates.append({"name": name, "description": f"The skill called {name}.", "example_trajectories": examples})
    return {"candidates": candidates}


class FakeOpenAIServer:
    """See the module docstring. Use as a context manager; `base_url` ends in /v1."""

    def __init__(self, api_key: str | None = None, model: str = "fake-model", retry_after: str = "0",
                 responder: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.api_key = api_key
        self.responder = responder
        self.model = model
        self.retry_after = retry_after
        self.faults: list[str] = []
        self.faults_by_trajectory: dict[str, list[str]] = {}
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.arrived = threading.Condition()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "FakeOpenAIServer":
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda request, address: None  # dropped sockets are part of the script
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start the server with `with FakeOpenAIServer() as server:`"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def n_requests(self) -> int:
        with self._lock:
            return len(self.requests)

    def wait_for_requests(self, n: int, timeout: float = 30.0) -> bool:
        """Block until at least `n` requests have arrived (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.arrived.wait(left)
        return True

    # -- request handling ------------------------------------------------------------------------
    def _record(self, entry: dict[str, Any]) -> None:
        with self.arrived:
            with self._lock:
                self.requests.append(entry)
            self.arrived.notify_all()

    def _next_fault(self, trajectory_id: str | None) -> str | None:
        with self._lock:
            if self.faults:
                return self.faults.pop(0)
            queue = self.faults_by_trajectory.get(trajectory_id or "")
            if queue:
                return queue.pop(0)
        return None


def _completion(model: str, content: str, prompt_chars: int) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(content) // 4,
                      "total_tokens": prompt_chars // 4 + len(content) // 4}}


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: Any,
              headers: dict[str, str] | None = None) -> None:
    """Answer `handler`'s request with `payload` as JSON (the stand-in servers of several tests share it)."""
    body = json.dumps(payload).encode("utf-8")
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


class _Handler(BaseHTTPRequestHandler):
    owner: FakeOpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        send_json(self, status, payload, headers)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": "fake", "code": status}}, headers)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_POST(self) -> None:  # noqa: N802 -- http.server naming
        owner = self.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        key_ok = owner.api_key is None or self.headers.get("Authorization") == f"Bearer {owner.api_key}"
        messages = body.get("messages") or []
        user_texts = [m.get("content") or "" for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        first_user = user_texts[0] if user_texts else ""
        match = TRAJECTORY_ID.search(first_user)
        is_propose = first_user.startswith("Propose ")
        trajectory_id = None if is_propose or not match else match.group(1).strip()
        fault = None
        if self.path == "/v1/chat/completions" and key_ok:
            fault = owner._next_fault(trajectory_id)
        owner._record({"path": self.path, "body": body, "key_ok": key_ok, "fault": fault,
                       "trajectory_id": trajectory_id, "propose": is_propose, "time": time.monotonic()})
        if self.path != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}")
        if not key_ok or fault == "401":
            return self._error(401, "Incorrect API key provided.")
        if body.get("model") != owner.model or fault == "404":
            return self._error(404, f"The model `{body.get('model')}` does not exist.")
        if fault == "429":
            return self._error(429, "Rate limit reached.", {"Retry-After": owner.retry_after})
        if fault == "500":
            return self._error(500, "The server had an error.")
        if fault == "503":
            return self._error(503, "Overloaded.", {"Retry-After": owner.retry_after})
        if fault == "drop":
            return self._drop()
        if fault == "block":
            owner.release.wait(60)
            return self._drop()
        if fault and fault.startswith("hang:"):
            time.sleep(float(fault.split(":", 1)[1]))
        prompt_chars = sum(len(m.get("content") or "") for m in messages if isinstance(m, dict))
        if owner.responder is not None:
            return self._send_json(200, _completion(owner.model, owner.responder(body), prompt_chars))
        if is_propose:
            content = json.dumps(propose_rule(first_user))
        else:
            names_match = CAPABILITY_LINE.findall(user_texts[-1] if user_texts else "")
            names = json.loads(names_match[-1]) if names_match else []
            transcript = first_user.split("Transcript:\n", 1)[-1]
            labels = label_rule(transcript, names)
            if fault == "missing" and names:
                labels.pop(names[0])
            if fault == "bad_label" and names:
                labels[names[0]] = {"label": "MAYBE", "reason": "unsure"}
            content = json.dumps(labels)
        if fault == "bad_json":
            content = "Sure! Here are the labels: {not json"
        self._send_json(200, _completion(owner.model, content, prompt_chars))
