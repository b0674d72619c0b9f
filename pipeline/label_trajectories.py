"""Step 1 without a person in the loop: LLM labelers over any OpenAI-compatible endpoint.

    python -m pipeline.label_trajectories SUMMARY.jsonl --out DIR --base-url URL --model NAME \\
        [--api-key-env OPENAI_API_KEY] (--candidates FILE | --propose) [--runs 10] [--concurrency 4] ...

SUMMARY.jsonl is the `_summarize` output (`id`, `passed`, `text` per trajectory); trajectories whose
`passed` is null are skipped with a warning (their outcome is unknown).

Phase 1 (`--propose`): one discovery call over a seeded sample of failed and passed trajectories
returns the candidates JSON of the capability-selection prompt; it is validated (snake_case unique
names, the configured count, example ids from the summary, a failed example each) and saved to
`DIR/candidates.json`. `--candidates FILE` skips it.

Phase 2: run r (1..N) is an independent labeler: its own `seed` (--seed + r) and temperature, no shared
context. One chat-completion call per (run, trajectory) labels every candidate: the answer is a JSON
object mapping each capability name to {"label": "NA"|"PRESENT"|"LACKING", "reason": str}
(`--json-mode object` asks for response_format json_object, `schema` for a JSON schema — vLLM's guided
decoding —, `none` for nothing). An invalid answer, or one that misses or mislabels a capability, is
answered with the problem and asked again for the capabilities still missing, up to --max-attempts
answers; pairs still unlabeled then are recorded as NA and counted in `DIR/labeling_report.json`. An answer that
gives one key twice (a capability labeled twice, "label" twice in an entry) is such an invalid answer. When more
than --max-defaulted-share (default 0.10) of all (trajectory, capability) pairs were defaulted so, the labels are
not usable (a model that cannot answer in this format): exit 1 with one line, the report lists the pairs, and no
run file, aggregation or export is written; below it, a warning names the count. Runs are independent only when
they sample: more than one run at temperature 0 draws a warning (greedy decoding answers them all alike).

Outputs: `DIR/run_01.json` ... `run_NN.json` in the aggregation schema (built by `labels_to_run`,
checked by `aggregate_capabilities.validate_run`), `DIR/labeling_report.json`, then the aggregation
(`--export`, default `DIR/selected_capabilities.json`, and its `_report.json`) with its table printed. Run
files in DIR beyond run_NN (an earlier labeling with more runs) are refused before any call: the aggregation's
`DIR/run_*.json` would count them. A repeated run keeps the Step-2 status of the capabilities still selected
(see `aggregate_capabilities.write_outputs`).

Resuming: every finished call is appended to `DIR/label_cache.jsonl` (or `--cache FILE`), keyed by sha256 of
(model, hash of the prompt and sampling parameters, trajectory id, capability set, run); an interrupted or repeated
invocation pays only for what is missing, and for the calls whose pairs were defaulted to NA when --max-attempts
is now larger than they were made with (the new answer replaces the cached one; the same --max-attempts asks
nothing again). Ctrl-C stops at once (exit 130): the calls in flight are dropped, the finished ones stay in the
cache, no run file is written. Every flag, path and the --base-url (http:// or https://)
are checked before the summary is read, `--dry-run` included. `--dry-run` prints the calls it would make and an
estimate of their prompt tokens, and makes none. HTTP retries, Retry-After, --requests-per-minute: see
`common/llm_client.py`. The API key is read from the variable named by --api-key-env and is never
printed, logged, cached or written.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import queue
import random
import re
import sys
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from common.cli import INTERRUPTED, cli_entry, exit_code, seed_value
from common.run_folder import claimed_run_folder
from common.io import (append_line, atomic_write_json, check_output_folder, check_output_path, json_line,
                       load_jsonl)
from common.validation import InputError, check_number, check_url
from pipeline.summarize import truncate_middle
from pipeline.aggregate_capabilities import (CATEGORIES, AggregationConfig, aggregate, check_outputs, exact_threshold,
                                             format_table, load_candidates, queue_messages, validate_run, write_outputs)
from pipeline.labels_to_run import SkippedTrajectoryWarning, labels_to_run
from common.llm_client import ChatClient, FatalAPIError, RateLimiter, RetryPolicy

JSON_MODES = ("object", "schema", "none")
CACHE_NAME = "label_cache.jsonl"
REPORT_NAME = "labeling_report.json"
CANDIDATES_NAME = "candidates.json"
CHARS_PER_TOKEN = 4  # the --dry-run estimate; real tokenizers differ, so it is only an estimate
MAX_QUOTED_ANSWER = 2000  # characters of a rejected answer repeated back to the model
SNAKE_CASE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
CAPABILITY_LINE = "Capabilities (the JSON keys of your answer): "

LABEL_SYSTEM_PROMPT = """\
You label one agent trajectory for capability selection. For EACH capability listed, choose one label:
- NA: the task never needed this capability.
- PRESENT: the task needed it and the agent showed it (also on a failed trajectory that failed for another reason).
- LACKING: the task needed it and the agent did not show it; on a failed trajectory, its absence contributed \
to the failure.
When unsure between PRESENT and LACKING, choose PRESENT: a false LACKING inflates both coverage and gap.
Judge each capability on its own; do not aim for any distribution.
Answer with one JSON object and nothing else. Its keys are the capability names exactly as listed; each value is
{"label": "NA" or "PRESENT" or "LACKING", "reason": "one short sentence"}."""

PROPOSE_SYSTEM_PROMPT = """\
You analyse failed and passed trajectories of an AI agent on a benchmark and propose the reusable capabilities
whose absence explains the failures. A real deficit is lacking in failures and present in passes; something the
agent gets wrong everywhere does not explain failure. A capability is a reusable skill that would matter on
unseen tasks and could be trained in a small synthetic environment: not a task-specific error, not a domain
rule, not a restatement of the outcome ("task_failure"). Make candidates distinct (merge two that would always
get the same labels) and describe each so that a labeler who never saw your notes can tell, on a failed
trajectory, whether this capability was lacking or the failure came from something else.
Answer with one JSON object and nothing else:
{"candidates": [{"name": "snake_case_name",
  "description": "2-3 sentences: what the skill is, when a task needs it, what LACKING looks like.",
  "example_trajectories": [{"task_id": "<trajectory id>", "reward": 0.0, "note": "how the agent lacked it"},
                           {"task_id": "<trajectory id>", "reward": 1.0, "note": "how the agent showed it"}]}]}
