"""Shared by the phase scripts of the Qwen3.6 self-TRACE reference run: prerequisite checks that say what is
missing before anything starts, the mini-swe-agent + SWE-bench-harness run (phases 1 and 6), paths.

Not a phase itself. The scripts import it after putting this folder on sys.path.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from common.io import load_yaml_mapping
from common.paths import REPO_ROOT
from common.run_folder import check_output_dir
from common.validation import InputError, check_int

HERE = Path(__file__).resolve().parent

DEFAULT_RUN_DIR = REPO_ROOT / "runs" / "swebench" / "qwen36_self_trace"
DEFAULT_BASE_URL = "http://localhost:8000/v1"
DEFAULT_MODEL = "Qwen/Qwen3.6-27B"
DATASET = "princeton-nlp/SWE-bench_Verified"
CAPABILITIES = ("semantic_logic_precision", "deep_call_graph_traversal")
EXIT_MISSING = 2  # a prerequisite is missing: nothing was started


class Missing:
    """Collects missing prerequisites; `stop_if_any` prints them all and exits before any work."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.items: list[str] = []

    def add(self, problem: str | None) -> None:
        if problem:
            self.items.append(problem)

    def stop_if_any(self) -> None:
        if self.items:
            lines = "\n".join(f"  - {item}" for item in self.items)
            print(f"{self.phase} cannot start on this machine; nothing was run. Missing:\n{lines}", file=sys.stderr)
            sys.exit(EXIT_MISSING)


def docker_problem() -> str | None:
    """Why Docker cannot be used here, or None (`docker info` must answer)."""
    if shutil.which("docker") is None:
        return "Docker: the `docker` command is not installed (SWE-bench instances and the harness run in containers)"
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"Docker: `docker info` failed ({err})"
    if done.returncode != 0:
        return f"Docker: the daemon does not answer (`docker info`: {(done.stderr or done.stdout).strip()[:200]})"
    return None


def gpu_problem(count: int = 1) -> str | None:
    """Why `count` CUDA GPUs are not usable here, or None."""
    try:
        import torch
    except ImportError:
        return "GPU: torch is not installed (make venv)"
    if not torch.cuda.is_available():
        smi = shutil.which("nvidia-smi")
        return (f"GPU: no CUDA device visible to torch (nvidia-smi {'found' if smi else 'not found'}; "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")
    if torch.cuda.device_count() < count:
        return f"GPU: {count} CUDA devices needed, {torch.cuda.device_count()} visible"
    return None


def server_models(base_url: str, timeout: float = 5.0, api_key_env: str | None = None
                  ) -> tuple[list[str] | None, str, bool]:
    """(model ids served at base_url, why not, whether anything answered over HTTP at all). The key sent is the
    one the phase's client will use, read from the variable `api_key_env` names, and only that one: none when
    it names none (vLLM servers without authentication, as the rollout and agent clients use them)."""
    url = base_url.rstrip("/") + "/models"
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            data = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        return None, f"{url} answered HTTP {err.code}", True
    except (urllib.error.URLError, OSError, ValueError) as err:
        return None, f"no answer from {url} ({err})", False
    return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)], "", True


def server_problem(base_url: str, model: str | None = None, need_model_list: bool = True,
                   api_key_env: str | None = None) -> str | None:
    """Why the OpenAI-compatible server at base_url cannot be used, or None. With need_model_list=False any
    HTTP answer will do (servers without GET /models). `api_key_env`: see server_models."""
    models, why, answered = server_models(base_url, api_key_env=api_key_env)
    if models is None and not (answered and not need_model_list):
        return f"model server: {why}; start the server first (see swebench/qwen3.6_self_trace/README.md)"
    if models is not None and model and model not in models:
        return f"model server: {base_url} serves {models}, not {model!r}"
    return None


