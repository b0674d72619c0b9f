"""Step 1 (capability selection) faults found by an audit: each test fails without its fix.

- the demo's LLM label cache survives the step's cleanup, so a rerun pays only the missing calls;
- labels the labeler never gave (pairs defaulted to NA) beyond --max-defaulted-share fail the run;
- a cache line cut inside a multi-byte character costs that line only;
- a 200 whose body is not JSON is retried like other transient faults;
- an answer that gives a key twice is asked again;
- the demo refuses a labeler URL without a scheme before any step runs;
- concurrent `capabilities mark` / aggregation merges do not lose updates;
- two τ²-bench result files of one domain can be summarized together;
- identical runs, and several runs at temperature 0, are warned about.
"""
from __future__ import annotations

import json
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.llm_client import ChatClient, RetriesExhausted, RetryPolicy
from common.validation import InputError
from fake_openai_server import FakeOpenAIServer
from pipeline import capabilities
from pipeline import label_trajectories as lt
from pipeline.aggregate_capabilities import main as aggregate_main
from pipeline.aggregate_capabilities import write_outputs
from pipeline.summarize import summarize_paths

KEY_ENV = "TRACE_TEST_STEP1_KEY"
FAST = ["--backoff-base", "0.01", "--backoff-max", "0.02"]


def _inputs(folder: Path, n: int = 2) -> tuple[Path, Path]:
    """A summary with n failed (MARK_a: LACKING) and n passed trajectories, and a one-capability candidates file."""
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"id": f"f{i}", "passed": False, "reward": 0.0, "text": "[assistant] MARK_a"} for i in range(n)]
    records += [{"id": f"p{i}", "passed": True, "reward": 1.0, "text": "[assistant] done"} for i in range(n)]
    summary = folder / "summary.jsonl"
    summary.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    candidates = folder / "candidates.json"
    candidates.write_text(json.dumps({"candidates": [{"name": "a", "description": "A skill."}]}), encoding="utf-8")
    return summary, candidates


def _argv(summary: Path, candidates: Path, out: Path, server: FakeOpenAIServer, *extra: str) -> list[str]:
    return [str(summary), "--out", str(out), "--base-url", server.base_url, "--model", server.model,
            "--api-key-env", KEY_ENV, "--candidates", str(candidates), *FAST, *extra]


# ----------------------------------------------------------------------------------------------
# 1. the demo's LLM label cache outlives the step folder
# ----------------------------------------------------------------------------------------------

def test_demo_rerun_after_a_failed_llm_labeling_pays_only_the_missing_calls(tmp_path, monkeypatch, capsys):
    import demo.run as demo_run
    from demo.config import SelectSettings
    from demo.selection import _llm_labelers, llm_label_cache

    monkeypatch.setenv(KEY_ENV, "secret")
    monkeypatch.setattr(demo_run, "_device", lambda: "cpu")  # the step record's device; torch takes seconds to load
    summary, candidates = _inputs(tmp_path / "inputs", n=3)
    fake = types.SimpleNamespace(fresh=False, fingerprints={}, records={}, run_dir=tmp_path, steps_root=tmp_path)
    fake.step_dir = lambda name: tmp_path / name

    def body(settings):
        def run(folder: Path) -> dict:
            for source in (summary, candidates):
                (folder / source.name).write_bytes(source.read_bytes())
            return {"selected": _llm_labelers(folder, settings)["selected"]}
        return run

    with FakeOpenAIServer(api_key="secret") as server:
        settings = SelectSettings(runs=2, k=1, labeler_url=server.base_url, labeler_model=server.model,
                                  labeler_api_key_env=KEY_ENV)
        server.faults = [None] * 5 + ["401"]  # the 6th of 12 calls: a key that expired mid-run
        with pytest.raises(InputError, match="LLM labeling failed"):
            demo_run.Demo.step(fake, "select", {"x": 1}, (), body(settings))
        cache = llm_label_cache(tmp_path / "select", server.base_url)
        assert tmp_path / "select" not in cache.parents  # outside the folder the rerun deletes
        n_cached = len(cache.read_text().splitlines())
        assert 0 < n_cached < 12
        before = server.n_requests
        demo_run.Demo.step(fake, "select", {"x": 1}, (), body(settings))
        assert server.n_requests - before == 12 - n_cached  # only the calls still missing
        # --fresh starts over: every call made again, none answered from the cache
        fake.fresh, before = True, server.n_requests
        demo_run.Demo.step(fake, "select", {"x": 1}, (), body(settings))
        assert server.n_requests - before == 12
        fake.fresh = False
    # Another endpoint under the same model name is another file: its answers are never mixed in.
    with FakeOpenAIServer(api_key="secret") as other:
        assert llm_label_cache(tmp_path / "select", other.base_url) != cache
        settings = SelectSettings(runs=2, k=1, labeler_url=other.base_url, labeler_model=other.model,
                                  labeler_api_key_env=KEY_ENV)
        demo_run.Demo.step(fake, "select", {"x": 2}, (), body(settings))
        assert other.n_requests == 12
    capsys.readouterr()


