"""Every rollout counted: the episodes each model consumed (analysis, calibration, training), per step."""
from __future__ import annotations

import dataclasses
from typing import Any



# The baselines step's runs and their model labels: direct GRPO on fresh target tasks and on a fixed pool of them,
# and one adapter on the selected games mixed.
BASELINE_LABELS = {"direct": "direct GRPO", "direct_pool": "direct GRPO (task pool)", "mixed": "single-adapter GRPO"}


def _step_settings(records: dict[str, dict[str, Any]], step: str, section: Any) -> dict[str, Any]:
    """The settings a step ran with (its step.json), falling back to the config's section."""
    return records.get(step, {}).get("settings") or dataclasses.asdict(section)


def calibration_episodes(environment: dict[str, Any], tasks: int, samples: int) -> tuple[int, int]:
    """(probes, episodes) Step 2's calibration played for one capability, all of them episodes of the base agent
    on the capability's game: one probe per knob value tried (`history`; a record without one that holds a
    measurement made one probe), each `tasks` × `samples` episodes; plus its mistake census
    (`demo.loop.count_first_mistakes`, recorded as `mistake_census` = {"episodes", "rounds", ...}), which a game
    no probed value brought into the band plays after the search: the kept probe's episodes (already counted
    among the probes) and `rounds` more rounds of `tasks` × `samples` fresh tasks — those rounds are counted here
    (`census_episodes`), so `episodes` is every calibration episode played. Validation plays scripted policies,
    not the model."""
    probes = len(environment.get("history") or []) or (1 if environment.get("success_rate") is not None else 0)
    return probes, probes * tasks * samples + census_episodes(environment, tasks, samples)


def census_episodes(environment: dict[str, Any], tasks: int, samples: int) -> int:
    """The episodes a capability's mistake census played beyond the kept probe: its `rounds` × `tasks` × `samples`
    (0 without a census)."""
    census = environment.get("mistake_census") or {}
    return int(census.get("rounds") or 0) * tasks * samples


def episode_accounting(records: dict[str, dict[str, Any]], config: Any) -> dict[str, Any]:
    """Every episode each model's method played, by part, from the steps' records.

    Parts: Step 1's analysis episodes (the base agent on the target, `select.tasks` × `select.samples`), Step 2's
    calibration probes and mistake census (`calibration_episodes` per capability), router SFT (no new episode: its
    data are successful rollouts of Step 1 and Step 3, counted there), Step 3's adapters, Step 4's gate GRPO, and the
    baselines' runs. Per model: "training" (its GRPO episodes), "all" (every episode its method played on any
    environment), "target" (those on the target storefront), "parts" ({part: episodes}) and "budget" (which
    total it was given). A LoRA's method is Step 1, its own calibration and its own run; TRACE's and the
    single-adapter baseline's are Step 1, every calibration (they train what calibration found trainable) and
    their training; direct GRPO plays only its own run, on the target. The efficiency step's checkpoints are rows
    too: direct GRPO's (its episodes so far) and TRACE's (`trace_checkpoint_row`). Evaluations (`evaluate`,
    `own_game`, `final`, `efficiency`) measure models and are no part of any method."""
    select = _step_settings(records, "select", config.select)
    loop = _step_settings(records, "environments", config.loop)
    analysis = select["tasks"] * select["samples"] if "select" in records else 0
    envs = records.get("environments", {}).get("figures", {}).get("capabilities") or {}
    calibration = {c: {**dict(zip(("probes", "episodes"), calibration_episodes(
        e, loop["calibration_tasks"], loop["calibration_samples"]))),
        "census": census_episodes(e, loop["calibration_tasks"], loop["calibration_samples"])} for c, e in envs.items()}
    calibration_total = sum(c["episodes"] for c in calibration.values())
    trained = records.get("train", {}).get("figures", {}).get("adapters", {})
    adapters = {c: run["episodes"] for c, run in trained.items()}
    gate = records.get("gate", {}).get("figures", {})
    baselines = records.get("baselines", {}).get("figures", {})
    routing = gate.get("routing_episodes", 0)  # routing targets: each adapter alone on Step 1's tasks
    trace_training = sum(adapters.values()) + gate.get("episodes", 0) + routing
    trace_parts = {"step1_analysis": analysis, "calibration": calibration_total, "router_sft_new": routing,
                   **{f"adapter:{c}": n for c, n in adapters.items()}, "gate_grpo": gate.get("episodes", 0)}
    trace_all = sum(trace_parts.values())
    models: dict[str, dict[str, Any]] = {"base": {"training": 0, "all": 0, "target": 0, "parts": {},
                                                  "budget": "none (the SFT'd starting point)"}}
    for c, n in adapters.items():
        parts = {"step1_analysis": analysis, f"calibration:{c}": calibration.get(c, {}).get("episodes", 0),
                 f"adapter:{c}": n}
        models[f"lora:{c}"] = {"training": n, "all": sum(parts.values()), "target": analysis, "parts": parts,
                               "budget": "its own Step 3 run"}
    if gate.get("gate"):
        models["TRACE"] = {"training": trace_training, "all": trace_all, "target": analysis + routing, "parts": trace_parts,
                           "budget": "its own: Steps 3-4"}
    given = (f"TRACE's Steps 3-4 training episodes ({baselines.get('budget_episodes', trace_training):,}), not its "
             f"all-episodes total ({trace_all:,})")
    for name, label in BASELINE_LABELS.items():
        run = baselines.get(name)
        if not run:
            continue
        if name in ("direct", "direct_pool"):
            parts = {"direct_grpo": run["episodes"]}
            target = run["episodes"]
        else:
            parts = {"step1_analysis": analysis, "calibration": calibration_total, "mixed_grpo": run["episodes"]}
            target = analysis
        models[label] = {"training": run["episodes"], "all": sum(parts.values()), "target": target, "parts": parts,
                         "budget": given}
    checkpoints = records.get("efficiency", {}).get("figures", {}).get("checkpoints") or {}
    for label, checkpoint in checkpoints.items():  # direct GRPO's run, stopped early: only its own episodes so far
        n = checkpoint["episodes"]
        models[label] = {"training": n, "all": n, "target": n, "parts": {"direct_grpo": n},
                         "budget": f"direct GRPO's checkpoint at iteration {checkpoint['iteration']} of "
                                   f"{baselines.get('direct', {}).get('iterations', '?')}"}
    trace_checkpoints = records.get("efficiency", {}).get("figures", {}).get("trace_checkpoints") or {}
    for label, checkpoint in trace_checkpoints.items():
        models[label] = trace_checkpoint_row(checkpoint, analysis, calibration_total)
    return {"parts": {"step1_analysis": {"episodes": analysis, "game": "storefront (the target)",
                                         "tasks": select["tasks"], "samples": select["samples"]},
                      "calibration": {"episodes": calibration_total, "per_probe": loop["calibration_tasks"]
                                      * loop["calibration_samples"], "per_capability": calibration,
                                      "game": "each capability's game"},
                      "router_sft": {"new_episodes": routing, "data": gate.get("sft_data"),
                                     "note": "routing targets: each adapter alone on Step 1's analysis tasks (new "
                                             "episodes), beside the base agent's Step-1 rollouts" if routing else
                                             "successful rollouts of Step 1 and Step 3, already counted there"},
                      "adapters": adapters, "gate_grpo": gate.get("episodes", 0),
                      "baselines": {name: baselines[name]["episodes"] for name in BASELINE_LABELS
                                    if baselines.get(name)},
                      "baseline_budget": baselines.get("budget_episodes")},
            "models": models,
            "not_counted": "evaluations (evaluate, own_game, final: they measure models); game validation (scripted "
                           "policies, no model); the base agent's SFT demonstrations (expert-written, shared by all)"}


