"""The CPU demo's report: runs/demo/report.md, results.json and the plots beside them.

Numbers come only from the steps' own `step.json` figures; a step that did not run has no row. One exception,
for run folders whose final step predates them: the routing shares per request kind (`routing.by_kind`, which
the final step records) are measured when missing by the `measure_routing` function the caller passes
(`demo.run.write_report` passes `demo.loop.routing_by_kind`: one forward pass per
conversation, seconds on the demo's model); this module itself never runs a model.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from demo.plotting import pyplot, save_figure
from demo.trainable import mistakes_text, not_trained_because
from pipeline.recalibrate import measurement_text




def _fmt(cell: dict[str, float] | None) -> str:
    return "-" if cell is None else f"{cell['mean']:.3f} ± {cell['std']:.3f}"


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


def plot_sft_curve(log: list[dict[str, Any]], path: Path) -> Path | None:
    """Loss and token accuracy of the base agent's SFT against training time (PNG)."""
    if not log:
        return None
    plt = pyplot()
    figure, loss_axis = plt.subplots(figsize=(7, 3.5))
    minutes = [row["seconds"] / 60 for row in log]
    losses = [row["loss"] for row in log]
    # Each logged loss is one batch's: the raw line is noisy, so a running mean over 9 log rows is drawn on top.
    window = 9
    smoothed = [sum(losses[max(0, i - window + 1): i + 1]) / (i + 1 - max(0, i - window + 1))
                for i in range(len(losses))]
    loss_axis.plot(minutes, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="loss, one batch")
    loss_axis.plot(minutes, smoothed, color="tab:blue", label=f"loss, mean of {window} logged batches")
    loss_axis.set_xlabel("SFT time (minutes)")
    loss_axis.set_ylabel("loss", color="tab:blue")
    loss_axis.set_yscale("log")
    accuracy_axis = loss_axis.twinx()
    accuracy_axis.plot(minutes, [row["token_accuracy"] for row in log], color="tab:orange", label="token accuracy")
    accuracy_axis.set_ylabel("token accuracy", color="tab:orange")
    accuracy_axis.set_ylim(0, 1)
    loss_axis.legend(fontsize=7, loc="lower left")
    loss_axis.set_title("Base agent: supervised fine-tuning on storefront demonstrations")
    return save_figure(figure, path)


def curve_episodes(curve: list[dict[str, Any]], episodes_per_iteration: int) -> list[int]:
    """Episodes used by the end of each logged iteration (metrics count iterations from 1)."""
    return [row["iteration"] * episodes_per_iteration for row in curve]


def plot_training_curves(curves: dict[str, list[dict[str, Any]]], episodes_per_iteration: int, path: Path
                         ) -> Path | None:
    """Success rate on each run's own training game against the episodes it used (PNG)."""
    curves = {name: curve for name, curve in curves.items() if curve}
    if not curves:
        return None
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 3.8))
    for name, curve in curves.items():
        axis.plot(curve_episodes(curve, episodes_per_iteration),
                  [row["success_rate"] for row in curve], marker="o", markersize=3, label=name)
    axis.set_xlabel("episodes (rollouts) used")
    axis.set_ylabel("success rate on its training game")
    axis.set_ylim(-0.02, 1.02)
    axis.legend(fontsize=7)
    axis.set_title("GRPO runs: success rate of the training episodes")
    return save_figure(figure, path)


MODE_TITLES = {"greedy": "greedy", "sampled": "temperature 1"}


