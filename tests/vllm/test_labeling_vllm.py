"""One labeling run through a REAL vLLM server with guided JSON decoding (`--json-mode schema`).

Runs only when TRACE_VLLM_URL (and TRACE_VLLM_MODEL, the served model name) are set, as
`make test-vllm` / scripts/test_vllm.sh do. The tiny model's labels are meaningless; what is tested is
the protocol: response_format json_schema accepted by vLLM, answers parsed or defaulted to NA within
the attempt cap, and a run file that passes the aggregation's validation.
"""
from __future__ import annotations

import json
import os

import pytest

from pipeline import label_trajectories as lt
from pipeline.aggregate_capabilities import load_run

URL = os.environ.get("TRACE_VLLM_URL", "")
MODEL = os.environ.get("TRACE_VLLM_MODEL", "")

pytestmark = pytest.mark.skipif(not (URL and MODEL), reason="needs a vLLM server: set TRACE_VLLM_URL and "
                                                           "TRACE_VLLM_MODEL (make test-vllm does)")


def _base_url(url: str) -> str:
    """The OpenAI base URL: TRACE_VLLM_URL is the server root (http://host:port), with or without /v1."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def test_one_labeling_run_with_guided_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACE_VLLM_TEST_KEY", "EMPTY")  # the test server runs without --api-key
    summary = tmp_path / "summary.jsonl"
    rows = [{"id": "t1", "passed": False, "reward": 0.0, "n_turns": 1, "text": "[user] cancel it\n[assistant] done"},
            {"id": "t2", "passed": True, "reward": 1.0, "n_turns": 1, "text": "[user] refund\n[assistant] refunded"},
            {"id": "t3", "passed": False, "reward": 0.0, "n_turns": 1, "text": "[user] book\n[assistant] error"}]
    summary.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"candidates": [
        {"name": "verify_first", "description": "Checks preconditions before acting."},
        {"name": "finish_all", "description": "Completes every part of a request."}]}), encoding="utf-8")
    out = tmp_path / "labels"
    # The test server's context is 1024 tokens: a short answer budget, and one attempt (a retry would append
    # the rejected answer and could overflow the context); unparsable answers become NA and are counted. The
    # random tiny model's answers are noise (often cut at 256 tokens), so any share of defaulted pairs is let
    # through: this checks the plumbing through vLLM's guided JSON, not the labels.
    code = lt.main([str(summary), "--out", str(out), "--base-url", _base_url(URL), "--model", MODEL,
                    "--api-key-env", "TRACE_VLLM_TEST_KEY", "--candidates", str(candidates), "--runs", "1", "--k", "1",
                    "--json-mode", "schema", "--max-tokens", "256", "--max-attempts", "1", "--concurrency", "3",
                    "--temperature", "0.0", "--timeout", "300", "--http-retries", "2", "--max-defaulted-share", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    run = load_run(out / "run_01.json")
    assert (run.total_failed, run.total_passed) == (2, 1) and set(run.labels) == {"verify_first", "finish_all"}
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["totals"]["calls"] == 3 and report["totals"]["prompt_tokens"] > 0  # usage came from vLLM
    for pair in report["per_run"][0]["defaulted_pairs"]:  # every defaulted pair is NA in the run file
        lists = run.labels[pair["capability"]]
        assert pair["trajectory_id"] in lists["na_failed"] + lists["na_passed"]
    assert (out / "selected_capabilities.json").exists()