def trace_checkpoint_row(checkpoint: dict[str, Any], analysis: int, calibration: int) -> dict[str, Any]:
    """`episode_accounting`'s row of one of TRACE's checkpoints (the efficiency step's "trace_checkpoints": its
    capability adapters at an earlier iteration and a gate trained for a share of the gate's GRPO iterations on
    them). Its method is TRACE's own: Step 1's `analysis` and all `calibration` episodes (played in full whatever
    the training budget) plus its own training, {"adapter:<c>": n} and "gate_grpo"."""
    gate = checkpoint["gate_iterations"]
    routing = checkpoint.get("routing_episodes", 0)
    parts = {"step1_analysis": analysis, "calibration": calibration, "router_sft_new": routing,
             **{f"adapter:{c}": n for c, n in checkpoint["adapter_episodes"].items()},
             "gate_grpo": checkpoint["gate_episodes"]}
    return {"training": checkpoint["episodes"], "all": analysis + calibration + checkpoint["episodes"],
            "target": analysis + routing, "parts": parts,
            "budget": f"TRACE's adapters at iteration {checkpoint['iteration']} of {checkpoint['iterations']} and a "
                      f"gate of {gate} GRPO iteration{'' if gate == 1 else 's'}"}


def _parts_text(parts: dict[str, int]) -> str:
    names = {"step1_analysis": "Step 1", "calibration": "calibration", "router_sft_new": "router SFT (new)",
             "gate_grpo": "gate GRPO", "direct_grpo": "GRPO on the target", "mixed_grpo": "GRPO on the games mixed"}
    return " + ".join(f"{names.get(k, k.replace('adapter:', 'LoRA ').replace('calibration:', 'calibration '))} "
                      f"{v:,}" for k, v in parts.items()) or "-"


def accounting_section(accounting: dict[str, Any], shown: list[str]) -> list[str]:
    """The report's table of episodes per model (the models of the results table, in its order)."""
    parts = accounting["parts"]
    lines = ["## Every rollout counted", "",
             f"Episodes each model's method played. Step 1: {parts['step1_analysis']['episodes']:,} analysis episodes "
             f"of the base agent on the target ({parts['step1_analysis']['tasks']} tasks × "
             f"{parts['step1_analysis']['samples']} samples). Step 2: {parts['calibration']['episodes']:,} calibration "
             f"episodes ({parts['calibration']['per_probe']} per probed value: "
             + (", ".join(f"{c} {v['probes']} × {parts['calibration']['per_probe']}"
                          + (f" + mistake census {v['census']:,}" if v.get("census") else "")
                          for c, v in parts["calibration"]["per_capability"].items()) or "none")
             + "), on the capability games. "
             + (f"Router SFT's routing targets: {parts['router_sft']['new_episodes']:,} new episodes on the target "
                "(each adapter alone on Step 1's analysis tasks; the base agent's are Step 1's own), part of TRACE's "
                "training. " if parts["router_sft"]["new_episodes"] else
                "Router SFT plays no new episode (its data are successful rollouts of Step 1 and Step 3, counted "
                "there). ")
             + "A LoRA's method is Step 1, its own calibration and its run; TRACE's "
             "and the single-adapter baseline's include every calibration (they train what calibration found "
             "trainable). "
             f"Not counted: {accounting['not_counted']}.", "",
             "| model | training episodes | all episodes (any environment) | on the target | made of | budget |",
             "|---|---|---|---|---|---|"]
    for model in shown:
        row = accounting["models"].get(model)
        if row:
            lines.append(f"| {model} | {row['training']:,} | {row['all']:,} | {row['target']:,} | "
                         f"{_parts_text(row['parts'])} | {row['budget']} |")
    return lines + [""]