Every candidate needs at least one failed example; use only the trajectory ids shown."""


# ----------------------------------------------------------------------------------------------
# Configuration and inputs
# ----------------------------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LabelingConfig:
    """Everything that shapes the labeling calls (the endpoint and key are separate)."""

    model: str
    runs: int = 10
    temperatures: tuple[float, ...] = (1.0,)
    seed: int = 0
    max_tokens: int = 2048
    max_attempts: int = 3
    json_mode: str = "object"
    concurrency: int = 4
    max_trajectory_chars: int | None = None
    min_candidates: int = 5
    max_candidates: int = 10
    propose_failed: int = 20
    propose_passed: int = 10
    propose_max_chars: int = 4000

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InputError("model must be a non-empty string; pass --model NAME (the server's model name)")
        for name in ("runs", "max_tokens", "max_attempts", "concurrency", "min_candidates", "propose_max_chars"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise InputError(f"{name} must be an integer >= 1 (got {value!r}); e.g. --{name.replace('_', '-')} 3")
        for name in ("propose_failed", "propose_passed"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise InputError(f"{name} must be an integer >= 0 (got {getattr(self, name)!r})")
        if not _is_int(self.max_candidates) or self.max_candidates < self.min_candidates:
            raise InputError(f"max_candidates ({self.max_candidates!r}) must be an integer >= min_candidates "
                             f"({self.min_candidates}); e.g. --min-candidates 5 --max-candidates 10")
        if not _is_int(self.seed):
            raise InputError(f"seed must be an integer (got {self.seed!r})")
        if self.json_mode not in JSON_MODES:
            raise InputError(f"json_mode must be one of {', '.join(JSON_MODES)} (got {self.json_mode!r})")
        if self.max_trajectory_chars is not None and (not _is_int(self.max_trajectory_chars)
                                                      or self.max_trajectory_chars < 1):
            raise InputError(f"max_trajectory_chars must be an integer >= 1 or None (got {self.max_trajectory_chars!r})")
        if len(self.temperatures) not in (1, self.runs):
            raise InputError(f"give one temperature or one per run ({self.runs}); got {len(self.temperatures)}: "
                             "e.g. --temperature 1.0 or --temperature 0.6,0.8,1.0 with --runs 3")
        for value in self.temperatures:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InputError(f"temperatures must be finite numbers >= 0 (got {value!r})")

    def temperature(self, run: int) -> float:
        """Sampling temperature of run `run` (1-based)."""
        return float(self.temperatures[0] if len(self.temperatures) == 1 else self.temperatures[run - 1])

    def run_seed(self, run: int) -> int:
        """Sampling seed of run `run` (1-based): each labeler draws its own samples."""
        return self.seed + run


@dataclass(frozen=True)
class Trajectory:
    """One usable `_summarize` record."""

    id: str
    passed: bool
    reward: float | None
    text: str


def load_summary(path: str | Path) -> tuple[list[Trajectory], list[str]]:
    """(usable trajectories in file order, ids skipped because `passed` is null); InputError on bad records."""
    usable: list[Trajectory] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for number, record in enumerate(load_jsonl(path), start=1):
        where = f"{path}: record {number}"
        if not isinstance(record, dict) or "id" not in record or "passed" not in record:
            raise InputError(f"{where}: expected a _summarize record with 'id', 'passed' and 'text'")
        traj_id = record["id"]
        if not (isinstance(traj_id, str) and traj_id) and not _is_int(traj_id):
            raise InputError(f"{where}: 'id' must be a non-empty string (got {traj_id!r})")
        traj_id = str(traj_id)
        if traj_id in seen:
            raise InputError(f"{where}: trajectory id {traj_id!r} occurs twice")
        seen.add(traj_id)
        passed = record["passed"]
        if passed is None:
            skipped.append(traj_id)
            continue
        if not isinstance(passed, bool):
            raise InputError(f"{where}: 'passed' must be true, false or null (got {passed!r})")
        if not isinstance(record.get("text"), str):
            raise InputError(f"{where}: 'text' must be a string (the compacted transcript)")
        reward = record.get("reward")
        reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
        usable.append(Trajectory(traj_id, passed, reward, record["text"]))
    if not any(not t.passed for t in usable) or not any(t.passed for t in usable):
        n_failed = sum(not t.passed for t in usable)
        raise InputError(f"{path}: {n_failed} failed and {len(usable) - n_failed} passed trajectories with a known "
                         "outcome; the contrast needs at least one of each")
    return usable, skipped


# ----------------------------------------------------------------------------------------------
# Prompts and answers
# ----------------------------------------------------------------------------------------------

def _outcome_line(traj: Trajectory) -> str:
    reward = "" if traj.reward is None else f" (reward {traj.reward:g})"
    return f"Outcome: {'PASSED' if traj.passed else 'FAILED'}{reward}"


def _capability_block(names: Sequence[str], descriptions: dict[str, str]) -> str:
    lines = [CAPABILITY_LINE + json.dumps(list(names), ensure_ascii=False)]
    lines += [f"- {name}: {' '.join(descriptions.get(name, '').split())}" for name in names]
    return "\n".join(lines)


def label_messages(traj: Trajectory, descriptions: dict[str, str], max_chars: int | None) -> list[dict[str, str]]:
    """The first-attempt messages for labeling `traj` on every capability in `descriptions`."""
    text = traj.text if max_chars is None else truncate_middle(traj.text, max_chars)
    user = "\n".join([_capability_block(list(descriptions), descriptions), "",
                      f"Trajectory id: {traj.id}", _outcome_line(traj), "Transcript:", text])
    return [{"role": "system", "content": LABEL_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def retry_message(problems: list[str], missing: Sequence[str], descriptions: dict[str, str]) -> str:
    """The follow-up asking again for the capabilities still missing after a rejected answer."""
    return "\n".join(["Your answer could not be used: " + "; ".join(problems[:10]) + ".",
                      "Answer again with one JSON object for these capabilities only.",
                      _capability_block(missing, descriptions)])


def labels_schema(names: Sequence[str]) -> dict[str, Any]:
    """JSON schema of a labeling answer for `names` (kept to the subset strict servers accept)."""
    entry = {"type": "object",
             "properties": {"label": {"type": "string", "enum": list(CATEGORIES)}, "reason": {"type": "string"}},
             "required": ["label", "reason"], "additionalProperties": False}
    return {"type": "object", "properties": {name: entry for name in names}, "required": list(names),
            "additionalProperties": False}


def candidates_schema() -> dict[str, Any]:
    """JSON schema of a Phase-1 answer (counts and ids are checked after parsing, not in the schema)."""
    example = {"type": "object",
               "properties": {"task_id": {"type": "string"}, "reward": {"type": ["number", "null"]},
                              "note": {"type": "string"}},
               "required": ["task_id", "reward", "note"], "additionalProperties": False}
    candidate = {"type": "object",
                 "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                "example_trajectories": {"type": "array", "items": example}},
                 "required": ["name", "description", "example_trajectories"], "additionalProperties": False}
    return {"type": "object", "properties": {"candidates": {"type": "array", "items": candidate}},
            "required": ["candidates"], "additionalProperties": False}


def response_format(json_mode: str, schema_name: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The `response_format` request field for --json-mode."""
    if json_mode == "object":
        return {"type": "json_object"}
    if json_mode == "schema":
        return {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema, "strict": True}}
    return None


