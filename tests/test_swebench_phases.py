"""The reference-run phase scripts: documented --help, phases 2-4 here, phases 1/5/6 refuse to pretend."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from game_registry import REPO_ROOT

from fake_openai_server import FakeOpenAIServer


PHASES = REPO_ROOT / "swebench" / "qwen3.6_self_trace"
SCRIPTS = sorted(PHASES.glob("phase*_*.py"))


def run_phase(name: str, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    script = next(p for p in SCRIPTS if p.name.startswith(name))
    return subprocess.run([sys.executable, str(script), *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def no_tools_env(tmp_path: Path) -> dict[str, str]:
    """PATH without docker, mini-extra or nvidia-smi; no visible GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    return {"PATH": str(bin_dir), "CUDA_VISIBLE_DEVICES": "", "VLLM_BASE_URLS": ""}


def test_there_are_six_phases_and_each_help_documents_inputs_and_outputs():
    assert [p.name.split("_")[0] for p in SCRIPTS] == [f"phase{i}" for i in range(1, 7)]
    for script in SCRIPTS:
        done = subprocess.run([sys.executable, str(script), "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, (script.name, done.stderr)
        assert "Inputs:" in done.stdout and "Outputs:" in done.stdout, script.name


def test_phase1_checks_docker_the_agent_the_harness_and_the_server(tmp_path):
    done = run_phase("phase1", "--base-url", "http://127.0.0.1:9/v1", "--run-dir", str(tmp_path),
                     env=no_tools_env(tmp_path))
    assert done.returncode == 2
    for needed in ("Docker", "mini-extra", "swebench.harness", "model server"):
        assert needed in done.stderr, needed
    assert not (tmp_path / "phase1").exists()  # nothing started
    dry = run_phase("phase1", "--dry-run", "--slice", "0:5", "--run-dir", str(tmp_path))
    assert dry.returncode == 0 and "mini-extra swebench" in dry.stdout and "swebench.harness.run_evaluation" in dry.stdout


def test_phase5_checks_the_gpu_and_the_scenarios(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "", "VLLM_BASE_URLS": "http://127.0.0.1:9"}
    # a --scenarios file the command names is input: one line before any prerequisite is probed
    named = run_phase("phase5", "--capability", "semantic_logic_precision", "--model", "some/model", "--scenarios",
                      str(tmp_path / "missing.json"), env=env)
    assert named.returncode == 2 and named.stderr.startswith("error: --scenarios: ")
    assert "missing.json" in named.stderr
    assert len(named.stderr.splitlines()) == 1, named.stderr
    # what this machine lacks is listed all at once
    done = run_phase("phase5", "--capability", "semantic_logic_precision", "--model", "some/model",
                     "--output-dir", str(tmp_path / "adapter"), env=env)
    assert done.returncode == 2 and "cannot start on this machine" in done.stderr
    assert "GPU" in done.stderr and "127.0.0.1:9" in done.stderr
    dry = run_phase("phase5", "--capability", "deep_call_graph_traversal", "--model", "m", "--dry-run")
    assert dry.returncode == 0 and "torch.distributed.run" in dry.stdout and "capability_deep_call_graph_traversal" \
        in dry.stdout and "TRACE_GAMES_DIRS=" in dry.stdout


def test_phase6_checks_the_adapter_docker_and_the_server(tmp_path):
    named = run_phase("phase6", "--adapter", str(tmp_path / "nope"), "--base-url", "http://127.0.0.1:9/v1",
                      "--run-dir", str(tmp_path), env=no_tools_env(tmp_path))
    assert named.returncode == 2 and named.stderr.startswith("error: --adapter ")
    assert "adapter_config.json" in named.stderr
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    done = run_phase("phase6", "--adapter", str(adapter), "--base-url", "http://127.0.0.1:9/v1",
                     "--run-dir", str(tmp_path), env=no_tools_env(tmp_path))
    assert done.returncode == 2
    for needed in ("Docker", "model server", "baseline"):
        assert needed in done.stderr, needed


def test_phase2_summarizes_the_bundled_trajectories_and_labels_them_with_a_server(tmp_path):
    alone = run_phase("phase2", "--run-dir", str(tmp_path))
    assert alone.returncode == 0, alone.stderr
    assert "labeling needs an OpenAI-compatible server" in alone.stdout
    records = [json.loads(line) for line in (tmp_path / "phase2" / "summary.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["passed"]) for r in records) == [("django__django-10999", False),
                                                                ("django__django-16255", True)]
    with FakeOpenAIServer(api_key="k") as server:
        labeled = run_phase("phase2", "--run-dir", str(tmp_path), "--base-url", server.base_url, "--model", "fake-model",
                            "--runs", "2", "--k", "1", "--candidates", str(PHASES / "candidates.json"),
                            env={"OPENAI_API_KEY": "k"})
    assert labeled.returncode == 0, labeled.stderr
    assert (tmp_path / "phase2" / "labels" / "run_02.json").is_file()
    assert isinstance(json.loads((tmp_path / "phase2" / "selected_capabilities.json").read_text()), list)
    report = json.loads((tmp_path / "phase2" / "selected_capabilities_report.json").read_text())
    candidates = json.loads((PHASES / "candidates.json").read_text())["candidates"]
    assert sorted(e["skill"] for e in report["capabilities"]) == sorted(c["name"] for c in candidates)
    down = run_phase("phase2", "--run-dir", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
    assert down.returncode == 2 and "model server" in down.stderr


def test_phase2_has_the_labeler_model_propose_the_candidates_by_default(tmp_path):
    """Without --candidates the labeler model proposes them (label_trajectories --propose): the fixed list,
    which holds the reference run's answers, is not what a default run labels."""
    fixtures = REPO_ROOT / "tests" / "fixtures" / "real" / "mini-swe-agent-swebench-verified"
    trajectories = tmp_path / "trajectories"
    trajectories.mkdir()
    for path in fixtures.glob("*.json"):
        data = json.loads(path.read_text())
        if path.name == "django__django-10999.traj.json":  # the failed one: what the fake model "notices"
            # at the end: the proposal prompt keeps each trajectory's beginning and end
            data["messages"][-1]["content"] += ("\nMARK_root_cause_search MARK_reproduce_first MARK_regex_precision "
                                                "MARK_test_reading MARK_edge_case_listing")
        (trajectories / path.name).write_text(json.dumps(data))
    with FakeOpenAIServer(api_key="k") as server:
        done = run_phase("phase2", str(trajectories), "--run-dir", str(tmp_path / "run"), "--base-url",
                         server.base_url, "--model", "fake-model", "--runs", "2", "--k", "1",
                         env={"OPENAI_API_KEY": "k"})
        proposals = [r for r in server.requests if r.get("propose")]
    assert done.returncode == 0, done.stderr
    assert len(proposals) == 1
    proposed = json.loads((tmp_path / "run" / "phase2" / "labels" / "candidates.json").read_text())
    names = sorted(c["name"] for c in (proposed["candidates"] if isinstance(proposed, dict) else proposed))
    assert names == ["edge_case_listing", "regex_precision", "reproduce_first", "root_cause_search", "test_reading"]
    report = json.loads((tmp_path / "run" / "phase2" / "selected_capabilities_report.json").read_text())
    assert sorted(e["skill"] for e in report["capabilities"]) == names


@pytest.mark.slow  # ~6 s: two phase subprocesses
def test_phases_3_and_4_run_here_without_a_model(tmp_path):
    three = run_phase("phase3", "--run-dir", str(tmp_path), "--capability", "deep_call_graph_traversal",
                      "--candidates", "2", "--target", "2")
    assert three.returncode == 0, three.stdout + three.stderr
    assert "not calibrated: no --model given" in three.stdout
    kept = tmp_path / "phase3" / "deep_call_graph_traversal" / "scenarios_selftested.json"
    assert len(json.loads(kept.read_text())) == 2
    four = run_phase("phase4", str(kept), "--run-dir", str(tmp_path), "--fuzz-actions", "20")
    assert four.returncode == 0, four.stdout + four.stderr
    report = json.loads((tmp_path / "phase4" / "validation.json").read_text())[str(kept)]
    assert report["passed"] and report["validate_game"]["checks"]["oracle"]["success_rate"] == 1.0
    assert report["statistics"]["scenarios"] == 2


@pytest.mark.slow
def test_phase5_trains_a_tiny_model_on_cpu_when_allowed(tiny_model_dir, tmp_path):
    scenarios = tmp_path / "set.json"
    from swebench.generators import generate_many
    from swebench.scenario import save_scenarios

    save_scenarios(scenarios, generate_many("semantic_logic_precision", 2, seed=3))
    done = run_phase("phase5", "--capability", "semantic_logic_precision", "--model", str(tiny_model_dir),
                     "--nproc", "1", "--allow-cpu", "--scenarios", str(scenarios), "--output-dir",
                     str(tmp_path / "adapter"), "--", "--iterations", "1", "--groups_per_iteration", "2",
                     "--group_size", "2", "--max_episode_tokens", "3000", "--dtype", "float32",
                     env={"VLLM_BASE_URLS": ""}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_the_server_check_sends_only_the_key_the_command_names(monkeypatch):
    """A phase's server check sends the key of --api-key-env (the variable its client will read), never
    $OPENAI_API_KEY by default: a key set for another service must not leave the machine."""
    import importlib.util
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    seen: list[str | None] = []

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server protocol
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = importlib.util.spec_from_file_location("phases_common_under_test", PHASES / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sentinel-not-to-be-sent")
    monkeypatch.setenv("LABELER_KEY", "sk-labeler")
    try:
        assert common.server_problem(url, "m", api_key_env="LABELER_KEY") is None
        assert common.server_problem(url, "m") is None  # vLLM for rollouts / the agent: no key
        monkeypatch.delenv("LABELER_KEY")
        assert common.server_problem(url, "m", api_key_env="LABELER_KEY") is None  # named but unset: none sent
    finally:
        server.shutdown()
    assert seen == ["Bearer sk-labeler", None, None]


KEY_SENTINEL = "sk-sentinel-child-argv-7d41"


def test_the_labeler_key_reaches_no_child_argv_no_output_and_no_file(tmp_path):
    """Issue 45 point 7: an audit hook (sitecustomize on PYTHONPATH, inherited by every Python child) logs the argv
    of every process the phase's process tree starts (phase 2 labels in process today; its only children are the
    platform module's). The key travels by the variable's name only: no child argv, no output line, no file."""
    hooks, log = tmp_path / "hooks", tmp_path / "spawned.jsonl"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import json, os, sys\n"
        "def _log(event, args):\n"
        "    if event in ('subprocess.Popen', 'os.posix_spawn', 'os.exec'):\n"
        "        argv = args[1] if len(args) > 1 else args\n"
        f"        with open({str(log)!r}, 'a') as f:\n"
        "            f.write(json.dumps([event, [str(a) for a in (argv or [])]]) + '\\n')\n"
        "sys.addaudithook(_log)\n")
    run_dir = tmp_path / "run"
    with FakeOpenAIServer(api_key=KEY_SENTINEL) as server:
        done = run_phase("phase2", "--run-dir", str(run_dir), "--base-url", server.base_url, "--model", "fake-model",
                         "--api-key-env", "LABELER_KEY", "--runs", "2", "--k", "1", "--candidates",
                         str(PHASES / "candidates.json"),
                         env={"LABELER_KEY": KEY_SENTINEL, "OPENAI_API_KEY": "sk-decoy",
                              "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])})
        sent = {r["key_ok"] for r in server.requests}
    assert done.returncode == 0, done.stderr
    assert sent == {True}  # the labeler sent the named variable's key, and only it
    spawned = [json.loads(line) for line in log.read_text().splitlines()]
    assert spawned  # the hook saw the tree's children
    assert all(KEY_SENTINEL not in " ".join(argv) for _, argv in spawned)
    assert KEY_SENTINEL not in done.stdout + done.stderr
    for path in run_dir.rglob("*"):
        assert not path.is_file() or KEY_SENTINEL.encode() not in path.read_bytes(), f"the key was written to {path}"
