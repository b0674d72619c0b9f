"""Sample efficiency in the report: TRACE's checkpoints against direct GRPO's, the paper's claim at its ratio, repeats."""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Callable

from demo.report_accounting import BASELINE_LABELS
from demo.report_paired import compared, evaluation_scores, not_compared_text, paired_text
from demo.report_plots import plot_efficiency
from demo.report_text import MODE_TITLES, fmt_cell, mode_name


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
    difference = {mode: compared(ps.paired_difference(scores[pool_label][mode]["scores"],
                                                      scores[fresh_label][mode]["scores"], resamples=resamples),
                                 scores[pool_label][mode], scores[fresh_label][mode]) for mode in modes}
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
                     f"{tasks.get('distinct') or '-'} | {passes} | {fmt_cell(cells.get('greedy'))} | "
                     f"{fmt_cell(cells.get('sampled'))} |")
    pool = rows[pool_label]["tasks"]
    lines += ["", "Task pool − fresh, paired over the evaluation's (seed, task) pairs: "
              + "; ".join(f"{mode_name(mode, temperature)} {paired_text(cell).replace('**', '')}"
                          for mode, cell in difference.items()) + "."
              + not_compared_text({"task pool vs fresh": difference}, temperature)]
    if pool.get("passes") is not None and pool["passes"] <= 1:
        lines.append(f"At this budget the pool run played each of its tasks at most once ({pool['groups']} groups, "
                     f"{pool['pool']} tasks): the two settings then differ only by chance.")
    lines.append("")
    printed = [f"direct GRPO, task pool ({pool['pool']} tasks) - fresh: "
               + "; ".join(f"{mode_name(mode, temperature)} {paired_text(cell).replace('**', '')}"
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


# Two pass^1 means this close are the same pass rate: a mean over seeds of c/n per seed holds the same total passes
# split differently over the seeds as floats a last bit apart (75, 76, 77 of 105: 0.7238095238095238; 74, 76, 78:
# 0.7238095238095239), far below one task's 1/(seeds × tasks).
MEAN_TIE_TOLERANCE = 1e-9


def at_or_above(mean: float, reference: float) -> bool:
    """`mean` >= `reference`, a tie within MEAN_TIE_TOLERANCE counted as reached whatever float noise says."""
    return mean >= reference or math.isclose(mean, reference, rel_tol=0.0, abs_tol=MEAN_TIE_TOLERANCE)


def first_at_or_above(rows: dict[str, dict[str, Any]], points: list[str], reference: str, mode: str) -> str | None:
    """The first of `points` (rows of `rows`) whose pass^1 mean in `mode` is at or above `reference`'s
    (`at_or_above`: a tie counts as reached), or None."""
    target = rows[reference].get(mode)
    return next((m for m in points if rows[m].get(mode) and target
                 and at_or_above(rows[m][mode]["mean"], target["mean"])), None)


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
    ci = paired_text(cell).replace("**", "")
    if resolved(cell):
        return (f"TRACE above direct GRPO at equal budget ({ci})" if cell["difference"] > 0 else
                f"direct GRPO above TRACE at equal budget ({ci})")
    if cell["excludes_zero"]:
        return (f"not resolved: the interval excludes 0 but rests on few untied tasks (sign test p = "
                f"{cell['sign_test_p']:.3f}; {ci})")
    return f"not resolved: the interval holds 0 ({ci})"


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
        cells = {mode: compared(ps.paired_difference(scores[label][mode]["scores"],
                                                     scores["direct GRPO"][mode]["scores"], resamples=resamples),
                                scores[label][mode], scores["direct GRPO"][mode])
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
        cells = ", ".join(f"{mode_name(mode, temperature)} {paired_text(cell).replace('**', '')}"
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
            + "; ".join(f"{mode_name(mode, temperature)} pass^1 "
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
            differences[model] = {mode: compared(ps.paired_difference(scores["TRACE"][mode]["scores"],
                                                                      scores[model][mode]["scores"],
                                                                      resamples=resamples),
                                                 scores["TRACE"][mode], scores[model][mode])
                                  for mode in modes if mode in scores[model] and mode in scores["TRACE"]}
    claims = claim_at_ratio(scores, rows, trace_names, modes, resamples) if trace_names else {}
    trace = rows.get("TRACE")
    # direct GRPO's own points only (the base agent is its episode 0), never TRACE's checkpoints
    grpo_points = [m for m in ("base", *checkpoints, "direct GRPO") if m in rows]
    matched = {mode: first_at_or_above(rows, [m for m in grpo_points if m != "base"], "TRACE", mode)
               for mode in modes} if trace else {}
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
                    + "; ".join(f"{mode_name(mode, temperature)} pass^1 TRACE "
                                f"{_mean_text(trace[mode])} vs {cells[mode]}" for mode in modes) + ".")
    lines += [_efficiency_intro(budget, ", ".join(_fraction_text(rows[m]["training"], budget)
                                                  for m in checkpoint_names),
                                schedule_text(Path(direct["adapter"])), list(claims), trace_names), ""]
    lines += not_measured
    for text in (headline, _trace_headline(rows, trace_names, modes, temperature)):
        if text:
            lines += [text, ""]
    header = "| model | training episodes | share of TRACE's | all episodes | " + " | ".join(
        f"{mode_name(m, temperature)} pass^1" for m in modes) + " |"
    if has_trace:
        header += "".join(f" TRACE − model, {mode_name(m, temperature)} [95% CI] |" for m in modes)
    lines += [header, "|---" * (header.count("|") - 1) + "|"]
    for model in order:
        row = rows[model]
        name = "base (episode 0 of both)" if model == "base" else model
        cells = [name, episodes(model), _fraction_text(row["training"], trace["training"]) if trace else "-",
                 f"{row['all']:,}", *(fmt_cell(row[mode]) for mode in modes)]
        if has_trace:
            cells += [paired_text(differences.get(model, {}).get(mode)) for mode in modes]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if has_trace:
        lines += ["Each difference is TRACE's pass^1 minus the model's, paired over the same (seed, task) pairs "
                  "(as in \"Paired differences\"; **bold**: the interval excludes 0). "
                  + ("Every model played TRACE's tasks (checked in the results files)." if all(same.values()) else
                     "NOT the same tasks as TRACE: " + ", ".join(m for m, ok in same.items() if not ok) + ".")
                  + not_compared_text({f"TRACE vs {model}": cells for model, cells in differences.items()},
                                      temperature), ""]
        lines += ["The paper's comparison at equal budget (TRACE − direct GRPO's final): "
                  + "; ".join(f"{mode_name(mode, temperature)}: {verdicts[mode]}" for mode in modes)
                  + ". " + _claim_text(verdicts, differences.get("direct GRPO", {}), rows, checkpoint_names,
                                       measured=bool(claims))
                  + " Direct GRPO's first point at or above TRACE's mean pass^1: "
                  + "; ".join(f"{mode_name(mode, temperature)} "
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
    printed = ["", "sample efficiency, pass^1 " + " / ".join(mode_name(m, temperature) for m in modes)
               + " (training episodes):"]
    printed += [f"  {model}: " + " / ".join("-" if rows[model][m] is None else f"{rows[model][m]['mean']:.3f}"
                                            for m in modes) + f" ({episodes(model)})" for model in order]
    printed += [f"  TRACE − {model}: " + "; ".join(paired_text(cell).replace("**", "") for cell in cells.values())
                for model, cells in differences.items() if model != "base"]
    printed += [f"  {label} − direct GRPO (final): "
                + "; ".join(paired_text(cell).replace("**", "") for cell in claim["differences"].values())
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
