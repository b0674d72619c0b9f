"""The Step-1 demo and its rule-based stand-in labelers."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo import rule_labeler
from demo.rule_labeler import Evidence

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


def _demo(run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "demo.tau2", "--run-dir", str(run_dir), *flags],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def test_demo_selection_end_to_end(tmp_path):
    result = _demo(tmp_path)
    assert "RULE-BASED STAND-IN" in result.stdout
    select = tmp_path / "select"
    summary = [json.loads(line) for line in (select / "summary.jsonl").read_text().splitlines()]
    assert len(summary) == 60 and sum(r["passed"] for r in summary) == 44
    assert len(list((select / "labels").glob("run_*.json"))) == 10
    selected = json.loads((select / "selected_capabilities.json").read_text())
    report = json.loads((select / "selected_capabilities_report.json").read_text())
    assert [e["skill"] for e in selected] == report["selected"]
    assert selected, "the demo is deterministic and selects capabilities; an empty selection is a regression"
    assert all(e["status"] == "PENDING" and e["n_runs_passed"] >= 8 for e in selected)
    for entry in report["capabilities"]:  # every candidate is in the table, with its verdict
        assert entry["skill"] in result.stdout
    # the selected list is what Step 2's `next` command reads: it names the first (highest mean Δ) entry
    nxt = subprocess.run(
        [sys.executable, "-m", "pipeline.capabilities", "next", "--file", str(select / "selected_capabilities.json")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert nxt.returncode == 0, nxt.stderr
    assert nxt.stdout.splitlines()[0] == selected[0]["skill"]


def test_demo_says_what_it_does_not_do():
    """The candidates are fixed, not proposed; the rule labelers read gold actions; later steps are not run."""
    source = (REPO / "demo" / "run.py").read_text()
    out = _demo_output()
    assert "Phase 1 is NOT run" in out and "FIXED candidate capabilities" in out
    assert "gold action list, which real labelers never see" in out
    assert "Not run by this demo yet:" in out and "Step 2" in out and "Step 3" in out and "Step 4" in out
    assert "design/ARTIFACTS.md" not in source and (REPO / "docs" / "ARTIFACTS.md").is_file()


_OUTPUT: dict[str, str] = {}


def _demo_output() -> str:
    if "out" not in _OUTPUT:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            _OUTPUT["out"] = _demo(Path(tmp)).stdout
    return _OUTPUT["out"]


def test_demo_candidates_pass_the_prompts_phase_1_check(tmp_path):
    """The Phase-1 check of the filled-in τ²-bench prompt, run as the prompt says, accepts the demo's candidates."""
    prompt = (REPO / "prompts" / "tau-bench" / "capability_selection.md").read_text(encoding="utf-8")
    phase_1 = prompt[prompt.index("## Phase 1"):prompt.index("## Phase 2")]
    script = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", phase_1, re.S).group(1)
    select = re.search(r'open\("(runs/[^"]+)/summary\.jsonl"\)', script).group(1)
    _demo(tmp_path / Path(select).parent)  # the demo writes <run-dir>/select/, the prompt reads runs/<run>/select/
    check = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "candidates OK", check.stdout


def test_demo_with_fewer_labelers_removes_the_earlier_demos_run_files(tmp_path):
    _demo(tmp_path, "--runs", "10", "--k", "8")
    result = _demo(tmp_path, "--runs", "3", "--k", "2")
    labels = tmp_path / "select" / "labels"
    assert sorted(p.name for p in labels.glob("run_*.json")) == ["run_01.json", "run_02.json", "run_03.json"]
    assert sorted(p.name for p in labels.glob("labels_*.jsonl")) == ["labels_01.jsonl", "labels_02.jsonl",
                                                                    "labels_03.jsonl"]
    assert "removed 14 label files of an earlier demo" in result.stdout
    # the README's glob now sees this demo's three runs only
    export = tmp_path / "again.json"
    again = subprocess.run([sys.executable, "pipeline/aggregate_capabilities.py", "--runs", str(labels / "run_*.json"),
                            "--k", "2", "--export", str(export)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again_report.json").read_text())["params"]["n_runs"] == 3
