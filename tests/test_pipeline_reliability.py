"""Step 1 reliability: JSONL line breaks, retrying defaulted labels, Step 2's queue kept on a rerun, the capability
prompt's export path, stale run files, --dry-run --propose from the cache, numpy thresholds. No models, no server."""
from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml

import render_pipeline
from common.io import atomic_write_jsonl, load_jsonl
from common.llm_client import ChatResult
from pipeline import aggregate_capabilities as ac
from pipeline import agent_runner
from pipeline import label_trajectories as lt

REPO = Path(__file__).resolve().parents[1]
KEY_ENV = "TRACE_TEST_RELIABILITY_KEY"
BREAKS = "a\u2028b\u2029c\x85d"  # str.splitlines() breaks at each of these; JSON keeps them raw in a string


# ----------------------------------------------------------------------------------------------
# 1. JSONL is split at newlines only
# ----------------------------------------------------------------------------------------------

def test_jsonl_with_unicode_line_breaks_reads_back(tmp_path):
    raw = tmp_path / "raw.jsonl"  # as written before the writer escaped them (or by another tool)
    raw.write_text(json.dumps({"text": BREAKS}, ensure_ascii=False) + "\n" + '{"id": 2}\n', encoding="utf-8")
    assert load_jsonl(raw) == [{"text": BREAKS}, {"id": 2}]
    written = atomic_write_jsonl(tmp_path / "new.jsonl", [{"text": BREAKS}, {"id": 2}])
    text = written.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 2 and load_jsonl(written) == [{"text": BREAKS}, {"id": 2}]


def test_label_cache_line_with_unicode_line_break_is_not_cut_off(tmp_path):
    path = tmp_path / lt.CACHE_NAME
    entry = {"key": "k1", "kind": "label", "labels": {"a": {"label": "PRESENT", "reason": BREAKS}}, "defaulted": []}
    path.write_text(json.dumps(entry, ensure_ascii=False) + "\n", encoding="utf-8")
    cache = lt.LabelCache(path)
    assert cache.broken_lines == 0 and cache.get("k1") == entry  # else re-made (and re-billed) on every rerun


# ----------------------------------------------------------------------------------------------
# 2. Pairs defaulted to NA are asked again when --max-attempts grows
# ----------------------------------------------------------------------------------------------

class ScriptedClient:
    """Answers every labeling call with `answer` (a callable of the capability names asked), counting calls."""

    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def complete(self, messages, **_):
        self.calls += 1
        names = json.loads(messages[-1]["content"].split(lt.CAPABILITY_LINE, 1)[1].split("\n", 1)[0])
        return ChatResult(self.answer(names), 1, 1, 0, "stop")


def _label(tmp_path, client, max_attempts):
    config = lt.LabelingConfig(model="m", runs=1, max_attempts=max_attempts, concurrency=1)
    descriptions = {"a": "skill a"}
    jobs = lt.make_jobs([lt.Trajectory("f1", False, 0.0, "text")], descriptions, config)
    cache = lt.LabelCache(tmp_path / lt.CACHE_NAME)  # loaded from the file each time, as a rerun does
    results = lt.run_jobs(client, jobs, descriptions, config, cache, {1: lt.RunStats()})
    return results[jobs[0].key]


def test_defaulted_labels_are_retried_with_a_larger_max_attempts(tmp_path):
    garbage = ScriptedClient(lambda names: "no json")
    assert _label(tmp_path, garbage, 1)["defaulted"] == ["a"] and garbage.calls == 1
    assert _label(tmp_path, garbage, 1)["defaulted"] == ["a"] and garbage.calls == 1  # same max: free
    good = ScriptedClient(lambda names: json.dumps({n: {"label": "LACKING", "reason": "r"} for n in names}))
    entry = _label(tmp_path, good, 3)
    assert good.calls == 1 and entry["defaulted"] == [] and entry["labels"]["a"]["label"] == "LACKING"
    assert _label(tmp_path, good, 3) == entry and good.calls == 1  # the replacement is what the cache holds now
    # An entry cached before max_attempts was stored: its answers ran out at `attempts`.
    old = {**entry, "defaulted": ["a"], "attempts": 2}
    del old["max_attempts"]
    assert lt.reusable(old, lt.LabelingConfig(model="m", max_attempts=2))
    assert not lt.reusable(old, lt.LabelingConfig(model="m", max_attempts=3))


# ----------------------------------------------------------------------------------------------
# 3. Rerunning the aggregation keeps Step 2's queue
# ----------------------------------------------------------------------------------------------

def _run_file(path, lacking_b):
    lists = {"lacking_failed": ["f1", "f2"], "present_failed": [], "na_failed": [], "lacking_passed": [],
             "present_passed": ["p1", "p2"], "na_passed": []}
    b = dict(lists) if lacking_b else {**lists, "lacking_failed": [], "present_failed": ["f1", "f2"]}
    path.write_text(json.dumps({"attempt": 1, "totals": {"total_failed": 2, "total_passed": 2},
                                "labels": {"a": lists, "b": b}}), encoding="utf-8")
    return path


def _aggregate(run, export):
    return ac.main(["--runs", str(run), "--k", "1", "--n-bootstrap", "10", "--export", str(export)])


