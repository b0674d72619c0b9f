"""Tests for pipeline.label_trajectories and common.llm_client against a real local HTTP server.

The server (tests/fake_openai_server.py) speaks the OpenAI chat-completions protocol on 127.0.0.1 and
labels by a deterministic rule (MARK_<capability> in a transcript -> LACKING), so the expected run
files are known; scripted faults (bad JSON, missing capability, 429, 500, dropped connection, 401, ...)
exercise the retry paths through the real `openai` client and HTTP stack.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

from fake_openai_server import FakeOpenAIServer, label_rule
from pipeline import label_trajectories as lt
from pipeline.aggregate_capabilities import load_run
from common.llm_client import ChatClient, FatalAPIError, RateLimiter, RetryPolicy, parse_retry_after
from signals import restore_sigint

SECRET = "sk-test-7d1e0c4b9a-DO-NOT-LEAK"
KEY_ENV = "TRACE_TEST_LABEL_KEY"
CAPABILITIES = {"tool_use": "Calls the right tool with well-formed arguments.",
                "planning": "Carries a multi-part request through to its last part."}
FAST_RETRIES = ["--backoff-base", "0.01", "--backoff-max", "0.02"]


def _trajectories() -> list[dict]:
    """Six usable trajectories (3 failed, 3 passed) with markers, plus one with unknown outcome."""
    texts = {
        "f1": "[user] cancel order\n[assistant] MARK_tool_use MARK_planning",
        "f2": "[user] refund\n[assistant] MARK_tool_use",
        "f3": "[user] hi\n[assistant] NA_planning MARK_tool_use",
        "p1": "[user] change address\n[assistant] done",
        "p2": "[user] book flight\n[assistant] MARK_planning booked",
        "p3": "[user] question\n[assistant] NA_tool_use answered",
    }
    records = [{"id": i, "passed": i.startswith("p"), "reward": 1.0 if i.startswith("p") else 0.0, "n_turns": 1,
                "text": text} for i, text in texts.items()]
    records.append({"id": "u1", "passed": None, "reward": None, "n_turns": 1, "text": "[user] ? MARK_tool_use"})
    return records


@pytest.fixture()
def inputs(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    summary = tmp_path / "summary.jsonl"
    summary.write_text("".join(json.dumps(r) + "\n" for r in _trajectories()), encoding="utf-8")
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"candidates": [{"name": n, "description": d} for n, d in CAPABILITIES.items()]}),
                          encoding="utf-8")
    return summary, candidates, tmp_path / "labels"


def _argv(summary, out, server, *extra, candidates=None):
    argv = [str(summary), "--out", str(out), "--base-url", server.base_url, "--model", server.model,
            "--api-key-env", KEY_ENV, *FAST_RETRIES]
    if candidates is not None:
        argv += ["--candidates", str(candidates)]
    return argv + list(extra)


def _assert_key_nowhere(folder: Path, *texts: str) -> None:
    """The API key appears in no file under `folder` and in none of `texts` (captured output)."""
    assert folder.exists()
    for path in folder.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"API key written to {path}"
    for text in texts:
        assert SECRET not in text, "API key printed"


def _expected_lists(capability: str) -> dict[str, list[str]]:
    """The six lists the rule yields for `capability` over the usable fixture trajectories."""
    lists = {key: [] for key in ("lacking_failed", "present_failed", "na_failed", "lacking_passed", "present_passed",
                                 "na_passed")}
    for record in _trajectories():
        if record["passed"] is None:
            continue
        label = label_rule(record["text"], [capability])[capability]["label"].lower()
        lists[f"{label}_{'passed' if record['passed'] else 'failed'}"].append(record["id"])
    return lists


# ----------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------

def test_runs_validate_follow_the_rule_and_aggregate(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        code = lt.main(_argv(summary, out, server, "--runs", "3", "--k", "2", "--concurrency", "3",
                             "--temperature", "0.5,0.7,0.9", candidates=candidates))
        requests = list(server.requests)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert len(requests) == 3 * 6 and all(r["key_ok"] for r in requests)  # one call per (run, trajectory)
    assert "u1" not in {r["trajectory_id"] for r in requests}
    assert "1 trajectories with unknown outcome" in captured.err and "u1" in captured.err
    # Each run is its own labeler: its own seed and temperature; JSON object mode by default.
    by_seed = {}
    for r in requests:
        by_seed.setdefault(r["body"]["seed"], set()).add(r["body"]["temperature"])
        assert r["body"]["response_format"] == {"type": "json_object"}
    assert by_seed == {1: {0.5}, 2: {0.7}, 3: {0.9}}
    for run in (1, 2, 3):
        loaded = load_run(out / f"run_{run:02d}.json")
        assert loaded.attempt == run and (loaded.total_failed, loaded.total_passed) == (3, 3)
        for capability in CAPABILITIES:
            assert {k: sorted(v) for k, v in loaded.labels[capability].items()} == _expected_lists(capability)
    selected = json.loads((out / "selected_capabilities.json").read_text())
    assert [entry["skill"] for entry in selected] == ["tool_use"]  # LACKING in all failures, no pass: Δ = 1
    assert (out / "selected_capabilities_report.json").exists()
    assert "SELECTED" in captured.out and "tool_use" in captured.out
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["totals"]["calls"] == 18 and report["totals"]["pairs_defaulted_to_na"] == 0
    assert report["totals"]["prompt_tokens"] > 0 and report["skipped_unknown_outcome"] == ["u1"]
    _assert_key_nowhere(out, captured.out, captured.err)


def test_faults_are_retried_and_counted(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        server.faults_by_trajectory = {"f1": ["bad_json", "missing"], "f2": ["bad_label"],
                                       "p1": ["429", "500", "drop"], "p2": ["hang:1.5"]}
        code = lt.main(_argv(summary, out, server, "--runs", "1", "--k", "1", "--timeout", "0.5",
                             candidates=candidates))
        by_traj = {}
        for r in server.requests:
            by_traj.setdefault(r["trajectory_id"], []).append(r)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # f1: bad JSON -> asked again; then 'tool_use' missing -> asked again for it alone.
    assert len(by_traj["f1"]) == 3
    last_user = by_traj["f1"][-1]["body"]["messages"][-1]["content"]
    assert '["tool_use"]' in last_user and "is missing" in last_user
    assert len(by_traj["f2"]) == 2 and "MAYBE" in by_traj["f2"][-1]["body"]["messages"][-1]["content"]
    assert len(by_traj["p1"]) == 4 and len(by_traj["p2"]) == 2  # 3 HTTP failures; 1 timeout
    run = load_run(out / "run_01.json")
    for capability in CAPABILITIES:  # after the retries every label is the rule's
        assert {k: sorted(v) for k, v in run.labels[capability].items()} == _expected_lists(capability)
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["totals"]["invalid_answers"] == 3
    assert report["totals"]["retries"] == 4
    assert report["totals"]["calls"] == 6 + 3
    assert report["http_retries_by_kind"] == {"429": 1, "500": 1, "connection": 1, "timeout": 1}
    assert report["totals"]["pairs_defaulted_to_na"] == 0
    _assert_key_nowhere(out, captured.out, captured.err)


def test_cap_records_na_and_counts_it(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        # f1 never answers usable JSON; p2 always leaves out its first capability.
        server.faults_by_trajectory = {"f1": ["bad_json"] * 2, "p2": ["missing"] * 2}
        # 3 of the 12 pairs are defaulted: at the share allowed (> it fails, see test_step1_reliability.py).
        code = lt.main(_argv(summary, out, server, "--runs", "1", "--k", "1", "--max-attempts", "2",
                             "--max-defaulted-share", "0.25", candidates=candidates))
        calls = {t: sum(r["trajectory_id"] == t for r in server.requests) for t in ("f1", "p2", "f2")}
    err = capsys.readouterr().err
    assert code == 0
    assert "warning: 3 of 12 (trajectory, capability) pairs (25.0%) got no valid label" in err
    assert calls == {"f1": 2, "p2": 2, "f2": 1}  # the cap: 2 answers, no more
    run = load_run(out / "run_01.json")
    assert "f1" in run.labels["tool_use"]["na_failed"] and "f1" in run.labels["planning"]["na_failed"]
    assert "p2" in run.labels["tool_use"]["na_passed"]  # the missing one defaulted...
    assert "p2" in run.labels["planning"]["lacking_passed"]  # ...the answered one kept
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["per_run"][0]["pairs_defaulted_to_na"] == 3
    assert sorted((d["trajectory_id"], d["capability"]) for d in report["per_run"][0]["defaulted_pairs"]) == \
        [("f1", "planning"), ("f1", "tool_use"), ("p2", "tool_use")]
    assert report["totals"]["invalid_answers"] == 4


def test_second_invocation_makes_no_calls(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        argv = _argv(summary, out, server, "--runs", "2", "--k", "1", "--concurrency", "2", candidates=candidates)
        assert lt.main(argv) == 0
        first = server.n_requests
        runs_before = [(out / f"run_0{r}.json").read_text() for r in (1, 2)]
        assert lt.main(argv) == 0
        assert server.n_requests == first == 12
        assert [(out / f"run_0{r}.json").read_text() for r in (1, 2)] == runs_before
        # A change of the prompt (here: a capability description) is a different call: paid again.
        data = json.loads(candidates.read_text())
        data["candidates"][0]["description"] += " Also counts tool errors."
        candidates.write_text(json.dumps(data))
        assert lt.main(argv) == 0
        assert server.n_requests == first + 12
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["totals"]["this_invocation"]["calls"] == 12
    _assert_key_nowhere(out, *capsys.readouterr())


@pytest.mark.slow  # kill and resume
def test_killed_run_resumes_with_only_the_missing_calls(inputs):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        server.faults = [None, None, None, None, "block"]  # the 5th call hangs until the process is killed
        argv = _argv(summary, out, server, "--runs", "2", "--k", "1", "--concurrency", "1", candidates=candidates)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.label_trajectories", *argv], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert server.wait_for_requests(5, timeout=60), proc.communicate(timeout=5)
        finally:
            proc.kill()
            stdout, stderr = proc.communicate(timeout=30)
        server.release.set()
        assert not (out / "run_01.json").exists()  # it died before writing run files
        cached = [json.loads(line) for line in (out / lt.CACHE_NAME).read_text().splitlines()]
        assert len(cached) == 4
        before = server.n_requests
        assert lt.main(argv) == 0
        assert server.n_requests - before == 2 * 6 - 4  # only the missing calls
    for run in (1, 2):
        load_run(out / f"run_{run:02d}.json")
    _assert_key_nowhere(out, stdout, stderr)


# ----------------------------------------------------------------------------------------------
# Fatal errors, bad input, dry run
# ----------------------------------------------------------------------------------------------

def test_401_is_fatal_at_once_and_never_shows_the_key(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key="sk-the-servers-other-key") as server:
        code = lt.main(_argv(summary, out, server, "--runs", "2", "--concurrency", "1", "--k", "1",
                             candidates=candidates))
        assert server.n_requests == 1  # not retried
        assert server.requests[0]["key_ok"] is False
    captured = capsys.readouterr()
    assert code == 1
    assert "HTTP 401" in captured.err and f"${KEY_ENV}" in captured.err and "rerun" in captured.err
    assert not list(out.glob("run_*.json")) and not (out / "labeling_report.json").exists()
    assert SECRET not in captured.out + captured.err


def test_404_names_base_url_and_model(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET, model="served-name") as server:
        argv = _argv(summary, out, server, "--runs", "1", "--k", "1", candidates=candidates)
        argv[argv.index("--model") + 1] = "wrong-name"
        assert lt.main(argv) == 1
    err = capsys.readouterr().err
    assert "HTTP 404" in err and "--model" in err and "wrong-name" in err


def test_retries_run_out_with_a_clear_error(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        server.faults = ["500"] * 3
        code = lt.main(_argv(summary, out, server, "--runs", "1", "--k", "1", "--concurrency", "1",
                             "--http-retries", "2", candidates=candidates))
        assert server.n_requests == 3
    err = capsys.readouterr().err
    assert code == 1 and "gave up after 3 tries" in err and "HTTP 500" in err


def test_dry_run_counts_calls_and_makes_none(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        argv = _argv(summary, out, server, "--runs", "3", "--k", "1", "--dry-run", candidates=candidates)
        assert lt.main(argv) == 0
        assert server.n_requests == 0
        first = capsys.readouterr().out
        assert not out.exists()  # nothing written
        assert lt.main(_argv(summary, out, server, "--runs", "1", "--k", "1", candidates=candidates)) == 0
        capsys.readouterr()
        assert lt.main(argv) == 0  # run 1 is cached now
        second = capsys.readouterr().out
        assert server.n_requests == 6
    assert "18 labeling calls (0 cached, 18 to make)" in first
    assert "18 labeling calls (6 cached, 12 to make)" in second
    assert "estimate" in first and "prompt tokens" in first
    estimate = int(first.split("~")[1].split(" ")[0].replace(",", ""))
    assert estimate > 0


def test_dry_run_needs_no_key(inputs, monkeypatch, capsys):
    summary, candidates, out = inputs
    monkeypatch.delenv(KEY_ENV)
    assert lt.main([str(summary), "--out", str(out), "--model", "m", "--api-key-env", KEY_ENV, "--candidates",
                    str(candidates), "--runs", "2", "--k", "1", "--dry-run"]) == 0
    assert "12 labeling calls" in capsys.readouterr().out


@pytest.mark.parametrize("change, expected", [
    ("no_key", f"{KEY_ENV} (--api-key-env) is not set"),
    ("missing_summary", "file not found"),
    ("bad_temperatures", "one temperature or one per run"),
    ("k_too_big", "--k 5 must be between 1 and --runs 2"),
    ("only_failed", "the contrast needs at least one of each"),
])
def test_bad_input_exits_2_and_writes_nothing(inputs, monkeypatch, capsys, change, expected):
    summary, candidates, out = inputs
    extra = ["--runs", "2", "--k", "1"]
    if change == "no_key":
        monkeypatch.delenv(KEY_ENV)
    elif change == "missing_summary":
        summary = summary.with_name("nope.jsonl")
    elif change == "bad_temperatures":
        extra += ["--temperature", "0.1,0.2,0.3"]
    elif change == "k_too_big":
        extra = ["--runs", "2", "--k", "5"]
    elif change == "only_failed":
        summary.write_text("".join(json.dumps(r) + "\n" for r in _trajectories() if r["passed"] is False))
    with FakeOpenAIServer(api_key=SECRET) as server:
        assert lt.main(_argv(summary, out, server, *extra, candidates=candidates)) == 2
        assert server.n_requests == 0
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_key_is_not_accepted_on_the_command_line():
    with pytest.raises(SystemExit):
        lt.build_parser().parse_args(["s.jsonl", "--out", "d", "--model", "m", "--candidates", "c", "--api-key", "x"])


# ----------------------------------------------------------------------------------------------
# Phase 1 and JSON modes
# ----------------------------------------------------------------------------------------------

def test_propose_writes_valid_candidates_then_labels(inputs, capsys):
    summary, _, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        server.faults = ["bad_json"]  # the first proposal answer is unusable: asked again with the problem
        argv = _argv(summary, out, server, "--propose", "--min-candidates", "2", "--max-candidates", "4",
                     "--runs", "2", "--k", "1")
        assert lt.main(argv) == 0
        proposals = [r for r in server.requests if r["propose"]]
        assert len(proposals) == 2 and "could not be used" in proposals[1]["body"]["messages"][-1]["content"]
        shown = proposals[0]["body"]["messages"][1]["content"]
        assert "u1" not in shown and all(f"Trajectory id: {i}" in shown for i in ("f1", "f2", "f3", "p1"))
        n_first = server.n_requests
        assert lt.main(argv) == 0  # proposal and labels both cached
        assert server.n_requests == n_first == 2 + 2 * 6
    candidates = json.loads((out / "candidates.json").read_text())
    assert [c["name"] for c in candidates["candidates"]] == ["planning", "tool_use"]
    assert load_run(out / "run_01.json").labels.keys() == {"planning", "tool_use"}
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["candidates"] == str(out / "candidates.json")
    _assert_key_nowhere(out, *capsys.readouterr())


def test_propose_gives_up_on_invalid_candidates(inputs, capsys):
    summary, _, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:  # the rule yields 2 candidates; 5-10 are required
        code = lt.main(_argv(summary, out, server, "--propose", "--max-attempts", "2", "--runs", "1", "--k", "1"))
        assert server.n_requests == 2
    err = capsys.readouterr().err
    assert code == 1 and "2 candidates, want 5-10" in err and "--candidates FILE" in err


@pytest.mark.parametrize("mode", ["schema", "none"])
def test_json_modes_send_the_right_response_format(inputs, capsys, mode):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        server.faults_by_trajectory = {"f1": ["missing"]}
        assert lt.main(_argv(summary, out, server, "--runs", "1", "--k", "1", "--json-mode", mode,
                             candidates=candidates)) == 0
        bodies = [r["body"] for r in server.requests]
    capsys.readouterr()
    if mode == "none":
        assert all("response_format" not in b for b in bodies)
        return
    first = bodies[0]["response_format"]
    assert first["type"] == "json_schema" and first["json_schema"]["strict"] is True
    schema = first["json_schema"]["schema"]
    assert schema["required"] == list(CAPABILITIES) and schema["additionalProperties"] is False
    assert schema["properties"]["tool_use"]["properties"]["label"]["enum"] == ["NA", "PRESENT", "LACKING"]
    retry = [b for b in bodies if len(b["messages"]) > 2]
    assert len(retry) == 1 and retry[0]["response_format"]["json_schema"]["schema"]["required"] == ["tool_use"]


# ----------------------------------------------------------------------------------------------
# Units: answer parsing, candidates, retry policy, rate limit
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, labels, n_problems", [
    ('{"a": {"label": "lacking", "reason": "r"}, "b": {"label": "NA", "reason": ""}}', {"a": "LACKING", "b": "NA"}, 0),
    ('```json\n{"a": {"label": "PRESENT", "reason": "r"}, "b": "NA"}\n```', {"a": "PRESENT", "b": "NA"}, 0),
    ('Here you go: {"labels": {"a": {"label": "NA", "reason": "r"}}} hope it helps', {"a": "NA"}, 1),
    ('{"a": {"label": "MAYBE"}, "b": 3}', {}, 2),
    ('[1, 2]', {}, 1),
    ('not json at all', {}, 1),
    ('', {}, 1),
])
def test_parse_label_answer(text, labels, n_problems):
    found, problems = lt.parse_label_answer(text, ["a", "b"])
    assert {k: v["label"] for k, v in found.items()} == labels
    assert len(problems) == n_problems


def test_validate_candidates_names_each_problem():
    ids = {"f1": False, "p1": True}
    good = {"candidates": [{"name": "tool_use", "description": "d",
                            "example_trajectories": [{"task_id": "f1", "reward": 0.0, "note": "n"}]}]}
    assert lt.validate_candidates(good, ids, 1, 2) == []
    bad = {"candidates": [{"name": "Tool Use", "description": "", "example_trajectories": [{"task_id": "zz"}]},
                          {"name": "x_y", "description": "d", "example_trajectories": [{"task_id": "p1"}]}]}
    problems = " | ".join(lt.validate_candidates(bad, ids, 3, 5))
    for expected in ("2 candidates, want 3-5", "snake_case", "non-empty description", "unknown trajectory ids ['zz']",
                     "'x_y': no failed example"):
        assert expected in problems


def test_retry_after_is_honoured_and_backoff_is_jittered_exponential():
    waits = []
    with FakeOpenAIServer(api_key=SECRET, retry_after="7") as server:
        server.faults = ["429", "500", "503", "drop"]
        client = ChatClient(server.base_url, SECRET, server.model, retry=RetryPolicy(max_retries=5, base_delay=2.0,
                            max_delay=5.0), sleep=waits.append, rng=random.Random(0))
        result = client.complete([{"role": "user", "content": "Trajectory id: x\nTranscript:\n"}])
    assert result.http_retries == 4 and server.n_requests == 5
    assert waits[0] == 7.0 and waits[2] == 7.0  # Retry-After on the 429 and on the 503
    assert 0.0 <= waits[1] <= 4.0 and 0.0 <= waits[3] <= 5.0  # full jitter under min(max, base * 2**retry)
    assert client.retry_log.counts == {"429": 1, "500": 1, "503": 1, "connection": 1}
    policy = RetryPolicy(base_delay=1.0, max_delay=8.0)
    draws = [policy.backoff(3, random.Random(seed)) for seed in range(200)]
    assert max(draws) <= 8.0 and min(draws) >= 0.0 and len(set(draws)) > 150  # jittered, capped


def test_retry_after_beyond_the_limit_is_fatal():
    with FakeOpenAIServer(api_key=SECRET, retry_after="900") as server:
        server.faults = ["429"]
        client = ChatClient(server.base_url, SECRET, server.model, retry=RetryPolicy(max_retry_after=60),
                            sleep=lambda s: pytest.fail("must not sleep 900 s"))
        with pytest.raises(FatalAPIError, match="Retry-After"):
            client.complete([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("value, seconds", [("3", 3.0), ("0", 0.0), ("-5", 0.0), ("soon", None), (None, None),
                                            ("Wed, 21 Oct 2015 07:28:00 GMT", 60.0)])
def test_parse_retry_after(value, seconds):
    now = 1445412420.0  # 60 s before the HTTP date above
    assert parse_retry_after(value, now=now) == seconds


def test_rate_limiter_spaces_request_starts():
    clock = [100.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)

    limiter = RateLimiter(120, clock=lambda: clock[0], sleep=sleep)  # one start every 0.5 s
    for _ in range(3):
        limiter.wait()
    assert slept == [0.5, 1.0]  # reserved slots: the 2nd waits 0.5 s, the 3rd 1.0 s (clock frozen)
    clock[0] += 10.0
    limiter.wait()
    assert slept == [0.5, 1.0]  # long after the last slot: no wait
    with pytest.raises(ValueError, match="requests_per_minute"):
        RateLimiter(0)


def test_requests_per_minute_flag_limits_real_calls(inputs, capsys):
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        started = time.monotonic()
        assert lt.main(_argv(summary, out, server, "--runs", "1", "--k", "1", "--concurrency", "3",
                             "--requests-per-minute", "600", candidates=candidates)) == 0
        times = sorted(r["time"] for r in server.requests)
    capsys.readouterr()
    assert len(times) == 6 and times[-1] - times[0] >= 5 * 0.1 - 0.02  # 0.1 s apart despite 3 threads
    assert time.monotonic() - started < 10


def test_config_validation_spells_out_the_fix():
    with pytest.raises(ValueError, match="--max-attempts 3"):
        lt.LabelingConfig(model="m", max_attempts=0)
    with pytest.raises(ValueError, match="json_mode"):
        lt.LabelingConfig(model="m", json_mode="xml")
    with pytest.raises(ValueError, match="max_delay"):
        RetryPolicy(base_delay=5, max_delay=1)
    with pytest.raises(ValueError, match="EMPTY"):
        ChatClient("http://127.0.0.1:9/v1", "", "m")


# ----------------------------------------------------------------------------------------------
# Regressions
# ----------------------------------------------------------------------------------------------

def test_cache_append_after_a_cut_line_is_kept(tmp_path):
    """A kill can leave the last line without its newline; the next entry must not be glued to it."""
    path = tmp_path / lt.CACHE_NAME
    path.write_text(json.dumps({"key": "done", "kind": "label"}) + "\n" + '{"key": "cut", "ki', encoding="utf-8")
    cache = lt.LabelCache(path)
    assert set(cache.entries) == {"done"} and cache.broken_lines == 1
    cache.put({"key": "new", "kind": "label"})
    reloaded = lt.LabelCache(path)
    assert set(reloaded.entries) == {"done", "new"}
    assert reloaded.broken_lines == 1


class _CandidatesClient:
    """Answers every call with the same valid Phase-1 candidates object, and counts the calls."""

    def __init__(self, answer: str) -> None:
        self.answer, self.calls = answer, []

    def complete(self, messages, **params):
        from common.llm_client import ChatResult
        self.calls.append(params)
        return ChatResult(text=self.answer, prompt_tokens=1, completion_tokens=1, http_retries=0)


def test_propose_cache_key_includes_the_temperature(tmp_path):
    trajectories = [lt.Trajectory("f1", False, 0.0, "failed"), lt.Trajectory("p1", True, 1.0, "passed")]
    answer = json.dumps({"candidates": [{"name": "tool_use", "description": "Calls tools well.",
                                         "example_trajectories": [{"task_id": "f1", "reward": 0.0, "note": "x"}]}]})
    client = _CandidatesClient(answer)
    cache = lt.LabelCache(tmp_path / lt.CACHE_NAME)
    hot = lt.LabelingConfig(model="m", min_candidates=1, max_candidates=1, temperatures=(1.0,))
    cold = lt.LabelingConfig(model="m", min_candidates=1, max_candidates=1, temperatures=(0.0,))
    _, first = lt.propose_candidates(client, trajectories, hot, cache)
    _, again = lt.propose_candidates(client, trajectories, hot, cache)
    _, other = lt.propose_candidates(client, trajectories, cold, cache)
    assert not first["from_cache"] and again["from_cache"]
    assert not other["from_cache"], "a different sampling temperature must not reuse the cached proposal"
    assert [call["temperature"] for call in client.calls] == [1.0, 0.0]


def test_export_that_is_a_folder_exits_2_before_any_call(inputs, capsys):
    """The selection is written last; a bad --export must stop the run before calls are paid for."""
    summary, candidates, out = inputs
    export = summary.parent / "a_folder"
    export.mkdir()
    with FakeOpenAIServer(api_key=SECRET) as server:
        code = lt.main(_argv(summary, out, server, "--runs", "2", "--k", "1", "--export", str(export),
                             candidates=candidates))
        assert server.n_requests == 0
    assert code == 2 and "--export" in capsys.readouterr().err and not out.exists()


# ----------------------------------------------------------------------------------------------
# Issue 28: checked at the door, Ctrl-C ends at once
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, expected", [
    (["--rho", "nan"], "rho must be in [0, 1] (got nan)"),
    (["--delta", "inf"], "delta must be in [-1, 1] (got inf)"),
    (["--rho", "1.5"], "rho must be in [0, 1] (got 1.5)"),
    (["--timeout", "nan"], "--timeout must be a finite number > 0, got nan"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_aggregation_thresholds_are_checked_before_any_call(inputs, capsys, flags, expected, dry_run):
    # Before: --rho nan paid for every call, wrote run_01.json, then raised ValueError; --dry-run said 0.
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        code = lt.main(_argv(summary, out, server, "--runs", "2", "--k", "1", *flags, *(["--dry-run"] * dry_run),
                             candidates=candidates))
        assert server.n_requests == 0
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and expected in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("url", ["localhost:8000", "127.0.0.1:8000/v1", "ftp://host/v1", "http://"])
def test_base_url_without_scheme_is_refused_at_once(inputs, capsys, url):
    # Before: localhost:8000 was retried 7 times (~35 s) before failing.
    summary, candidates, out = inputs
    started = time.monotonic()
    code = lt.main([str(summary), "--out", str(out), "--base-url", url, "--model", "m", "--api-key-env", KEY_ENV,
                    "--candidates", str(candidates), "--runs", "2", "--k", "1"])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - started < 5
    assert err.count("\n") == 1 and "--base-url" in err and "add http://" in err, err
    assert not out.exists()


def test_out_that_is_a_file_or_cannot_be_created_exits_2(inputs, capsys):
    summary, candidates, _ = inputs
    a_file = summary.parent / "a_file"
    a_file.write_text("keep me")
    for out, message in ((a_file, "is a file, not a folder"), (a_file / "labels", "a_file is a file, not a folder")):
        with FakeOpenAIServer(api_key=SECRET) as server:
            assert lt.main(_argv(summary, out, server, "--runs", "2", "--k", "1", candidates=candidates)) == 2
            assert server.n_requests == 0
        assert message in capsys.readouterr().err
    assert a_file.read_text() == "keep me"


def test_export_onto_the_summary_is_refused(inputs, capsys):
    summary, candidates, out = inputs
    before = summary.read_text()
    with FakeOpenAIServer(api_key=SECRET) as server:
        assert lt.main(_argv(summary, out, server, "--runs", "2", "--k", "1", "--export", str(summary),
                             candidates=candidates)) == 2
        assert server.n_requests == 0
    assert "is also the summary" in capsys.readouterr().err and summary.read_text() == before


@pytest.mark.slow  # a subprocess interrupted and resumed
def test_ctrl_c_stops_at_once_with_one_line_and_a_whole_cache(inputs):
    # Before: "interrupted" was printed, then the exit waited for the calls in flight and their retries (45 s in
    # the field; here the blocked call holds it 60 s), and a second Ctrl-C gave a threading traceback.
    summary, candidates, out = inputs
    with FakeOpenAIServer(api_key=SECRET) as server:
        server.faults = [None, None, "block"]  # the third call hangs, as a slow or retried call would
        argv = _argv(summary, out, server, "--runs", "2", "--k", "1", "--concurrency", "1", candidates=candidates)
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.label_trajectories", *argv], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=restore_sigint)
        try:
            assert server.wait_for_requests(3, timeout=60), proc.communicate(timeout=5)
            time.sleep(0.2)  # the two finished calls are in the cache
            proc.send_signal(signal.SIGINT)
            started = time.monotonic()
            stdout, stderr = proc.communicate(timeout=30)
            seconds = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 130, stderr
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        lines = stderr.splitlines()  # the skipped-trajectory warning, then one line for the interrupt
        assert "Traceback" not in stderr and len(lines) == 2 and lines[1].startswith("interrupted; 2 finished"), stderr
        assert not list(out.glob("run_*.json")) and not (out / "labeling_report.json").exists()
        text = (out / lt.CACHE_NAME).read_text()
        assert text.endswith("\n") and [json.loads(line)["trajectory_id"] for line in text.splitlines()] == ["f1", "f2"]
        server.release.set()
        before = server.n_requests
        assert lt.main(argv) == 0  # resumes: only the missing calls
        assert server.n_requests - before == 2 * 6 - 2
