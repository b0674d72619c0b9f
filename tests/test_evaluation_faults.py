"""An evaluation that survives its server (issue 45): `python -m train.play --agent vllm:URL` against a stand-in
OpenAI-compatible server on 127.0.0.1 that fails requests at random, stalls some past the client's timeout, or
fails for good, and a run killed mid-way. Every scored episode is kept as it finishes, a rerun continues from what
was scored (each episode scored exactly once), a server failure is never a score of 0, and the scores equal
those of a clean run with the same seed."""
from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fake_openai_server import send_json

REPO = Path(__file__).resolve().parents[1]

# What the stand-in model says: chosen by the prompt's hash, so the same conversation gets the same answer.
REPLIES = (
    "Please give me your email, or your name and zip code.",
    '<tool_call>{"name": "find_user_id_by_email", "arguments": {"email": "noah.brown@example.com"}}</tool_call>',
    "I am sorry, I cannot help with that. Goodbye.",
    '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W0000001"}}</tool_call>',
)


class StandIn:
    """GET /v1/models and POST /v1/completions; `fail` and `stall` are the shares of completions answered with a
    500 or after `stall_s` seconds (drawn from a seeded stream, in arrival order)."""

    def __init__(self, fail: float = 0.0, stall: float = 0.0, stall_s: float = 1.5, seed: int = 0) -> None:
        self.fail, self.stall, self.stall_s = fail, stall, stall_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "500": 0, "stalled": 0}
        self.keys: set[str | None] = set()  # the Authorization headers the server was sent
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict) -> None:
                send_json(self, status, body)

            def do_GET(self):  # noqa: N802 - http.server's protocol
                stand_in.keys.add(self.headers.get("Authorization"))
                self._answer(200, {"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

            def do_POST(self):  # noqa: N802
                stand_in.keys.add(self.headers.get("Authorization"))
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stand_in.lock:
                    draw = stand_in.rng.random()
                if draw < stand_in.fail:
                    stand_in.counts["500"] += 1
                    return self._answer(500, {"error": {"message": "stand-in failure", "type": "server_error"}})
                if draw < stand_in.fail + stand_in.stall:
                    stand_in.counts["stalled"] += 1
                    time.sleep(stand_in.stall_s)  # past the client's timeout: it has given up and asks again
                stand_in.counts["ok"] += 1
                text = REPLIES[hashlib.sha256(request["prompt"].encode()).digest()[0] % len(REPLIES)]
                self._answer(200, {"id": "c", "object": "text_completion", "created": 0, "model": "stand-in",
                                   "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "StandIn":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


ENV = {"VLLM_REQUEST_TIMEOUT": "0.5", "VLLM_RETRY_BACKOFF": "0.01", "VLLM_MAX_RETRIES": "8"}


def _argv(url: str, tokenizer: Path, out: Path, tasks: int = 6) -> list[str]:
    return ["--agent", f"vllm:{url}", "--tokenizer", str(tokenizer), "--tasks", str(tasks), "--trials", "2",
            "--seed", "3", "--max-new-tokens", "64", "--out", str(out), "--no-progress"]


def _scores(path: Path) -> list[tuple]:
    simulations = json.loads(path.read_text())["simulations"]
    return [(s["task_id"], s["trial"], json.dumps(s["reward_info"], sort_keys=True),
             json.dumps(s["messages"], sort_keys=True)) for s in simulations]


def _play(argv: list[str], monkeypatch, capsys, **env: str) -> tuple[int, str]:
    from common.cli import exit_code
    from train.play import main

    for name, value in {**ENV, **env}.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = exit_code(main, argv)
    return code, capsys.readouterr().err


def test_random_failures_and_stalls_are_retried_and_change_no_score(tiny_model_dir, tmp_path, monkeypatch, capsys):
    with StandIn() as clean:
        code, err = _play(_argv(clean.url, tiny_model_dir, tmp_path / "clean.json"), monkeypatch, capsys)
    assert code == 0, err
    with StandIn(fail=0.10, stall=0.05, stall_s=1.0) as faulty:
        code, err = _play(_argv(faulty.url, tiny_model_dir, tmp_path / "faulty.json"), monkeypatch, capsys)
        counts = dict(faulty.counts)
    assert code == 0, err
    assert counts["500"] > 0 and counts["stalled"] > 0, counts  # the faults happened
    assert _scores(tmp_path / "faulty.json") == _scores(tmp_path / "clean.json")
    assert not Path(f"{tmp_path / 'faulty.json'}.partial.jsonl").exists()  # complete: the journal is gone


def test_a_server_that_fails_for_good_is_counted_never_scored_0(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    with StandIn(fail=1.0) as broken:  # (ENV's 8 retries would only wait longer for the same end)
        code, err = _play(_argv(broken.url, tiny_model_dir, out, tasks=3), monkeypatch, capsys, VLLM_MAX_RETRIES="1")
    assert code == 1
    assert "error: 6 of 6 episodes could not be scored" in err and "Traceback" not in err, err
    assert not out.exists()  # no results file that would read as a finished run of zeros
    journal = Path(f"{out}.partial.jsonl")
    entries = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert len(entries) == 6 and all("server_error" in e and "simulation" not in e for e in entries)
    with StandIn() as healthy:  # the server is back: the rerun plays them all, and only once each
        code, err = _play(_argv(healthy.url, tiny_model_dir, out, tasks=3), monkeypatch, capsys)
    assert code == 0, err
    keys = [(s[0], s[1]) for s in _scores(out)]
    assert len(keys) == 6 == len(set(keys)) and not journal.exists()


def test_a_rerun_with_other_settings_does_not_continue_the_journal(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    Path(f"{out}.partial.jsonl").write_text(json.dumps({"settings": {"seed": 99}}) + "\n")
    with StandIn() as server:
        code, err = _play(_argv(server.url, tiny_model_dir, out, tasks=2), monkeypatch, capsys)
    assert code == 2 and "holds a run with other settings" in err and "seed" in err, err


@pytest.mark.slow
def test_a_run_killed_mid_way_continues_and_scores_each_episode_once(tiny_model_dir, tmp_path):
    """SIGKILL while the server fails and stalls at random; the rerun of the same command finishes the run and
    its scores equal a clean run's."""
    clean_out, out = tmp_path / "clean.json", tmp_path / "r.json"
    env = {**__import__("os").environ, **ENV}
    command = [sys.executable, "-m", "train.play"]
    with StandIn() as clean:
        done = subprocess.run([*command, *_argv(clean.url, tiny_model_dir, clean_out, tasks=8)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    journal = Path(f"{out}.partial.jsonl")
    with StandIn(fail=0.10, stall=0.05, stall_s=1.0, seed=1) as faulty:
        argv = [*command, *_argv(faulty.url, tiny_model_dir, out, tasks=8)]
        child = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while (not journal.exists() or len(journal.read_text().splitlines()) < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        kept = [json.loads(line)["key"] for line in journal.read_text().splitlines()[1:] if line.strip()]
        assert 3 <= len(kept) < 16, kept  # killed mid-way
        rerun = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"{len(kept)} of 16 episodes already scored" in rerun.stderr
    assert _scores(out) == _scores(clean_out)
    keys = [(s[0], s[1]) for s in _scores(out)]
    assert len(keys) == len(set(keys)) == 16


SENTINEL = "sk-sentinel-3f9c1e-NOT-TO-BE-WRITTEN"


def test_the_endpoint_key_comes_only_from_the_variable_named_and_is_written_nowhere(tiny_model_dir, tmp_path,
                                                                                  monkeypatch, capsys):
    """A hosted endpoint's key (issue 45 point 7): `--api-key-env NAME` sends $NAME's key and no other variable's;
    the key is in no results or journal file and in no output; without the flag no key is read at all (vLLM's
    "EMPTY"), however $OPENAI_API_KEY is set."""
    monkeypatch.setenv("TRACE_EVAL_KEY", SENTINEL)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-decoy-must-not-be-sent")
    out = tmp_path / "keyed.json"
    with StandIn() as server:
        code, err = _play([*_argv(server.url, tiny_model_dir, out, tasks=2), "--api-key-env", "TRACE_EVAL_KEY"],
                          monkeypatch, capsys)
        sent = set(server.keys)
    assert code == 0, err
    assert sent - {None} == {f"Bearer {SENTINEL}"}  # None: the runner's first look at the server sends no key
    assert SENTINEL not in err + capsys.readouterr().out
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or SENTINEL.encode() not in path.read_bytes(), f"the key was written to {path}"
    with StandIn() as server:
        code, err = _play(_argv(server.url, tiny_model_dir, tmp_path / "plain.json", tasks=2), monkeypatch, capsys)
        sent = set(server.keys)
    assert code == 0, err
    assert sent - {None} == {"Bearer EMPTY"}
    monkeypatch.delenv("TRACE_EVAL_KEY")
    code, err = _play([*_argv("http://127.0.0.1:9", tiny_model_dir, tmp_path / "x.json"), "--api-key-env",
                       "TRACE_EVAL_KEY"], monkeypatch, capsys)
    assert code == 2 and err.startswith("error: --api-key-env TRACE_EVAL_KEY: that environment variable is not set")
