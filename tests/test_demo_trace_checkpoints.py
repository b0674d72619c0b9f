"""TRACE at shares of its own training budget (issue 29 point 3): Step 3's adapters keep checkpoints at the
efficiency fractions, and the efficiency step trains a gate on each checkpoint (router SFT on the rollouts played up
to it, floor(share x gate_iterations) GRPO iterations) and evaluates it as "TRACE @1/4", ...
(demo/run.py, demo/loop.py). The report side is tests/test_demo_trace_efficiency_report.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from test_demo_efficiency import CAPABILITIES, demo_with, fake_train_lora


def test_step3_keeps_each_adapters_checkpoints_at_the_fractions(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    calls: list = []
    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora(calls))
    demo = demo_with(tmp_path)  # configs/demo.yaml: 8 iterations per adapter, fractions [0.25, 0.5]
    figures = demo.train(tmp_path / "train")
    assert [(c["folder"], c["iterations"], c["checkpoints_at"]) for c in calls] == [
        (c, 8, [2, 4]) for c in CAPABILITIES]
    for capability, run in figures["adapters"].items():
        assert [(k["fraction"], k["asked"], k["iteration"], k["episodes"]) for k in run["checkpoints"]] == [
            (0.25, 0.25, 2, 128), (0.5, 0.5, 4, 256)]
        assert run["checkpoints"][0]["adapter"].endswith(f"{capability}/checkpoints/iter_000002/adapter")
    calls.clear()
    assert "checkpoints" not in demo_with(tmp_path, fractions=()).train(tmp_path / "t2")["adapters"][CAPABILITIES[0]]
    assert calls[0]["checkpoints_at"] == []


def _with_adapter_checkpoints(demo, tmp_path: Path) -> None:
    """The train step's record as `Demo.train` writes it with fractions [0.25, 0.5] (8 iterations of 64 episodes)."""
    for capability, run in demo.records["train"]["figures"]["adapters"].items():
        run["adapter"] = str(tmp_path / "train" / capability)
        run["checkpoints"] = [{"fraction": f, "asked": f, "iteration": i, "episodes": i * 64,
                               "adapter": str(tmp_path / "train" / capability / "checkpoints" / f"iter_{i:06d}" /
                                              "adapter")} for f, i in ((0.25, 2), (0.5, 4))]


