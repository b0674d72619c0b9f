"""Repeatability in the CPU demo (issue 29 point 5): `--repeat N` (the config's `repeats`) runs the steps from `train`
on again with training seeds 1..N-1 under <run-dir>/repeats/seed<r>/ (demo/run.py), every training run of a
repeat takes its seed (demo/loop.py), and the report gives each model's mean and spread over the repeats
(demo/report.py `repeats_section`)."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from test_demo_stats import SEEDS, heterogeneous, write_runs

REPO = Path(__file__).resolve().parent.parent


def test_repeats_are_validated_with_the_fix_spelled_out(tmp_path):
    from common.validation import InputError
    from demo.config import DemoConfig, load_demo_config

    assert DemoConfig().repeats == 1 and load_demo_config(REPO / "configs" / "demo.yaml").repeats == 1
    for bad in ("0", "-2", "true", "1.5"):
        path = tmp_path / "bad.yaml"
        path.write_text(f"repeats: {bad}\n")
        with pytest.raises(InputError, match=r"repeats must be an int >= 1 \(1 = one run of every step"):
            load_demo_config(path)
    done = subprocess.run([sys.executable, "-m", "demo", "--profile", "fast", "--repeat", "0",
                           "--run-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--repeat must be >= 1" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before any step


def demo_with(tmp_path, repeats: int, config_name: str = "demo.yaml"):
    from demo.config import load_demo_config
    from demo.run import Demo

    config = load_demo_config(REPO / "configs" / config_name)
    config.repeats = repeats
    return Demo(config, tmp_path, fresh=False, profile="default")


def test_each_repeat_reruns_the_training_steps_with_its_seed_in_its_own_folder(tmp_path, monkeypatch):
    from demo import run as demo_run
    from demo.run import REPEATED_STEPS, _run_steps

    seen: list = []

    def step(self, name, settings, reads, body, force=False):
        seen.append({"seed": self.training_seed, "name": name, "folder": self.step_dir(name),
                     "settings": json.loads(json.dumps(settings, default=str)), "reads": reads})
        self.fingerprints[name] = f"{self.training_seed}:{name}"
        self.records[name] = {"figures": {}}
        return {}

    monkeypatch.setattr(demo_run.Demo, "step", step)
    monkeypatch.setattr(demo_run.Demo, "base_step_settings", lambda self: {})
    monkeypatch.setattr(demo_run, "write_report", lambda demo: "")
    demo = demo_with(tmp_path, 3)
    assert _run_steps(demo, demo.config, REPO / "configs" / "demo.yaml", tmp_path, "default") == 0
    main = ["base", "evaluate", "select", "environments", *REPEATED_STEPS]
    assert [(s["seed"], s["name"]) for s in seen] == [(0, n) for n in main] + [
        (seed, n) for seed in (1, 2) for n in REPEATED_STEPS]
    for s in seen:
        repeat = s["seed"] > 0
        expected = tmp_path / "repeats" / f"seed{s['seed']}" / s["name"] if repeat else tmp_path / s["name"]
        assert s["folder"] == expected
        # the seed is in a repeat's settings (its fingerprint), never in the first run's (runs made before stay
        # up to date)
        assert s["settings"].get("training_seed") == (s["seed"] if repeat else None), s
    first = {s["name"]: s["settings"] for s in seen if s["seed"] == 0}
    second = {s["name"]: s["settings"] for s in seen if s["seed"] == 1}
    for name in REPEATED_STEPS:
        assert {k: v for k, v in second[name].items() if k != "training_seed"} == first[name], name
    assert [r.training_seed for r in demo.repeats] == [1, 2]
    # a repeat shares the steps before `train` (their records) and keeps its own for the rest
    assert all(r.records["environments"] is demo.records["environments"] for r in demo.repeats)
    assert all(r.records["train"] is not demo.records["train"] for r in demo.repeats)


def test_every_training_run_of_a_repeat_takes_its_seed(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    calls: list = []

    def train_lora(spec, model_dir, output_dir, overrides, settings, iterations, report_to=None, checkpoints_at=(),
                   task_pool=0, seed=0):
        calls.append((output_dir.name, seed))
        per_iteration = settings.groups_per_iteration * settings.group_size
        return {"adapter": str(output_dir), "iterations": iterations, "episodes": iterations * per_iteration,
                "curve": [], **({"checkpoints": [{"iteration": i, "episodes": i * per_iteration, "adapter": "x"}
                                                 for i in checkpoints_at]} if checkpoints_at else {})}

    gates: list = []

    def train_gate(model_dir, adapters, games, folder, settings, report_to=None, target_rollouts=None, seed=0,
                   routing=None):
        gates.append({"folder": folder, "seed": seed, "target_rollouts": target_rollouts, "routing": routing})
        return {"gate": str(folder / "gate"), "episodes": 256}

    from demo.run import Demo

    monkeypatch.setattr(demo_loop, "train_lora", train_lora)
    monkeypatch.setattr(demo_loop, "train_gate", train_gate)
    # demo_full.yaml's reward targets: the adapters alone on Step 1's tasks, played in the repeat's own gate folder
    monkeypatch.setattr(Demo, "routing_targets", lambda self, folder, adapters, n_tasks: {"folder": folder,
                                                                                          "tasks": n_tasks})
    (tmp_path / "select").mkdir()
    (tmp_path / "select" / "analysis_seed500_sampled.json").write_text("{}")
    demo = demo_with(tmp_path, 2, "demo_full.yaml")  # every training run, direct GRPO's two settings included
    capabilities = ("precondition_verification", "tool_calling_precision")
    demo.records["environments"] = {"figures": {"capabilities": {c: {"status": "no_knob", "value": None,
                                                                     "game_overrides": {}} for c in capabilities},
                                                "forced": False}}
    repeat = demo.repeat(1)
    repeat.records["train"] = {"figures": repeat.train(repeat.step_dir("train"))}
    repeat.records["gate"] = {"figures": repeat.gate(repeat.step_dir("gate"))}
    repeat.baselines(repeat.step_dir("baselines"))
    assert calls == [(c, 1) for c in capabilities] + [("direct", 1), ("direct_pool", 1), ("mixed", 1)]
    # the gate of a repeat: its own folder, its seed, and Step 1's rollouts of the shared run as "base" data
    (gate,) = gates
    assert gate["folder"] == tmp_path / "repeats" / "seed1" / "gate" and gate["seed"] == 1
    assert gate["target_rollouts"] == [tmp_path / "select" / "analysis_seed500_sampled.json"]
    assert gate["routing"] == {"folder": gate["folder"], "tasks": demo.config.select.tasks}
    calls.clear()
    demo.records["train"] = {"figures": demo.train(demo.step_dir("train"))}
    assert calls == [(c, 0) for c in capabilities]  # the first run: seed 0, as before repeats existed


# ---- the report ------------------------------------------------------------------------------------------------


def outcomes(extra: int) -> dict:
    return {seed: {"greedy": [[r] for r in heterogeneous(extra=extra)],
                   "sampled": [[r, r] for r in heterogeneous(extra=extra // 2)]} for seed in SEEDS}


def final_records(run_dir: Path, seed: int, trace_extra: int, direct_extra: int) -> dict:
    where = run_dir / ("." if seed == 0 else f"repeats/seed{seed}")
    models = {"TRACE": write_runs(where, "TRACE", outcomes(trace_extra)),
              "direct GRPO": write_runs(where, "direct", outcomes(direct_extra))}
    for runs in models.values():  # paths relative to the run folder, as the demo records them
        for run in runs.values():
            run["path"] = str((where / run["path"]).relative_to(run_dir))
    return {"final": {"seconds": 2.0, "device": "cpu", "figures": {"models": models}}}


def test_the_report_gives_each_models_mean_and_spread_over_repeats(tmp_path):
    from demo.config import DemoConfig
    from demo.report import render_report
    from demo.report_efficiency import repeats_section
    from demo.run import summarize_runs

    base = {"evaluate": {"seconds": 1.0, "device": "cpu",
                         "figures": {"base": write_runs(tmp_path, "base", outcomes(0))}}}
    records = {**base, **final_records(tmp_path, 0, 2, 10)}  # TRACE 0.44, direct 0.60 greedy
    repeats = {1: {**base, **final_records(tmp_path, 1, 0, 14)},  # TRACE 0.40, direct 0.68
               2: {**base, **final_records(tmp_path, 2, 5, 6)}}  # TRACE 0.50, direct 0.52
    lines, results, printed = repeats_section(records, repeats, DemoConfig(), summarize_runs)
    text = "\n".join(lines)
    trace = results["models"]["TRACE"]["greedy"]
    assert trace["values"] == pytest.approx([0.44, 0.40, 0.50])
    assert trace["mean"] == pytest.approx(statistics.fmean([0.44, 0.40, 0.50]))
    assert trace["std"] == pytest.approx(statistics.stdev([0.44, 0.40, 0.50]))
    assert (trace["min"], trace["max"]) == pytest.approx((0.40, 0.50))
    gap = results["differences"]["direct GRPO − TRACE"]["greedy"]
    assert gap["values"] == pytest.approx([0.16, 0.28, 0.02])
    assert results["differences"]["TRACE − base"]["greedy"]["values"] == pytest.approx([0.04, 0.0, 0.10])
    assert results["training_seeds"] == [0, 1, 2]
    assert "| TRACE | 0.440 / 0.400 / 0.500 | 0.447 ± 0.050 (0.400 to 0.500) |" in text, text
    assert "| base | 0.400 / 0.400 / 0.400 | (not retrained) |" in text
    assert "| direct GRPO − TRACE | +0.160 / +0.280 / +0.020; +0.153 ± 0.130 (+0.020 to +0.280) |" in text, text
    assert any(line.startswith("  direct GRPO − TRACE: +0.153 ± 0.130") for line in printed)
    assert repeats_section(records, {}, DemoConfig(), summarize_runs) == ([], {}, [])  # one run: nothing
    # wired into the report, with each repeat's own steps in the time table
    text, results, table = render_report(tmp_path, records, DemoConfig(), summarize_runs, "default", repeats=repeats)
    assert "## Repeats: the spread between training runs" in text and results["repeats"]["training_seeds"] == [0, 1, 2]
    assert "| final (training seed 1) | 2 | cpu |" in text and "| evaluate (training seed 1)" not in text
    assert "over 3 repeats (training seeds 0, 1, 2)" in table
    json.dumps(results)