def plot_pass_vs_rollouts(points: dict[str, tuple[int, dict[str, tuple[float, float]]]], path: Path
                          ) -> Path | None:
    """Held-out storefront pass^1 (mean ± std over seeds) against rollouts used, one panel per decoding mode
    (PNG). `points`: {model: (episodes, {mode: (mean, std)})}. Models that used the same number of episodes
    (TRACE and the baselines) are drawn side by side around it, each with its mean written next to it."""
    if len(points) < 2:
        return None
    plt = pyplot()
    modes = [m for m in MODE_TITLES if any(m in cells for _, cells in points.values())]
    figure, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.0), sharey=True, squeeze=False)
    colors = {name: f"C{i}" for i, name in enumerate(points)}
    at_x: dict[int, list[str]] = {}
    for name, (episodes, _) in points.items():
        at_x.setdefault(episodes, []).append(name)
    spread = 0.045 * max(max(at_x), 1)
    for axis, mode in zip(axes[0], modes):
        for episodes, names in at_x.items():
            for i, name in enumerate(names):
                cell = points[name][1].get(mode)
                if cell is None:
                    continue
                x = episodes + (i - (len(names) - 1) / 2) * spread
                axis.errorbar([x], [cell[0]], yerr=[cell[1]], fmt="o", capsize=3, color=colors[name], label=name)
                axis.annotate(f"{cell[0]:.2f}", (x, cell[0]), textcoords="offset points", xytext=(4, 4), fontsize=6)
        axis.set_xlabel("training episodes (rollouts) used after SFT")
        axis.set_title(f"pass^1, {MODE_TITLES[mode]}")
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out storefront pass^1")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    figure.suptitle("Held-out storefront tasks against rollouts used (mean ± std over evaluation seeds)")
    return save_figure(figure, path)


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
                cells = (_fmt(greedy.get("pass^1")), _fmt(sampled.get("pass^1")), _fmt(sampled.get(f"pass^{k}")))
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
        png = plot_pass_vs_rollouts(points, run_dir / "pass_vs_rollouts.png")
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
        lines += [f"Router SFT data, successful rollouts per label: {counts}. \"base\": the base agent's own "
                  "successful conversations on the target from Step 1's analysis tasks (not the evaluation's); each "
                  "capability: its GRPO run's. "
                  + ("Labels weighted equally (class-weighted cross-entropy)" if gate.get("sft_balance_labels")
                     else "Labels weighted by their token counts (no balancing)")
                  + (f"; {hinted} successful hinted rollouts left out (their system prompt holds the game's hint, a "
                     "cue the target never shows)." if hinted else "."), ""]
    if measure is not None and "by_kind" not in routing and gate.get("gate") and "TRACE" in final.get("models", {}):
        paths = [run_dir / run["path"] for run in final["models"]["TRACE"].values()]
        routing["by_kind"] = measure(run_dir / "base" / "model", Path(gate["gate"]), paths)
    by_kind = routing.get("by_kind")
    if by_kind:
        out["by_kind"] = by_kind
        slots = by_kind["slots"]
        lines += [f"Routing on the target per request kind: share of assistant tokens × layers sent to each slot, "
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


def _classes_text(probe: dict[str, Any]) -> str:
    """'act 0.50 (0.31), refuse 0.50 (0.12)': each decision class's share and the base agent's success on it."""
    shares = probe.get("class_shares") or {}
    success = probe.get("success_by_class") or {}
    return ", ".join(f"{name} {share:.2f} ({success.get(name, 0.0):.2f})" for name, share in shares.items()) or "-"


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
                   f"{_figure(p.get('mean_reward'))} | {_figure(p.get('spread_share'))} | {_classes_text(p)} | "
                   f"{mistakes_text(p) or '-'} |"
                   for p in e.get("history") or []]
    lines += ["", f"Band: the base agent's full-success rate in [{loop.band[0]:g}, {loop.band[1]:g}] (T=1, "
              f"{loop.calibration_tasks} tasks x {loop.calibration_samples} samples per value). Knobs move in the "
              "game's declared order; one that cannot reach the band stays at its nearest value while the next moves. "
              "A game is trained only where some value reached the band; otherwise it is *not trainable with this "
              "agent* and its row gives the base agent's first mistakes in the failed episodes. "
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


# ---- every rollout counted ------------------------------------------------------------------------------------

# The baselines step's runs and their model labels: direct GRPO on fresh target tasks and on a fixed pool of them,
# and one adapter on the selected games mixed.
BASELINE_LABELS = {"direct": "direct GRPO", "direct_pool": "direct GRPO (task pool)", "mixed": "single-adapter GRPO"}


def _step_settings(records: dict[str, dict[str, Any]], step: str, section: Any) -> dict[str, Any]:
    """The settings a step ran with (its step.json), falling back to the config's section."""
    return records.get(step, {}).get("settings") or dataclasses.asdict(section)


def calibration_episodes(environment: dict[str, Any], tasks: int, samples: int) -> tuple[int, int]:
    """(probes, episodes) Step 2's calibration played for one capability: one probe per knob value tried
    (`history`; a record without one that holds a measurement made one probe), each `tasks` × `samples`
    episodes of the base agent on the capability's game. Validation plays scripted policies, not the model."""
    probes = len(environment.get("history") or []) or (1 if environment.get("success_rate") is not None else 0)
    return probes, probes * tasks * samples


def episode_accounting(records: dict[str, dict[str, Any]], config: Any) -> dict[str, Any]:
    """Every episode each model's method played, by part, from the steps' records.

    Parts: Step 1's analysis episodes (the base agent on the target, `select.tasks` × `select.samples`), Step 2's
    calibration probes (`calibration_episodes` per capability), router SFT (no new episode: its data are
    successful rollouts of Step 1 and Step 3, counted there), Step 3's adapters, Step 4's gate GRPO, and the
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
    calibration = {c: dict(zip(("probes", "episodes"), calibration_episodes(
        e, loop["calibration_tasks"], loop["calibration_samples"]))) for c, e in envs.items()}
    calibration_total = sum(c["episodes"] for c in calibration.values())
    trained = records.get("train", {}).get("figures", {}).get("adapters", {})
    adapters = {c: run["episodes"] for c, run in trained.items()}
    gate = records.get("gate", {}).get("figures", {})
    baselines = records.get("baselines", {}).get("figures", {})
    trace_training = sum(adapters.values()) + gate.get("episodes", 0)
    trace_parts = {"step1_analysis": analysis, "calibration": calibration_total, "router_sft_new": 0,
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
        models["TRACE"] = {"training": trace_training, "all": trace_all, "target": analysis, "parts": trace_parts,
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
                      "router_sft": {"new_episodes": 0, "data": gate.get("sft_data"),
                                     "note": "successful rollouts of Step 1 and Step 3, already counted there"},
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
    parts = {"step1_analysis": analysis, "calibration": calibration, "router_sft_new": 0,
             **{f"adapter:{c}": n for c, n in checkpoint["adapter_episodes"].items()},
             "gate_grpo": checkpoint["gate_episodes"]}
    return {"training": checkpoint["episodes"], "all": analysis + calibration + checkpoint["episodes"],
            "target": analysis, "parts": parts,
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
                          for c, v in parts["calibration"]["per_capability"].items()) or "none")
             + "), on the capability games. Router SFT plays no new episode (its data are successful rollouts of "
             "Step 1 and Step 3, counted there). A LoRA's method is Step 1, its own calibration and its run; TRACE's "
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


# ---- paired statistics ----------------------------------------------------------------------------------------

POWER_Z = 0.8416  # the normal quantile for 80% power


def evaluation_scores(run_dir: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """{mode: {"scores": {seed: {task_id: pass^1}}, "played": {(seed, task_id, sample_idx), ...}}} of one model's
    evaluation runs (keys "seed/mode", each with its results file's `path` under run_dir)."""
    from benchmarks.results import load_results
    from demo.paired_stats import task_scores

    out: dict[str, Any] = {}
    for key, run in runs.items():
        seed, mode = key.split("/", 1)
        simulations = load_results(run_dir / run["path"])["simulations"]
        entry = out.setdefault(mode, {"scores": {}, "played": set()})
        entry["scores"][seed] = task_scores(simulations)
        entry["played"] |= {(seed, str(s["task_id"]), s.get("sample_idx", s.get("trial"))) for s in simulations}
    return out


def _ci(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    text = f"{cell['difference']:+.3f} [{cell['low']:+.3f}, {cell['high']:+.3f}]"
    counts = f" ({cell['better']}↑ {cell['worse']}↓)" if "better" in cell else ""
    return (f"**{text}**" if cell["excludes_zero"] else text) + counts


def paired_section(run_dir: Path, evaluate: dict[str, dict[str, Any]], config: Any, resamples: int | None = None
                   ) -> tuple[list[str], dict[str, Any], list[str]]:
    """Each model's pass^1 difference against the base agent and against TRACE, greedy and at the evaluation
    temperature, with paired bootstrap 95% intervals over (seed, task) pairs stratified by seed
    (`demo.paired_stats`), and the evaluation size an 8-point difference needs. Returns (report lines,
    results["paired"], printed lines)."""
    from demo import paired_stats as ps

    resamples = resamples or ps.DEFAULT_RESAMPLES
    if "base" not in evaluate:
        return [], {}, []
    e = config.evaluate
    scores = {model: evaluation_scores(run_dir, runs) for model, runs in evaluate.items()}
    modes = [m for m in MODE_TITLES if m in scores["base"]]
    same = {model: all(s.get(m, {}).get("played") == scores["base"][m]["played"] for m in modes)
            for model, s in scores.items()}
    references = ["base"] + (["TRACE"] if "TRACE" in scores else [])
    comparisons: dict[str, dict[str, dict[str, Any]]] = {}
    for model in scores:
        for reference in references:
            if model == reference or (model == "base" and reference == "TRACE"):  # the negative of TRACE vs base
                continue
            comparisons.setdefault(model, {})[reference] = {
                mode: ps.paired_difference(scores[model][mode]["scores"], scores[reference][mode]["scores"],
                                           resamples=resamples)
                for mode in modes if mode in scores[model]}
    base_scores = {mode: scores["base"][mode]["scores"] for mode in modes}
    base_intervals = {mode: ps.mean_interval(base_scores[mode], resamples=resamples) for mode in modes}
    own = (ps.paired_difference(base_scores["greedy"], base_scores["sampled"], resamples=resamples)
           if len(modes) == 2 else None)
    temperature = f"T={e.temperature:g}"
    results: dict[str, Any] = {
        "method": "percentile bootstrap over (seed, task) pairs, stratified by evaluation seed (tasks resampled with "
                  "replacement within each seed, the same draw for both models); per task its pass^1, the mean over "
                  "its samples; demo/paired_stats.py",
        "resamples": resamples, "rng_seed": ps.DEFAULT_SEED, "confidence": ps.DEFAULT_CONFIDENCE,
        "same_tasks_as_base": same, "comparisons": comparisons, "base_pass1_interval": base_intervals,
        "base_greedy_minus_sampled": own}
    lines = ["## Paired differences", "",
             "Every model played the same evaluation tasks (same seeds, task ids and samples): "
             + ("checked in the results files, for every model." if all(same.values()) else
                "NOT for " + ", ".join(m for m, ok in same.items() if not ok) + " (their differences use the "
                "pairs both models played).")
             + f" Each cell: the model's pass^1 minus the reference's, with a paired bootstrap 95% interval over "
             f"(seed, task) pairs, stratified by evaluation seed ({resamples:,} resamples, tasks drawn with "
             "replacement within each seed, the same draw for both models; a task's score is its pass^1, the mean "
             "over its samples; numpy, RNG seed 0: `demo/paired_stats.py`). **Bold**: the interval excludes 0. "
             "↑ / ↓: the pairs on which the model scored above / below the reference (the rest tie). "
             "The intervals cover the evaluation tasks only, not the spread between training runs (a retrained "
             "model moves by more).", "",
             f"| model | against | greedy pass^1 difference [95% CI] | {temperature} pass^1 difference [95% CI] |",
             "|---|---|---|---|"]
    printed = ["", f"pass^1 difference, paired bootstrap 95% CI over tasks (greedy; {temperature}):"]
    excluding = []
    for model, against in comparisons.items():
        for reference, cells in against.items():
            lines.append(f"| {model} | {reference} | {_ci(cells.get('greedy'))} | {_ci(cells.get('sampled'))} |")
            printed.append(f"  {model} - {reference}: {_ci(cells.get('greedy')).replace('**', '')}; "
                           f"{_ci(cells.get('sampled')).replace('**', '')}")
            excluding += [f"{model} vs {reference} ({_mode_name(mode, temperature)}: "
                          f"{cell['difference']:+.3f}"
                          + (f"; untied tasks {cell['better']}↑ {cell['worse']}↓, sign test p = "
                             f"{cell['sign_test_p']:.3f}"
                             if cell["sign_test_p"] >= 0.05 else "") + ")"
                          for mode, cell in cells.items() if cell["excludes_zero"]]
    lines += ["", "Intervals that exclude 0: " + ("; ".join(excluding) or "none") + ". A percentile bootstrap is "
              "too narrow when a difference rests on few untied tasks; where the exact sign test on the untied tasks "
              "does not reach p < 0.05, the line says so.", ""]
    results["excluding_zero"] = excluding
    sizing = _sizing(base_intervals, own, comparisons, config, evaluate)
    results["sizing"] = sizing
    if sizing:
        lines += [sizing["text"], ""]
    return lines, results, printed


def _sizing(base_intervals: dict[str, dict[str, Any]], own: dict[str, Any] | None,
            comparisons: dict[str, dict[str, dict[str, Any]]], config: Any, evaluate: dict[str, Any],
            target: float = 0.08) -> dict[str, Any]:
    """How many (seed, task) pairs an 8-point difference needs, sized from the base agent's own interval: two
    models whose task outcomes were independent would have a difference half-width of √2 × the base's pass^1
    half-width (the wider mode), pairing only narrows it. Resolvable: half-width ≤ 0.08 (a measured 8-point
    difference excludes 0); with 80% power for a true 8-point difference: ≤ 0.08 × 1.96 / (1.96 + 0.84)."""
    from demo.paired_stats import pairs_for_half_width

    if not base_intervals:
        return {}
    e = config.evaluate
    pairs = max(cell["pairs"] for cell in base_intervals.values())
    base_half = max(cell["half_width"] for cell in base_intervals.values())
    independent = math.sqrt(2) * base_half
    power_target = target * 1.96 / (1.96 + POWER_Z)
    need = pairs_for_half_width(independent, pairs, target)
    need_power = pairs_for_half_width(independent, pairs, power_target)
    widths = [cell["half_width"] for against in comparisons.values() for cells in against.values()
              for cell in cells.values()]
    per_pair = 1 + e.samples  # one greedy episode and `samples` sampled ones per (seed, task) pair
    models = len(evaluate)
    runs = [run for model_runs in evaluate.values() for run in model_runs.values()]
    seconds = sum(run.get("seconds", 0.0) for run in runs)
    episodes_now = pairs * per_pair * models
    per_episode = seconds / episodes_now if seconds else None

    def cost(n: int) -> str:
        episodes = n * per_pair * models
        return f"{episodes:,} evaluation episodes" + (f" (~{episodes * per_episode / 60:.0f} min here)" if per_episode
                                                       else "")

    out = {"target": target, "pairs_now": pairs, "base_half_width": base_half,
           "independent_difference_half_width": independent,
           "base_greedy_minus_sampled_half_width": own["half_width"] if own else None,
           "table_half_widths": [min(widths), max(widths)] if widths else None,
           "pairs_needed": need, "pairs_needed_80_power": need_power, "episodes_per_pair_per_model": per_pair,
           "episodes_now": episodes_now, "episodes_needed": None if need is None else need * per_pair * models,
           "episodes_needed_80_power": None if need_power is None else need_power * per_pair * models,
           "seconds_per_episode": per_episode}
    if need is None:
        out["text"] = ("Sizing: the base agent scored every task alike (interval width 0), so there is no variance "
                       "to size the evaluation from.")
        return out
    seeds = len(e.seeds)
    out["text"] = (
        f"Sizing for an 8-point difference (resolvable: 95% half-width ≤ {target:.2f}). Measured on the base agent: "
        f"its pass^1 interval half-width is {base_half:.3f} over {pairs} (seed, task) pairs (the wider of greedy and "
        f"T={e.temperature:g}), so two models whose task outcomes were independent would differ with half-width "
        f"√2 × {base_half:.3f} = {independent:.3f}; pairing only narrows it (base greedy vs its own "
        f"T={e.temperature:g}: "
        + (f"{own['half_width']:.3f}" if own else "-")
        + (f"; the differences above: {min(widths):.3f}-{max(widths):.3f}" if widths else "")
        + f"). Half-widths shrink as 1/√pairs, so that needs **{need} (seed, task) pairs** ({seeds} seeds × "
        f"{math.ceil(need / seeds)} tasks; now {pairs}), each played once greedy and {e.samples} times at "
        f"T={e.temperature:g} by each of the {models} models: {cost(need)}, against {cost(pairs)} now. To detect a "
        f"true 8-point difference 80% of the time (half-width ≤ {power_target:.3f}): {need_power} pairs, "
        f"{cost(need_power)}.")
    return out


# ---- sample efficiency --------------------------------------------------------------------------------------------

CLAIM = "with under a quarter of the rollouts, TRACE exceeded the final scores of GRPO"


def direct_settings_section(run_dir: Path, records: dict[str, dict[str, Any]], evaluate: dict[str, dict[str, Any]],
                            config: Any, summarize: Callable[[dict[str, Any], str], dict[str, Any]],
                            resamples: int | None = None) -> tuple[list[str], dict[str, Any], list[str]]:
    """Direct GRPO in its two settings side by side: on unlimited fresh target tasks and on a fixed pool of
    target tasks (`loop.direct_task_pool`), with the same budget: the tasks each played (distinct tasks, passes
    over the pool), pass^1 greedy and at the evaluation temperature, and pool − fresh with its paired bootstrap
    interval (`paired_section`'s method). Returns (report lines, results["direct_settings"], printed lines);
    nothing when the run has no fixed-pool run."""
    from demo import paired_stats as ps

    baselines = records.get("baselines", {}).get("figures", {})
    fresh_label, pool_label = BASELINE_LABELS["direct"], BASELINE_LABELS["direct_pool"]
    if not baselines.get("direct_pool") or fresh_label not in evaluate or pool_label not in evaluate:
        return [], {}, []
    resamples = resamples or ps.DEFAULT_RESAMPLES
    temperature = f"T={config.evaluate.temperature:g}"
    scores = {label: evaluation_scores(run_dir, evaluate[label]) for label in (fresh_label, pool_label)}
    modes = [m for m in MODE_TITLES if m in scores[fresh_label] and m in scores[pool_label]]
    difference = {mode: ps.paired_difference(scores[pool_label][mode]["scores"], scores[fresh_label][mode]["scores"],
                                             resamples=resamples) for mode in modes}
    rows: dict[str, Any] = {}
    lines = ["## Direct GRPO: a fixed task pool and fresh tasks", "",
             "The same budget and trainer in both; only the training tasks differ. *Fresh*: every group plays a new "
             "target task (an unlimited stream from the evaluation's generator, never the evaluation's tasks). "
             "*Task pool*: the groups go through a fixed pool of target tasks (disjoint from the evaluation's) pass "
             "after pass, each pass in a new order, as GRPO on a finite benchmark does (the paper's τ²-Bench "
             "target has 164 tasks).", "",
             f"| setting | pool | groups | distinct tasks | passes | greedy pass^1 | {temperature} pass^1 |",
             "|---|---|---|---|---|---|---|"]
    for name, label in (("direct", fresh_label), ("direct_pool", pool_label)):
        run = baselines[name]
        tasks = run.get("tasks") or {"pool": 0, "groups": None, "distinct": None, "passes": None}
        cells = {mode: _pass1(evaluate[label], mode, summarize) for mode in modes}
        rows[label] = {"tasks": tasks, "episodes": run["episodes"], **cells}
        passes = "-" if tasks.get("passes") is None else f"{tasks['passes']:.2f}"
        lines.append(f"| {label} | {tasks['pool'] or 'fresh'} | {tasks.get('groups') or '-'} | "
                     f"{tasks.get('distinct') or '-'} | {passes} | {_fmt(cells.get('greedy'))} | "
                     f"{_fmt(cells.get('sampled'))} |")
    pool = rows[pool_label]["tasks"]
    lines += ["", "Task pool − fresh, paired over the evaluation's (seed, task) pairs: "
              + "; ".join(f"{_mode_name(mode, temperature)} {_ci(cell).replace('**', '')}"
                          for mode, cell in difference.items()) + "."]
    if pool.get("passes") is not None and pool["passes"] <= 1:
        lines.append(f"At this budget the pool run played each of its tasks at most once ({pool['groups']} groups, "
                     f"{pool['pool']} tasks): the two settings then differ only by chance.")
    lines.append("")
    printed = [f"direct GRPO, task pool ({pool['pool']} tasks) - fresh: "
               + "; ".join(f"{_mode_name(mode, temperature)} {_ci(cell).replace('**', '')}"
                           for mode, cell in difference.items())]
    return lines, {"rows": rows, "pool_minus_fresh": difference}, printed


# Differences whose spread over repeats the report gives: (model, reference).
REPEAT_DIFFERENCES = (("TRACE", "base"), ("direct GRPO", "TRACE"), ("single-adapter GRPO", "TRACE"))


def _spread(values: list[float]) -> dict[str, Any]:
    return {"values": values, "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values)}


def _spread_text(cell: dict[str, Any] | None, signed: bool = False) -> str:
    if cell is None:
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"{cell['mean']:{f}} ± {cell['std']:.3f} ({cell['min']:{f}} to {cell['max']:{f}})"


def repeats_section(records: dict[str, dict[str, Any]], repeats: dict[int, dict[str, dict[str, Any]]], config: Any,
                    summarize: Callable[[dict[str, Any], str], dict[str, Any]]
                    ) -> tuple[list[str], dict[str, Any], list[str]]:
    """Run-to-run spread (`--repeat N`): each model's pass^1 (mean over evaluation seeds) in every repeat — training
    seed 0 is the run the rest of the report shows, `repeats` holds the others' records — with the mean, sample std
    and range over repeats, greedy and at the evaluation temperature; the base agent (shared, not retrained) once;
    and the differences of REPEAT_DIFFERENCES per repeat with their spread. Returns (report lines,
    results["repeats"], printed lines); nothing with one repeat."""
    if not repeats:
        return [], {}, []
    by_seed = {0: records, **repeats}
    seeds = sorted(by_seed)
    modes = list(MODE_TITLES)
    means: dict[str, dict[int, dict[str, float]]] = {}  # model -> seed -> mode -> pass^1
    base_runs = records.get("evaluate", {}).get("figures", {}).get("base")
    for seed, recs in by_seed.items():
        models = {**({"base": base_runs} if base_runs else {}),
                  **recs.get("final", {}).get("figures", {}).get("models", {}),
                  **recs.get("efficiency", {}).get("figures", {}).get("models", {})}
        for label, runs in models.items():
            for mode in modes:
                cell = _pass1(runs, mode, summarize)
                if cell is not None:
                    means.setdefault(label, {}).setdefault(seed, {})[mode] = cell["mean"]
    rows = {label: {mode: _spread([per_seed[s][mode] for s in seeds if mode in per_seed.get(s, {})])
                    for mode in modes if any(mode in per_seed.get(s, {}) for s in seeds)}
            for label, per_seed in means.items()}
    differences: dict[str, dict[str, Any]] = {}
    for model, reference in REPEAT_DIFFERENCES:
        if model not in means or reference not in means:
            continue
        cells = {}
        for mode in modes:
            values = [means[model][s][mode] - means[reference][s][mode] for s in seeds
                      if mode in means[model].get(s, {}) and mode in means[reference].get(s, {})]
            if values:
                cells[mode] = _spread(values)
        differences[f"{model} − {reference}"] = cells
    temperature = f"T={config.evaluate.temperature:g}"
    lines = ["## Repeats: the spread between training runs", "",
             f"Steps 3-4, the baselines and their evaluations ran {len(seeds)} times, with training seeds "
             f"{', '.join(map(str, seeds))} (seed 0 is the run above; seed r's folders are under repeats/seed<r>/). The "
             "base agent, Step 1 and Step 2's calibration are shared (none draws from a training seed), and every "
             "repeat plays the same evaluation tasks. Each cell: pass^1 (mean over evaluation seeds) per repeat, then "
             "mean ± sample std over repeats (range). This is the spread the paired intervals above do not cover.", "",
             f"| model | greedy pass^1 per repeat | greedy over repeats | {temperature} pass^1 per repeat | "
             f"{temperature} over repeats |", "|---|---|---|---|---|"]
    for label, per_seed in means.items():
        cells = []
        for mode in modes:
            cells += [" / ".join(f"{per_seed[s][mode]:.3f}" if mode in per_seed.get(s, {}) else "-" for s in seeds),
                      _spread_text(rows[label].get(mode)) if label != "base" else "(not retrained)"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| difference | greedy: per repeat, then over repeats | "
              f"{temperature}: per repeat, then over repeats |", "|---|---|---|"]
    printed = ["", f"over {len(seeds)} repeats (training seeds {', '.join(map(str, seeds))}), pass^1 mean ± std "
               f"(greedy; {temperature}):"]
    for label, cells in differences.items():
        lines.append(f"| {label} | " + " | ".join(
            (" / ".join(f"{v:+.3f}" for v in cells[mode]["values"]) + "; " + _spread_text(cells[mode], signed=True))
            if mode in cells else "-" for mode in modes) + " |")
    for label in rows:
        if label != "base":
            printed.append(f"  {label}: " + "; ".join(_spread_text(rows[label].get(mode)) for mode in modes))
    printed += [f"  {label}: " + "; ".join(_spread_text(cells.get(mode), signed=True) for mode in modes)
                for label, cells in differences.items()]
    lines.append("")
    return lines, {"training_seeds": seeds, "models": rows, "differences": differences}, printed


def _pass1(runs: dict[str, Any], mode: str, summarize: Callable[[dict[str, Any], str], dict[str, Any]]
           ) -> dict[str, float] | None:
    return summarize(runs, mode).get("all", {}).get("pass^1")


def _fraction_text(episodes: int, of: int) -> str:
    from fractions import Fraction

    share = Fraction(episodes, of) if of else None
    if share is None:
        return "-"
    return "0" if share == 0 else "all" if share == 1 else f"{share.numerator}/{share.denominator}"


def _mean_text(cell: dict[str, float] | None) -> str:
    return "-" if cell is None else f"{cell['mean']:.3f}"


def resolved(cell: dict[str, Any]) -> bool:
    """A paired difference the report calls: its interval excludes 0 and the sign test on its untied tasks has
    p < 0.05 (a percentile bootstrap is too narrow when a difference rests on a handful of tasks)."""
    return bool(cell["excludes_zero"] and cell.get("sign_test_p", 0.0) < 0.05)


def _verdict(cell: dict[str, Any] | None) -> str:
    """TRACE − direct GRPO (final) at equal budget, in words."""
    if cell is None:
        return "not measured"
    ci = _ci(cell).replace("**", "")
    if resolved(cell):
        return (f"TRACE above direct GRPO at equal budget ({ci})" if cell["difference"] > 0 else
                f"direct GRPO above TRACE at equal budget ({ci})")
    if cell["excludes_zero"]:
        return (f"not resolved: the interval excludes 0 but rests on few untied tasks (sign test p = "
                f"{cell['sign_test_p']:.3f}; {ci})")
    return f"not resolved: the interval holds 0 ({ci})"


def _mode_name(mode: str, temperature: str) -> str:
    return "greedy" if mode == "greedy" else temperature


CLAIM_VERDICTS = {"supported": "supported here", "contradicted": "contradicted here",
                  "not resolved": "cannot be resolved here"}


def claim_verdict(cells: dict[str, dict[str, Any]]) -> str:
    """The paper's claim from TRACE @x − direct GRPO (final), one paired difference per mode, by `resolved`'s rule:
    "contradicted" when a mode is resolved below 0, "supported" when every mode is resolved above 0, otherwise
    "not resolved"."""
    if any(resolved(cell) and cell["difference"] < 0 for cell in cells.values()):
        return "contradicted"
    if cells and all(resolved(cell) and cell["difference"] > 0 for cell in cells.values()):
        return "supported"
    return "not resolved"


def claim_at_ratio(scores: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]], trace_checkpoints: list[str],
                   modes: list[str], resamples: int) -> dict[str, dict[str, Any]]:
    """The paper's claim at its own ratio: each of TRACE's checkpoints (`trace_checkpoints`, rows of `rows`) that
    trained on at most 1/4 of direct GRPO's final training episodes, minus direct GRPO's final, paired per mode
    over the same (seed, task) pairs (`paired_section`'s method). `scores`: {model: `evaluation_scores`}. Returns
    {label: {"episodes", "share_of_direct" (of direct GRPO's training episodes), "all_episodes",
    "direct_all_episodes", "differences": {mode: cell}, "verdict" (`claim_verdict`)}}."""
    from demo import paired_stats as ps

    direct = rows["direct GRPO"]
    out: dict[str, dict[str, Any]] = {}
    for label in trace_checkpoints:
        row = rows[label]
        if not direct["training"] or 4 * row["training"] > direct["training"]:
            continue
        cells = {mode: ps.paired_difference(scores[label][mode]["scores"], scores["direct GRPO"][mode]["scores"],
                                            resamples=resamples)
                 for mode in modes if mode in scores[label] and mode in scores["direct GRPO"]}
        out[label] = {"episodes": row["training"], "share_of_direct": row["training"] / direct["training"],
                      "all_episodes": row["all"], "direct_all_episodes": direct["all"], "differences": cells,
                      "verdict": claim_verdict(cells)}
    return out


def _claim_lines(claims: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]], temperature: str) -> list[str]:
    """The report's line per `claim_at_ratio` entry: the differences, the verdict and the all-episodes count."""
    lines = []
    direct = rows["direct GRPO"]
    for label, claim in claims.items():
        cells = ", ".join(f"{_mode_name(mode, temperature)} {_ci(cell).replace('**', '')}"
                          for mode, cell in claim["differences"].items())
        ratio = claim["all_episodes"] / claim["direct_all_episodes"] if claim["direct_all_episodes"] else None
        count = ("" if ratio is None else
                 f" Counting every episode played, {label} used {claim['all_episodes']:,} (Step 1 analysis and "
                 f"calibration, played in full, and its training) against direct GRPO's "
                 f"{claim['direct_all_episodes']:,} (only its own training): {ratio:.2f}× direct GRPO's, "
                 + ("within the claim's 1/4 on that count too." if ratio <= 0.25 else
                    "more than the claim's 1/4 on that count (the ratio holds for training episodes)."))
        lines += [f"**The paper's claim at its own ratio**: {label} ({claim['episodes']:,} training episodes, "
                  f"{_fraction_text(claim['episodes'], direct['training'])} of direct GRPO's {direct['training']:,}) "
                  f"against direct GRPO's final: {cells}: **{CLAIM_VERDICTS[claim['verdict']]}**.{count}", ""]
    return lines