def test_the_efficiency_step_composes_trace_from_the_adapters_checkpoints(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora([]))
    demo = demo_with(tmp_path)
    # reward targets: the test below; 4 gate GRPO iterations (the demo's configs train router SFT alone), so each
    # checkpoint's gate has its share of them
    demo.config.loop = dataclasses.replace(demo.config.loop, gate_labels="game", gate_iterations=4)
    _with_adapter_checkpoints(demo, tmp_path)
    demo.records["baselines"] = {"figures": demo.baselines(tmp_path / "baselines")}
    gates: list = []

    def train_gate(model_dir, adapters, games, folder, settings, report_to=None, target_rollouts=None, seed=0,
                   runs=None, through=None, routing=None):
        assert routing is None
        gates.append({"adapters": adapters, "games": set(games), "folder": folder.name,
                      "gate_iterations": settings.gate_iterations, "runs": runs, "through": through,
                      "target_rollouts": target_rollouts, "seed": seed})
        episodes = settings.gate_iterations * settings.groups_per_iteration * settings.group_size
        return {"gate": str(folder / "gate"), "episodes": episodes, "sft_data": {"base": 3}}

    evaluated: list = []

    def evaluate(model_dir, adapter, folder, seeds, n_tasks, samples, label, **kw):
        evaluated.append({"adapter": adapter, "label": label, "seeds": seeds, "tasks": n_tasks, **kw})
        return {f"{seeds[0]}/greedy": {"path": f"efficiency/{label}.json"}}

    monkeypatch.setattr(demo_loop, "train_gate", train_gate)
    monkeypatch.setattr(demo, "_evaluate", evaluate)
    figures = demo.efficiency(tmp_path / "efficiency")
    # one gate per checkpoint, on the adapters' checkpoints, with the same share of Step 4's 4 GRPO iterations,
    # router SFT on the rollouts played up to the checkpoint (the runs' rollouts/, iterations 1..i)
    assert [g["folder"] for g in gates] == ["trace_iter000002", "trace_iter000004"]
    assert [g["gate_iterations"] for g in gates] == [1, 2] and [g["through"] for g in gates] == [2, 4]
    for gate, i in zip(gates, (2, 4)):
        assert gate["adapters"] == {c: str(tmp_path / "train" / c / "checkpoints" / f"iter_{i:06d}" / "adapter")
                                    for c in CAPABILITIES}
        assert gate["runs"] == {c: str(tmp_path / "train" / c) for c in CAPABILITIES}
        assert gate["games"] == set(CAPABILITIES) and gate["seed"] == 0
        assert gate["target_rollouts"] == []  # Step 1's analysis results (none in this folder), as Step 4's gate
    # 2 x 128 + 64 = 320 of TRACE's 1,280 episodes: "TRACE @1/4"; 2 x 256 + 128 = 640: "TRACE @1/2"
    trace = figures["trace_checkpoints"]
    assert list(trace) == ["TRACE @1/4", "TRACE @1/2"]
    assert trace["TRACE @1/4"] == {
        "fraction": 0.25, "asked": 0.25, "iteration": 2, "iterations": 8,
        "adapter_episodes": {c: 128 for c in CAPABILITIES}, "gate_iterations": 1, "gate_episodes": 64,
        "routing_episodes": 0, "episodes": 320, "gate": str(tmp_path / "efficiency" / "trace_iter000002" / "gate"),
        "sft_data": {"base": 3}}
    assert trace["TRACE @1/2"]["episodes"] == 640 and trace["TRACE @1/2"]["fraction"] == 0.5
    # evaluated like direct GRPO's checkpoints: the final step's tasks and seeds, the gate as the adapter
    e = demo.config.evaluate
    mine = [c for c in evaluated if c["label"].startswith("TRACE")]
    assert [(c["label"], c["adapter"]) for c in mine] == [
        ("TRACE_at1of4", tmp_path / "efficiency" / "trace_iter000002" / "gate"),
        ("TRACE_at1of2", tmp_path / "efficiency" / "trace_iter000004" / "gate")]
    assert all((c["seeds"], c["tasks"]) == (e.seeds, e.tasks) and set(c) == {"adapter", "label", "seeds", "tasks"}
               for c in mine)
    assert list(figures["models"]) == ["direct GRPO @1/4", "direct GRPO @1/2", "TRACE @1/4", "TRACE @1/2"]
    assert "trace_why" not in figures and "why" not in figures


def test_the_efficiency_step_says_why_trace_has_no_checkpoints(tmp_path, monkeypatch):
    from demo import loop as demo_loop

    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora([]))
    monkeypatch.setattr(demo_loop, "train_gate", lambda *a, **k: {"gate": None, "episodes": 0,
                                                                            "sft_data": {}})
    demo = demo_with(tmp_path)
    monkeypatch.setattr(demo, "routing_targets", lambda *a: None)
    demo.records["baselines"] = {"figures": demo.baselines(tmp_path / "baselines")}
    monkeypatch.setattr(demo, "_evaluate", lambda *a, **k: {})
    # a train step without checkpoints (the adapters ran too few iterations)
    figures = demo.efficiency(tmp_path / "e1")
    assert "no checkpoint before the last" in figures["trace_why"] and figures["trace_checkpoints"] == {}
    assert list(figures["models"]) == ["direct GRPO @1/4", "direct GRPO @1/2"]  # direct GRPO's are still measured
    # checkpoints, but no gate could be trained on them (no router SFT data and 0 GRPO iterations)
    _with_adapter_checkpoints(demo, tmp_path)
    demo.config.loop = dataclasses.replace(demo.config.loop, gate_iterations=1)
    figures = demo.efficiency(tmp_path / "e2")
    assert "iteration 2: no gate" in figures["trace_why"] and figures["trace_checkpoints"] == {}
    # no TRACE model at all
    demo.records["gate"] = {"figures": {}}
    assert "no TRACE model" in demo.efficiency(tmp_path / "e3")["trace_why"]


