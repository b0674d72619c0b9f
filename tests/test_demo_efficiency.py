"""Sample efficiency in the CPU demo (issue 29 point 3): direct GRPO keeps its checkpoints at fractions of its budget
(demo/loop.py), the `efficiency` step evaluates them on the final step's tasks (demo/run.py), and the
report sets them beside TRACE at its full budget with paired differences and a plot (demo/report.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SEEDS = ("1000", "2000")


# ---- which checkpoints ----------------------------------------------------------------------------------------


def test_the_checkpoint_plan_takes_at_most_each_share_and_labels_the_share_it_is():
    from demo.loop import checkpoint_plan

    assert checkpoint_plan(20, [0.25, 0.5]) == [
        {"fraction": 0.25, "asked": 0.25, "iteration": 5, "label": "direct GRPO @1/4"},
        {"fraction": 0.5, "asked": 0.5, "iteration": 10, "label": "direct GRPO @1/2"}]
    # 18 iterations: 4.5 -> 4 (at most a quarter of the episodes), labelled by what it is
    assert [(p["iteration"], p["label"]) for p in checkpoint_plan(18, [0.25, 0.5])] == [
        (4, "direct GRPO @2/9"), (9, "direct GRPO @1/2")]
    # the fast profile's 3 iterations: both fractions land on iteration 1, kept once; never the last iteration
    assert [p["iteration"] for p in checkpoint_plan(3, [0.25, 0.5])] == [1]
    assert checkpoint_plan(3, [0.5])[0]["label"] == "direct GRPO @1/3"
    assert checkpoint_plan(1, [0.5]) == [] and checkpoint_plan(20, []) == []
    assert checkpoint_plan(4, [0.9]) == [{"fraction": 0.75, "asked": 0.9, "iteration": 3, "label": "direct GRPO @3/4"}]


def test_the_fractions_are_validated_with_the_fix_spelled_out(tmp_path):
    from common.validation import InputError
    from demo.config import EvaluateSettings, load_demo_config

    assert EvaluateSettings().efficiency_fractions == [0.25, 0.5]
    assert EvaluateSettings(efficiency_fractions=[]).efficiency_fractions == []
    for name, fractions in (("demo.yaml", [0.25]), ("demo_full.yaml", [0.25, 0.5]), ("demo_fast.yaml", [0.5])):
        assert load_demo_config(REPO / "configs" / name).evaluate.efficiency_fractions == fractions
    for bad in ("[0.5, 0.25]", "[0.25, 0.25]", "[0, 0.5]", "[1]", "[1.5]", "0.25", "[true]", "['1/4']"):
        path = tmp_path / "bad.yaml"
        path.write_text(f"evaluate: {{efficiency_fractions: {bad}}}\n")
        with pytest.raises(InputError, match=r"evaluate\.efficiency_fractions must list fractions of direct GRPO's "
                                             r"budget strictly between 0 and 1, in increasing order without repeats, "
                                             r"e\.g\. \[0\.25, 0\.5\] .*\[\] turns the efficiency step off"):
            load_demo_config(path)


# ---- GRPO keeps them --------------------------------------------------------------------------------------------


@pytest.fixture
def letter_game(monkeypatch):
    """The test capability game of tests/games, registered for one test (as test_demo.py's tracker test does)."""
    import game_registry

    game_registry.discover_games()
    monkeypatch.setattr(game_registry, "_REGISTRY", dict(game_registry._REGISTRY))
    monkeypatch.setattr(game_registry, "_LOADED_FILES", set(game_registry._LOADED_FILES))
    game_registry._import_game_file(REPO / "tests" / "games" / "capability_letter_density_game.py")
    return game_registry.get_game("capability_letter_density")


def _adapter_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_train_lora_keeps_the_asked_checkpoints_and_each_is_the_shorter_run(tiny_model_dir, tmp_path, letter_game):
    """A checkpoint at iteration k of an n-iteration run is the adapter a k-iteration run ends with (constant learning
    rate, same task seeds), checkpointing changes nothing in the run, and only the asked ones and the last are kept."""
    from demo.config import LoopSettings
    from demo.loop import train_lora
    from train.evaluate import load_policy_model

    settings = LoopSettings(groups_per_iteration=2, group_size=4, max_episode_tokens=128, learning_rate=3e-2)
    run = train_lora(letter_game, tiny_model_dir, tmp_path / "long", {}, settings, 3, checkpoints_at=[1])
    assert run["checkpoints"] == [{"iteration": 1, "episodes": 8,
                                   "adapter": str(tmp_path / "long" / "checkpoints" / "iter_000001" / "adapter")}]
    assert sorted(p.name for p in (tmp_path / "long" / "checkpoints").iterdir()) == ["iter_000001", "iter_000003"]
    plain = train_lora(letter_game, tiny_model_dir, tmp_path / "plain", {}, settings, 3)
    assert "checkpoints" not in plain
    assert sorted(p.name for p in (tmp_path / "plain" / "checkpoints").iterdir()) == ["iter_000003"]
    short = train_lora(letter_game, tiny_model_dir, tmp_path / "short", {}, settings, 1)
    first = _adapter_tensors(tmp_path / "long" / "checkpoints" / "iter_000001" / "adapter")
    assert _same(first, _adapter_tensors(tmp_path / "short"))
    assert _same(_adapter_tensors(tmp_path / "long"), _adapter_tensors(tmp_path / "plain"))
    assert not _same(first, _adapter_tensors(tmp_path / "long")), "the run must learn for the test to mean anything"
    assert len(run["curve"]) == 3 and short["episodes"] == 8 and run["episodes"] == 24
    load_policy_model(tiny_model_dir, run["checkpoints"][0]["adapter"])  # the final step's loader takes it
    with pytest.raises(ValueError, match="checkpoints_at"):
        train_lora(letter_game, tiny_model_dir, tmp_path / "bad", {}, settings, 3, checkpoints_at=[3])


# ---- the baselines step keeps them, the efficiency step evaluates them ------------------------------------------

CAPABILITIES = ("precondition_verification", "structured_data_reasoning")


def loop_records() -> dict:
    """Steps 2-4 as they record: two trained adapters of 512 episodes and a gate of 256 (TRACE: 1,280)."""
    return {"environments": {"figures": {"capabilities": {c: {"status": "no_knob", "value": None, "game_overrides": {}}
                                                          for c in CAPABILITIES}, "forced": False}},
            "train": {"figures": {"adapters": {c: {"adapter": f"train/{c}", "episodes": 512} for c in CAPABILITIES}}},
            "gate": {"figures": {"gate": "gate/gate", "episodes": 256}}}


def fake_train_lora(calls: list):
    def train(spec, model_dir, output_dir, overrides, settings, iterations, report_to=None, checkpoints_at=(),
              task_pool=0, seed=0):
        calls.append({"game": spec.name, "folder": output_dir.name, "iterations": iterations,
                      "checkpoints_at": list(checkpoints_at), "task_pool": task_pool})
        per_iteration = settings.groups_per_iteration * settings.group_size
        out = {"adapter": str(output_dir), "iterations": iterations, "episodes": iterations * per_iteration,
               "curve": []}
        if checkpoints_at:
            out["checkpoints"] = [{"iteration": i, "episodes": i * per_iteration,
                                   "adapter": str(output_dir / "checkpoints" / f"iter_{i:06d}" / "adapter")}
                                  for i in checkpoints_at]
        return out
    return train


def demo_with(tmp_path, fractions=(0.25, 0.5), config_name="demo_full.yaml"):
    from demo.run import Demo
    from demo.config import load_demo_config

    config = load_demo_config(REPO / "configs" / config_name)
    config.evaluate = dataclasses.replace(config.evaluate, efficiency_fractions=list(fractions))
    demo = Demo(config, tmp_path, fresh=False, profile="default")
    demo.records.update(loop_records())
    return demo


def test_the_baselines_step_keeps_direct_grpos_checkpoints_at_the_fractions(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    calls: list = []
    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora(calls))
    demo = demo_with(tmp_path)
    figures = demo.baselines(tmp_path / "baselines")
    assert figures["budget_episodes"] == 1280
    assert calls[0] == {"game": "storefront", "folder": "direct", "iterations": 20, "checkpoints_at": [5, 10],
                        "task_pool": 0}
    # direct GRPO's second setting (configs/demo_full.yaml: a fixed pool of 40 tasks), same budget, no checkpoints
    assert calls[1] == {"game": "storefront", "folder": "direct_pool", "iterations": 20, "checkpoints_at": [],
                        "task_pool": 40}
    assert calls[2]["folder"] == "mixed" and calls[2]["checkpoints_at"] == []  # only direct GRPO keeps them
    assert calls[2]["task_pool"] == 0
    direct = figures["direct"]
    assert [(c["label"], c["iteration"], c["episodes"], c["fraction"]) for c in direct["checkpoints"]] == [
        ("direct GRPO @1/4", 5, 320, 0.25), ("direct GRPO @1/2", 10, 640, 0.5)]
    assert direct["checkpoints"][0]["adapter"].endswith("direct/checkpoints/iter_000005/adapter")
    calls.clear()
    assert "checkpoints" not in demo_with(tmp_path, fractions=()).baselines(tmp_path / "b2")["direct"]
    assert calls[0]["checkpoints_at"] == []


def test_the_claims_profile_trains_one_direct_grpo_run_on_the_pool_with_the_checkpoints(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    calls: list = []
    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora(calls))
    demo = demo_with(tmp_path, fractions=(0.25,), config_name="demo.yaml")  # loop.direct_fresh false
    figures = demo.baselines(tmp_path / "baselines")
    assert [call["folder"] for call in calls] == ["direct", "mixed"]
    assert calls[0] == {"game": "storefront", "folder": "direct", "iterations": 20, "checkpoints_at": [5],
                        "task_pool": 40}
    assert [c["label"] for c in figures["direct"]["checkpoints"]] == ["direct GRPO @1/4"]
    assert "direct_pool" not in figures


def test_the_efficiency_step_evaluates_each_checkpoint_on_the_final_steps_tasks(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora([]))
    demo = demo_with(tmp_path)
    demo.records["baselines"] = {"figures": demo.baselines(tmp_path / "baselines")}
    evaluated: list = []

    def evaluate(model_dir, adapter, folder, seeds, n_tasks, samples, label, **kw):
        evaluated.append({"model": model_dir, "adapter": adapter, "seeds": seeds, "tasks": n_tasks,
                          "samples": samples, "label": label, **kw})
        return {f"{seeds[0]}/greedy": {"path": f"efficiency/{label}.json"}}

    monkeypatch.setattr(demo, "_evaluate", evaluate)
    figures = demo.efficiency(tmp_path / "efficiency")
    e = demo.config.evaluate
    assert [c["adapter"] for c in evaluated] == [tmp_path / "baselines" / "direct" / "checkpoints" / f"iter_{i:06d}" /
                                                 "adapter" for i in (5, 10)]
    assert all(c["model"] == tmp_path / "base" / "model" and (c["seeds"], c["tasks"], c["samples"]) ==
               (e.seeds, e.tasks, e.samples) and set(c) == {"model", "adapter", "seeds", "tasks", "samples", "label"}
               for c in evaluated)  # the storefront as the final step plays it: no other game, no other overrides
    assert [c["label"] for c in evaluated] == ["direct_GRPO_at1of4", "direct_GRPO_at1of2"]
    assert list(figures["models"]) == list(figures["checkpoints"]) == ["direct GRPO @1/4", "direct GRPO @1/2"]
    assert figures["checkpoints"]["direct GRPO @1/4"] == {
        "fraction": 0.25, "asked": 0.25, "iteration": 5, "episodes": 320,
        "adapter": str(tmp_path / "baselines" / "direct" / "checkpoints" / "iter_000005" / "adapter")}
    assert "why" not in figures and figures["fractions"] == [0.25, 0.5]
    # off, or nothing to evaluate: it says why and evaluates nothing
    evaluated.clear()
    off = demo_with(tmp_path, fractions=())
    off.records["baselines"] = demo.records["baselines"]
    assert "efficiency step is off" in off.efficiency(tmp_path / "e2")["why"]
    demo.records["baselines"] = {"figures": {}}
    assert "no direct GRPO run" in demo.efficiency(tmp_path / "e3")["why"]
    demo.records["baselines"] = {"figures": {"direct": {"iterations": 1, "adapter": "x"}}}
    assert "no checkpoint before the last" in demo.efficiency(tmp_path / "e4")["why"]
    assert evaluated == []


def test_the_fractions_fingerprint_the_train_baselines_and_efficiency_steps_only(tmp_path, monkeypatch):
    """evaluate.efficiency_fractions is no setting of the evaluate, select or final steps (their fingerprints stay
    what they were before the key existed); the train and baselines steps carry it (they keep the checkpoints)
    unless it is [], and the efficiency step runs last, reading both."""
    from demo import run as demo_run
    from demo.run import _run_steps

    def steps_of(fractions):
        demo = demo_with(tmp_path, fractions)
        seen: dict = {}
        monkeypatch.setattr(demo_run.Demo, "step", lambda self, name, settings, reads, body, force=False:
                            seen.setdefault(name, (json.loads(json.dumps(settings, default=str)), reads)) and {})
        monkeypatch.setattr(demo_run.Demo, "base_step_settings", lambda self: {})
        monkeypatch.setattr(demo_run, "write_report", lambda demo: "")
        assert _run_steps(demo, demo.config, REPO / "configs" / "demo.yaml", tmp_path / "run", "default") == 0
        return seen

    on, off, other = steps_of([0.25, 0.5]), steps_of([]), steps_of([0.5])
    assert list(on) == ["base", "evaluate", "select", "environments", "train", "own_game", "gate", "baselines",
                        "final", "efficiency"]
    for name in ("evaluate", "select", "final", "environments", "gate"):
        assert on[name] == off[name] == other[name], name
        assert "efficiency_fractions" not in json.dumps(on[name][0]), name
    assert on["baselines"][0]["efficiency_fractions"] == on["train"][0]["efficiency_fractions"] == [0.25, 0.5]
    assert other["train"][0]["efficiency_fractions"] == [0.5]
    assert "efficiency_fractions" not in off["train"][0]  # off: Step 3's settings of before
    # loop.direct_task_pool is the baselines' setting only (direct GRPO's fixed-pool run): Steps 2-4 keep theirs
    assert on["baselines"][0]["direct_task_pool"] == 40
    for name in ("environments", "train", "gate", "own_game"):
        assert "direct_task_pool" not in json.dumps(on[name][0]), name
    assert "efficiency_fractions" not in off["baselines"][0]  # off: the baselines' settings of before
    assert on["efficiency"][1] == ("train", "gate", "baselines")
    assert on["efficiency"][0]["efficiency_fractions"] == [0.25, 0.5]
    assert on["efficiency"][0]["storefront"] == on["evaluate"][0]["storefront"]
    assert {k: v for k, v in on["efficiency"][0].items() if k != "efficiency_fractions"} == on["evaluate"][0]


# ---- the report ----------------------------------------------------------------------------------------------------


def write_runs(run_dir: Path, label: str, greedy_passing: int, sampled_passing: int, n: int = 50) -> dict:
    """One model's evaluation runs as the demo records them, 2 seeds × n tasks: the first `greedy_passing` tasks of
    each seed pass greedy, the first `sampled_passing` pass both samples at T=1 (the rest fail)."""
    from benchmarks.results import pass_hat_k, write_results

    runs = {}
    for seed in SEEDS:
        for mode, passing, samples in (("greedy", greedy_passing, 1), ("sampled", sampled_passing, 2)):
            sims = [{"id": f"{seed}-{t}-{i}", "task_id": f"{seed}-t{t}", "sample_idx": i, "messages": [],
                     "reward_info": {"reward": float(t < passing)}} for t in range(n) for i in range(samples)]
            path = run_dir / "final" / f"{label}_seed{seed}_{mode}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_results(path, sims, None, {})
            hat = pass_hat_k(sims, samples)
            runs[f"{seed}/{mode}"] = {"path": str(path.relative_to(run_dir)), "seconds": 1.0, "pass_hat_k": {
                g: {"n_tasks": v["n_tasks"], **{str(k): p for k, p in v["pass_hat_k"].items()}}
                for g, v in hat.items()}}
    return runs


def efficiency_records(run_dir: Path, trace: tuple[int, int], schedule: str | None = "constant") -> dict:
    """A whole run's records: base 10/50 greedy and T=1, direct GRPO's checkpoints 15 (1/4) and 20 (1/2), its
    final 25 (greedy; 12, 14, 16 at T=1), TRACE `trace` (greedy, T=1 passing tasks per seed)."""
    def record(figures: dict, settings: dict | None = None) -> dict:
        return {"seconds": 1.0, "device": "cpu", "figures": figures, "settings": settings or {}}

    direct = run_dir / "baselines" / "direct"
    if schedule:
        direct.mkdir(parents=True)
        (direct / "config.yaml").write_text(f"lr_schedule: {schedule}\nwarmup_iterations: 0\n")
    checkpoints = {label: {"fraction": f, "asked": f, "iteration": i, "episodes": i * 64,
                           "adapter": str(direct / "checkpoints" / f"iter_{i:06d}" / "adapter")}
                   for label, f, i in (("direct GRPO @1/4", 0.25, 5), ("direct GRPO @1/2", 0.5, 10))}
    loop = loop_records()
    return {
        "evaluate": record({"base": write_runs(run_dir, "base", 10, 10)}),
        "select": record({}, {"tasks": 100, "samples": 2, "seed": 500}),
        "environments": record({"capabilities": {}, "forced": False},
                               {"calibration_tasks": 16, "calibration_samples": 4}),
        "train": record({"adapters": {c: {**run, "curve": []} for c, run in
                                      loop["train"]["figures"]["adapters"].items()}}),
        "gate": record({**loop["gate"]["figures"], "curve": []}),
        "baselines": record({"budget_episodes": 1280, "direct": {"adapter": str(direct), "iterations": 20,
                                                                 "episodes": 1280, "curve": []}}),
        "final": record({"models": {"TRACE": write_runs(run_dir, "TRACE", *trace),
                                    "direct GRPO": write_runs(run_dir, "direct", 25, 16)},
                         "routing": {"by_kind": {"slots": ["base"], "per_kind": 1, "sources": [], "kinds": {}}}}),
        "efficiency": record({"fractions": [0.25, 0.5], "checkpoints": checkpoints,
                              "models": {"direct GRPO @1/4": write_runs(run_dir, "q", 15, 12),
                                         "direct GRPO @1/2": write_runs(run_dir, "h", 20, 14)}}),
    }


def test_the_report_sets_trace_beside_direct_grpo_at_each_share_of_its_budget(tmp_path):
    from demo.run import summarize_runs
    from demo.config import DemoConfig
    from demo.report import render_report

    text, results, table = render_report(tmp_path, efficiency_records(tmp_path, (12, 11)), DemoConfig(),
                                         summarize_runs, "default")
    section = text.split("## Sample efficiency", 1)[1].split("\n## ", 1)[0]
    assert ("**TRACE (its 1,280 training episodes) vs direct GRPO at 1/4, 1/2, all of that budget (320, 640, 1,280 "
            "episodes):** greedy pass^1 TRACE 0.240 vs 0.300 / 0.400 / 0.500; T=1 pass^1 TRACE 0.220 vs 0.240 / "
            "0.280 / 0.320.") in section, section
    assert "with under a quarter of the rollouts, TRACE exceeded the final scores of GRPO" in section
    assert "**not available at equal cost**" in section and "at least 4× TRACE's episodes" in section
    assert "a checkpoint is what a run stopped there would have reached" in section  # its config.yaml: constant
    # rows: base at 0, each checkpoint at its episodes, TRACE − model paired over the same tasks
    assert "| base (episode 0 of both) | 0 | 0 | 0 | 0.200 ± 0.000 | 0.200 ± 0.000 | **+0.040 [" in section, section
    assert "| direct GRPO @1/4 | 320 | 1/4 | 320 | 0.300 ± 0.000 | 0.240 ± 0.000 | **-0.060 [" in section, section
    assert "| direct GRPO @1/2 | 640 | 1/2 | 640 | 0.400 ± 0.000 |" in section
    assert "| direct GRPO | 1,280 | all | 1,280 | 0.500 ± 0.000 | 0.320 ± 0.000 | **-0.260 [" in section
    assert "| TRACE | 1,280 | all | 1,480 | 0.240 ± 0.000 | 0.220 ± 0.000 | - | - |" in section  # + Step 1's 200
    eff = results["efficiency"]
    assert eff["trace_minus"]["direct GRPO @1/4"]["greedy"]["difference"] == pytest.approx(0.24 - 0.30)
    assert eff["trace_minus"]["direct GRPO @1/2"]["sampled"]["difference"] == pytest.approx(0.22 - 0.28)
    assert eff["trace_minus"]["direct GRPO"]["greedy"]["difference"] == pytest.approx(0.24 - 0.50)
    assert eff["rows"]["direct GRPO @1/2"]["training"] == 640 and eff["rows"]["TRACE"]["training"] == 1280
    assert all(eff["same_tasks_as_trace"].values())
    assert eff["first_direct_point_at_or_above_trace"] == {"greedy": "direct GRPO @1/4", "sampled": "direct GRPO @1/4"}
    assert "contradicted here" in section and "0.200 → 0.300 → 0.400 → 0.500" in section
    assert eff["equal_budget"]["greedy"].startswith("direct GRPO above TRACE at equal budget")
    assert (tmp_path / "efficiency.png").is_file() and "![pass rate against episodes](efficiency.png)" in section
    # the checkpoints are models of every table: results, paired differences, every rollout counted
    assert "direct GRPO @1/4" in results["evaluation"] and "direct GRPO @1/4" in results["paired"]["comparisons"]
    assert results["episodes"]["models"]["direct GRPO @1/4"] == {
        "training": 320, "all": 320, "target": 320, "parts": {"direct_grpo": 320},
        "budget": "direct GRPO's checkpoint at iteration 5 of 20"}
    assert "direct GRPO @1/4: 0.300 / 0.240 (320)" in table and "TRACE − direct GRPO: -0.260 [" in table
    json.dumps(results)


def test_the_report_says_when_trace_is_above_at_equal_budget_or_it_is_not_resolved(tmp_path):
    from demo.run import summarize_runs
    from demo.config import DemoConfig
    from demo.report import render_report

    above, _, _ = render_report(tmp_path / "a", efficiency_records(tmp_path / "a", (40, 30), schedule="cosine"),
                                DemoConfig(), summarize_runs, "default")
    assert "Consistent with the paper's direction at equal budget" in above
    assert "TRACE above direct GRPO at equal budget" in above and "none of its points (TRACE above all" in above
    assert "close to, not the same as, a shorter run" in above  # a schedule over the whole run
    tied, results, _ = render_report(tmp_path / "t", efficiency_records(tmp_path / "t", (25, 16), schedule=None),
                                     DemoConfig(), summarize_runs, "default")
    assert "**cannot be resolved** here" in tied and "not resolved: the interval holds 0" in tied
    assert "no config.yaml" in tied
    assert results["efficiency"]["first_direct_point_at_or_above_trace"]["greedy"] == "direct GRPO"
    # +0.04 greedy on 4 untied tasks, all TRACE's: the bootstrap excludes 0, the sign test (p = 0.125) does not
    few, results, _ = render_report(tmp_path / "f", efficiency_records(tmp_path / "f", (27, 16)), DemoConfig(),
                                    summarize_runs, "default")
    cell = results["efficiency"]["trace_minus"]["direct GRPO"]["greedy"]
    assert cell["excludes_zero"] and cell["sign_test_p"] == pytest.approx(0.125)
    assert "greedy: not resolved: the interval excludes 0 but rests on few untied tasks (sign test p = 0.125" in few
    assert "**cannot be resolved** here" in few


def test_the_report_says_why_efficiency_was_not_measured(tmp_path):
    from demo.run import summarize_runs
    from demo.config import DemoConfig
    from demo.report import render_report

    records = efficiency_records(tmp_path, (12, 11))
    records["efficiency"]["figures"] = {"fractions": [], "checkpoints": {}, "models": {},
                                        "why": "evaluate.efficiency_fractions is []: the efficiency step is off"}
    text, results, _ = render_report(tmp_path, records, DemoConfig(), summarize_runs, "default")
    assert "## Sample efficiency\n\nNot measured: evaluate.efficiency_fractions is []: the efficiency step is off." \
        in text
    assert results["efficiency"] == {"why": "evaluate.efficiency_fractions is []: the efficiency step is off"}
    del records["efficiency"]  # a run folder from before the step: no section
    text, results, _ = render_report(tmp_path, records, DemoConfig(), summarize_runs, "default")
    assert "## Sample efficiency" not in text and "efficiency" not in results
