"""The report's plots: the SFT curve, GRPO training curves, pass^1 against rollouts and sample efficiency."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from demo.plotting import pyplot, save_figure
from demo.report_text import MODE_TITLES, mode_name


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


def plot_pass_vs_rollouts(points: dict[str, tuple[int, dict[str, tuple[float, float]]]], path: Path,
                          temperature: str | None = None) -> Path | None:
    """Held-out storefront pass^1 (mean ± std over seeds) against rollouts used, one panel per decoding mode
    (PNG). `points`: {model: (episodes, {mode: (mean, std)})}; `temperature` names the sampled mode's panel
    (e.g. "T=0.7", the evaluation's; without it, "sampled"). Models that used the same number of episodes
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
        axis.set_title(f"pass^1, {mode_name(mode, temperature) if temperature else MODE_TITLES[mode]}")
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out storefront pass^1")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    figure.suptitle("Held-out storefront tasks against rollouts used (mean ± std over evaluation seeds)")
    return save_figure(figure, path)


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