# ----------------------------------------------------------------------------------------------
# 2. too many pairs defaulted to NA fail the run
# ----------------------------------------------------------------------------------------------

def test_unusable_answers_fail_the_run_and_leave_the_export_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, "secret")
    summary, candidates = _inputs(tmp_path)
    out = tmp_path / "labels"
    out.mkdir()
    export = out / "selected_capabilities.json"
    queue = [{"skill": "a", "status": "IN_PROGRESS", "mean_delta": 0.5}]  # Step 2's queue from an earlier labeling
    export.write_text(json.dumps(queue))
    with FakeOpenAIServer(responder=lambda body: "I cannot produce JSON, sorry.") as server:
        code = lt.main(_argv(summary, candidates, out, server, "--runs", "2", "--k", "1", "--max-attempts", "2"))
    err = capsys.readouterr().err
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert "8 of 8 (trajectory, capability) pairs (100.0%)" in lines[0]
    assert "--max-defaulted-share 0.1" in lines[0] and "larger --max-attempts" in lines[0]
    assert json.loads(export.read_text()) == queue
    assert not list(out.glob("run_*.json")) and not (out / "selected_capabilities_report.json").exists()
    report = json.loads((out / "labeling_report.json").read_text())
    assert report["status"].startswith("failed") and report["totals"]["pairs_defaulted_to_na"] == 8


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_max_defaulted_share_is_checked_before_any_call(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv(KEY_ENV, "secret")
    summary, candidates = _inputs(tmp_path)
    with FakeOpenAIServer() as server:
        code = lt.main(_argv(summary, candidates, tmp_path / "labels", server, "--max-defaulted-share", value))
        assert server.n_requests == 0
    assert code == 2
    assert "--max-defaulted-share must be a finite number in [0, 1]" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# 3. a cache line cut inside a multi-byte character
# ----------------------------------------------------------------------------------------------

def test_cache_line_cut_inside_a_utf8_character_costs_that_line_only(tmp_path):
    path = tmp_path / "label_cache.jsonl"
    whole = [json.dumps({"key": f"k{i}", "reason": "the agent’s call"}, ensure_ascii=False) for i in range(2)]
    cut = json.dumps({"key": "k2", "reason": "the agent’s call"}, ensure_ascii=False).encode("utf-8")
    cut = cut[:cut.index("’".encode("utf-8")) + 1]  # ends in the first byte of a 3-byte character
    path.write_bytes(("\n".join(whole) + "\n").encode("utf-8") + cut)
    cache = lt.LabelCache(path)
    assert sorted(cache.entries) == ["k0", "k1"] and cache.broken_lines == 1
    cache.put({"key": "k3"})
    assert sorted(lt.LabelCache(path).entries) == ["k0", "k1", "k3"]  # the new line starts on a line of its own


# ----------------------------------------------------------------------------------------------
# 4. a 200 whose body is not JSON
# ----------------------------------------------------------------------------------------------

class _BodyServer:
    """Answers POSTs with the next body of `bodies` (status 200), repeating the last one."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies, self.n = bodies, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = owner.bodies[min(owner.n, len(owner.bodies) - 1)]
                owner.n += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


GOOD_BODY = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                     "finish_reason": "stop"}]}).encode()


def test_a_body_that_is_not_json_is_retried_then_gives_up_in_one_line():
    server = _BodyServer([b'{"choices": [', GOOD_BODY])
    try:
        client = ChatClient(server.url, "k", "m", retry=RetryPolicy(max_retries=2), sleep=lambda s: None)
        assert client.complete([{"role": "user", "content": "x"}]).text == "hi"
        assert client.retry_log.counts == {"bad_body": 1}
        server.bodies, server.n = [b'{"choices": ['], 0
        with pytest.raises(RetriesExhausted, match="gave up after 3 tries; last failure: the server answered with "
                                                   "a body that is not valid JSON"):
            client.complete([{"role": "user", "content": "x"}])
        assert server.n == 3
    finally:
        server.close()


# ----------------------------------------------------------------------------------------------
# 5. an answer that gives a key twice
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ('{"a": {"label": "LACKING", "reason": "x"}, "b": {"label": "NA", "reason": "y"}, "a": {"label": "PRESENT"}}',
     "the answer gives 'a' twice"),
    ('{"a": {"label": "LACKING", "label": "PRESENT"}, "b": "na"}', "the answer gives 'label' twice inside 'a'"),
    ('{"labels": {"a": "NA", "b": "NA", "b": "LACKING"}}', "the answer gives 'b' twice inside 'labels'"),
])
def test_an_answer_giving_a_key_twice_is_malformed(text, fragment):
    found, problems = lt.parse_label_answer(text, ["a", "b"])
    assert found == {} and len(problems) == 1 and problems[0].startswith(fragment)


def test_a_capability_labeled_twice_is_asked_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, "secret")
    summary, candidates = _inputs(tmp_path, n=1)

    def answer(body):
        if len(body["messages"]) == 2:  # the first attempt: "a" twice, the last one wrong
            return '{"a": {"label": "LACKING", "reason": "x"}, "a": {"label": "NA", "reason": "y"}}'
        return json.dumps({"a": {"label": "LACKING" if "MARK_a" in body["messages"][1]["content"] else "PRESENT",
                                 "reason": "z"}})

    with FakeOpenAIServer(responder=answer) as server:
        code = lt.main(_argv(summary, candidates, tmp_path / "labels", server, "--runs", "1", "--k", "1"))
        retries = [r["body"]["messages"][-1]["content"] for r in server.requests if len(r["body"]["messages"]) > 2]
    capsys.readouterr()
    assert code == 0 and len(retries) == 2
    assert all("the answer gives 'a' twice" in text for text in retries)
    run = json.loads((tmp_path / "labels" / "run_01.json").read_text())
    assert run["labels"]["a"]["lacking_failed"] == ["f0"] and run["labels"]["a"]["present_passed"] == ["p0"]


# ----------------------------------------------------------------------------------------------
# 6. the demo checks the labeler URL before any step
# ----------------------------------------------------------------------------------------------

def test_demo_refuses_a_labeler_url_without_a_scheme_before_any_step(tmp_path, monkeypatch, capsys):
    import demo.run as demo_run
    from demo.config import SelectSettings

    with pytest.raises(InputError, match="select.labeler_url localhost:8000/v1: needs a scheme"):
        SelectSettings(labeler_url="localhost:8000/v1", labeler_model="m")
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    monkeypatch.setattr(demo_run, "_run_steps", lambda *a, **k: pytest.fail("a step ran"))
    code = demo_run.main(["--labeler-url", "localhost:8000/v1", "--labeler-model", "m",
                          "--run-dir", str(tmp_path / "demo")])
    assert code == 2
    assert "--labeler-url localhost:8000/v1: needs a scheme and host; add http://" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# 7. the capabilities list under concurrent writers
# ----------------------------------------------------------------------------------------------

QUEUE = [{"skill": "c0", "status": "PENDING", "mean_delta": 0.5},
         {"skill": "c1", "status": "PENDING", "mean_delta": 0.4}]


def _in_thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _statuses(path: Path) -> dict[str, str]:
    return {entry["skill"]: entry["status"] for entry in json.loads(path.read_text())}


def test_mark_waits_for_the_lock_so_no_update_is_lost(tmp_path, capsys):
    path = tmp_path / "selected_capabilities.json"
    path.write_text(json.dumps(QUEUE))
    with capabilities.locked(path):  # another writer holds the list
        thread = _in_thread(capabilities.main, ["mark", "c0", "IN_PROGRESS", "--file", str(path)])
        time.sleep(0.3)
        assert thread.is_alive(), "mark did not wait for the lock"
        entries = capabilities.load_selected(path)  # the other writer's load -> change -> write
        capabilities.mark(entries, "c1", "DONE")
        path.write_text(json.dumps(entries))
    thread.join(10)
    assert _statuses(path) == {"c0": "IN_PROGRESS", "c1": "DONE"}
    assert not capabilities.lock_path_for(path).exists()  # removed by its last holder
    capsys.readouterr()


def test_the_aggregations_merge_waits_for_the_lock(tmp_path):
    export = tmp_path / "selected_capabilities.json"
    export.write_text(json.dumps(QUEUE))
    report = {"capabilities": [{"skill": s, "description": "", "mean_cov": 0.3, "std_cov": 0.0, "mean_delta": d,
                                "std_delta": 0.0, "n_runs_passed": 1, "n_runs_total": 1, "example_failed_cases": [],
                                "selected": True} for s, d in (("c0", 0.5), ("c1", 0.4))]}
    with capabilities.locked(export):
        thread = _in_thread(write_outputs, report, export)
        time.sleep(0.3)
        assert thread.is_alive(), "write_outputs did not wait for the lock"
        entries = capabilities.load_selected(export)
        capabilities.mark(entries, "c1", "DONE")
        export.write_text(json.dumps(entries))
    thread.join(10)
    assert _statuses(export) == {"c0": "PENDING", "c1": "DONE"}  # the merge read the list after the mark


def test_next_claim_gives_each_agent_its_own_capability(tmp_path, capsys):
    path = tmp_path / "selected_capabilities.json"
    path.write_text(json.dumps(QUEUE))
    assert capabilities.main(["next", "--claim", "--file", str(path)]) == 0
    assert capabilities.main(["next", "--claim", "--file", str(path)]) == 0
    assert capabilities.main(["next", "--claim", "--file", str(path)]) == 1
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("c")] == ["c0", "c1"]
    assert _statuses(path) == {"c0": "IN_PROGRESS", "c1": "IN_PROGRESS"}
    assert capabilities.main(["mark", "c0", "IN_PROGRESS", "--file", str(path)]) == 0
    assert "warning: c0 was already IN_PROGRESS" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# 8. two τ²-bench result files of one domain
# ----------------------------------------------------------------------------------------------

def _tau2(path: Path, domain: str, task_ids: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sims = [{"task_id": t, "messages": [{"role": "assistant", "content": "hello"}], "reward_info": {"reward": 1.0}}
            for t in task_ids]
    path.write_text(json.dumps({"info": {"environment_info": {"domain_name": domain}}, "tasks": [],
                                "simulations": sims}))
    return path


def test_two_result_files_of_one_domain_are_told_apart_by_file_name(tmp_path):
    batch1 = _tau2(tmp_path / "retail_batch1.json", "retail", ["0", "1"])
    batch2 = _tau2(tmp_path / "retail_batch2.json", "retail", ["1", "2"])
    airline = _tau2(tmp_path / "airline.json", "airline", ["0", "5"])
    ids = [r["id"] for r in summarize_paths([batch1, batch2, airline])]
    assert ids == ["retail:retail_batch1:0", "retail:retail_batch1:1", "retail:retail_batch2:1",
                   "retail:retail_batch2:2", "airline:0", "airline:5"]
    # Without a clash between the retail files, the ids keep the form earlier summaries have.
    assert [r["id"] for r in summarize_paths([batch1, airline])] == ["retail:0", "retail:1", "airline:0", "airline:5"]
    # One file name in two folders cannot be told apart: refused, as before.
    copy = _tau2(tmp_path / "other" / "retail_batch1.json", "retail", ["0"])
    with pytest.raises(InputError, match="even after prefixing them with the domain and file name"):
        summarize_paths([batch1, copy])


# ----------------------------------------------------------------------------------------------
# 9. runs that are not independent labelers
# ----------------------------------------------------------------------------------------------

def _run_file(path: Path, attempt: int, lacking: list[str]) -> Path:
    failed, passed = ["f0", "f1", "f2"], ["p0", "p1"]
    labels = {"a": {"lacking_failed": lacking, "present_failed": [f for f in failed if f not in lacking],
                    "na_failed": [], "lacking_passed": [], "present_passed": passed, "na_passed": []}}
    path.write_text(json.dumps({"attempt": attempt, "totals": {"total_failed": 3, "total_passed": 2},
                                "labels": labels}))
    return path


def test_identical_runs_are_warned_about_whatever_their_attempts(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    _run_file(runs / "run_01.json", 1, ["f0", "f1"])
    _run_file(runs / "run_02.json", 2, ["f1", "f0"])  # the same labels, listed in another order
    _run_file(runs / "run_03.json", 3, ["f0"])
    assert aggregate_main(["--runs", str(runs / "run_*.json"), "--k", "1",
                           "--export", str(tmp_path / "selected.json")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"warning: 2 runs hold identical labels for every (trajectory, capability) pair "
                                  f"({runs / 'run_01.json'}, {runs / 'run_02.json'})")


@pytest.mark.parametrize("flags, warned", [(["--runs", "3", "--temperature", "0"], True),
                                           (["--runs", "1", "--temperature", "0"], False),
                                           (["--runs", "2", "--temperature", "0,0.7"], False),
                                           (["--runs", "3"], False)])
def test_several_runs_at_temperature_0_are_warned_about(tmp_path, capsys, flags, warned):
    summary, candidates = _inputs(tmp_path)
    code = lt.main([str(summary), "--out", str(tmp_path / "labels"), "--model", "m", "--candidates", str(candidates),
                    "--k", "1", "--dry-run", *flags])
    err = capsys.readouterr().err
    assert code == 0
    assert ("runs label at temperature 0: greedy decoding gives them the same answers" in err) is warned