def test_trace_at_a_share_plays_that_share_of_the_routing_tasks_and_counts_them(tmp_path, monkeypatch):
    """loop.gate_labels reward (configs/demo_full.yaml): TRACE @1/4's gate fits reward targets on a quarter of Step 1's
    100 tasks (2 adapters x 25 tasks x 2 samples = 100 new episodes), and they count in its share of TRACE's
    training, as Step 4's 400 routing episodes count in the full 1,280 + 400."""
    from demo import loop as demo_loop

    monkeypatch.setattr(demo_loop, "train_lora", fake_train_lora([]))
    demo = demo_with(tmp_path, fractions=(0.25,))
    assert demo.config.loop.gate_labels == "reward" and demo.config.select.tasks == 100
    demo.config.loop = dataclasses.replace(demo.config.loop, gate_iterations=4)  # with gate GRPO, as Step 4's 256
    _with_adapter_checkpoints(demo, tmp_path)
    demo.records["gate"]["figures"]["routing_episodes"] = 400
    assert demo.trace_episodes() == 1680
    routed: list = []

    def routing_targets(folder, adapters, n_tasks):
        routed.append((folder.name, sorted(adapters), n_tasks))
        return {"data": [], "summary": {}, "episodes": n_tasks * 2 * len(adapters)}

    def train_gate(model_dir, adapters, games, folder, settings, report_to=None, target_rollouts=None, seed=0,
                   runs=None, through=None, routing=None):
        episodes = settings.gate_iterations * settings.groups_per_iteration * settings.group_size
        return {"gate": str(folder / "gate"), "episodes": episodes, "sft_data": {},
                "routing_episodes": routing["episodes"]}

    monkeypatch.setattr(demo, "routing_targets", routing_targets)
    monkeypatch.setattr(demo_loop, "train_gate", train_gate)
    monkeypatch.setattr(demo, "_evaluate", lambda *a, **k: {})
    out = {"trace_checkpoints": {}, "models": {}}
    assert demo.trace_checkpoints(tmp_path / "efficiency", out) is None
    assert routed == [("trace_iter000002", sorted(CAPABILITIES), 25), ("trace_iter000004", sorted(CAPABILITIES), 50)]
    # 2 x 128 adapter + 64 gate GRPO + 100 routing = 420 of 1,680; 2 x 256 + 128 + 200 = 840
    rows = out["trace_checkpoints"]
    assert list(rows) == ["TRACE @1/4", "TRACE @1/2"]
    assert [(r["episodes"], r["routing_episodes"]) for r in rows.values()] == [(420, 100), (840, 200)]


def test_router_sft_data_for_a_checkpoint_reads_only_the_rollouts_played_up_to_it(tmp_path):
    from demo.loop import sft_data

    run = tmp_path / "train" / "cap"
    (run / "rollouts").mkdir(parents=True)
    for i in (1, 2, 3, 4):
        (run / "rollouts" / f"iter_{i:06d}.json").write_text("{}")
    checkpoint = str(run / "checkpoints" / "iter_000002" / "adapter")
    target = [tmp_path / "select" / "analysis_seed500_sampled.json"]
    data = sft_data({"cap": checkpoint}, target, runs={"cap": str(run)}, through=2)
    assert [Path(d["path"]).name for d in data if d["label"] == "cap"] == ["iter_000001.json", "iter_000002.json"]
    assert [d["path"] for d in data if d["label"] == "base"] == [str(target[0])]
    # the final adapter (its run folder): every iteration's rollouts
    assert len([d for d in sft_data({"cap": str(run)}, target) if d["label"] == "cap"]) == 4