def test_rerun_keeps_step_2_status_and_reports_what_left_the_queue(tmp_path, capsys):
    run, export = _run_file(tmp_path / "run_01.json", lacking_b=True), tmp_path / "selected.json"
    assert _aggregate(run, export) == 0
    queue = json.loads(export.read_text())
    queue[0].update(status="DONE", environment_path="games/a.py")
    queue[1]["status"] = "IN_PROGRESS"
    export.write_text(json.dumps(queue))
    capsys.readouterr()
    assert _aggregate(run, export) == 0
    assert "a (DONE)" in capsys.readouterr().out
    again = {e["skill"]: e for e in json.loads(export.read_text())}
    assert again["a"]["status"] == "DONE" and again["a"]["environment_path"] == "games/a.py"
    assert again["b"]["status"] == "IN_PROGRESS"
    _run_file(run, lacking_b=False)  # b is no longer selected: out of the queue, named, its record in the report
    assert _aggregate(run, export) == 0
    assert "b (IN_PROGRESS)" in capsys.readouterr().err
    assert [e["skill"] for e in json.loads(export.read_text())] == ["a"]
    report = json.loads(ac.report_path_for(export).read_text())
    assert [e["skill"] for e in report["queue"]["no_longer_selected"]] == ["b"]
    # The runner of `render_pipeline --run` accepts a status the previous list held, and only that.
    snapshot = agent_runner.Snapshot([])
    assert [e["status"] for e in agent_runner.check_selection(export, snapshot, {"a": "DONE"})] == ["DONE"]
    with pytest.raises(agent_runner.AgentRunError, match="has status DONE"):
        agent_runner.check_selection(export, snapshot, {"a": "PENDING"})


def test_an_export_that_is_not_a_queue_is_refused_before_any_work(tmp_path, capsys):
    export = tmp_path / "selected.json"
    export.write_text("{not json", encoding="utf-8")
    run = tmp_path / "run_01.json"
    run.write_text("{}", encoding="utf-8")  # a bad run file too: the export is refused first, before any run is read
    assert _aggregate(run, export) == 2
    assert "move it aside" in capsys.readouterr().err and export.read_text() == "{not json"
    assert not ac.report_path_for(export).exists()


# ----------------------------------------------------------------------------------------------
# 4. The capability prompt exports the file `render_pipeline --run` checks
# ----------------------------------------------------------------------------------------------

def test_capability_prompt_exports_the_file_run_checks(tmp_path):
    config = yaml.safe_load((REPO / "configs/capability_selection.yaml").read_text(encoding="utf-8"))
    config["capabilities_file"] = "custom/my_selection.json"
    path = tmp_path / "capability.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    text = render_pipeline.render(path, "capability")
    assert re.search(r"--export (\S+)", text).group(1) == "custom/my_selection.json"
    assert render_pipeline.selected_list_path(render_pipeline.load_config(path)) == Path("custom/my_selection.json")
    assert "custom/my_selection_report.json" in text and "selected_capabilities.json" not in text


# ----------------------------------------------------------------------------------------------
# 5, 6. label_trajectories: stale run files; --dry-run --propose with Phase 1 cached
# ----------------------------------------------------------------------------------------------

def _summary(tmp_path):
    path = tmp_path / "summary.jsonl"
    rows = [{"id": i, "passed": i.startswith("p"), "reward": None, "text": f"transcript {i}"}
            for i in ("f1", "f2", "p1", "p2")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_stale_run_files_of_a_larger_run_are_refused_before_any_call(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "x")
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"candidates": [{"name": "a", "description": "A."}]}), encoding="utf-8")
    out = tmp_path / "labels"
    out.mkdir()
    for run in (1, 2, 3):
        (out / f"run_{run:02d}.json").write_text("{}", encoding="utf-8")
    code = lt.main([str(_summary(tmp_path)), "--out", str(out), "--candidates", str(candidates), "--runs", "2",
                    "--k", "1", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--api-key-env", KEY_ENV,
                    "--http-retries", "0", "--timeout", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "run_03.json" in err and "--runs 3" in err and "mv " in err, err
    assert sorted(p.name for p in out.iterdir()) == ["run_01.json", "run_02.json", "run_03.json"]  # nothing made


def test_dry_run_with_propose_counts_cached_phase_1_and_labels_as_cached(tmp_path, capsys):
    summary, out = _summary(tmp_path), tmp_path / "labels"
    config = lt.LabelingConfig(model="m", runs=1, min_candidates=1, max_candidates=2)
    trajectories, _ = lt.load_summary(summary)
    cache = lt.LabelCache(out / lt.CACHE_NAME)
    key = lt.propose_key(lt.propose_messages(*lt.propose_sample(trajectories, config), config), config)
    candidates = {"candidates": [{"name": "a", "description": "A."}]}
    cache.put({"key": key, "kind": "propose", "model": "m", "candidates": candidates})
    for job in lt.make_jobs(trajectories, ac.load_candidates(candidates), config):
        cache.put({"key": job.key, "kind": "label", "labels": {"a": {"label": "NA", "reason": ""}}, "defaulted": []})
    assert lt.main([str(summary), "--out", str(out), "--propose", "--runs", "1", "--k", "1", "--model", "m",
                    "--min-candidates", "1", "--max-candidates", "2", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "(4 cached, 0 to make), 1 capabilities" in printed and "Phase 1 cached" in printed, printed


# ----------------------------------------------------------------------------------------------
# 7. numpy thresholds
# ----------------------------------------------------------------------------------------------

def test_numpy_float_thresholds_are_exact():
    config = ac.AggregationConfig(rho=np.float64(0.1), delta=np.float64(0.2), k=1)
    assert (config.exact_rho, config.exact_delta) == (Fraction(1, 10), Fraction(1, 5))
