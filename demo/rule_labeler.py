"""Rule-based stand-in for the LLM labelers of Step 1, used by the CPU demo.

In TRACE, N independent LLM labelers read each trajectory and mark every candidate capability NA /
PRESENT / LACKING. The demo has no LLM, so this module derives labels from documented rules over
τ²-bench results: the agent's tool calls, the tool results, and the evaluation details τ²-bench
stores with each simulation (gold actions of the task, action checks, communicate checks). It is a
stand-in, not a substitute: the rules only see what τ²-bench logged, and they read the task's whole
gold action list, which a real labeler is not shown (its `summary.jsonl` record lists only the checks
that failed).

Independent labelers disagree. To imitate that honestly rather than hand out ten identical votes,
labeler r applies the rules and then, with its own seeded random draw per (trajectory, capability),
misses evidence (LACKING -> PRESENT, "PRESENT when unsure") with probability `miss_rate` and
over-reads it (PRESENT -> LACKING) with probability `false_alarm_rate`. The aggregation's Fleiss' κ
then shows how much the runs agree.

The rules (agent write = a call to a tool that changes state; read tools are get_/find_/search_/list_
/calculate/think):
- multi_step_task_completion: NA when the task's gold plan has fewer than 2 writes; LACKING when a
  gold write tool is never called or the agent made fewer writes than the gold plan; else PRESENT.
- structured_data_reasoning: NA when the agent made no write; LACKING when the agent called a gold
  write tool but τ²-bench's action check for that gold action failed (right tool, wrong values read
  from earlier tool output); else PRESENT.
- precondition_verification: NA when neither the agent nor the gold plan writes; LACKING when the
  agent made a write that the gold plan does not contain, or wrote before any read call; else PRESENT.
- tool_calling_precision: NA when the agent made no tool call; LACKING when a tool call returned an
  error; else PRESENT.
- information_communication: NA when the task has no communicate checks; LACKING when one is unmet while
  the other rules find nothing wrong with the actions (when they do, the unmet value is their consequence:
  an agent that skipped the status check cannot report the status); else PRESENT.
- escalation_judgment: NA when neither the agent nor the gold plan transfers to a human; LACKING when
  exactly one of them does; else PRESENT.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterable

READ_TOOL_PREFIXES = ("get_", "find_", "search_", "list_", "calculate", "think")
TRANSFER_TOOL = "transfer_to_human_agents"

CANDIDATES = [
    {
        "name": "multi_step_task_completion",
        "description": "Completes every sub-request of a compound request instead of stopping after the first one.",
    },
    {
        "name": "structured_data_reasoning",
        "description": "Reads the right fields out of nested tool output (ids, prices, payment methods) and uses "
        "them correctly in later tool arguments.",
    },
    {
        "name": "precondition_verification",
        "description": "Checks the policy's preconditions (status, eligibility, ownership) before a state-changing "
        "action, and does not act when they fail.",
    },
    {
        "name": "tool_calling_precision",
        "description": "Calls tools with well-formed, exactly formatted arguments so that calls do not error.",
    },
    {
        "name": "information_communication",
        "description": "Tells the user the specific values the task requires (amounts, statuses, counts).",
    },
    {
        "name": "escalation_judgment",
        "description": "Transfers to a human agent exactly when the policy requires it, and otherwise resolves "
        "the request itself.",
    },
]


def is_write_tool(name: str) -> bool:
    return not name.startswith(READ_TOOL_PREFIXES) and name != TRANSFER_TOOL


@dataclass(frozen=True)
class Evidence:
    """What the rules look at, extracted once per simulation."""

    agent_calls: tuple[str, ...]
    tool_errors: int
    gold_actions: tuple[str, ...]
    failed_gold_actions: tuple[str, ...]
    communicate_met: tuple[bool, ...]


def extract_evidence(simulation: dict[str, Any], task: dict[str, Any] | None) -> Evidence:
    """Pull tool calls, tool errors and evaluation details out of one τ²-bench simulation."""
    calls: list[str] = []
    errors = 0
    for message in simulation.get("messages") or []:
        if message.get("role") == "assistant":
            calls.extend(call.get("name", "") for call in message.get("tool_calls") or [])
        elif message.get("role") == "tool":
            content = str(message.get("content") or "")
            if message.get("error") or content.startswith("Error"):
                errors += 1
    reward_info = simulation.get("reward_info") or {}
    criteria = (task or {}).get("evaluation_criteria") or {}
    # The gold plan: the task's evaluation criteria, or else the simulation's own action checks, which list
    # every gold action with its verdict (the storefront's results; the demo passes no task at all).
    gold = tuple(action.get("name", "") for action in criteria.get("actions") or []) or tuple(
        check["action"].get("name", "") for check in reward_info.get("action_checks") or [])
    failed = tuple(
        check["action"].get("name", "")
        for check in reward_info.get("action_checks") or []
        if not check.get("action_match", True)
    )
    met = tuple(bool(check.get("met")) for check in reward_info.get("communicate_checks") or [])
    return Evidence(tuple(calls), errors, gold, failed, met)


def rule_labels(evidence: Evidence) -> dict[str, str]:
    """The noiseless rule verdict for every candidate capability."""
    agent_writes = [name for name in evidence.agent_calls if is_write_tool(name)]
    gold_writes = [name for name in evidence.gold_actions if is_write_tool(name)]
    labels: dict[str, str] = {}

    if len(gold_writes) < 2:
        labels["multi_step_task_completion"] = "NA"
    elif any(name not in agent_writes for name in gold_writes) or len(agent_writes) < len(gold_writes):
        labels["multi_step_task_completion"] = "LACKING"
    else:
        labels["multi_step_task_completion"] = "PRESENT"

    if not agent_writes:
        labels["structured_data_reasoning"] = "NA"
    elif any(is_write_tool(name) and name in agent_writes for name in evidence.failed_gold_actions):
        labels["structured_data_reasoning"] = "LACKING"
    else:
        labels["structured_data_reasoning"] = "PRESENT"

    if not agent_writes and not gold_writes:
        labels["precondition_verification"] = "NA"
    else:
        first_write = next((i for i, n in enumerate(evidence.agent_calls) if is_write_tool(n)), None)
        wrote_blind = first_write is not None and not any(
            n.startswith(READ_TOOL_PREFIXES) for n in evidence.agent_calls[:first_write]
        )
        unwarranted = any(name not in gold_writes for name in agent_writes)
        labels["precondition_verification"] = "LACKING" if (wrote_blind or unwarranted) else "PRESENT"

    if not evidence.agent_calls:
        labels["tool_calling_precision"] = "NA"
    else:
        labels["tool_calling_precision"] = "LACKING" if evidence.tool_errors else "PRESENT"

    if not evidence.communicate_met:
        labels["information_communication"] = "NA"
    elif all(evidence.communicate_met):
        labels["information_communication"] = "PRESENT"
    elif "LACKING" in labels.values():
        # The agent also acted wrongly: an unmet value is a consequence (it cannot report a status it never
        # checked, or the result of a write it did not make), not a separate communication deficit.
        labels["information_communication"] = "PRESENT"
    else:
        labels["information_communication"] = "LACKING"

    agent_transferred = TRANSFER_TOOL in evidence.agent_calls
    gold_transfers = TRANSFER_TOOL in evidence.gold_actions
    if not agent_transferred and not gold_transfers:
        labels["escalation_judgment"] = "NA"
    else:
        labels["escalation_judgment"] = "PRESENT" if agent_transferred == gold_transfers else "LACKING"
    return labels


def noisy_labeler(
    rule_verdicts: dict[str, dict[str, str]],
    run: int,
    *,
    miss_rate: float = 0.15,
    false_alarm_rate: float = 0.05,
    seed: int = 0,
) -> list[dict[str, str]]:
    """Labeler `run`'s flat label records `{"trajectory_id", "capability", "label"}`.

    `rule_verdicts` maps trajectory id -> {capability: rule label}. Each (run, trajectory, capability)
    draws from its own `random.Random` (string seeds hash deterministically), so labelers are
    independent of each other and of iteration order.
    """
    for rate, name in ((miss_rate, "miss_rate"), (false_alarm_rate, "false_alarm_rate")):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {rate}")
    records = []
    for trajectory_id in sorted(rule_verdicts):
        for capability, label in sorted(rule_verdicts[trajectory_id].items()):
            draw = random.Random(f"{seed}:{run}:{trajectory_id}:{capability}").random()
            if label == "LACKING" and draw < miss_rate:
                label = "PRESENT"
            elif label == "PRESENT" and draw < false_alarm_rate:
                label = "LACKING"
            records.append({"trajectory_id": trajectory_id, "capability": capability, "label": label})
    return records


def candidates_with_examples(verdicts: dict[str, dict[str, str]], summary: list[dict]) -> tuple[dict, list[str]]:
    """Phase 1 output from the fixed candidates: ({"candidates": [...]}, names dropped).

    Each candidate gets up to two failed trajectories where the rules say LACKING and one passed trajectory
    where they say PRESENT. A candidate with no failed LACKING example is dropped: the Phase-1 check of
    prompts/*/capability_selection.md refuses a candidate without a failed example.
    """
    by_id = {record["id"]: record for record in summary}
    candidates, dropped = [], []
    for candidate in CANDIDATES:
        name = candidate["name"]
        failed = [tid for tid in sorted(verdicts) if by_id[tid]["passed"] is False and verdicts[tid][name] == "LACKING"]
        passed = [tid for tid in sorted(verdicts) if by_id[tid]["passed"] is True and verdicts[tid][name] == "PRESENT"]
        if not failed:
            dropped.append(name)
            continue
        examples = [{"task_id": tid, "reward": by_id[tid]["reward"], "note": "rule verdict LACKING"}
                    for tid in failed[:2]]
        examples += [{"task_id": tid, "reward": by_id[tid]["reward"], "note": "rule verdict PRESENT"}
                     for tid in passed[:1]]
        candidates.append({**candidate, "example_trajectories": examples})
    return {"candidates": candidates}, dropped


def candidate_names() -> Iterable[str]:
    return [c["name"] for c in CANDIDATES]
