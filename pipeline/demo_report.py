"""The CPU demo's report: runs/demo/report.md, results.json and the plots beside them.

Numbers come only from the steps' own `step.json` figures; a step that did not run has no row.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable


def _fmt(cell: dict[str, float] | None) -> str:
    return "-" if cell is None else f"{cell['mean']:.3f} ± {cell['std']:.3f}"


def plot_sft_curve(log: list[dict[str, Any]], path: Path) -> Path | None:
    """Loss and token accuracy of the base agent's SFT against training time (PNG)."""
    if not log:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    figure, loss_axis = plt.subplots(figsize=(7, 3.5))
    minutes = [row["seconds"] / 60 for row in log]
    loss_axis.plot(minutes, [row["loss"] for row in log], color="tab:blue", label="loss (assistant tokens)")
    loss_axis.set_xlabel("SFT time (minutes)")
    loss_axis.set_ylabel("loss", color="tab:blue")
    loss_axis.set_yscale("log")
    accuracy_axis = loss_axis.twinx()
    accuracy_axis.plot(minutes, [row["token_accuracy"] for row in log], color="tab:orange", label="token accuracy")
    accuracy_axis.set_ylabel("token accuracy", color="tab:orange")
    accuracy_axis.set_ylim(0, 1)
    loss_axis.set_title("Base agent: supervised fine-tuning on storefront demonstrations")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def results_rows(evaluate: dict[str, Any], summarize: Callable[[dict[str, Any], str], dict[str, Any]]
                 ) -> dict[str, dict[str, Any]]:
    """{model: {"greedy": table, "sampled": table}} with table = {group: {"pass^k": {mean, std}}}."""
    return {model: {mode: summarize(runs, mode) for mode in ("greedy", "sampled")} for model, runs in evaluate.items()}


def render_report(run_dir: Path, records: dict[str, dict[str, Any]], config: Any,
                  summarize: Callable[[dict[str, Any], str], dict[str, Any]], not_run: tuple[str, ...],
                  profile: str) -> tuple[str, dict[str, Any], str]:
    """(report markdown, results.json object, the table printed at the end)."""
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
        curve = plot_sft_curve(base.get("log") or [], run_dir / "sft_curve.png")
        if curve:
            lines += ["![SFT curve](sft_curve.png)", ""]

    table_text = ""
    evaluate = records.get("evaluate", {}).get("figures", {})
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
        plain = [f"{'model':8s} {'kind':22s} {'greedy pass^1':>16s} {'T=1 pass^1':>16s} {f'T=1 pass^{k}':>16s}"]
        for model, modes in rows.items():
            groups = sorted(g for g in modes["sampled"] if g != "all") + ["all"]
            for group in groups:
                greedy = modes["greedy"].get(group, {})
                sampled = modes["sampled"].get(group, {})
                cells = (_fmt(greedy.get("pass^1")), _fmt(sampled.get("pass^1")), _fmt(sampled.get(f"pass^{k}")))
                lines.append(f"| {model} | {group} | {sampled.get('n_tasks', 0)} | " + " | ".join(cells) + " |")
                plain.append(f"{model:8s} {group:22s} " + " ".join(f"{c:>16s}" for c in cells))
        lines.append("")
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

    lines += ["## Time per step", "", "| step | seconds | device |", "|---|---|---|"]
    lines += [f"| {name} | {r['seconds']:.0f} | {r['device']} |" for name, r in records.items()]
    lines += ["", "## Not run by this demo yet", ""] + [f"- {item}" for item in not_run] + [""]
    results["not_run"] = list(not_run)
    return "\n".join(lines), results, table_text