class _RepeatedKeys(dict):
    """A JSON object in which a key occurs more than once (`repeated`: those keys); `json.loads` would keep the last."""

    repeated: list[str]


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """`json.loads`' object_pairs_hook: a dict, marked as `_RepeatedKeys` when a key occurs twice."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = _RepeatedKeys(obj)
    marked.repeated = [key for key, count in Counter(key for key, _ in pairs).items() if count > 1]
    return marked


def _repeated_key(value: Any, path: tuple[str, ...] = ()) -> str | None:
    """The problem of the first object (depth first) that gives a key twice, naming the key and where it is."""
    if isinstance(value, _RepeatedKeys):
        inside = f" inside {'/'.join(path)!r}" if path else ""
        return f"the answer gives {value.repeated[0]!r} twice{inside} (which one is meant?); give each key once"
    if isinstance(value, dict):
        children = ((str(key), child) for key, child in value.items())
    elif isinstance(value, list):
        children = ((str(index), child) for index, child in enumerate(value))
    else:
        return None
    for name, child in children:
        problem = _repeated_key(child, (*path, name))
        if problem:
            return problem
    return None


def parse_json_object(text: str) -> tuple[dict | None, str | None]:
    """(object, None) for an answer holding one JSON object (code fences and chatter around it allowed),
    else (None, the problem). An object that gives one key twice (e.g. one capability labeled twice, or "label"
    twice in an entry) is a problem too: which value is meant is not known."""
    stripped = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", stripped, re.DOTALL)
    if fenced:
        stripped = fenced.group(1)
    candidates = [stripped]
    start, end = stripped.find("{"), stripped.rfind("}")
    if 0 <= start < end and (start, end) != (0, len(stripped) - 1):
        candidates.append(stripped[start:end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate, object_pairs_hook=_object_pairs)
            repeated = _repeated_key(value)
        except (json.JSONDecodeError, RecursionError):
            continue
        if repeated:
            return None, repeated
        if isinstance(value, dict):
            return value, None
        return None, f"the answer is JSON but a {type(value).__name__}, not an object"
    return None, "the answer is not valid JSON" if stripped else "the answer is empty"


def parse_label_answer(text: str, names: Sequence[str]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """(valid labels by capability, problems) for one answer; only capabilities in `names` are read."""
    obj, problem = parse_json_object(text)
    if obj is None:
        return {}, [problem or "no JSON object"]
    if not any(name in obj for name in names) and isinstance(obj.get("labels"), dict):
        obj = obj["labels"]  # a common wrapping: {"labels": {...}}
    labels: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for name in names:
        if name not in obj:
            problems.append(f"capability {name!r} is missing")
            continue
        entry = obj[name]
        if isinstance(entry, str):  # shorthand "LACKING": usable, no reason given
            entry = {"label": entry, "reason": ""}
        if not isinstance(entry, dict):
            problems.append(f"{name!r} must map to {{\"label\", \"reason\"}}")
            continue
        label = entry.get("label")
        label = label.strip().upper() if isinstance(label, str) else label
        if label not in CATEGORIES:
            problems.append(f"{name!r} has label {entry.get('label')!r}; use NA, PRESENT or LACKING")
            continue
        reason = entry.get("reason", "")
        labels[name] = {"label": label, "reason": reason if isinstance(reason, str) else json.dumps(reason)}
    return labels, problems


def validate_candidates(data: Any, ids: dict[str, bool], min_count: int, max_count: int) -> list[str]:
    """Problems of a Phase-1 candidates object (empty when it is usable); `ids` maps trajectory id -> passed."""
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
        return ["expected an object with a 'candidates' list"]
    candidates = data["candidates"]
    problems = [] if min_count <= len(candidates) <= max_count else \
        [f"{len(candidates)} candidates, want {min_count}-{max_count}"]
    names: list[str] = []
    for index, cand in enumerate(candidates):
        if not isinstance(cand, dict):
            problems.append(f"candidates[{index}] is not an object")
            continue
        name = cand.get("name")
        label = f"candidate {name!r}" if isinstance(name, str) else f"candidates[{index}]"
        if not isinstance(name, str) or not SNAKE_CASE.fullmatch(name):
            problems.append(f"{label}: name must be snake_case")
        elif name in names:
            problems.append(f"{label}: name used twice")
        else:
            names.append(name)
        if not isinstance(cand.get("description"), str) or not cand["description"].strip():
            problems.append(f"{label}: needs a non-empty description")
        examples = cand.get("example_trajectories")
        if not isinstance(examples, list):
            problems.append(f"{label}: example_trajectories must be a list")
            continue
        example_ids = [str(e.get("task_id")) for e in examples if isinstance(e, dict)]
        unknown = [i for i in example_ids if i not in ids]
        if unknown:
            problems.append(f"{label}: unknown trajectory ids {unknown[:3]}")
        if not any(ids.get(i) is False for i in example_ids):
            problems.append(f"{label}: no failed example trajectory")
    return problems


def propose_messages(failed: Sequence[Trajectory], passed: Sequence[Trajectory], config: LabelingConfig
                     ) -> list[dict[str, str]]:
    """The Phase-1 discovery prompt over the sampled trajectories."""
    parts = [f"Propose {config.min_candidates}-{config.max_candidates} candidate capabilities.", ""]
    for traj in [*failed, *passed]:
        parts += [f"=== Trajectory id: {traj.id}", _outcome_line(traj),
                  truncate_middle(traj.text, config.propose_max_chars), ""]
    return [{"role": "system", "content": PROPOSE_SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(parts)}]


def propose_sample(trajectories: Sequence[Trajectory], config: LabelingConfig) -> tuple[list[Trajectory], list[Trajectory]]:
    """A seeded sample of failed and passed trajectories for Phase 1 (all of them when there are fewer)."""
    rng = random.Random(config.seed)
    failed = [t for t in trajectories if not t.passed]
    passed = [t for t in trajectories if t.passed]
    return (rng.sample(failed, min(config.propose_failed, len(failed))),
            rng.sample(passed, min(config.propose_passed, len(passed))))


# ----------------------------------------------------------------------------------------------
# Cache
# ----------------------------------------------------------------------------------------------

def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class LabelCache:
    """Finished calls, one JSON line each, appended (and fsynced) as they finish; thread-safe.

    A line cut short by a kill is ignored on load (that call is simply made again). A later line with the same key
    (a call made again, see `reusable`) replaces the earlier one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict] = {}
        self.broken_lines = 0
        self._lock = threading.Lock()
        # A kill mid-write can leave the last line without its newline; the next append must start a
        # new line, or it would be glued to the cut one and lost with it on the next load.
        self._starts_mid_line = False
        self._closed = False
        if path.exists():
            # Bytes first, split at b"\n", then decoded line by line: a kill can cut the last line inside a
            # multi-byte UTF-8 character, which must cost that one line (made again), not the whole cache.
            # (Not splitlines(): a reason may hold U+2028 and the like.)
            data = path.read_bytes()
            self._starts_mid_line = bool(data) and not data.endswith(b"\n")
            for raw in data.split(b"\n"):
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    self.broken_lines += 1
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    self.entries[entry["key"]] = entry

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def close(self) -> None:
        """Take no more entries (after Ctrl-C); waits for an append in progress, so the file ends on a whole line."""
        with self._lock:
            self._closed = True

    def put(self, entry: dict) -> None:
        line = json_line(entry)
        with self._lock:
            if self._closed:
                return
            append_line(self.path, "\n" + line if self._starts_mid_line else line)
            self._starts_mid_line = False
            self.entries[entry["key"]] = entry


