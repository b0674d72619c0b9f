"""The Step-1 demo and its rule-based stand-in labelers."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import rule_labeler
from pipeline.rule_labeler import Evidence

REPO = Path(__file__).resolve().parent.parent


def _evidence(calls=(), errors=0, gold=(), failed=(), met=()):
    return Evidence(tuple(calls), errors, tuple(gold), tuple(failed), tuple(met))


@pytest.mark.parametrize(
    "evidence, capability, expected",
    [
        # multi-step: one gold write is not multi-step; a dropped gold write is LACKING
        (_evidence(calls=["get_order_details", "cancel_pending_order"], gold=["cancel_pending_order"]),
         "multi_step_task_completion", "NA"),
        (_evidence(calls=["get_order_details", "cancel_pending_order"],
                   gold=["cancel_pending_order", "modify_pending_order_address"]),
         "multi_step_task_completion", "LACKING"),
        (_evidence(calls=["get_order_details", "modify_pending_order_address", "cancel_pending_order"],
                   gold=["cancel_pending_order", "modify_pending_order_address"]),
         "multi_step_task_completion", "PRESENT"),
        # structured data: right tool, failed action check -> LACKING; no write -> NA
        (_evidence(calls=["get_order_details"]), "structured_data_reasoning", "NA"),
        (_evidence(calls=["get_order_details", "return_delivered_order_items"],
                   gold=["return_delivered_order_items"], failed=["return_delivered_order_items"]),
         "structured_data_reasoning", "LACKING"),
        (_evidence(calls=["get_order_details", "return_delivered_order_items"], gold=["return_delivered_order_items"]),
         "structured_data_reasoning", "PRESENT"),
        # preconditions: writing blind, or a write the gold plan does not have
        (_evidence(calls=["cancel_pending_order"], gold=["cancel_pending_order"]), "precondition_verification", "LACKING"),
        (_evidence(calls=["get_order_details", "cancel_pending_order"], gold=[]), "precondition_verification", "LACKING"),
        (_evidence(calls=["get_order_details", "cancel_pending_order"], gold=["cancel_pending_order"]),
         "precondition_verification", "PRESENT"),
        (_evidence(calls=["get_order_details"], gold=["get_order_details"]), "precondition_verification", "NA"),
        # tool precision and communication
        (_evidence(calls=[]), "tool_calling_precision", "NA"),
        (_evidence(calls=["get_order_details"], errors=1), "tool_calling_precision", "LACKING"),
        (_evidence(met=[True, False]), "information_communication", "LACKING"),
        (_evidence(met=[]), "information_communication", "NA"),
        # escalation
        (_evidence(calls=["transfer_to_human_agents"], gold=[]), "escalation_judgment", "LACKING"),
        (_evidence(calls=["transfer_to_human_agents"], gold=["transfer_to_human_agents"]), "escalation_judgment", "PRESENT"),
    ],
)
def test_rule_labels(evidence, capability, expected):
    assert rule_labeler.rule_labels(evidence)[capability] == expected


def test_noisy_labelers_are_seeded_and_independent():
    verdicts = {f"t{i}": {"a": "LACKING", "b": "PRESENT", "c": "NA"} for i in range(400)}
    run1 = rule_labeler.noisy_labeler(verdicts, 1)
    assert run1 == rule_labeler.noisy_labeler(verdicts, 1)
    assert run1 != rule_labeler.noisy_labeler(verdicts, 2)
    flipped = sum(r["label"] == "PRESENT" for r in run1 if r["capability"] == "a") / 400
    assert 0.08 < flipped < 0.22  # miss_rate 0.15
    assert all(r["label"] == "NA" for r in run1 if r["capability"] == "c")  # NA is never flipped
    with pytest.raises(ValueError, match="miss_rate"):
        rule_labeler.noisy_labeler(verdicts, 1, miss_rate=1.5)


def test_demo_selection_end_to_end(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.demo", "--run-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "RULE-BASED STAND-IN" in result.stdout
    select = tmp_path / "select"
    summary = [json.loads(line) for line in (select / "summary.jsonl").read_text().splitlines()]
    assert len(summary) == 60 and sum(r["passed"] for r in summary) == 44
    assert len(list((select / "labels").glob("run_*.json"))) == 10
    selected = json.loads((select / "selected_capabilities.json").read_text())
    report = json.loads((select / "selected_capabilities_report.json").read_text())
    assert [e["skill"] for e in selected] == report["selected"]
    assert all(e["status"] == "PENDING" and e["n_runs_passed"] >= 8 for e in selected)
    for entry in report["capabilities"]:  # every candidate is in the table, with its verdict
        assert entry["skill"] in result.stdout
    # the selected list is what Step 2's `next` command reads
    nxt = subprocess.run(
        [sys.executable, "-m", "pipeline.capabilities", "next", "--file", str(select / "selected_capabilities.json")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    if selected:
        assert nxt.returncode == 0 and nxt.stdout.splitlines()[0] == selected[0]["skill"]
