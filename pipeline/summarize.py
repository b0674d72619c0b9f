"""Compact agent trajectories into short text records for capability labeling (Step 1).

Each trajectory becomes one record `{id, passed, reward, n_turns, text}`:

- `text` keeps every message's role, the tool names and their arguments; a message body (or one
  tool call's arguments) longer than `max_chars` keeps its head and tail around a marker
  `…[truncated N chars]…`, so a labeler sees how a long tool output starts and ends.
- `passed` is `reward >= pass_threshold`. When the outcome is unknown (a SWE trajectory without a
  report, a τ²-bench simulation without `reward_info`) `passed` and `reward` are null and an
  `UnknownOutcomeWarning` is issued. Downstream tools (`labels_to_run`, the aggregation) must treat
  such a record as "cannot be used": it is neither a failure nor a success.
- `n_turns` is the number of assistant messages.
- τ²-bench records also keep the evidence a labeler needs to tell why a trajectory failed:
  `user_instructions` (the simulated user's scenario from `tasks[]`: reason for the call, what the user
  knows and does not know, the task instructions), `termination_reason`, and `failure_reasons`, one
  `{"check", "scored", "detail"}` per check τ²-bench's evaluation marked as not met: `db` (final
  database differs), `action` (an expected tool call was not made as expected), `nl` (a natural-language
  assertion, with the judge's justification), `communicate` (information the user had to be told),
  `env` (an environment assertion). `scored` says whether that kind of check counts toward the reward
  (`reward_info.reward_basis`). The same three appear in `text`: the scenario before the transcript, the
  evaluation after it, so labelers that read only `text` see them too.

Supported inputs, detected from the content (not the file name, except `.jsonl`):

- τ²-bench `tau2 run` results JSON: `{"simulations": [{task_id, messages, reward_info{reward}, trial,
  seed, [sample_idx]}]}`. The id is the task_id; when one file holds several simulations of a task,
  `#<sample_idx>` (or `#<trial>`, `#<seed>`, `#<position>`: the first that tells them apart) is appended.
- mini-swe-agent `*.traj.json` (`trajectory_format` "mini-swe-agent-1"): id = `instance_id`.
- SWE-agent `.traj` (`trajectory[]` steps and/or `history[]` chat): id = file name without `.traj`.
  Demonstration messages (`is_demo`) are skipped: they are not this agent's behaviour.
- generic JSONL of OpenAI-style records `{"id", "messages", "reward"}` (reward may be null).

SWE outcomes come from SWE-bench reports, looked up for instance `<iid>` in `reports` (a folder or a
run-level report file) and, always, next to the trajectory: `<iid>.report.json` or
`<iid>/report.json` (per-instance `{"resolved": bool}`, possibly wrapped as `{"<iid>": {...}}`), else a
run-level harness report (`schema_version` 2, `resolved_ids` / `unresolved_ids`). In a run-level
report `empty_patch_ids` count as failed (the agent produced no patch) and `error_ids` as unknown
(the harness, not the agent, may be at fault).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from tqdm import tqdm

from common.cli import cli_entry, exit_code
from common.io import atomic_write_jsonl, check_output_path, load_json, load_jsonl
from common.validation import InputError

DEFAULT_MAX_CHARS = 1000
DEFAULT_PASS_THRESHOLD = 1.0
# Per-simulation keys that can tell apart several τ²-bench simulations of one task, in order of preference.
_TAU2_DISAMBIGUATION_KEYS = ("sample_idx", "trial", "seed")


class UnknownOutcomeWarning(UserWarning):
    """A trajectory whose pass/fail is unknown; its record has passed = reward = null."""


@dataclass(frozen=True)
class SummarizeOptions:
    """How to compact trajectories.

    max_chars: per message body (and per tool call's arguments), characters kept before truncating.
    pass_threshold: a trajectory passed when its reward is >= this value.
    reports: a folder with SWE-bench reports, or one run-level harness report file, or None.
    """

    max_chars: int = DEFAULT_MAX_CHARS
    pass_threshold: float = DEFAULT_PASS_THRESHOLD
    reports: Path | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) or self.max_chars < 1:
            raise InputError(f"max_chars must be a positive integer (got {self.max_chars!r}); e.g. 1000")
        if (not isinstance(self.pass_threshold, (int, float)) or not math.isfinite(self.pass_threshold)
                or self.pass_threshold <= 0):
            raise InputError(f"pass_threshold must be a finite number > 0 (got {self.pass_threshold!r}; at 0 or "
                             "below every trajectory passes); e.g. 1.0")
        if self.reports is not None and not Path(self.reports).exists():
            raise InputError(f"reports path {self.reports} does not exist; pass an existing folder or report file")


# ----------------------------------------------------------------------------------------------
# Text rendering
# ----------------------------------------------------------------------------------------------

def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the first and last characters of `text` (max_chars in all) around a truncation marker."""
    if len(text) <= max_chars:
        return text
    head = (max_chars + 1) // 2
    tail = max_chars - head
    removed = len(text) - head - tail
    return f"{text[:head]}…[truncated {removed} chars]…{text[len(text) - tail:] if tail else ''}"


def _content_to_text(content: Any) -> str:
    """Message content as plain text: strings as is, OpenAI content parts joined, other JSON dumped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and "type" in part:
                parts.append(f"[{part['type']}]")  # images/audio: keep only that something was there
            else:
                parts.append(json.dumps(part, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _tool_call_name_and_args(call: Any) -> tuple[str, str, str | None]:
    """(name, arguments as text, call id) for a τ²-bench call `{name, arguments}` or an OpenAI one
    `{id, function: {name, arguments}}`."""
    if not isinstance(call, dict):
        return "?", _content_to_text(call), None
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    name = call.get("name") or function.get("name") or "?"
    args = call.get("arguments", function.get("arguments", ""))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return str(name), args, call.get("id")


def render_messages(messages: Sequence[dict], max_chars: int) -> tuple[str, int]:
    """Render chat messages as compact text; returns (text, number of assistant messages).

    Each message starts with `[role]` (`[tool NAME]` for tool results whose call id is known); tool
    calls follow on their own line as `-> name(arguments)`.
    """
    call_names: dict[str, str] = {}  # tool-call id -> tool name, to label tool results
    lines: list[str] = []
    n_assistant = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("is_demo"):
            continue
        role = str(message.get("role") or "?")
        if role == "assistant":
            n_assistant += 1
        body = truncate_middle(_content_to_text(message.get("content")).strip(), max_chars)
        header = role
        if role == "tool":
            call_id = message.get("tool_call_id") or message.get("id")
            ids = message.get("tool_call_ids")
            if call_id is None and isinstance(ids, list) and ids:
                call_id = ids[0]
            name = message.get("name") or (call_names.get(str(call_id)) if call_id is not None else None)
            if name:
                header = f"tool {name}"
        lines.append(f"[{header}] {body}" if body else f"[{header}]")
        calls = message.get("tool_calls") or []
        for call in calls if isinstance(calls, list) else []:
            name, args, call_id = _tool_call_name_and_args(call)
            if call_id is not None:
                call_names[str(call_id)] = name
            lines.append(f"  -> {name}({truncate_middle(args, max_chars)})")
        # SWE-agent history messages carry the command in `action` when there are no tool calls; it is
        # shown unless the (untruncated) content already spells it out.
        action = message.get("action")
        if not calls and role == "assistant" and isinstance(action, str) and action.strip() \
                and action.strip() not in _content_to_text(message.get("content")):
            lines.append(f"  -> action: {truncate_middle(action.strip(), max_chars)}")
    return "\n".join(lines), n_assistant


def _swe_agent_steps_as_messages(steps: list) -> list[dict]:
    """SWE-agent `trajectory[]` steps (thought, action, observation) as assistant/tool messages."""
    messages = []
    for step in steps:
        if not isinstance(step, dict):
            continue
        messages.append({"role": "assistant", "content": step.get("thought") or step.get("response") or "",
                         "action": step.get("action") or ""})
        messages.append({"role": "tool", "content": step.get("observation") or ""})
    return messages


# ----------------------------------------------------------------------------------------------
# Outcomes
# ----------------------------------------------------------------------------------------------

def _outcome(reward: float | None, options: SummarizeOptions) -> tuple[bool | None, float | None]:
    """(passed, reward); both None when the reward is unknown."""
    if reward is None:
        return None, None
    return reward >= options.pass_threshold, float(reward)


def _warn_unknown(traj_id: str, why: str) -> None:
    warnings.warn(f"{traj_id}: pass/fail unknown ({why}); passed=null, reward=null", UnknownOutcomeWarning,
                  stacklevel=3)


def _per_instance_resolved(path: Path, instance_id: str) -> bool:
    """`resolved` from a per-instance SWE-bench report, wrapped as `{iid: {...}}` or not."""
    report = load_json(path)
    if isinstance(report, dict) and "resolved" not in report and instance_id in report:
        report = report[instance_id]
    if not isinstance(report, dict) or not isinstance(report.get("resolved"), bool):
        raise InputError(f"{path}: not a SWE-bench report for {instance_id} (needs a boolean 'resolved', "
                         f"possibly under the key '{instance_id}')")
    return report["resolved"]


def _is_run_level_report(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("resolved_ids"), list) and "unresolved_ids" in obj


class SweOutcomes:
    """Looks up SWE-bench resolution for instance ids from per-instance and run-level reports."""

    def __init__(self, reports: Path | None) -> None:
        self.reports = Path(reports) if reports is not None else None
        self._run_level: list[tuple[Path, dict]] | None = None

    def _run_level_reports(self) -> list[tuple[Path, dict]]:
        """Run-level reports: the `reports` file itself, or the top-level JSON files of the folder that
        look like one (per-instance reports and trajectories are skipped without being parsed)."""
        if self._run_level is None:
            found: list[tuple[Path, dict]] = []
            if self.reports is not None and self.reports.is_file():
                report = load_json(self.reports)
                if not _is_run_level_report(report):
                    raise InputError(f"{self.reports}: not a SWE-bench run-level report (needs 'resolved_ids' "
                                     "and 'unresolved_ids' lists)")
                found.append((self.reports, report))
            elif self.reports is not None:
                for path in sorted(self.reports.glob("*.json")):
                    if path.name.endswith((".report.json", ".traj.json")) or path.name == "report.json":
                        continue
                    report = load_json(path)
                    if _is_run_level_report(report):
                        found.append((path, report))
            self._run_level = found
        return self._run_level

    def resolved(self, instance_id: str, traj_path: Path) -> tuple[bool | None, str]:
        """(resolved or None when unknown, where the answer came from / why it is unknown)."""
        folders = [self.reports] if self.reports is not None and self.reports.is_dir() else []
        folders.append(traj_path.parent)
        for folder in folders:
            for candidate in (folder / f"{instance_id}.report.json", folder / instance_id / "report.json"):
                if candidate.is_file():
                    return _per_instance_resolved(candidate, instance_id), str(candidate)
        for path, report in self._run_level_reports():
            if instance_id in report["resolved_ids"]:
                return True, str(path)
            if instance_id in (report.get("unresolved_ids") or []) or instance_id in (report.get("empty_patch_ids") or []):
                return False, str(path)
            if instance_id in (report.get("error_ids") or []):
                return None, f"harness error for this instance in {path}"
        return None, "no SWE-bench report found; pass --reports DIR"


# ----------------------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------------------

def detect_format(path: Path, data: Any) -> str:
    """Name of the trajectory format of `data` (already parsed from `path`); InputError if unknown."""
    if isinstance(data, dict):
        if isinstance(data.get("simulations"), list):
            return "tau2"
        if str(data.get("trajectory_format", "")).startswith("mini-swe-agent"):
            return "mini-swe-agent"
        if isinstance(data.get("trajectory"), list) or isinstance(data.get("history"), list):
            return "swe-agent"
        keys = ", ".join(sorted(map(str, data))[:8])
        raise InputError(f"{path}: unknown trajectory format (top-level keys: {keys}); expected a τ²-bench results "
                         "file ('simulations'), a mini-swe-agent .traj.json ('trajectory_format'), a SWE-agent .traj "
                         "('trajectory'/'history') or a .jsonl of {id, messages, reward}")
    raise InputError(f"{path}: unknown trajectory format (top level is a {type(data).__name__}, not an object)")


def _reward_value(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: reward must be a number or null (got {value!r})")
    return float(value)


def _tau2_ids(path: Path, simulations: list[dict]) -> list[str]:
    """task_id per simulation, with `#<key value>` appended only for tasks simulated more than once."""
    task_ids = []
    for index, sim in enumerate(simulations):
        if not isinstance(sim, dict) or "task_id" not in sim or not isinstance(sim.get("messages"), list):
            raise InputError(f"{path}: simulations[{index}] needs 'task_id' and a 'messages' list")
        task_ids.append(str(sim["task_id"]))
    counts = Counter(task_ids)
    ids = list(task_ids)
    for task_id, count in counts.items():
        if count == 1:
            continue
        positions = [i for i, t in enumerate(task_ids) if t == task_id]
        for key in _TAU2_DISAMBIGUATION_KEYS:
            values = [simulations[i].get(key) for i in positions]
            if None not in values and len(set(map(str, values))) == len(values):
                for i, value in zip(positions, values):
                    ids[i] = f"{task_id}#{value}"
                break
        else:  # nothing tells them apart: their position among this task's simulations does
            for n, i in enumerate(positions):
                ids[i] = f"{task_id}#{n}"
    return ids


# reward_info key -> (check name in failure_reasons, reward_basis entry that scores it)
_TAU2_CHECK_BASIS = {"db": "DB", "action": "ACTION", "nl": "NL_ASSERTION", "communicate": "COMMUNICATE",
                     "env": "ENV_ASSERTION"}
_SCENARIO_FIELDS = ("reason_for_call", "known_info", "unknown_info", "task_instructions")
_DETAIL_CHARS = 400  # per failure reason; the transcript has its own budget


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def tau2_user_instructions(task: Any, max_chars: int) -> str | None:
    """The simulated user's scenario of a τ²-bench task as one text (None when the task has none)."""
    scenario = task.get("user_scenario") if isinstance(task, dict) else None
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else scenario
    if instructions is None:
        return None
    if isinstance(instructions, dict):
        parts = [f"{key}: {_as_text(instructions[key]).strip()}" for key in _SCENARIO_FIELDS
                 if instructions.get(key) not in (None, "")]
        parts += [f"{key}: {_as_text(value).strip()}" for key, value in instructions.items()
                  if key not in _SCENARIO_FIELDS and key != "domain" and value not in (None, "")]
        text = "\n".join(parts)
    else:
        text = _as_text(instructions).strip()
    return truncate_middle(text, max_chars) if text else None


def tau2_failure_reasons(reward_info: Any) -> list[dict]:
    """One `{"check", "scored", "detail"}` per evaluation check of a τ²-bench simulation that was not met."""
    if not isinstance(reward_info, dict):
        return []
    basis = reward_info.get("reward_basis")
    basis = set(basis) if isinstance(basis, list) else None
    reasons: list[dict] = []

    def add(check: str, detail: str) -> None:
        scored = None if basis is None else _TAU2_CHECK_BASIS[check] in basis
        reasons.append({"check": check, "scored": scored, "detail": truncate_middle(detail, _DETAIL_CHARS)})

    def items(key: str) -> list[dict]:
        value = reward_info.get(key)
        return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []

    db_check = reward_info.get("db_check")
    if isinstance(db_check, dict) and db_check.get("db_match") is False:
        add("db", "the final database differs from the expected one")
    for check in items("action_checks"):
        if check.get("action_match") is False:
            action = check.get("action") if isinstance(check.get("action"), dict) else {}
            args = json.dumps(action.get("arguments"), ensure_ascii=False, sort_keys=True)
            add("action", f"expected call {action.get('name', '?')}({args}) was not made with these arguments")
    for check in items("nl_assertions"):
        if check.get("met") is False:
            why = check.get("justification")
            add("nl", f"not met: {_as_text(check.get('nl_assertion'))}" + (f" (judge: {_as_text(why)})" if why else ""))
    for check in items("communicate_checks"):
        if check.get("met") is False:
            add("communicate", f"the user was not told: {_as_text(check.get('info'))}")
    for check in items("env_assertions"):
        if check.get("met") is False:
            assertion = check.get("env_assertion", check)
            add("env", f"environment assertion not met: {_as_text(assertion)}")
    return reasons


def _tau2_text(transcript: str, instructions: str | None, termination: Any, reward: float | None,
               reasons: list[dict]) -> str:
    """The transcript between the user's scenario and the evaluation."""
    head = f"[user scenario] {instructions}\n" if instructions else ""
    outcome = "unknown" if reward is None else f"{reward:g}"
    tail = [f"[evaluation] reward {outcome}; ended: {termination or 'unknown'}"]
    for reason in reasons:
        scored = {True: "", False: " (not scored)", None: ""}[reason["scored"]]
        tail.append(f"  failed {reason['check']} check{scored}: {reason['detail']}")
    return head + transcript + "\n" + "\n".join(tail)


def _summarize_tau2(path: Path, data: dict, options: SummarizeOptions) -> list[dict]:
    simulations = data["simulations"]
    tasks = {str(task.get("id")): task for task in data.get("tasks") or [] if isinstance(task, dict)}
    records = []
    for index, (sim, traj_id) in enumerate(zip(simulations, _tau2_ids(path, simulations))):
        reward_info = sim.get("reward_info")
        if reward_info is not None and not isinstance(reward_info, dict):
            raise InputError(f"{path}: simulations[{index}].reward_info must be an object or null")
        reward = _reward_value((reward_info or {}).get("reward"), f"{path}: simulations[{index}]")
        if reward is None:
            _warn_unknown(traj_id, f"{path.name}: no reward_info.reward")
        transcript, n_turns = render_messages(sim["messages"], options.max_chars)
        passed, reward = _outcome(reward, options)
        instructions = tau2_user_instructions(tasks.get(str(sim["task_id"])), options.max_chars)
        termination = sim.get("termination_reason")
        termination = None if termination is None else _as_text(termination)
        reasons = tau2_failure_reasons(reward_info)
        records.append({"id": traj_id, "passed": passed, "reward": reward, "n_turns": n_turns,
                        "text": _tau2_text(transcript, instructions, termination, reward, reasons),
                        "user_instructions": instructions, "termination_reason": termination,
                        "failure_reasons": reasons})
    return records


def _swe_record(path: Path, instance_id: str, messages: list, options: SummarizeOptions,
                outcomes: SweOutcomes) -> dict:
    resolved, source = outcomes.resolved(instance_id, path)
    if resolved is None:
        _warn_unknown(instance_id, source)
    reward = None if resolved is None else float(resolved)
    text, n_turns = render_messages(messages, options.max_chars)
    passed, reward = _outcome(reward, options)
    return {"id": instance_id, "passed": passed, "reward": reward, "n_turns": n_turns, "text": text}


def _summarize_mini_swe_agent(path: Path, data: dict, options: SummarizeOptions, outcomes: SweOutcomes) -> list[dict]:
    if not isinstance(data.get("messages"), list):
        raise InputError(f"{path}: mini-swe-agent trajectory without a 'messages' list")
    instance_id = data.get("instance_id") or path.name.removesuffix(".json").removesuffix(".traj")
    return [_swe_record(path, str(instance_id), data["messages"], options, outcomes)]


def _summarize_swe_agent(path: Path, data: dict, options: SummarizeOptions, outcomes: SweOutcomes) -> list[dict]:
    history = data.get("history") if isinstance(data.get("history"), list) else []
    # The chat history has the system prompt and the issue; the steps alone are the fallback.
    messages = history or _swe_agent_steps_as_messages(data.get("trajectory") or [])
    instance_id = path.name.removesuffix(".json").removesuffix(".traj")
    return [_swe_record(path, instance_id, messages, options, outcomes)]


def _summarize_jsonl(path: Path, options: SummarizeOptions) -> list[dict]:
    records = []
    for number, item in enumerate(load_jsonl(path), start=1):
        where = f"{path}: record {number}"
        if not isinstance(item, dict) or "id" not in item or not isinstance(item.get("messages"), list):
            raise InputError(f"{where}: expected an object with 'id' and a 'messages' list")
        if "reward" not in item:
            raise InputError(f"{where}: missing 'reward' (use null when pass/fail is unknown)")
        traj_id = str(item["id"])
        reward = _reward_value(item["reward"], where)
        if reward is None:
            _warn_unknown(traj_id, f"{path.name}: reward is null")
        text, n_turns = render_messages(item["messages"], options.max_chars)
        passed, reward = _outcome(reward, options)
        records.append({"id": traj_id, "passed": passed, "reward": reward, "n_turns": n_turns, "text": text})
    return records


def _domain_label(path: Path) -> str:
    """Prefix used when ids of several files collide: the τ²-bench domain name, else the file stem."""
    if path.suffix != ".jsonl":
        data = load_json(path)
        domain = ((data.get("info") or {}).get("environment_info") or {}).get("domain_name") \
            if isinstance(data, dict) and isinstance(data.get("info"), dict) else None
        if isinstance(domain, str) and domain:
            return domain
    return path.name.split(".")[0]


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def summarize_file(path: str | Path, max_chars: int = DEFAULT_MAX_CHARS,
                   pass_threshold: float = DEFAULT_PASS_THRESHOLD, reports: str | Path | None = None,
                   _outcomes: SweOutcomes | None = None) -> list[dict]:
    """Compact every trajectory in one file (format auto-detected) into `{id, passed, reward, n_turns, text}`.

    Raises InputError for a missing file, broken JSON, an unknown format or bad options.
    """
    options = SummarizeOptions(max_chars=max_chars, pass_threshold=pass_threshold,
                               reports=Path(reports) if reports is not None else None)
    path = Path(path)
    if path.suffix == ".jsonl":
        return _summarize_jsonl(path, options)
    data = load_json(path)
    kind = detect_format(path, data)
    if kind == "tau2":
        return _summarize_tau2(path, data, options)
    outcomes = _outcomes or SweOutcomes(options.reports)
    if kind == "mini-swe-agent":
        return _summarize_mini_swe_agent(path, data, options, outcomes)
    return _summarize_swe_agent(path, data, options, outcomes)


def summarize_paths(paths: Iterable[str | Path], max_chars: int = DEFAULT_MAX_CHARS,
                    pass_threshold: float = DEFAULT_PASS_THRESHOLD,
                    reports: str | Path | None = None) -> list[dict]:
    """Compact all trajectories of several files into one list with unique ids.

    When ids of different files collide (e.g. task "0" of two τ²-bench domains), every record of the
    files involved gets the prefix `<domain>:` (τ²-bench) or `<file stem>:`. Files whose ids still collide
    (two result files of one τ²-bench domain) get `<domain>:<file stem>:` instead; ids that clash even then
    (files of one name in two folders) are an InputError. Ids that did not clash keep their form.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("no input files given")
    outcomes = SweOutcomes(Path(reports)) if reports is not None else None
    per_file: list[list[dict]] = []
    for path in tqdm(paths, desc="summarize", unit="file", disable=None, file=sys.stderr):
        per_file.append(summarize_file(path, max_chars=max_chars, pass_threshold=pass_threshold,
                                       reports=reports, _outcomes=outcomes))
    for index, records in enumerate(per_file):
        duplicates_inside = [i for i, c in Counter(r["id"] for r in records).items() if c > 1]
        if duplicates_inside:
            raise InputError(f"{paths[index]}: duplicate trajectory ids {duplicates_inside[:5]}")
    clashing = _clashing_files(per_file)
    labels = {index: _domain_label(paths[index]) for index in clashing}
    for index in clashing:
        for record in per_file[index]:
            record["id"] = f"{labels[index]}:{record['id']}"
    # Files of one τ²-bench domain (two batches of its tasks) still clash under `<domain>:`: those files, and only
    # those, get `<domain>:<file stem>:` (the domain stays the first part, which the aggregation groups examples by).
    still_clashing = _clashing_files(per_file)
    for index in still_clashing:
        stem = paths[index].name.split(".")[0]
        if labels.get(index, stem) == stem:  # unprefixed, or the label already was the stem: refused below
            continue
        for record in per_file[index]:
            record["id"] = f"{labels[index]}:{stem}:{record['id'][len(labels[index]) + 1:]}"
    merged = [record for records in per_file for record in records]
    still = [i for i, c in Counter(r["id"] for r in merged).items() if c > 1]
    if still:
        raise InputError(f"trajectory ids {still[:5]} occur in several input files even after prefixing them with "
                         "the domain and file name (files of the same name in different folders?); rename one, or "
                         "summarize those files separately")
    return merged


def _clashing_files(per_file: list[list[dict]]) -> list[int]:
    """The indexes of the files holding an id that another file holds too."""
    owner_files: dict[str, set[int]] = {}
    for index, records in enumerate(per_file):
        for record in records:
            owner_files.setdefault(record["id"], set()).add(index)
    return sorted({i for owners in owner_files.values() if len(owners) > 1 for i in owners})


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """CLI: `python -m pipeline._summarize INPUT... --out FILE.jsonl [--max-chars N] [--reports DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m pipeline._summarize", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="trajectory files (τ²-bench JSON, *.traj.json, *.traj, *.jsonl)")
    parser.add_argument("--out", required=True, help="output JSONL, one {id, passed, reward, n_turns, text} per line")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                        help=f"per-message character budget before head/tail truncation (default {DEFAULT_MAX_CHARS})")
    parser.add_argument("--pass-threshold", type=float, default=DEFAULT_PASS_THRESHOLD,
                        help="reward at or above which a trajectory counts as passed (default 1.0)")
    parser.add_argument("--reports", default=None,
                        help="folder of SWE-bench reports (<iid>.report.json, <iid>/report.json, run-level *.json) "
                             "or one run-level report file")
    args = parser.parse_args(argv)
    # Options and the output path first, so a bad flag is reported before any file is read.
    SummarizeOptions(max_chars=args.max_chars, pass_threshold=args.pass_threshold,
                     reports=Path(args.reports) if args.reports is not None else None)
    check_output_path(args.out, "--out", [*(("an input", path) for path in args.inputs), ("--reports", args.reports)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownOutcomeWarning)
        records = summarize_paths(args.inputs, max_chars=args.max_chars, pass_threshold=args.pass_threshold,
                                  reports=args.reports)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    atomic_write_jsonl(args.out, records)
    n_passed = sum(r["passed"] is True for r in records)
    n_unknown = sum(r["passed"] is None for r in records)
    print(f"wrote {len(records)} trajectories to {args.out}: {n_passed} passed, "
          f"{len(records) - n_passed - n_unknown} failed, {n_unknown} unknown", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