# ----------------------------------------------------------------------------------------------
# Labeling
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabelJob:
    """One (run, trajectory) call with its first-attempt request and cache key."""

    run: int
    trajectory: Trajectory
    messages: list[dict[str, str]]
    temperature: float
    seed: int
    key: str


def make_jobs(trajectories: Sequence[Trajectory], descriptions: dict[str, str], config: LabelingConfig) -> list[LabelJob]:
    """Every (run, trajectory) call, run-major, with cache keys."""
    names = sorted(descriptions)
    jobs = []
    for run in range(1, config.runs + 1):
        temperature, seed = config.temperature(run), config.run_seed(run)
        for traj in trajectories:
            messages = label_messages(traj, descriptions, config.max_trajectory_chars)
            prompt_hash = sha256_json({"messages": messages, "json_mode": config.json_mode, "temperature": temperature,
                                       "seed": seed, "max_tokens": config.max_tokens})
            key = sha256_json(["label", config.model, prompt_hash, traj.id, names, run])
            jobs.append(LabelJob(run, traj, messages, temperature, seed, key))
    return jobs


COUNTERS = ("calls", "retries", "invalid_answers", "prompt_tokens", "completion_tokens")


@dataclass
class RunStats:
    """Counters of one run: `now` for the calls of this invocation, `recorded` for every call behind its run
    file (cached ones included). calls = answers requested (HTTP retries not counted), retries = HTTP
    retries, invalid_answers = answers asked again (bad JSON, missing or invalid labels)."""

    now: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    recorded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    trajectories_from_cache: int = 0
    pairs_defaulted_to_na: int = 0
    defaulted: list[dict[str, str]] = field(default_factory=list)


def _entry_counters(entry: dict) -> dict[str, int]:
    """The COUNTERS of one cache entry."""
    return {"calls": entry.get("attempts", 0), "retries": entry.get("http_retries", 0),
            "invalid_answers": entry.get("invalid_answers", 0), "prompt_tokens": entry.get("prompt_tokens", 0),
            "completion_tokens": entry.get("completion_tokens", 0)}