def module_problem(module: str, install: str) -> str | None:
    """Why `module` cannot be imported here, or None (a dotted name checks the submodule itself: this repo's
    own `swebench` package must not pass for the harness, which only its extended path can reach)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"Python module `{module}` is not installed ({install})"
    return None


def command_problem(command: str, install: str) -> str | None:
    if shutil.which(command) is None:
        return f"command `{command}` not found ({install})"
    return None


def run(command: list[str], **kwargs: Any) -> int:
    print("$ " + " ".join(command), flush=True)
    return subprocess.run(command, **kwargs).returncode


# --------------------------------------------------------------------------------------------------
# mini-swe-agent + SWE-bench harness (phases 1 and 6)
# --------------------------------------------------------------------------------------------------
def check_agent_run_flags(args: Any) -> None:
    """The flags of a mini-swe-agent run (phases 1 and 6), before any prerequisite is probed: InputError (one
    line, exit 2) for --workers below 1, a --slice that is not START:STOP, a --config that is not a YAML
    mapping, or a --run-dir that cannot hold the run. (The run folder holds every phase's outputs, which later
    phases read: each phase writes only its own subfolder, so what the folder holds is not checked.)"""
    check_int(args.workers, "--workers", 1)
    if args.slice is not None and not re.fullmatch(r"\d*:\d*(:\d+)?", args.slice):
        raise InputError(f"--slice {args.slice!r}: give START:STOP as mini-swe-agent takes it, e.g. 0:50")
    load_yaml_mapping(args.config)
    check_output_dir(args.run_dir, "--run-dir")


def agent_prerequisites(missing: Missing, base_url: str, model: str | None) -> None:
    missing.add(docker_problem())
    missing.add(command_problem("mini-extra", "pip install 'mini-swe-agent>=2'"))
    missing.add(module_problem("swebench.harness.run_evaluation", "pip install 'swebench>=4.1'"))
    missing.add(server_problem(base_url, model))


def agent_commands(out_dir: Path, model: str, base_url: str, config: Path, subset: str, split: str, workers: int,
                   run_id: str, slice_: str | None) -> tuple[list[str], list[str]]:
    """(mini-swe-agent command, harness command) of one evaluation run."""
    agent = ["mini-extra", "swebench", "-c", "swebench.yaml", "-c", str(config),
             "-c", f"model.model_name=hosted_vllm/{model}", "-c", f"model.model_kwargs.api_base={base_url}",
             "--subset", subset, "--split", split, "-o", str(out_dir / "agent"), "-w", str(workers)]
    if slice_:
        agent += ["--slice", slice_]
    harness = [sys.executable, "-m", "swebench.harness.run_evaluation", "--dataset_name", DATASET, "--split", split,
               "--predictions_path", str(out_dir / "preds.jsonl"), "--max_workers", str(workers),
               "--run_id", run_id, "--report_dir", str(out_dir / "reports")]
    return agent, harness


def predictions_to_jsonl(out_dir: Path) -> int:
    """agent/preds.json (mini-swe-agent) -> preds.jsonl (harness); returns the number of predictions."""
    source = out_dir / "agent" / "preds.json"
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: the agent run did not finish")
    predictions = json.loads(source.read_text())
    with (out_dir / "preds.jsonl").open("w", encoding="utf-8") as handle:
        for item in predictions.values():
            handle.write(json.dumps(item) + "\n")
    return len(predictions)


def summarize_report(out_dir: Path, run_id: str, model: str) -> dict[str, Any]:
    """Pass@1 from the harness's run-level report (`*.<run_id>.json`), written to summary.json."""
    reports = sorted(out_dir.glob(f"*.{run_id}.json")) + sorted((out_dir / "reports").glob(f"*.{run_id}.json"))
    if not reports:
        raise FileNotFoundError(f"no harness report *.{run_id}.json in {out_dir} or {out_dir / 'reports'}")
    report = json.loads(reports[0].read_text())
    counts = {key: len(report.get(f"{key}_ids", [])) for key in ("resolved", "unresolved", "empty_patch", "error")}
    total = sum(counts.values())
    summary = {"model": model, "run_id": run_id, "report": str(reports[0]), **{f"n_{k}": v for k, v in counts.items()},
               "n_total": total, "pass_at_1": counts["resolved"] / total if total else 0.0}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def evaluate(out_dir: Path, model: str, base_url: str, config: Path, subset: str, split: str, workers: int,
             run_id: str, slice_: str | None) -> int:
    """Agent run, conversion, grading, summary; 0 when a summary was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    agent, harness = agent_commands(out_dir, model, base_url, config, subset, split, workers, run_id, slice_)
    if run(agent) != 0:
        print("the agent run failed; rerun the same command to resume (finished instances are kept)", file=sys.stderr)
        return 1
    print(f"{predictions_to_jsonl(out_dir)} predictions -> {out_dir / 'preds.jsonl'}")
    if run(harness, cwd=out_dir) != 0:
        print("the harness exited with an error; summarizing what it wrote", file=sys.stderr)
    summary = summarize_report(out_dir, run_id, model)
    print(f"Pass@1 {summary['n_resolved']}/{summary['n_total']} = {100 * summary['pass_at_1']:.1f}% "
          f"-> {out_dir / 'summary.json'}")
    return 0