def _efficiency_intro(budget: int, direct_shares: str, schedule: str, claims: list[str], trace_checkpoints: list[str]
                      ) -> str:
    """The section's opening paragraph: the paper's claim and which rows measure it. With a TRACE checkpoint at
    at most 1/4 of direct GRPO's episodes (`claims`) the claim is measured; without, it is not available at
    equal cost (and `trace_checkpoints`, all above 1/4, are said not to measure it either)."""
    opening = (f"The paper's headline efficiency claim: \"{CLAIM}\" — TRACE with at most 1/4 of GRPO's budget "
               "against GRPO's final. ")
    equal = (f"direct GRPO's checkpoints at {direct_shares} and all of that budget (one run: the checkpoints are its "
             f"adapter after that many iterations; {schedule}) against TRACE at its full budget, on the final step's "
             "evaluation tasks and seeds. TRACE above direct GRPO at 1/4 is not the paper's claim (that gives GRPO "
             "less, not TRACE less); TRACE against direct GRPO's final at equal budget is the paper's comparison at a "
             "ratio of 1 instead of 4 or more: if direct GRPO is already above TRACE there, its claim fails here "
             "unless GRPO's score would fall with more training (see the curve of its checkpoints).")
    if claims:
        return (opening + "Here it is measured by TRACE's own checkpoint with at most 1/4 of direct GRPO's "
                f"training episodes ({', '.join(claims)}: TRACE's capability adapters at an earlier iteration of their "
                "runs and a gate trained for that share of its GRPO iterations on them) against direct GRPO's final "
                f"({budget:,} episodes): the claim line below the table. Direct GRPO was given TRACE's own training "
                "budget (the baselines step), so the other rows also show what equal budget shows: " + equal)
    above = (f" TRACE's own checkpoints ({', '.join(trace_checkpoints)}) each trained on more than 1/4 of direct "
             "GRPO's episodes, so none of them measures it either." if trace_checkpoints else "")
    return (opening + f"Here direct GRPO was given TRACE's own training budget ({budget:,} episodes: the baselines "
            "step), so that comparison is **not available at equal cost**: it needs a direct GRPO run of at least 4× "
            f"TRACE's episodes, which this demo does not train.{above} The rows below are what equal cost allows: "
            + equal)