def label_one(client: ChatClient, job: LabelJob, descriptions: dict[str, str], config: LabelingConfig,
              stats: RunStats, lock: threading.Lock) -> dict:
    """Label every capability for one (run, trajectory), asking again for what is missing; returns the cache entry."""
    names = list(descriptions)
    messages = [dict(m) for m in job.messages]
    labels: dict[str, dict[str, str]] = {}
    attempts = invalid = retries = prompt_tokens = completion_tokens = 0
    while attempts < config.max_attempts:
        missing = [name for name in names if name not in labels]
        result = client.complete(messages, temperature=job.temperature, seed=job.seed, max_tokens=config.max_tokens,
                                 response_format=response_format(config.json_mode, "capability_labels",
                                                                 labels_schema(missing)))
        attempts += 1
        retries += result.http_retries
        prompt_tokens += result.prompt_tokens
        completion_tokens += result.completion_tokens
        found, problems = parse_label_answer(result.text, missing)
        labels.update(found)
        if problems and result.finish_reason == "length":
            problems.append(f"the answer was cut at max_tokens {config.max_tokens}")
        if not problems:
            break
        invalid += 1
        still = [name for name in names if name not in labels]
        if not still:
            break
        messages += [{"role": "assistant", "content": result.text[:MAX_QUOTED_ANSWER]},
                     {"role": "user", "content": retry_message(problems, still, descriptions)}]
    defaulted = [name for name in names if name not in labels]
    for name in defaulted:
        labels[name] = {"label": "NA", "reason": f"defaulted to NA: no valid label after {attempts} answers"}
    entry = {"key": job.key, "kind": "label", "model": config.model, "run": job.run,
             "trajectory_id": job.trajectory.id, "labels": {name: labels[name] for name in names},
             "defaulted": defaulted, "attempts": attempts, "max_attempts": config.max_attempts,
             "http_retries": retries, "invalid_answers": invalid,
             "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    with lock:
        for name, value in _entry_counters(entry).items():
            stats.now[name] += value
    return entry


def reusable(entry: dict | None, config: LabelingConfig) -> bool:
    """Whether a cached label entry answers its job under `config` without a new call.

    An entry whose pairs were all labeled always does. One with pairs defaulted to NA does only while
    `config.max_attempts` is not larger than the max_attempts it was made with: a rerun with a larger
    --max-attempts asks again (and the new entry replaces it), a rerun with the same one stays free. Entries
    written before `max_attempts` was stored fall back on their `attempts`, which equals the max_attempts they
    were made with whenever a pair was defaulted (the answers ran out)."""
    if entry is None:
        return False
    if not entry.get("defaulted"):
        return True
    made_with = entry.get("max_attempts", entry.get("attempts"))
    return _is_int(made_with) and made_with >= config.max_attempts


def run_jobs(client: ChatClient, jobs: Sequence[LabelJob], descriptions: dict[str, str], config: LabelingConfig,
             cache: LabelCache, stats: dict[int, RunStats]) -> dict[str, dict]:
    """Label every job (cached ones without a call, see `reusable`), `config.concurrency` at a time; key -> cache
    entry.

    The first FatalAPIError stops new calls, lets the running ones finish (their results are cached) and is
    re-raised; a rerun resumes from the cache. Ctrl-C (KeyboardInterrupt in this, the main thread) closes the
    cache and returns at once: the workers are daemon threads, so the calls still in flight (and their
    retries) are dropped with the process instead of holding its exit for minutes.
    """
    n_caps = len(descriptions)
    results: dict[str, dict] = {}
    lock = threading.Lock()
    todo: queue.SimpleQueue[LabelJob] = queue.SimpleQueue()
    n_todo = 0
    for job in jobs:
        entry = cache.get(job.key)
        if reusable(entry, config):
            results[job.key] = entry
            stats[job.run].trajectories_from_cache += 1
        else:
            todo.put(job)
            n_todo += 1
    stop = threading.Event()
    finished: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()  # ("entry" | "error", value), one per job
    bar = tqdm(total=len(jobs) * n_caps, initial=(len(jobs) - n_todo) * n_caps, desc="label", unit="pair",
               file=sys.stderr, disable=None)

    def work() -> None:
        while not stop.is_set():
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            try:
                entry = label_one(client, job, descriptions, config, stats[job.run], lock)
                cache.put(entry)  # written here, in the worker, so a kill loses at most the calls in flight
            except FatalAPIError as err:
                stop.set()  # here, not in the main thread, so this worker's next job already sees it
                finished.put(("error", err))
                return
            except BaseException as err:  # a bug: handed to the main thread, which re-raises it
                stop.set()
                finished.put(("error", err))
                return
            finished.put(("entry", entry))

    workers = [threading.Thread(target=work, name=f"label-{i}", daemon=True)
               for i in range(min(config.concurrency, n_todo))]
    error: BaseException | None = None
    try:
        for worker in workers:
            worker.start()
        done = 0
        while done < n_todo and any(worker.is_alive() for worker in workers) or not finished.empty():
            try:
                kind, value = finished.get(timeout=0.2)  # a timeout, so Ctrl-C is seen at once
            except queue.Empty:
                continue
            done += 1
            if kind == "error":
                error = error or value
                continue
            results[value["key"]] = value
            bar.update(n_caps)
            bar.set_postfix(tokens=sum(s.now["prompt_tokens"] + s.now["completion_tokens"] for s in stats.values()))
    except KeyboardInterrupt:
        stop.set()
        cache.close()  # no worker appends after this: the cache ends on a complete line
        raise
    finally:
        bar.close()
    if error is not None:
        for worker in workers:  # the running calls finish and are cached, as documented
            worker.join()
        raise error
    return results


def build_run(run: int, jobs: Sequence[LabelJob], results: dict[str, dict], trajectories: Sequence[Trajectory],
              names: Sequence[str], stats: RunStats) -> dict:
    """The run-file object of run `run`, checked with `validate_run`."""
    records = []
    for job in jobs:
        if job.run != run:
            continue
        entry = results[job.key]
        for counter, value in _entry_counters(entry).items():
            stats.recorded[counter] += value
        for name in names:
            records.append({"trajectory_id": job.trajectory.id, "capability": name,
                            "label": entry["labels"][name]["label"]})
        for name in entry.get("defaulted", []):
            stats.pairs_defaulted_to_na += 1
            stats.defaulted.append({"trajectory_id": job.trajectory.id, "capability": name})
    outcomes = [{"id": t.id, "passed": t.passed} for t in trajectories]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedTrajectoryWarning)  # every pair is labeled: a fill would be a bug
        data = labels_to_run(records, outcomes, attempt=run)
    validate_run(data, f"run {run}")
    return data


# ----------------------------------------------------------------------------------------------
# Phase 1
# ----------------------------------------------------------------------------------------------

def propose_key(messages: Sequence[dict[str, str]], config: LabelingConfig) -> str:
    """The cache key of the Phase-1 call with these first-attempt messages."""
    return sha256_json(["propose", config.model, sha256_json({"messages": messages, "json_mode": config.json_mode,
                                                              "temperature": config.temperature(1),
                                                              "seed": config.seed, "max_tokens": config.max_tokens})])


def propose_candidates(client: ChatClient, trajectories: Sequence[Trajectory], config: LabelingConfig,
                       cache: LabelCache) -> tuple[dict, dict]:
    """(candidates object, call statistics) from one discovery call, asked again with the problems up to
    max_attempts answers; FatalAPIError if no valid answer comes."""
    failed, passed = propose_sample(trajectories, config)
    messages = propose_messages(failed, passed, config)
    fmt = response_format(config.json_mode, "capability_candidates", candidates_schema())
    key = propose_key(messages, config)
    entry = cache.get(key)
    if entry is not None:
        return entry["candidates"], {"requests": 0, "from_cache": True}
    ids = {t.id: t.passed for t in trajectories}
    stats = {"requests": 0, "invalid_answers": 0, "http_retries": 0, "prompt_tokens": 0, "completion_tokens": 0}
    problems: list[str] = []
    for _ in range(config.max_attempts):
        result = client.complete(messages, temperature=config.temperature(1), seed=config.seed,
                                 max_tokens=config.max_tokens, response_format=fmt)
        stats["requests"] += 1
        stats["http_retries"] += result.http_retries
        stats["prompt_tokens"] += result.prompt_tokens
        stats["completion_tokens"] += result.completion_tokens
        data, problem = parse_json_object(result.text)
        problems = [problem] if data is None else validate_candidates(data, ids, config.min_candidates,
                                                                       config.max_candidates)
        if not problems:
            candidates = {"candidates": data["candidates"]}
            cache.put({"key": key, "kind": "propose", "model": config.model, "candidates": candidates, **stats})
            return candidates, {**stats, "from_cache": False}
        stats["invalid_answers"] += 1
        messages = messages + [{"role": "assistant", "content": result.text[:MAX_QUOTED_ANSWER]},
                               {"role": "user", "content": "Your answer could not be used: " + "; ".join(problems[:10])
                                + ". Answer again with the complete JSON object."}]
    raise FatalAPIError(f"Phase 1 (--propose): no valid candidates after {config.max_attempts} answers; last "
                        f"problems: {'; '.join(problems[:5])}. Write a candidates file and pass --candidates FILE")


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

