"""The CPU demo's report: runs/demo/report.md, results.json and the plots beside them.

Numbers come only from the steps' own `step.json` figures; a step that did not run has no row. One exception,
for run folders whose final step predates them: the routing shares per request kind (`routing.by_kind`, which
the final step records) are measured when missing by the `measure_routing` function the caller passes
(`demo.run.write_report` passes `demo.loop.routing_by_kind`: one forward pass per
conversation, seconds on the demo's model); this module itself never runs a model.

The sections live beside it: report_accounting (every rollout counted), report_paired (paired differences and
the sizing), report_efficiency (sample efficiency, the paper's claim, repeats), report_plots (every plot),
report_text (the cells they share).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from demo.trainable import not_trained_because
from pipeline.recalibrate import classes_text, measurement_text, mistakes_text
from demo.report_text import MODE_TITLES, fmt_cell
from demo.report_plots import plot_pass_vs_rollouts, plot_sft_curve, plot_training_curves
from demo.report_accounting import BASELINE_LABELS, accounting_section, episode_accounting
from demo.report_paired import paired_section
from demo.report_efficiency import direct_settings_section, efficiency_section, repeats_section


def settings_text(settings: dict[str, Any] | None) -> str:
    """Config settings as `name=value, ...` ('-' when none), e.g. `n_distractor_items=0, min_payment_methods=2`."""
    # The storefront surface a game draws from is the evaluation's (the report gives it once), not a setting.
    return ", ".join(f"{k}={v!r}" for k, v in (settings or {}).items() if k != "storefront") or "-"


def difficulty_text(environment: dict[str, Any]) -> str:
    """The knob settings calibration chose ('-' when none)."""
    settings = environment.get("settings")
    if settings is None and environment.get("knob"):  # an environments.json written before knobs moved in turn
        settings = {environment["knob"]: environment.get("value")}
    return settings_text(settings)


def probe_label(probe: dict[str, Any], knob: str | None = None) -> str:
    """`knob=value` of one calibration probe (`knob`: the environment's, for a probe that does not name one)."""
    return f"{probe.get('knob') or knob or '?'}={probe.get('value')!r}"


def environment_lines(capability: str, environment: dict[str, Any], skipped: str | None) -> list[str]:
    """Step 2's progress lines for one capability: its status, the figures at the kept settings, why it is not
    trained (if not), then one line per probed value (spread: the estimated share of GRPO groups whose
    rewards differ, which decides whether it is trained)."""
    line = f"  {capability}: {environment['status']}"
    if environment.get("settings"):
        size = environment.get("group_size")
        line += (f" ({difficulty_text(environment)}: {measurement_text(environment)}"
                 + (f" of groups of {size}" if size else "") + ")")
    if environment.get("detail"):
        line += f" — {environment['detail']}"
    if skipped:
        line += f" — not trained: {skipped}"
    return [line] + [f"    probe {probe_label(p, environment.get('knob'))}: {measurement_text(p)}"
                     for p in environment.get("history") or []]


def results_rows(evaluate: dict[str, Any], summarize: Callable[[dict[str, Any], str], dict[str, Any]]
                 ) -> dict[str, dict[str, Any]]:
    """{model: {"greedy": table, "sampled": table}} with table = {group: {"pass^k": {mean, std}}}."""
    return {model: {mode: summarize(runs, mode) for mode in ("greedy", "sampled")} for model, runs in evaluate.items()}


def render_report(run_dir: Path, records: dict[str, dict[str, Any]], config: Any,
                  summarize: Callable[[dict[str, Any], str], dict[str, Any]], profile: str,
                  measure_routing: Callable[..., dict[str, Any]] | None = None,
                  repeats: dict[int, dict[str, dict[str, Any]]] | None = None) -> tuple[str, dict[str, Any], str]:
    """(report markdown, results.json object, the table printed at the end). `measure_routing`: see
    `routing_section` (None: a run whose final step did not record the routing shares shows none). `repeats`:
    {training seed: that repeat's records} of the repeats after the first (`repeats_section`)."""
    lines = ["# TRACE CPU demo report", "",
             f"Profile `{profile}`; device {records.get('base', {}).get('device', '?')}. Every number below was "
             "measured by this run; steps that did not run have no numbers.", ""]
    results: dict[str, Any] = {"profile": profile, "config": dataclasses.asdict(config), "steps": {}}
    for name, record in records.items():
        results["steps"][name] = {"seconds": record["seconds"], "device": record["device"]}

    base = records.get("base", {}).get("figures", {})
    if base:
        s = config.base
        lines += ["## Base agent", "",
                  f"{base['parameters']:,}-parameter tiny model, SFT on {base['demonstrations']:,} storefront "
                  f"demonstrations (planted: {', '.join(f'{k} {v:.0%}' for k, v in s.planted.items()) or 'nothing'}; "
                  f"{base['demonstrations_failing_by_plant']:,} demonstrations fail their task because of a plant), "
                  f"{base['steps']} steps, {base['tokens_per_s']:.0f} tokens/s, final loss {base['final_loss']:.3f}, "
                  f"token accuracy {base['final_token_accuracy']:.3f}.", ""]
        openings = base.get("openings")
        if openings:
            lines[-1:] = [f"Before it, a curriculum stage on {openings['chats']:,} expert openings (cut after the "
                          f"first order look-up): {openings['steps']} steps in {openings['seconds'] / 60:.1f} min, "
                          f"final loss {openings['final_loss']:.3f}.", ""]
        drills = base.get("copy_drills")
        if drills:
            lines[-1:] = [f"First of all, {drills['chats']:,} copy drills (repeat a random token string; "
                          f"`train/copy_drill.py`): {drills['steps']} steps in {drills['seconds'] / 60:.1f} min, final "
                          f"loss {drills['final_loss']:.3f}, token accuracy {drills['final_token_accuracy']:.3f}.", ""]
        late = [f"{what} ({base[stage]['chats']:,} chats: {base[stage]['steps']} steps in "
                f"{base[stage]['seconds'] / 60:.1f} min, final loss {base[stage]['final_loss']:.3f})"
                for stage, what in (("selection", "return and exchange demonstrations cut through their write"),
                                    ("refresh", "fresh whole demonstrations")) if base.get(stage)]
        if late:
            lines[-1:] = [f"After it, at lr {s.late_lr:g}: {'; then '.join(late)}.", ""]
        shipped = base.get("shipped")
        if shipped:  # the SFT figures above are the build's, not this run's
            built = shipped["built"]
            lines[-1:] = [f"This run used the **shipped** base agent (`assets/demo_base_agent`, weights sha256 "
                          f"`{shipped['weights_sha256'][:16]}…`), built {built['date']} at commit {built['commit']} on "
                          f"{built['machine']} (torch {built['torch']}): the SFT figures above are that build's. "
                          f"Build it here instead: `{shipped['rebuild']}`.", ""]
        curve = plot_sft_curve(base.get("log") or [], run_dir / "sft_curve.png")
        if curve:
            lines += ["![SFT curve](sft_curve.png)", ""]

    table_text = ""
    evaluate = {**records.get("evaluate", {}).get("figures", {}),
                **records.get("final", {}).get("figures", {}).get("models", {}),
                **records.get("efficiency", {}).get("figures", {}).get("models", {})}
    if evaluate:
        rows = results_rows(evaluate, summarize)
        results["evaluation"] = rows
        e = config.evaluate
        k = e.samples
        header = (f"| model | request kind | tasks | greedy pass^1 | T={e.temperature:g} pass^1 | "
                  f"T={e.temperature:g} pass^{k} |")
        lines += ["## Results on held-out storefront tasks", "",
                  f"{e.tasks} tasks per evaluation seed, seeds {e.seeds}; mean ± std over seeds. pass^k: the chance "
                  f"that {k} samples of a task all pass (τ²-bench's pass^k over samples).", "", header,
                  "|---|---|---|---|---|---|"]
        width = max(len(m) for m in rows) + 2
        plain = [f"{'model':{width}s} {'greedy pass^1':>16s} {f'T={e.temperature:g} pass^1':>16s} "
                 f"{f'T={e.temperature:g} pass^{k}':>16s}"]
        for model, modes in rows.items():
            groups = sorted(g for g in modes["sampled"] if g != "all") + ["all"]
            for group in groups:
                greedy = modes["greedy"].get(group, {})
                sampled = modes["sampled"].get(group, {})
                cells = (fmt_cell(greedy.get("pass^1")), fmt_cell(sampled.get("pass^1")), fmt_cell(sampled.get(f"pass^{k}")))
                lines.append(f"| {model} | {group} | {sampled.get('n_tasks', 0)} | " + " | ".join(cells) + " |")
                if group == "all":
                    plain.append(f"{model:{width}s} " + " ".join(f"{c:>16s}" for c in cells))
        kinds = sorted({g for modes in rows.values() for g in modes["sampled"] if g != "all"})
        plain += ["", f"T={e.temperature:g} pass^1 per request kind (mean over seeds):",
                  f"{'kind':22s}" + "".join(f" {m[:14]:>14s}" for m in rows)]
        for kind in kinds:
            cells = [rows[m]["sampled"].get(kind, {}).get("pass^1") for m in rows]
            plain.append(f"{kind:22s}" + "".join(f" {'-' if c is None else format(c['mean'], '.3f'):>14s}"
                                                 for c in cells))
        lines.append("")
        paired_lines, results["paired"], paired_plain = paired_section(run_dir, evaluate, config)
        accounting = episode_accounting(records, config)
        results["episodes"] = accounting
        lines += paired_lines + accounting_section(accounting, list(rows))
        plain += paired_plain + ["", "episodes (training / all / on the target):"] + [
            f"  {model}: {row['training']:,} / {row['all']:,} / {row['target']:,}"
            for model, row in accounting["models"].items() if model in rows]
        settings_lines, direct_settings, settings_plain = direct_settings_section(run_dir, records, evaluate, config,
                                                                                  summarize)
        if direct_settings:
            results["direct_settings"] = direct_settings
        lines += settings_lines
        plain += settings_plain
        efficiency_lines, efficiency, efficiency_plain = efficiency_section(run_dir, records, evaluate, accounting,
                                                                            config, summarize)
        if efficiency:
            results["efficiency"] = efficiency
        lines += efficiency_lines
        plain += efficiency_plain
        repeat_lines, repeat_results, repeat_plain = repeats_section(records, repeats or {}, config, summarize)
        if repeat_results:
            results["repeats"] = repeat_results
        lines += repeat_lines
        plain += repeat_plain
        table_text = "\n".join(plain)

    select = records.get("select", {}).get("figures", {})
    if select:
        results["selection"] = {k: v for k, v in select.items() if k != "table"}
        pr = lambda v: "undefined" if v is None else f"{v:.2f}"  # noqa: E731
        lines += ["## Step 1: capability selection", "",
                  f"{select['trajectories']} analysis trajectories ({select['failed']} failed); candidates "
                  f"{', '.join(select['candidates'])}; planted {', '.join(select['planted_capabilities']) or 'none'}.",
                  "", "```", select.get("table") or select.get("why_empty", ""), "```", "",
                  f"Selected: {', '.join(select['selected']) or 'nothing'}. Precision {pr(select['precision'])}, "
                  f"recall {pr(select['recall'])} against the planted deficits.", ""]
        table_text += (f"\n\nStep 1 selected: {', '.join(select['selected']) or 'nothing'} "
                       f"(planted: {', '.join(select['planted_capabilities'])}; precision {pr(select['precision'])}, "
                       f"recall {pr(select['recall'])})")

    lines += _loop_sections(run_dir, records, config, results, summarize, measure_routing)
    lines += ["## Time per step", "", "| step | seconds | device |", "|---|---|---|"]
    lines += [f"| {name} | {r['seconds']:.0f} | {r['device']} |" for name, r in records.items()]
    for seed, repeat in (repeats or {}).items():  # the steps each repeat ran itself (the shared ones are above)
        lines += [f"| {name} (training seed {seed}) | {r['seconds']:.0f} | {r['device']} |"
                  for name, r in repeat.items() if r is not records.get(name)]
    lines.append("")
    return "\n".join(lines), results, table_text


def _loop_sections(run_dir: Path, records: dict[str, dict[str, Any]], config: Any, results: dict[str, Any],
                   summarize: Callable[[dict[str, Any], str], dict[str, Any]],
                   measure_routing: Callable[..., dict[str, Any]] | None = None) -> list[str]:
    lines: list[str] = []
    envs = records.get("environments", {}).get("figures", {}).get("capabilities")
    if envs is not None:
        results["environments"] = envs
        lines += ["## Step 2: environments", ""]
        forced = bool(records["environments"]["figures"].get("forced"))
        if forced:
            lines += ["**The capabilities below were set in the config (`loop.capabilities`), not selected by Step 1.**",
                      ""]
        if not envs:
            lines += ["Nothing was selected in Step 1, so no environment was built.", ""]
        else:
            lines += _environment_tables(envs, config, forced)
    loop = config.loop
    per_iteration = loop.groups_per_iteration * loop.group_size
    curves = {f"LoRA {c}": run["curve"] for c, run in records.get("train", {}).get("figures", {}).get("adapters", {}).items()}
    gate = records.get("gate", {}).get("figures", {})
    if gate.get("curve"):
        curves["TRACE gate"] = gate["curve"]
    baselines = records.get("baselines", {}).get("figures", {})
    for name, label in BASELINE_LABELS.items():
        if baselines.get(name):
            curves[label] = baselines[name]["curve"]
    if curves:
        results["training_curves"] = curves
        png = plot_training_curves(curves, per_iteration, run_dir / "training_curves.png")
        direct_pool = (baselines.get("direct") or {}).get("tasks", {}).get("pool")
        setting = (f" Direct GRPO trains on a fixed pool of {direct_pool} target tasks "
                   f"({baselines['direct']['tasks'].get('passes') or 0:.2f} passes; `loop.direct_fresh` is false: its run "
                   "on fresh tasks is a row of `make demo-full`)." if direct_pool else "")
        lines += ["## Steps 3-4 and baselines: training", "",
                  f"Every run: {loop.groups_per_iteration} groups × {loop.group_size} episodes per iteration, "
                  f"lr {loop.learning_rate:g}. Baselines get the episodes TRACE's Steps 3-4 used "
                  f"({baselines.get('budget_episodes', '-')}).{setting}", ""]
        if png:
            lines += ["![training curves](training_curves.png)", ""]
    lines += _own_game_section(run_dir, records, config, results, summarize)
    final = records.get("final", {}).get("figures", {}).get("models", {})
    base_runs = records.get("evaluate", {}).get("figures", {}).get("base")
    if final and base_runs:
        budget = baselines.get("budget_episodes", 0)
        efficiency = records.get("efficiency", {}).get("figures", {})
        checkpoints = {**(efficiency.get("checkpoints") or {}), **(efficiency.get("trace_checkpoints") or {})}
        points = {}
        for label, runs in {"base": base_runs, **final, **(efficiency.get("models") or {})}.items():
            episodes = (0 if label == "base" else checkpoints[label]["episodes"] if label in checkpoints else
                        budget if label in ("TRACE", *BASELINE_LABELS.values())
                        else records["train"]["figures"]["adapters"][label.split(":", 1)[1]]["episodes"])
            cells = {}
            for mode in MODE_TITLES:
                row = summarize(runs, mode).get("all", {}).get("pass^1")
                if row:
                    cells[mode] = (row["mean"], row["std"])
            if cells:
                points[label] = (episodes, cells)
        png = plot_pass_vs_rollouts(points, run_dir / "pass_vs_rollouts.png", f"T={config.evaluate.temperature:g}")
        if png:
            lines += ["![pass rate against rollouts](pass_vs_rollouts.png)", ""]
    return lines + routing_section(run_dir, records, results, measure_routing)


def routing_section(run_dir: Path, records: dict[str, dict[str, Any]], results: dict[str, Any],
                    measure: Callable[..., dict[str, Any]] | None = None) -> list[str]:
    """The gate: what router SFT trained it on (rollouts per label), how often it picks each slot per request
    kind on the target (TRACE's evaluation conversations), and one conversation's routing (plot_routing).

    `measure` (e.g. `demo.loop.routing_by_kind`) re-scores TRACE's saved evaluation conversations when
    the final step did not record `routing.by_kind`; without it such a run shows no shares. Sets
    results["routing"]."""
    gate = records.get("gate", {}).get("figures", {})
    final = records.get("final", {}).get("figures", {})
    routing = dict(final.get("routing") or {})
    out: dict[str, Any] = {}
    lines: list[str] = []
    if gate.get("sft_data") is not None:
        out["sft_data"] = gate["sft_data"]
        out["sft_hinted_left_out"] = gate.get("sft_hinted_left_out", {})
        counts = ", ".join(f"{label} {n}" for label, n in gate["sft_data"].items())
        hinted = sum(gate.get("sft_hinted_left_out", {}).values())
        targets = gate.get("routing_targets")
        if targets:
            out["routing_targets"] = targets
            source = ("Reward targets (train/routing_targets.py, `sft.objective: reward`): the base agent and each "
                      f"adapter alone played Step 1's first {targets['tasks']} analysis tasks (not the evaluation's), "
                      "and each slot's gate logit is fitted to that slot's mean reward on the task, at every position "
                      "that decides an assistant token (the one before it) of every conversation played there. Per "
                      "slot, mean reward and the tasks where it is "
                      "best (alone): " + ", ".join(
                          f"{slot} {v['mean_reward']:.3f}, {v['best_tasks']} ({v['best_alone']})"
                          for slot, v in targets["slots"].items())
                      + f"; no slot solved {targets['unsolved']}. ")
        else:
            source = ("\"base\": the base agent's own successful conversations on the target from Step 1's analysis "
                      "tasks (not the evaluation's); each capability: its GRPO run's. ")
        lines += [(f"Router SFT data, conversations per slot: {counts}. " if targets else
                   f"Router SFT data, successful rollouts per label: {counts}. ") + source
                  + ("Labels weighted equally (class-weighted cross-entropy)" if gate.get("sft_balance_labels")
                     else "No label balancing" if targets else "Labels weighted by their token counts (no balancing)")
                  + (f"; {hinted} successful hinted rollouts left out (their system prompt holds the game's hint, a "
                     "cue the target never shows)." if hinted else "."), ""]
    if measure is not None and "by_kind" not in routing and gate.get("gate") and "TRACE" in final.get("models", {}):
        paths = [run_dir / run["path"] for run in final["models"]["TRACE"].values()]
        routing["by_kind"] = measure(run_dir / "base" / "model", Path(gate["gate"]), paths)
    by_kind = routing.get("by_kind")
    if by_kind:
        out["by_kind"] = by_kind
        slots = by_kind["slots"]
        lines += [f"Routing on the target per request kind: share of assistant tokens × layers sent to each slot (a "
                  "token's slot: the one chosen at the position before it, whose pass produced it), "
                  f"over up to {by_kind['per_kind']} conversations per kind drawn from TRACE's "
                  f"{len(by_kind['sources'])} evaluation results files (greedy and sampled, every evaluation seed), "
                  "each re-scored in one forward pass. A share is not a pass rate: set it beside the per-kind pass "
                  "rates above.", "",
                  "| request kind | conversations | decisions | " + " | ".join(slots) + " |",
                  "|---|---|---|" + "---|" * len(slots)]
        for kind, row in by_kind["kinds"].items():
            lines.append(f"| {kind} | {row['conversations']} | {row['decisions']:,} | "
                         + " | ".join(f"{row['shares'][slot]:.0%}" for slot in slots) + " |")
        lines.append("")
    if routing.get("png"):
        out.update(caption=routing["caption"], png=routing["png"])
        lines += ["One greedy evaluation conversation, token by token: " + routing["caption"], "",
                  f"![routing]({routing['png']})", ""]
    if not lines:
        return []
    results["routing"] = out
    return ["## Routing", "", *lines]


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _environment_tables(envs: dict[str, dict[str, Any]], config: Any, forced: bool) -> list[str]:
    """Step 2: one row per capability (figures at the kept settings), then every probed value's figures."""

    loop = config.loop
    lines = ["| capability | game | validated | difficulty | base success | mean reward | groups with spread | "
             "status | trained |", "|---|---|---|---|---|---|---|---|---|"]
    probes = []
    for capability, e in envs.items():
        skipped = not_trained_because(e, loop.group_size, forced=forced)
        lines.append(f"| {capability} | {e.get('game', '-')} | {e.get('validated', '-')} | {difficulty_text(e)} | "
                     f"{_figure(e.get('success_rate'))} | {_figure(e.get('mean_reward'))} | "
                     f"{_figure(e.get('spread_share'))} | {e['status']} | {'no: ' + skipped if skipped else 'yes'} |")
        probes += [f"| {capability} | {probe_label(p, e.get('knob'))} | {_figure(p.get('success_rate'))} | "
                   f"{_figure(p.get('mean_reward'))} | {_figure(p.get('spread_share'))} | {classes_text(p) or '-'} | "
                   f"{mistakes_text(p) or '-'} |"
                   for p in e.get("history") or []]
    lines += ["", f"Band: the base agent's full-success rate in [{loop.band[0]:g}, {loop.band[1]:g}] (T=1, "
              f"{loop.calibration_tasks} tasks x {loop.calibration_samples} samples per value). Knobs move in the "
              "game's declared order; one that cannot reach the band stays at its nearest value while the next moves. "
              "A game is trained only where some value reached the band; otherwise it is *not trainable with this "
              "agent* and its row gives the base agent's first mistakes at the settings kept, counted over at least 30 failed "
              "episodes (calibration's mistake census plays more fresh tasks there until that many failed, at most 4 "
              "more rounds; `(never shown)` marks a written value the agent was never shown: invented, not copied). "
              f"Groups with spread: the estimated share of GRPO groups of {loop.group_size} episodes of one task whose "
              f"rewards differ (`pipeline.calibrate_environment.estimate_reward_spread`). Capabilities the config sets "
              "(`loop.capabilities`) are trained whatever calibration found.", ""]
    if probes:
        lines += ["Every value calibration tried (classes: the share of each decision class and the base agent's "
                  "success on it; first mistakes: counted over the failed episodes):", "",
                  "| capability | probe | success | mean reward | groups with spread | classes (share, success) | "
                  "first mistakes |", "|---|---|---|---|---|---|---|", *probes, ""]
    return lines


def _runs_mean_reward(run_dir: Path, runs: dict[str, Any], mode: str) -> float | None:
    """Mean episode reward over a model's runs in one mode (runs recorded before the figure existed are read
    from their results files)."""
    from benchmarks.results import load_results
    from benchmarks.results import mean_reward

    values = [run["mean_reward"] if "mean_reward" in run else
              mean_reward(load_results(run_dir / run["path"])["simulations"])
              for key, run in runs.items() if key.endswith("/" + mode)]
    return sum(values) / len(values) if values else None


def _own_game_section(run_dir: Path, records: dict[str, dict[str, Any]], config: Any, results: dict[str, Any],
                      summarize: Callable[[dict[str, Any], str], dict[str, Any]]) -> list[str]:
    """Each adapter against the base agent on the adapter's own game (the own_game step): pass^1 and the mean
    episode reward, which moves where pass^1 (every request of an episode right) stays at 0."""
    own = records.get("own_game", {}).get("figures")
    if not own:
        return []
    g, temperature = config.own_game, config.evaluate.temperature
    table = {capability: {"game": run["game"], "game_overrides": run["game_overrides"],
                          **{label: {mode: summarize(run[label], mode).get("all", {}).get("pass^1", {}).get("mean")
                                     for mode in MODE_TITLES} for label in ("base", "lora")},
                          "mean_reward": {label: {mode: _runs_mean_reward(run_dir, run[label], mode)
                                                  for mode in MODE_TITLES} for label in ("base", "lora")}}
             for capability, run in own.items()}
    results["own_game"] = table

    def arrow(row: dict[str, Any], mode: str) -> str:
        return " → ".join("-" if row[label][mode] is None else f"{row[label][mode]:.3f}" for label in ("base", "lora"))

    lines = ["## Each adapter on its own game", "",
             f"{g.tasks} held-out tasks (seed {g.seed}) of each capability's game, at the settings calibration chose; "
             f"pass^1 greedy and at T={temperature:g} (mean over {g.samples} samples), and the mean episode reward "
             "(partial credit: it can move where pass^1, a full success, does not). An adapter has to learn its skill here before anything can transfer to the target.", "",
             f"| capability | game overrides | pass^1 greedy: base → LoRA | pass^1 T={temperature:g}: base → LoRA | "
             f"mean reward greedy: base → LoRA | mean reward T={temperature:g}: base → LoRA |",
             "|---|---|---|---|---|---|"]
    for capability, row in table.items():
        lines.append(f"| {capability} | {settings_text(row['game_overrides'])} | {arrow(row, 'greedy')} | "
                     f"{arrow(row, 'sampled')} | {arrow(row['mean_reward'], 'greedy')} | "
                     f"{arrow(row['mean_reward'], 'sampled')} |")
    return lines + [""]