def _trace_headline(rows: dict[str, dict[str, Any]], trace_checkpoints: list[str], modes: list[str],
                    temperature: str) -> str:
    """TRACE's checkpoints and TRACE against direct GRPO's final, pass^1 means, in one bold-led sentence."""
    if not trace_checkpoints or "TRACE" not in rows:
        return ""
    names = [*trace_checkpoints, "TRACE"]
    full = rows["TRACE"]["training"]
    return (f"**TRACE at {', '.join(_fraction_text(rows[m]['training'], full) for m in names)} of its budget "
            f"({', '.join(format(rows[m]['training'], ',') for m in names)} training episodes) vs direct GRPO's final "
            f"({rows['direct GRPO']['training']:,}):** "
            + "; ".join(f"{_mode_name(mode, temperature)} pass^1 "
                        f"{' / '.join(_mean_text(rows[m][mode]) for m in names)} vs "
                        f"{_mean_text(rows['direct GRPO'][mode])}" for mode in modes) + ".")


def efficiency_section(run_dir: Path, records: dict[str, dict[str, Any]], evaluate: dict[str, dict[str, Any]],
                       accounting: dict[str, Any], config: Any,
                       summarize: Callable[[dict[str, Any], str], dict[str, Any]], resamples: int | None = None
                       ) -> tuple[list[str], dict[str, Any], list[str]]:
    """Sample efficiency as the paper measures it, on the same evaluation tasks: TRACE at its full training budget
    against direct GRPO's checkpoints at fractions of that budget (the efficiency step's "checkpoints") and at all
    of it (the final step); TRACE's own checkpoints at fractions of its budget (the efficiency step's
    "trace_checkpoints") where the run has them, and each of those with at most 1/4 of direct GRPO's training
    episodes against direct GRPO's final: the paper's claim at its own ratio (`claim_at_ratio`). Rows: pass^1
    greedy and at the evaluation temperature (mean ± std over seeds), TRACE minus each with its paired bootstrap
    interval (`paired_section`'s method), and a plot against training episodes and against all episodes played
    (`episode_accounting`). Returns (report lines, results["efficiency"], printed lines); nothing when the run has
    no efficiency step."""
    from demo import paired_stats as ps

    figures = records.get("efficiency", {}).get("figures")
    if figures is None:
        return [], {}, []
    lines = ["## Sample efficiency", ""]
    trace_why = figures.get("trace_why")
    not_measured = [f"TRACE's own checkpoints: not measured ({trace_why}).", ""] if trace_why else []
    if figures.get("why") or "direct GRPO" not in evaluate:
        why = figures.get("why") or "direct GRPO was not evaluated"
        return (lines + [f"Not measured: {why}.", ""] + not_measured,
                {"why": why, **({"trace_why": trace_why} if trace_why else {})},
                ["", f"sample efficiency: not measured ({why})"])
    resamples = resamples or ps.DEFAULT_RESAMPLES
    e = config.evaluate
    temperature = f"T={e.temperature:g}"
    models = accounting["models"]
    checkpoints = figures["checkpoints"]
    trace_checkpoints = figures.get("trace_checkpoints") or {}
    direct = records["baselines"]["figures"]["direct"]
    budget = direct["episodes"]
    order = [m for m in ("base", *checkpoints, "direct GRPO", *trace_checkpoints, "TRACE") if m in evaluate]
    modes = [mode for mode in MODE_TITLES if any(_pass1(evaluate[m], mode, summarize) for m in order)]
    rows: dict[str, dict[str, Any]] = {}
    for model in order:
        row = models.get(model, {})
        rows[model] = {"training": row.get("training", 0), "all": row.get("all", 0),
                       **{mode: _pass1(evaluate[model], mode, summarize) for mode in modes}}
    has_trace = "TRACE" in evaluate
    trace_names = [m for m in trace_checkpoints if m in rows]
    scores = ({model: evaluation_scores(run_dir, evaluate[model]) for model in order}
              if has_trace or trace_names else {})
    differences: dict[str, dict[str, Any]] = {}
    same: dict[str, bool] = {}
    if has_trace:
        for model in order:
            if model == "TRACE":
                continue
            same[model] = all(scores[model].get(m, {}).get("played") == scores["TRACE"][m]["played"] for m in modes)
            differences[model] = {mode: ps.paired_difference(scores["TRACE"][mode]["scores"],
                                                             scores[model][mode]["scores"], resamples=resamples)
                                  for mode in modes if mode in scores[model] and mode in scores["TRACE"]}
    claims = claim_at_ratio(scores, rows, trace_names, modes, resamples) if trace_names else {}
    trace = rows.get("TRACE")
    # direct GRPO's own points only (the base agent is its episode 0), never TRACE's checkpoints
    grpo_points = [m for m in ("base", *checkpoints, "direct GRPO") if m in rows]
    matched = {}
    if trace:
        for mode in modes:
            reached = [m for m in grpo_points if m != "base" and rows[m][mode] and trace[mode]
                       and rows[m][mode]["mean"] >= trace[mode]["mean"]]
            matched[mode] = reached[0] if reached else None
    verdicts = {mode: _verdict(differences.get("direct GRPO", {}).get(mode)) for mode in modes} if has_trace else {}

    def episodes(model: str) -> str:
        return f"{rows[model]['training']:,}"

    checkpoint_names = [m for m in checkpoints if m in rows]
    headline = ""
    if trace:
        cells = {mode: " / ".join(_mean_text(rows[m][mode]) for m in [*checkpoint_names, "direct GRPO"])
                 for mode in modes}
        shares = ", ".join(_fraction_text(rows[m]["training"], trace["training"])
                           for m in [*checkpoint_names, "direct GRPO"])
        headline = (f"**TRACE (its {trace['training']:,} training episodes) vs direct GRPO at {shares} of that budget "
                    f"({', '.join(episodes(m) for m in [*checkpoint_names, 'direct GRPO'])} episodes):** "
                    + "; ".join(f"{_mode_name(mode, temperature)} pass^1 TRACE "
                                f"{_mean_text(trace[mode])} vs {cells[mode]}" for mode in modes) + ".")
    lines += [_efficiency_intro(budget, ", ".join(_fraction_text(rows[m]["training"], budget)
                                                  for m in checkpoint_names),
                                schedule_text(Path(direct["adapter"])), list(claims), trace_names), ""]
    lines += not_measured
    for text in (headline, _trace_headline(rows, trace_names, modes, temperature)):
        if text:
            lines += [text, ""]
    header = "| model | training episodes | share of TRACE's | all episodes | " + " | ".join(
        f"{_mode_name(m, temperature)} pass^1" for m in modes) + " |"
    if has_trace:
        header += "".join(f" TRACE − model, {_mode_name(m, temperature)} [95% CI] |" for m in modes)
    lines += [header, "|---" * (header.count("|") - 1) + "|"]
    for model in order:
        row = rows[model]
        name = "base (episode 0 of both)" if model == "base" else model
        cells = [name, episodes(model), _fraction_text(row["training"], trace["training"]) if trace else "-",
                 f"{row['all']:,}", *(_fmt(row[mode]) for mode in modes)]
        if has_trace:
            cells += [_ci(differences.get(model, {}).get(mode)) for mode in modes]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if has_trace:
        lines += ["Each difference is TRACE's pass^1 minus the model's, paired over the same (seed, task) pairs "
                  "(as in \"Paired differences\"; **bold**: the interval excludes 0). "
                  + ("Every model played TRACE's tasks (checked in the results files)." if all(same.values()) else
                     "NOT the same tasks as TRACE: " + ", ".join(m for m, ok in same.items() if not ok) + "."), ""]
        lines += ["The paper's comparison at equal budget (TRACE − direct GRPO's final): "
                  + "; ".join(f"{_mode_name(mode, temperature)}: {verdicts[mode]}" for mode in modes)
                  + ". " + _claim_text(verdicts, differences.get("direct GRPO", {}), rows, checkpoint_names,
                                       measured=bool(claims))
                  + " Direct GRPO's first point at or above TRACE's mean pass^1: "
                  + "; ".join(f"{_mode_name(mode, temperature)} "
                              + (f"{matched[mode]} ({episodes(matched[mode])} episodes, "
                                 f"{_fraction_text(rows[matched[mode]]['training'], trace['training'])} of TRACE's)"
                                 if matched[mode] else "none of its points (TRACE above all, in mean)")
                              for mode in modes) + ".", ""]
    lines += _claim_lines(claims, rows, temperature)
    if has_trace and trace["all"]:
        lines += [f"Counting every episode played (\"Every rollout counted\"): TRACE {trace['all']:,} (Step 1 "
                  f"analysis, calibration and training), direct GRPO {rows['direct GRPO']['all']:,} (only its own "
                  f"training), so on that count direct GRPO's final used "
                  f"{rows['direct GRPO']['all'] / trace['all']:.2f}× TRACE's episodes.", ""]
    png = plot_efficiency(rows, modes, run_dir / "efficiency.png", temperature)
    if png:
        lines += ["![pass rate against episodes](efficiency.png)", ""]
    note = ("the paper's comparison (TRACE at <= 1/4 of GRPO's rollouts vs GRPO's final) is measured by TRACE's "
            f"checkpoint(s) {', '.join(claims)} against direct GRPO's final (claim_at_ratio); the other rows are "
            "direct GRPO at fractions of TRACE's budget vs TRACE at its full budget (equal budget)" if claims else
            "the paper's comparison (TRACE at <= 1/4 of GRPO's rollouts vs GRPO's final) needs direct GRPO at >= 4x "
            "TRACE's training episodes: not available; rows are direct GRPO at fractions of TRACE's budget vs TRACE "
            "at its full budget")
    results = {"claim": CLAIM, "budget_episodes": budget, "fractions": figures.get("fractions"),
               "checkpoints": checkpoints, "trace_checkpoints": dict(trace_checkpoints), "rows": rows,
               "trace_minus": differences, "same_tasks_as_trace": same, "equal_budget": verdicts,
               "first_direct_point_at_or_above_trace": matched, "claim_at_ratio": claims,
               "png": "efficiency.png" if png else None, "note": note,
               **({"trace_why": trace_why} if trace_why else {})}
    printed = ["", "sample efficiency, pass^1 " + " / ".join(_mode_name(m, temperature) for m in modes)
               + " (training episodes):"]
    printed += [f"  {model}: " + " / ".join("-" if rows[model][m] is None else f"{rows[model][m]['mean']:.3f}"
                                            for m in modes) + f" ({episodes(model)})" for model in order]
    printed += [f"  TRACE − {model}: " + "; ".join(_ci(cell).replace("**", "") for cell in cells.values())
                for model, cells in differences.items() if model != "base"]
    printed += [f"  {label} − direct GRPO (final): "
                + "; ".join(_ci(cell).replace("**", "") for cell in claim["differences"].values())
                + f" (paper's claim: {claim['verdict']})" for label, claim in claims.items()]
    if trace_why:
        printed.append(f"  TRACE's own checkpoints: not measured ({trace_why})")
    return lines, results, printed


