"""Paired statistics in the report: each model against the base agent on the same tasks, intervals and sizing."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from demo.report_text import MODE_TITLES, ci_text, mode_name


POWER_Z = 0.8416  # the normal quantile for 80% power


def evaluation_scores(run_dir: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """{mode: {"scores": {seed: {task_id: pass^1}}, "played": {(seed, task_id, sample_idx), ...}}} of one model's
    evaluation runs (keys "seed/mode", each with its results file's `path` under run_dir). "played" holds every
    simulation, scored or not; "scores" only tasks with a scored sample (`task_scores`), so a task whose episodes
    all have a null reward_info was played but has no score (`compared`)."""
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


def compared(cell: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`cell` (a `paired_difference` of mode entries `a` and `b` of `evaluation_scores`) with "not_compared": the
    (seed, task) pairs either model played that the difference leaves out — one model did not play the task, or
    played it without a scored episode (reward_info null), or neither scored it — counted from the results files,
    not only the pairs one side scored (`left_out`)."""
    played = {(str(seed), str(task)) for seed, task, _ in a["played"] | b["played"]}
    return {**cell, "not_compared": len(played) - cell["pairs"]}


def paired_text(cell: dict[str, Any] | None) -> str:
    """`ci_text` of a paired difference, and how many played pairs it leaves out when any (`compared`)."""
    text = ci_text(cell)
    dropped = 0 if cell is None else cell.get("not_compared", cell.get("left_out", 0))
    return text + (f" ({dropped} played pair{'' if dropped == 1 else 's'} not compared)" if dropped else "")


def not_compared_text(cells: dict[str, dict[str, Any]], temperature: str) -> str:
    """The report's sentence naming the differences that leave played pairs out ("" when none does); `cells`:
    {"model vs reference": {mode: cell}}."""
    dropped = [f"{label}, {mode_name(mode, temperature)}: {cell['not_compared']}"
               for label, by_mode in cells.items() for mode, cell in by_mode.items() if cell.get("not_compared")]
    return (" Not every played (seed, task) pair is compared: a difference uses the pairs both models scored, and "
            "leaves out a task one model did not play or played without a scored episode (reward_info null) — "
            + "; ".join(dropped) + "." if dropped else "")


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
                mode: compared(ps.paired_difference(scores[model][mode]["scores"], scores[reference][mode]["scores"],
                                                    resamples=resamples), scores[model][mode], scores[reference][mode])
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
             + not_compared_text({f"{model} vs {reference}": cells for model, against in comparisons.items()
                                  for reference, cells in against.items()}, temperature)
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
            lines.append(f"| {model} | {reference} | {paired_text(cells.get('greedy'))} | "
                         f"{paired_text(cells.get('sampled'))} |")
            printed.append(f"  {model} - {reference}: {paired_text(cells.get('greedy')).replace('**', '')}; "
                           f"{paired_text(cells.get('sampled')).replace('**', '')}")
            excluding += [f"{model} vs {reference} ({mode_name(mode, temperature)}: "
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