def _temperatures(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number or comma-separated numbers, e.g. 1.0") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.label_trajectories", allow_abbrev=False,
                                     description="Label trajectories with LLM labelers over an OpenAI-compatible "
                                                 "endpoint, write run files and aggregate them (TRACE Step 1).")
    parser.add_argument("summary", help="_summarize output (JSONL of {id, passed, reward, n_turns, text})")
    parser.add_argument("--out", required=True, help="folder for run files, cache, report and selection")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="model name as the server knows it")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY",
                        help="name of the environment variable holding the API key (default OPENAI_API_KEY; the key "
                             "itself is never accepted on the command line)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--candidates", help="candidates JSON ({'candidates': [{name, description, ...}]}); skips Phase 1")
    source.add_argument("--propose", action="store_true", help="Phase 1: one discovery call proposes the candidates")
    parser.add_argument("--runs", type=int, default=10, help="independent labelers N (default 10)")
    parser.add_argument("--concurrency", type=int, default=4, help="calls in flight at once (default 4)")
    parser.add_argument("--temperature", type=_temperatures, default=(1.0,),
                        help="sampling temperature, or one per run comma-separated (default 1.0)")
    parser.add_argument("--seed", type=seed_value, default=0, help="run r samples with seed SEED + r (default 0)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="answer token limit per call (default 2048)")
    parser.add_argument("--max-attempts", type=int, default=3,
                        help="answers per call before unlabeled pairs become NA (default 3)")
    parser.add_argument("--max-defaulted-share", type=float, default=0.10,
                        help="largest share of (trajectory, capability) pairs that may be defaulted to NA (no valid "
                             "label within --max-attempts answers) before the run fails with exit 1 and writes no "
                             "run file or selection (default 0.10; 0 to 1)")
    parser.add_argument("--json-mode", choices=JSON_MODES, default="object",
                        help="response_format: json_object (default), a JSON schema (vLLM guided decoding, OpenAI "
                             "structured outputs), or none for servers that support neither")
    parser.add_argument("--max-trajectory-chars", type=int, default=None,
                        help="truncate each transcript to this many characters (head and tail kept; default: whole)")
    parser.add_argument("--min-candidates", type=int, default=5, help="Phase 1: fewest candidates (default 5)")
    parser.add_argument("--max-candidates", type=int, default=10, help="Phase 1: most candidates (default 10)")
    parser.add_argument("--propose-failed", type=int, default=20, help="Phase 1: failed trajectories shown (default 20)")
    parser.add_argument("--propose-passed", type=int, default=10, help="Phase 1: passed trajectories shown (default 10)")
    parser.add_argument("--propose-max-chars", type=int, default=4000,
                        help="Phase 1: characters kept per trajectory (default 4000)")
    parser.add_argument("--requests-per-minute", type=float, default=None, help="rate limit over all threads")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per HTTP request (default 120)")
    parser.add_argument("--http-retries", type=int, default=6,
                        help="retries of a request after 429/5xx/timeout/dropped connection (default 6)")
    parser.add_argument("--backoff-base", type=float, default=1.0, help="first backoff cap in seconds (default 1)")
    parser.add_argument("--backoff-max", type=float, default=60.0, help="largest backoff cap in seconds (default 60)")
    parser.add_argument("--max-retry-after", type=float, default=300.0,
                        help="longest Retry-After wait accepted, in seconds (default 300)")
    parser.add_argument("--rho", type=float, default=0.10, help="aggregation: minimum Cov per run (default 0.10)")
    parser.add_argument("--delta", type=float, default=0.20, help="aggregation: minimum Δ per run (default 0.20)")
    parser.add_argument("--k", type=int, default=None, help="aggregation: minimum passing runs (default ceil(0.8 N))")
    parser.add_argument("--export", default=None, help="selected list (default DIR/selected_capabilities.json)")
    parser.add_argument("--cache", default=None,
                        help=f"the file of finished calls (default DIR/{CACHE_NAME}); put it outside a folder that "
                             "is deleted on failure (as the demo does) so a rerun still pays only for what is missing")
    parser.add_argument("--dry-run", action="store_true", help="print the calls and estimated prompt tokens; call nothing")
    return parser


def _estimate_tokens(messages: Sequence[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages) // CHARS_PER_TOKEN


def _dry_run(trajectories: Sequence[Trajectory], descriptions: dict[str, str] | None, config: LabelingConfig,
             cache: LabelCache, propose: bool) -> None:
    """Print what a real invocation would call (cached calls are not counted as to-be-made)."""
    n_propose_tokens = 0
    propose_cached = False
    if propose:
        failed, passed = propose_sample(trajectories, config)
        messages = propose_messages(failed, passed, config)
        entry = cache.get(propose_key(messages, config))
        if entry is not None:  # the real run takes Phase 1's answer from the cache too: Phase 2 is known exactly
            descriptions = load_candidates(entry["candidates"])
            propose_cached = True
        else:
            n_propose_tokens = _estimate_tokens(messages)
    placeholder = descriptions is None
    if placeholder:  # Phase 2 depends on Phase 1's answer: estimate with max_candidates made-up descriptions
        descriptions = {f"candidate_{i}": "x" * 300 for i in range(config.max_candidates)}
    jobs = make_jobs(trajectories, descriptions, config)
    todo = [job for job in jobs if placeholder or not reusable(cache.get(job.key), config)]
    tokens = sum(_estimate_tokens(job.messages) for job in todo)
    phase1 = ""
    if propose_cached:
        phase1 = f"; Phase 1 cached ({len(descriptions)} candidates, no call)"
    elif propose:
        phase1 = f"; plus 1 Phase-1 proposal call (~{n_propose_tokens:,} prompt tokens)"
    print(f"dry run: {config.runs} runs x {len(trajectories)} trajectories = {len(jobs)} labeling calls "
          f"({len(jobs) - len(todo)} cached, {len(todo)} to make), {len(descriptions)} capabilities each" + phase1)
    print(f"estimated prompt tokens of the calls to make: ~{tokens + n_propose_tokens:,} (an estimate: characters/"
          f"{CHARS_PER_TOKEN} of the first attempt; retries, answers and the server's tokenizer not counted)"
          + ("; Phase 2 estimated with placeholder candidates, since Phase 1 has not run" if placeholder else ""))


RUN_FILE = re.compile(r"run_(\d+)\.json")


def check_stale_runs(out: Path, runs: int) -> None:
    """InputError when --out holds run files this invocation will not rewrite (`run_*.json` beyond run_NN, from an
    earlier labeling with more runs): `aggregate_capabilities --runs 'DIR/run_*.json'` would count them as labelers
    of this one. Nothing is deleted; the message says how to move them aside."""
    if not out.is_dir():
        return
    ours = {f"run_{run:02d}.json" for run in range(1, runs + 1)}
    stale = sorted((path.name for path in out.glob("run_*.json") if path.name not in ours),
                   key=lambda name: (len(name), name))
    if not stale:
        return
    numbers = [int(match.group(1)) for name in stale if (match := RUN_FILE.fullmatch(name))]
    relabel = f", or pass --runs {max(numbers)} to label them again (cached calls are free)" if numbers \
        and len(numbers) == len(stale) and max(numbers) > runs else ""
    shown = ", ".join(stale[:6]) + (f" ... ({len(stale)} files)" if len(stale) > 6 else "")
    raise InputError(f"--out {out} holds run files that --runs {runs} does not write: {shown}; "
                     f"aggregate_capabilities --runs '{out}/run_*.json' would count them as labelers of this run. "
                     f"Move them aside first (e.g. mkdir {out}/old_runs && mv {out}/{stale[0]} ... {out}/old_runs/)"
                     f"{relabel}")


def _cache_path(args: argparse.Namespace, out: Path) -> Path:
    return Path(args.cache) if args.cache else out / CACHE_NAME


def _write_report(out: Path, report: dict) -> Path:
    return atomic_write_json(out / REPORT_NAME, report)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; see the module docstring. Exit 0 done, 1 API failure (cache kept), 2 bad input, 130
    Ctrl-C (finished calls kept in the cache, nothing else written)."""
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    try:
        return _label(args, out)
    except KeyboardInterrupt:
        cache = _cache_path(args, out)
        print(f"interrupted; finished calls are kept in {cache}" if cache.is_file() else "interrupted; nothing written",
              file=sys.stderr)
        return INTERRUPTED


@cli_entry
def _label(args: argparse.Namespace, out: Path) -> int:
    # Every flag, path and URL is checked here, before the summary is read or any call is paid for; --dry-run
    # passes the same checks.
    config = LabelingConfig(
        model=args.model, runs=args.runs, temperatures=args.temperature, seed=args.seed, max_tokens=args.max_tokens,
        max_attempts=args.max_attempts, json_mode=args.json_mode, concurrency=args.concurrency,
        max_trajectory_chars=args.max_trajectory_chars, min_candidates=args.min_candidates,
        max_candidates=args.max_candidates, propose_failed=args.propose_failed,
        propose_passed=args.propose_passed, propose_max_chars=args.propose_max_chars)
    check_number(args.backoff_base, "--backoff-base", 0.0)  # RetryPolicy names its fields, not the flags
    check_number(args.backoff_max, "--backoff-max", 0.0)
    retry = RetryPolicy(max_retries=args.http_retries, base_delay=args.backoff_base, max_delay=args.backoff_max,
                        max_retry_after=args.max_retry_after)
    limiter = RateLimiter(args.requests_per_minute)
    k = args.k if args.k is not None else max(1, math.ceil(0.8 * args.runs))
    if not 1 <= k <= args.runs:
        raise InputError(f"--k {k} must be between 1 and --runs {args.runs}")
    AggregationConfig(rho=args.rho, delta=args.delta, k=k)  # the aggregation's own checks, NaN included
    check_number(args.timeout, "--timeout", 0.0, low_open=True)
    check_number(args.max_defaulted_share, "--max-defaulted-share", 0.0, 1.0)
    export = Path(args.export) if args.export else out / "selected_capabilities.json"
    if args.base_url is not None:
        check_url(args.base_url, "--base-url")
    inputs = [("the summary", args.summary), ("--candidates", args.candidates)]
    check_output_folder(out, "--out", inputs)
    check_stale_runs(out, config.runs)
    check_outputs(export, inputs=inputs)  # before any call is paid for
    cache_path = _cache_path(args, out)
    if args.cache:
        check_output_path(cache_path, "--cache", [*inputs, ("--export", export)])
    trajectories, skipped = load_summary(args.summary)
    descriptions = load_candidates(args.candidates) if args.candidates else None
    if descriptions is not None and not descriptions:
        raise InputError(f"{args.candidates}: the candidates list is empty")
    cache = LabelCache(cache_path)
    greedy = [run for run in range(1, config.runs + 1) if config.temperature(run) == 0]
    if len(greedy) > 1:
        print(f"warning: {len(greedy)} of the {config.runs} runs label at temperature 0: greedy decoding gives them "
              "the same answers (the seed changes nothing) unless the server samples anyway, so they are not "
              "independent labelers and K of N means little; use --temperature > 0 (default 1.0)", file=sys.stderr)
    if skipped:
        print(f"warning: {len(skipped)} trajectories with unknown outcome (passed = null) skipped: "
              f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}", file=sys.stderr)
    if args.dry_run:
        _dry_run(trajectories, descriptions, config, cache, args.propose)
        return 0
    if not args.base_url:
        raise InputError("--base-url is required (e.g. http://127.0.0.1:8000/v1)")
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        raise InputError(f"environment variable {args.api_key_env} (--api-key-env) is not set or empty; export it "
                         "(for a server without authentication any value, e.g. EMPTY)")
    if cache.broken_lines:
        print(f"warning: {cache.path}: {cache.broken_lines} cut-off lines ignored (those calls are made again)",
              file=sys.stderr)
    # One folder, one labeling run: a second labeler on --out is refused at once (a rerun resumes from the cache).
    with claimed_run_folder(out, "--out", fresh=False):
        client = ChatClient(args.base_url, api_key, config.model, key_source=f"${args.api_key_env}",
                            timeout=args.timeout, retry=retry, limiter=limiter)
        del api_key  # only the client holds it from here on
        stats = {run: RunStats() for run in range(1, config.runs + 1)}
        propose_stats = None
        try:
            if descriptions is None:
                candidates, propose_stats = propose_candidates(client, trajectories, config, cache)
                candidates_path = atomic_write_json(out / CANDIDATES_NAME, candidates)
                descriptions = load_candidates(candidates_path)
                print(f"Phase 1: {len(descriptions)} candidates in {candidates_path}", file=sys.stderr)
            else:
                candidates_path = Path(args.candidates)
            jobs = make_jobs(trajectories, descriptions, config)
            results = run_jobs(client, jobs, descriptions, config, cache, stats)
        except FatalAPIError as err:
            print(f"error: {client.redact(str(err))}", file=sys.stderr)
            print(f"{len(cache.entries)} finished calls are cached in {cache.path}; rerun the same command to resume",
                  file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            cache.close()
            print(f"interrupted; {len(cache.entries)} finished calls are cached in {cache.path} (calls in flight were "
                  "dropped); rerun the same command to resume", file=sys.stderr)
            return INTERRUPTED
        names = list(descriptions)
        run_data = {run: build_run(run, jobs, results, trajectories, names, stats[run])
                    for run in range(1, config.runs + 1)}
        n_pairs = len(jobs) * len(names)
        n_defaulted = sum(s.pairs_defaulted_to_na for s in stats.values())
        failed = Fraction(n_defaulted, n_pairs) > exact_threshold(args.max_defaulted_share)  # 29 of 100 <= 0.29
        # Labels the labeler never gave are not labels: past the threshold they would decide the selection
        # (all-NA rejects everything, at a perfect κ), so no run file, aggregation or export is written.
        run_paths = {run: None if failed else atomic_write_json(out / f"run_{run:02d}.json", data)
                     for run, data in run_data.items()}
        report = {
            "model": config.model, "base_url": args.base_url, "json_mode": config.json_mode, "runs": config.runs,
            "max_attempts": config.max_attempts, "max_tokens": config.max_tokens, "candidates": str(candidates_path),
            "n_trajectories": len(trajectories), "skipped_unknown_outcome": skipped, "capabilities": names,
            "phase1": propose_stats,
            "max_defaulted_share": args.max_defaulted_share,
            "defaulted_share": n_defaulted / n_pairs if n_pairs else 0.0,
            "status": "failed: too many pairs defaulted to NA; no run file, selection or export written" if failed
            else "done",
            "per_run": [{"run": run, "seed": config.run_seed(run), "temperature": config.temperature(run),
                         "file": None if run_paths[run] is None else str(run_paths[run]), **s.recorded,
                         "pairs_defaulted_to_na": s.pairs_defaulted_to_na,
                         "defaulted_pairs": s.defaulted, "trajectories_from_cache": s.trajectories_from_cache,
                         "this_invocation": s.now}
                        for run, s in sorted(stats.items())],
            "http_retries_by_kind": dict(client.retry_log.counts),
            "notes": ["Per run, calls / retries / invalid_answers / tokens count every call behind the run file (calls "
                      "answered from the cache included); this_invocation counts only the calls made now.",
                      "calls: answers requested; retries: HTTP retries after 429/5xx/timeouts/dropped connections "
                      "(http_retries_by_kind: this invocation); invalid_answers: answers asked again because of bad JSON "
                      "or missing/invalid labels; pairs_defaulted_to_na: (trajectory, capability) pairs recorded as NA "
                      "because no valid label came within max_attempts answers."],
        }
        report["totals"] = {key: sum(r[key] for r in report["per_run"]) for key in (*COUNTERS, "pairs_defaulted_to_na")}
        report["totals"]["this_invocation"] = {key: sum(r["this_invocation"][key] for r in report["per_run"])
                                               for key in COUNTERS}
        report_path = _write_report(out, report)
        defaulted_text = (f"{n_defaulted} of {n_pairs} (trajectory, capability) pairs ({n_defaulted / n_pairs:.1%}) "
                          f"got no valid label within --max-attempts {config.max_attempts} answers and were "
                          "defaulted to NA") if n_defaulted else ""
        if failed:
            print(f"error: {defaulted_text}, more than --max-defaulted-share {args.max_defaulted_share:g}: the labels "
                  f"are unusable, so no run file, selection or export was written (the pairs are listed in "
                  f"{report_path}); finished calls stay cached in {cache.path}: rerun with a larger --max-attempts "
                  "(only the defaulted calls are asked again) or another --model", file=sys.stderr)
            return 1
        if n_defaulted:
            print(f"warning: {defaulted_text}; within --max-defaulted-share {args.max_defaulted_share:g}, so they "
                  f"count as NA labels (listed in {report_path})", file=sys.stderr)
        run_paths = list(run_paths.values())
        aggregation = aggregate(run_paths, candidates=candidates_path, rho=args.rho, delta=args.delta, k=k)
        for warning in aggregation["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        print(format_table(aggregation))
        export_path, aggregation_report = write_outputs(aggregation, export)
        info, queue_warnings = queue_messages(aggregation, export_path)
        for line in info:
            print(line)
        for line in queue_warnings:
            print(f"warning: {line}", file=sys.stderr)
        totals = report["totals"]["this_invocation"]
        print(f"wrote {len(run_paths)} run files to {out}, {report_path}, {export_path} "
              f"({len(aggregation['selected'])} selected) and {aggregation_report}")
        print(f"this invocation: {totals['calls']} calls, {totals['retries']} HTTP retries, "
              f"{totals['invalid_answers']} invalid answers, "
              f"{totals['prompt_tokens'] + totals['completion_tokens']:,} tokens; "
              f"{report['totals']['pairs_defaulted_to_na']} pairs defaulted to NA in the run files", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