def schedule_text(run_folder: Path) -> str:
    """What a checkpoint of the GRPO run in `run_folder` stands for, from the config.yaml the run saved: with a
    constant learning rate and no warm-up (the demo's), the run's state after k iterations does not depend on how
    many more it was going to run, so its checkpoint at k is what a run of k iterations reaches; with a schedule
    over the whole run it is not quite. Left-out keys are train/config.py's defaults (constant, 0)."""
    import yaml

    path = run_folder / "config.yaml"
    if not path.is_file():
        return "the run's learning-rate schedule is not known here (no config.yaml)"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    schedule, warmup = data.get("lr_schedule", "constant"), data.get("warmup_iterations", 0)
    if schedule == "constant" and not warmup:
        return ("its learning rate is constant with no warm-up (its config.yaml), so a checkpoint is what a run "
                "stopped there would have reached")
    return (f"its learning rate follows a schedule over the whole run (lr_schedule {schedule}, warmup_iterations "
            f"{warmup}), so a checkpoint is close to, not the same as, a shorter run")


def _claim_text(verdicts: dict[str, str], cells: dict[str, Any], rows: dict[str, dict[str, Any]],
                checkpoints: list[str], measured: bool = False) -> str:
    """What the equal-budget row says about the paper's claim. `measured`: a TRACE checkpoint measures the claim
    at its own ratio (`claim_at_ratio`), so the equal-budget row is said for what it is and the claim is left to
    that line."""
    if not cells:
        return "Direct GRPO's final was not compared with TRACE."
    curve = " → ".join(f"{rows[m]['greedy']['mean']:.3f}" for m in ["base", *checkpoints, "direct GRPO"]
                       if m in rows and rows[m].get("greedy"))
    below = [mode for mode, cell in cells.items() if resolved(cell) and cell["difference"] < 0]
    above = [mode for mode, cell in cells.items() if resolved(cell) and cell["difference"] > 0]
    if measured:
        shows = ("direct GRPO is above TRACE" if below else
                 "TRACE is above direct GRPO, the paper's direction" if above and len(above) == len(cells) else
                 "the difference is not resolved in every mode")
        return (f"At equal budget {shows} (direct GRPO's greedy pass^1 from episode 0 over its checkpoints: {curve}); "
                "the paper's claim at its own ratio is the line below.")
    if below:
        return ("So the paper's claim is **contradicted here**: direct GRPO with TRACE's own budget, not 4× it, "
                "already scores above TRACE, and more GRPO training would have to lower its score for the claim to "
                f"hold (direct GRPO's greedy pass^1 from episode 0 over its checkpoints: {curve}).")
    if above and len(above) == len(cells):
        return ("Consistent with the paper's direction at equal budget; the claim itself (TRACE above GRPO's final "
                f"with at most 1/4 of its rollouts) needs direct GRPO run at least 4× longer, not done here (direct "
                f"GRPO's greedy pass^1 over its checkpoints: {curve}: still rising at the end or not decides how much "
                "the longer run would add).")
    return ("The paper's claim **cannot be resolved** here: at equal budget the difference is not resolved in every "
            f"mode (direct GRPO's greedy pass^1 over its checkpoints: {curve}).")


