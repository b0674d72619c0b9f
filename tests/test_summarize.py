"""Trajectory compaction (pipeline/_summarize.py) on the real fixtures and on small hand-made files."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.validation import InputError
from pipeline.summarize import (UnknownOutcomeWarning, main, render_messages, summarize_file, summarize_paths,
                                 truncate_middle)

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "fixtures" / "real"
AIRLINE = REAL / "tau2-bench" / "gpt-4.1_airline_default_gpt-4.1_1trials.json"
RETAIL = REAL / "tau2-bench" / "gpt-4.1_retail_defautl_gpt-4.1_1trials.json"
MINI = REAL / "mini-swe-agent-swebench-verified"
SWE_AGENT = REAL / "swe-agent"


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --- real fixtures ------------------------------------------------------------------------------

@pytest.mark.parametrize("path, n_total, n_passed", [(AIRLINE, 20, 10), (RETAIL, 40, 34)])
def test_tau2_fixture_counts(path, n_total, n_passed):
    records = summarize_file(path)
    assert len(records) == n_total
    assert sum(r["passed"] for r in records) == n_passed
    assert all(set(r) == {"id", "passed", "reward", "n_turns", "text", "user_instructions", "termination_reason",
                          "failure_reasons"} for r in records)
    raw = json.loads(path.read_text())["simulations"]
    # One simulation per task in these files, so the id is the bare task_id.
    assert [r["id"] for r in records] == [str(s["task_id"]) for s in raw]
    assert [r["n_turns"] for r in records] == [sum(m["role"] == "assistant" for m in s["messages"]) for s in raw]


def test_tau2_text_keeps_roles_tool_names_and_arguments():
    records = {r["id"]: r for r in summarize_file(AIRLINE, max_chars=100_000)}
    raw = json.loads(AIRLINE.read_text())["simulations"]
    sim = next(s for s in raw if any(m.get("tool_calls") for m in s["messages"]))
    call = next(c for m in sim["messages"] for c in (m.get("tool_calls") or []))
    text = records[str(sim["task_id"])]["text"]
    assert f"  -> {call['name']}({json.dumps(call['arguments'], ensure_ascii=False)})" in text
    assert f"[tool {call['name']}]" in text  # the result is labeled with the tool that produced it
    assert "[user]" in text and "[assistant]" in text


def test_tau2_records_keep_the_failure_evidence():
    """A labeler needs to know why a trajectory failed: the failed checks (DB, action, nl, communicate), what the
    simulated user was told to do, and how the conversation ended. Values worked out from the fixture by hand."""
    records = {r["id"]: r for r in summarize_file(AIRLINE)}
    task_2 = records["2"]  # failed: DB differs; the expected send_certificate(amount 50) was made with 100
    assert task_2["passed"] is False and task_2["termination_reason"] == "user_stop"
    assert task_2["user_instructions"].startswith("reason_for_call: First, try to book a flight from sf to ny.")
    assert "known_info: You are Noah Muller." in task_2["user_instructions"]
    reasons = task_2["failure_reasons"]
    assert [(r["check"], r["scored"]) for r in reasons] == [("db", True), ("action", False), ("nl", False)]
    assert reasons[1]["detail"] == ('expected call send_certificate({"amount": 50, "user_id": "noah_muller_9847"}) '
                                    "was not made with these arguments")
    assert reasons[2]["detail"].startswith("not met: Agent should not offer compensation unless the user asks")
    assert "(judge: The agent offered compensation proactively" in reasons[2]["detail"]
    # The same evidence is in the text every labeler reads: the scenario first, the evaluation last.
    text = task_2["text"]
    assert text.startswith("[user scenario] reason_for_call: First, try to book")
    assert "[evaluation] reward 0; ended: user_stop\n  failed db check: the final database differs" in text
    assert "failed action check (not scored): expected call send_certificate(" in text
    # Every failed trajectory of the fixture has a reason; passed ones list only unscored checks.
    for record in records.values():
        scored = [r for r in record["failure_reasons"] if r["scored"]]
        assert bool(scored) == (record["passed"] is False), record["id"]


def test_tau2_failure_reasons_for_communicate_and_env_checks(tmp_path):
    reward_info = {"reward": 0.0, "reward_basis": ["COMMUNICATE"], "db_check": {"db_match": True},
                   "communicate_checks": [{"info": "1,240", "met": False}, {"info": "ok", "met": True}],
                   "env_assertions": [{"env_assertion": {"func_name": "assert_status"}, "met": False}],
                   "action_checks": None, "nl_assertions": "not a list"}
    path = _tau2_file(tmp_path / "a.json", [{"task_id": "1", "reward_info": reward_info}])
    record = summarize_file(path)[0]
    assert record["failure_reasons"] == [
        {"check": "communicate", "scored": True, "detail": "the user was not told: 1,240"},
        {"check": "env", "scored": False, "detail": 'environment assertion not met: {"func_name": "assert_status"}'}]
    assert record["user_instructions"] is None and record["termination_reason"] is None


def test_two_tau2_domains_get_prefixed_because_task_ids_collide():
    records = summarize_paths([AIRLINE, RETAIL])
    ids = [r["id"] for r in records]
    assert len(ids) == 60 and len(set(ids)) == 60
    assert sum(i.startswith("airline:") for i in ids) == 20
    assert sum(i.startswith("retail:") for i in ids) == 40


def test_mini_swe_agent_outcomes_from_reports_dir():
    records = summarize_paths(sorted(MINI.glob("*.traj.json")), reports=MINI)
    outcome = {r["id"]: (r["passed"], r["reward"]) for r in records}
    assert outcome == {"django__django-10999": (False, 0.0), "django__django-16255": (True, 1.0)}
    raw = json.loads((MINI / "django__django-16255.traj.json").read_text())
    n_assistant = sum(m["role"] == "assistant" for m in raw["messages"])
    assert next(r for r in records if r["id"] == "django__django-16255")["n_turns"] == n_assistant


def test_mini_swe_agent_report_layouts(tmp_path):
    """`<iid>/report.json` wrapped as {iid: {...}}, and a run-level harness report."""
    traj = tmp_path / "trajs" / "django__django-16255.traj.json"
    traj.parent.mkdir()
    shutil.copy(MINI / "django__django-16255.traj.json", traj)
    nested = tmp_path / "nested" / "django__django-16255" / "report.json"
    nested.parent.mkdir(parents=True)
    nested.write_text(json.dumps({"django__django-16255": {"resolved": False}}))
    assert summarize_file(traj, reports=tmp_path / "nested")[0]["passed"] is False

    run_level = tmp_path / "run" / "model.run1.json"
    run_level.parent.mkdir()
    run_level.write_text(json.dumps({"schema_version": 2, "resolved_ids": ["django__django-16255"],
                                     "unresolved_ids": [], "error_ids": []}))
    assert summarize_file(traj, reports=run_level.parent)[0]["passed"] is True
    assert summarize_file(traj, reports=run_level)[0]["passed"] is True

    run_level.write_text(json.dumps({"schema_version": 2, "resolved_ids": [], "unresolved_ids": [],
                                     "error_ids": ["django__django-16255"]}))
    with pytest.warns(UnknownOutcomeWarning, match="harness error"):
        assert summarize_file(traj, reports=run_level)[0]["passed"] is None


def test_broken_report_is_an_input_error(tmp_path):
    traj = tmp_path / "django__django-16255.traj.json"
    shutil.copy(MINI / "django__django-16255.traj.json", traj)
    (tmp_path / "django__django-16255.report.json").write_text(json.dumps({"patch_exists": True}))
    with pytest.raises(InputError, match="resolved"):
        summarize_file(traj)


def test_swe_agent_without_report_is_unknown_and_skips_demonstrations():
    with pytest.warns(UnknownOutcomeWarning, match="pydicom__pydicom-1458"):
        record = summarize_file(SWE_AGENT / "pydicom__pydicom-1458.traj")[0]
    assert record["passed"] is None and record["reward"] is None
    assert record["id"] == "pydicom__pydicom-1458"
    assert record["n_turns"] == 12  # 12 assistant messages in history (= 12 trajectory steps)
    assert "Here is a demonstration" not in record["text"]  # the is_demo message is not this agent's work
    assert "[system]" in record["text"]


def test_swe_agent_new_format_tool_calls():
    with pytest.warns(UnknownOutcomeWarning):
        record = summarize_file(SWE_AGENT / "6e44b9__sweagenttestrepo-1c2844.traj", max_chars=100_000)[0]
    assert record["n_turns"] == 4
    assert '  -> find_file({"file_name":"missing_colon.py"})' in record["text"]
    assert "[tool find_file] Found 1 matches" in record["text"]


def test_swe_agent_steps_only(tmp_path):
    data = json.loads((SWE_AGENT / "6e44b9__sweagenttestrepo-1c2844.traj").read_text())
    del data["history"]
    path = tmp_path / "x.traj"
    path.write_text(json.dumps(data))
    with pytest.warns(UnknownOutcomeWarning):
        record = summarize_file(path, max_chars=100_000)[0]
    assert record["n_turns"] == len(data["trajectory"]) == 5
    assert f"  -> action: {data['trajectory'][0]['action'].strip()}" in record["text"]


# --- hand-made inputs ---------------------------------------------------------------------------

def test_truncate_middle_keeps_head_and_tail():
    text = "a" * 50 + "b" * 50
    # 20 kept: 10 from the head, 10 from the tail; 100 - 20 = 80 removed.
    assert truncate_middle(text, 20) == "a" * 10 + "…[truncated 80 chars]…" + "b" * 10
    assert truncate_middle(text, 100) == text
    assert truncate_middle("abcdef", 3) == "ab…[truncated 3 chars]…f"


def test_render_truncates_long_tool_output_but_keeps_calls():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 500},
        {"role": "assistant", "content": "It is sunny."},
    ]
    text, n_turns = render_messages(messages, max_chars=40)
    assert n_turns == 2
    assert text.splitlines() == [
        "[user] weather?",
        "[assistant]",
        '  -> get_weather({"city": "Paris"})',
        "[tool get_weather] " + "x" * 20 + "…[truncated 460 chars]…" + "x" * 20,
        "[assistant] It is sunny.",
    ]


def test_generic_jsonl(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "reward": 1.0, "messages": [{"role": "assistant", "content": "done"}]},
        {"id": "b", "reward": 0.5, "messages": [{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]},
        {"id": "c", "reward": None, "messages": []},
    ])
    with pytest.warns(UnknownOutcomeWarning, match="c: pass/fail unknown"):
        records = summarize_file(path)
    assert [(r["id"], r["passed"], r["reward"], r["n_turns"]) for r in records] == [
        ("a", True, 1.0, 1), ("b", False, 0.5, 1), ("c", None, None, 0)]
    assert records[1]["text"] == "[assistant] hi"
    with pytest.warns(UnknownOutcomeWarning):
        assert summarize_file(path, pass_threshold=0.5)[1]["passed"] is True


def _tau2_file(path: Path, simulations: list[dict]) -> Path:
    sims = [{"messages": [{"role": "assistant", "content": "hello"}], "reward_info": {"reward": 1.0}, **s}
            for s in simulations]
    path.write_text(json.dumps({"info": {}, "tasks": [], "simulations": sims}))
    return path


def test_tau2_ids_made_unique_only_when_needed(tmp_path):
    by_trial = _tau2_file(tmp_path / "a.json", [{"task_id": "1", "trial": 0}, {"task_id": "1", "trial": 1},
                                                 {"task_id": "2", "trial": 0}])
    assert [r["id"] for r in summarize_file(by_trial)] == ["1#0", "1#1", "2"]
    by_sample = _tau2_file(tmp_path / "b.json", [{"task_id": "1", "trial": 0, "sample_idx": 3},
                                                  {"task_id": "1", "trial": 0, "sample_idx": 7}])
    assert [r["id"] for r in summarize_file(by_sample)] == ["1#3", "1#7"]
    by_position = _tau2_file(tmp_path / "c.json", [{"task_id": "1"}, {"task_id": "1"}])
    assert [r["id"] for r in summarize_file(by_position)] == ["1#0", "1#1"]


def test_tau2_without_reward_is_unknown(tmp_path):
    path = _tau2_file(tmp_path / "a.json", [{"task_id": "1", "reward_info": None}])
    with pytest.warns(UnknownOutcomeWarning):
        assert summarize_file(path)[0]["passed"] is None


# --- CLI ----------------------------------------------------------------------------------------

def test_cli_end_to_end(tmp_path):
    out = tmp_path / "out.jsonl"
    result = subprocess.run([sys.executable, "-m", "pipeline._summarize", str(AIRLINE),
                             str(SWE_AGENT / "pydicom__pydicom-1458.traj"), "--out", str(out), "--max-chars", "200"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "warning: pydicom__pydicom-1458: pass/fail unknown" in result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 21 and sum(r["passed"] is True for r in records) == 10
    assert records[-1]["passed"] is None


@pytest.mark.parametrize("content, problem", [
    ('{"simulations": [', "broken JSON"),
    ('{"hello": 1}', "unknown trajectory format"),
    ("[1, 2]", "unknown trajectory format"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "out.jsonl"
    assert main([str(AIRLINE), str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and problem in err
    assert not out.exists()


def test_cli_lone_surrogate_in_the_input_is_written_as_valid_json(tmp_path, capsys):
    """A broken \\u escape in a results file (half of a surrogate pair) must not crash the write: the output
    stays valid UTF-8 and reads back to the same text."""
    raw = ('{"simulations": [{"task_id": "1", "reward_info": {"reward": 1.0}, '
           '"messages": [{"role": "user", "content": "broken \\ud83d emoji"}]}]}')
    source = tmp_path / "broken.json"
    source.write_text(raw, encoding="ascii")
    out = tmp_path / "out.jsonl"
    assert main([str(source), "--out", str(out)]) == 0
    text = out.read_bytes().decode("utf-8")  # valid UTF-8
    assert "[user] broken \ud83d emoji" in json.loads(text)["text"]


def test_cli_refuses_a_folder_as_out_before_reading(tmp_path, capsys):
    out = tmp_path / "folder"
    out.mkdir()
    assert main([str(tmp_path / "missing.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a folder" in err and "missing.json" not in err


def test_cli_bad_flags_exit_2(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main([str(AIRLINE), "--out", str(out), "--max-chars", "0"]) == 2
    assert "max_chars" in capsys.readouterr().err
    assert main([str(AIRLINE), "--out", str(out), "--reports", str(tmp_path / "nope")]) == 2
    assert main([str(tmp_path / "missing.json"), "--out", str(out)]) == 2
    assert "file not found" in capsys.readouterr().err
    assert not out.exists()