def _efficiency_series(axis: Any, rows: dict[str, dict[str, Any]], names: list[str], count: str, mode: str,
                       style: tuple[str, str, str], label: str, color: str, markersize: float) -> None:
    """One line of `plot_efficiency`: the rows `names` in order, pass^1 (mean ± std) against `count` episodes."""
    line, marker, name = style
    points = [(rows[m][count], rows[m][mode]) for m in names if rows[m].get(mode)]
    if not points:
        return
    axis.errorbar([x for x, _ in points], [c["mean"] for _, c in points], yerr=[c["std"] for _, c in points],
                  fmt=marker + line, color=color, capsize=3, markersize=markersize,
                  markerfacecolor=color if mode == "greedy" else "white", label=f"{label}, {name}")
    for x, cell in points:
        axis.annotate(f"{cell['mean']:.2f}", (x, cell["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=6)


def plot_efficiency(rows: dict[str, dict[str, Any]], modes: list[str], path: Path, temperature: str
                    ) -> Path | None:
    """Held-out pass^1 (mean ± std over seeds) against training episodes (left) and all episodes played (right):
    direct GRPO from the base agent (episode 0) over its checkpoints to its final (C1, circles and squares), and
    TRACE over its own checkpoints to its full budget (C0, stars; rows whose label starts "TRACE", in `rows`'
    order) (PNG)."""
    grpo = [m for m in rows if not m.startswith("TRACE")]
    trace = [m for m in rows if m.startswith("TRACE")]
    if len(rows) < 2:
        return None
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10.5, 4.0), sharey=True)
    styles = {"greedy": ("-", "o", "greedy"), "sampled": ("--", "s", temperature)}
    titles = ("training episodes (TRACE: Steps 3-4; direct GRPO: its run)",
              "all episodes played (Step 1, calibration, training)")
    for axis, count, title in zip(axes, ("training", "all"), titles):
        for mode in modes:
            _efficiency_series(axis, rows, grpo, count, mode, styles[mode], "direct GRPO", "C1", 6)
            line, _, name = styles[mode]
            _efficiency_series(axis, rows, trace, count, mode, (line, "*", name), "TRACE", "C0", 11)
        axis.set_xlabel(title)
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("held-out storefront pass^1")
    axes[0].legend(fontsize=7, loc="upper left")
    figure.suptitle("Sample efficiency: direct GRPO's and TRACE's checkpoints (mean ± std over evaluation seeds)")
    return save_figure(figure, path)
