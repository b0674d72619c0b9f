"""Sample efficiency with TRACE's own checkpoints (demo/report.py): the efficiency step also evaluates TRACE
at fractions of its training budget ("trace_checkpoints"), and TRACE @1/4 against direct GRPO's final is the paper's
claim ("with under a quarter of the rollouts, TRACE exceeded the final scores of GRPO") at its own ratio."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_demo_efficiency import CAPABILITIES, efficiency_records, write_runs

TRACE_WHY = "loop.iterations is 1: no adapter checkpoint before the last"


def trace_checkpoint(run_dir: Path, share: float, iteration: int, gate_iterations: int) -> dict:
    """One "trace_checkpoints" entry as the efficiency step records it: the adapters (8 iterations of 64 episodes in
    `loop_records`: 512 each) at `iteration`, a gate of `gate_iterations` GRPO iterations of 64 episodes."""
    adapters = {c: iteration * 64 for c in CAPABILITIES}
    return {"fraction": share, "asked": share, "iteration": iteration, "iterations": 8, "adapter_episodes": adapters,
            "gate_iterations": gate_iterations, "gate_episodes": gate_iterations * 64,
            "episodes": sum(adapters.values()) + gate_iterations * 64,
            "gate": str(run_dir / "efficiency" / f"trace_at{iteration}" / "gate")}


def trace_records(run_dir: Path, trace: tuple[int, int] = (12, 11), quarter: tuple[int, int] | None = (45, 40),
                  half: tuple[int, int] | None = (30, 20), trace_why: str | None = None) -> dict:
    """`efficiency_records` (direct GRPO's final: 25 greedy, 16 at T=1 passing tasks per seed of 50) plus TRACE's
    checkpoints: @1/4 (adapters at iteration 2 of 8, a gate of 1 iteration: 320 episodes) passing `quarter`, @1/2
    (iteration 4, 2 gate iterations: 640) passing `half`; None leaves one out."""
    records = efficiency_records(run_dir, trace)
    figures = records["efficiency"]["figures"]
    planned = (("TRACE @1/4", 0.25, 2, 1, "tq", quarter), ("TRACE @1/2", 0.5, 4, 2, "th", half))
    figures["trace_checkpoints"] = {label: trace_checkpoint(run_dir, share, iteration, gate)
                                    for label, share, iteration, gate, _, passing in planned if passing}
    figures["models"].update({label: write_runs(run_dir, tag, *passing)
                              for label, _, _, _, tag, passing in planned if passing})
    if not figures["trace_checkpoints"]:
        del figures["trace_checkpoints"]
    if trace_why:
        figures["trace_why"] = trace_why
    return records


def render(run_dir: Path, records: dict) -> tuple[str, dict, str, str]:
    """(report, results, printed table, the "Sample efficiency" section) of `records`."""
    from demo.config import DemoConfig
    from demo.report import render_report
    from demo.run import summarize_runs

    text, results, table = render_report(run_dir, records, DemoConfig(), summarize_runs, "default")
    json.dumps(results)
    return text, results, table, text.split("## Sample efficiency", 1)[1].split("\n## ", 1)[0]


def test_traces_checkpoints_are_rows_with_their_episodes_counted(tmp_path):
    text, results, table, section = render(tmp_path, trace_records(tmp_path))
    eff = results["efficiency"]
    assert list(eff["rows"]) == ["base", "direct GRPO @1/4", "direct GRPO @1/2", "direct GRPO", "TRACE @1/4",
                                 "TRACE @1/2", "TRACE"]
    positions = [section.index(f"| {name} |") for name in ("base (episode 0 of both)", "direct GRPO @1/4",
                                                           "direct GRPO @1/2", "direct GRPO", "TRACE @1/4",
                                                           "TRACE @1/2", "TRACE")]
    assert positions == sorted(positions)
    # Step 1's 200 analysis episodes + calibration (none here) + its own training
    assert "| TRACE @1/4 | 320 | 1/4 | 520 | 0.900 ± 0.000 | 0.800 ± 0.000 | **-0.660 [" in section, section
    assert "| TRACE @1/2 | 640 | 1/2 | 840 | 0.600 ± 0.000 | 0.400 ± 0.000 | **-0.360 [" in section
    assert "| TRACE | 1,280 | all | 1,480 |" in section
    models = results["episodes"]["models"]
    a, b = (f"adapter:{c}" for c in CAPABILITIES)
    assert models["TRACE @1/4"] == {
        "training": 320, "all": 520, "target": 200,
        "parts": {"step1_analysis": 200, "calibration": 0, "router_sft_new": 0, a: 128, b: 128, "gate_grpo": 64},
        "budget": "TRACE's adapters at iteration 2 of 8 and a gate of 1 GRPO iteration"}
    assert models["TRACE @1/2"] == {
        "training": 640, "all": 840, "target": 200,
        "parts": {"step1_analysis": 200, "calibration": 0, "router_sft_new": 0, a: 256, b: 256, "gate_grpo": 128},
        "budget": "TRACE's adapters at iteration 4 of 8 and a gate of 2 GRPO iterations"}
    assert eff["rows"]["TRACE @1/4"]["training"] == 320 and eff["rows"]["TRACE @1/2"]["all"] == 840
    assert eff["trace_checkpoints"] == {"TRACE @1/4": trace_checkpoint(tmp_path, 0.25, 2, 1),
                                        "TRACE @1/2": trace_checkpoint(tmp_path, 0.5, 4, 2)}
    # every table of the report has them: results, paired differences, every rollout counted
    assert "| TRACE @1/4 | 320 | 520 | 200 | Step 1 200 + calibration 0 + router SFT (new) 0 + LoRA " in text
    assert "TRACE @1/4" in results["evaluation"] and "TRACE @1/4" in results["paired"]["comparisons"]
    assert "**TRACE at 1/4, 1/2, all of its budget (320, 640, 1,280 training episodes) vs direct GRPO's final " \
           "(1,280):** greedy pass^1 0.900 / 0.600 / 0.240 vs 0.500; T=1 pass^1 0.800 / 0.400 / 0.220 vs 0.320." \
           in section, section
    assert "TRACE @1/4: 0.900 / 0.800 (320)" in table
    assert (tmp_path / "efficiency.png").is_file() and (tmp_path / "pass_vs_rollouts.png").is_file()


@pytest.mark.parametrize("quarter, verdict, words, greedy, sampled", [
    ((45, 40), "supported", "supported here", 0.40, 0.48),  # well above direct GRPO's final (25, 16) in both modes
    ((5, 4), "contradicted", "contradicted here", -0.40, -0.24),  # well below
    ((25, 16), "not resolved", "cannot be resolved here", 0.0, 0.0)])  # the same tasks pass
def test_the_claim_at_its_own_ratio_is_trace_at_a_quarter_against_direct_grpos_final(tmp_path, quarter, verdict,
                                                                                         words, greedy, sampled):
    _, results, table, section = render(tmp_path, trace_records(tmp_path, quarter=quarter))
    claims = results["efficiency"]["claim_at_ratio"]
    assert list(claims) == ["TRACE @1/4"]  # TRACE @1/2 (640 of 1,280) is more than a quarter
    claim = claims["TRACE @1/4"]
    assert claim["verdict"] == verdict and claim["episodes"] == 320 and claim["share_of_direct"] == 0.25
    assert claim["differences"]["greedy"]["difference"] == pytest.approx(greedy)
    assert claim["differences"]["sampled"]["difference"] == pytest.approx(sampled)
    assert claim["differences"]["greedy"]["resamples"] == results["paired"]["resamples"]
    assert ("**The paper's claim at its own ratio**: TRACE @1/4 (320 training episodes, 1/4 of direct GRPO's 1,280) "
            f"against direct GRPO's final: greedy {greedy:+.3f} [") in section, section
    assert f", T=1 {sampled:+.3f} [" in section and f": **{words}**." in section
    assert ("Counting every episode played, TRACE @1/4 used 520 (Step 1 analysis and calibration, played in full, "
            "and its training) against direct GRPO's 1,280 (only its own training): 0.41× direct GRPO's, more than "
            "the claim's 1/4 on that count") in section
    assert f"  TRACE @1/4 − direct GRPO (final): {greedy:+.3f} [" in table
    assert f"(paper's claim: {verdict})" in table
    # measured: no longer "not available", and the equal-budget paragraph leaves the claim to that line
    assert "not available at equal cost" not in section
    assert "Here it is measured by TRACE's own checkpoint with at most 1/4 of direct GRPO's training episodes " \
           "(TRACE @1/4" in section
    assert "the other rows also show what equal budget shows" in section and "ratio of 1 instead of 4" in section
    assert "the paper's claim at its own ratio is the line below" in section
    assert "contradicted here**: direct GRPO with TRACE's own budget" not in section
    assert "measured by TRACE's checkpoint(s) TRACE @1/4" in results["efficiency"]["note"]


def test_the_claim_verdict_needs_every_mode_resolved_above_and_any_resolved_below_contradicts():
    from demo.report_efficiency import claim_verdict

    def cell(difference, excludes_zero=True, p=0.001):
        return {"difference": difference, "excludes_zero": excludes_zero, "sign_test_p": p}

    assert claim_verdict({"greedy": cell(0.2), "sampled": cell(0.1)}) == "supported"
    assert claim_verdict({"greedy": cell(0.2), "sampled": cell(0.1, excludes_zero=False)}) == "not resolved"
    assert claim_verdict({"greedy": cell(0.2), "sampled": cell(-0.1)}) == "contradicted"
    assert claim_verdict({"greedy": cell(0.04, p=0.125), "sampled": cell(0.1)}) == "not resolved"  # few untied tasks
    assert claim_verdict({"greedy": cell(-0.04, p=0.125)}) == "not resolved"
    assert claim_verdict({}) == "not resolved"


def test_without_a_trace_checkpoint_at_a_quarter_the_claim_stays_not_available(tmp_path):
    _, results, table, section = render(tmp_path / "why", trace_records(tmp_path / "why", quarter=None, half=None,
                                                                        trace_why=TRACE_WHY))
    assert f"TRACE's own checkpoints: not measured ({TRACE_WHY})." in section
    assert f"  TRACE's own checkpoints: not measured ({TRACE_WHY})" in table
    assert "**not available at equal cost**" in section and "at least 4× TRACE's episodes" in section
    eff = results["efficiency"]
    assert eff["trace_why"] == TRACE_WHY and eff["claim_at_ratio"] == {} and eff["trace_checkpoints"] == {}
    assert "not available" in eff["note"] and "The paper's claim at its own ratio" not in section
    # only a checkpoint above a quarter: it does not measure the claim either
    _, results, _, section = render(tmp_path / "half", trace_records(tmp_path / "half", quarter=None))
    assert "**not available at equal cost**" in section
    assert "TRACE's own checkpoints (TRACE @1/2) each trained on more than 1/4 of direct GRPO's episodes" in section
    assert results["efficiency"]["claim_at_ratio"] == {} and "trace_why" not in results["efficiency"]
    # nothing evaluated at all: "why", and TRACE's reason beside it
    records = trace_records(tmp_path / "off", quarter=None, half=None, trace_why=TRACE_WHY)
    records["efficiency"]["figures"] = {"fractions": [], "checkpoints": {}, "models": {}, "why": "off",
                                        "trace_why": TRACE_WHY}
    text, results, _, _ = render(tmp_path / "off", records)
    assert "Not measured: off.\n\nTRACE's own checkpoints: not measured (" in text
    assert results["efficiency"] == {"why": "off", "trace_why": TRACE_WHY}


def test_direct_grpos_first_point_at_or_above_trace_is_never_a_trace_checkpoint(tmp_path):
    """TRACE (30, 20) is above every direct GRPO point in mean; TRACE @1/2 (35, 25) is above TRACE: were TRACE's
    checkpoints among direct GRPO's points, it would be the first at or above TRACE."""
    _, results, _, section = render(tmp_path, trace_records(tmp_path, trace=(30, 20), quarter=(20, 12),
                                                            half=(35, 25)))
    assert results["efficiency"]["first_direct_point_at_or_above_trace"] == {"greedy": None, "sampled": None}
    assert ("Direct GRPO's first point at or above TRACE's mean pass^1: greedy none of its points (TRACE above all, "
            "in mean); T=1 none of its points") in section
    # direct GRPO's greedy curve in the equal-budget paragraph is its own: base, its checkpoints, its final
    assert "over its checkpoints: 0.200 → 0.300 → 0.400 → 0.500)" in section


def test_the_plot_draws_direct_grpo_and_trace_each_as_its_own_line(tmp_path, monkeypatch):
    import demo.report_plots as report_plots

    drawn: list = []
    save = report_plots.save_figure

    def capture(figure, path):
        drawn.append([{c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata()))
                       for c in axis.containers} for axis in figure.axes])
        return save(figure, path)

    monkeypatch.setattr(report_plots, "save_figure", capture)
    render(tmp_path, trace_records(tmp_path))
    assert (tmp_path / "efficiency.png").is_file()
    training, every = next(panels for panels in drawn if len(panels) == 2 and "TRACE, greedy" in panels[0])
    assert training["direct GRPO, greedy"] == ([0, 320, 640, 1280], pytest.approx([0.2, 0.3, 0.4, 0.5]))
    assert training["TRACE, greedy"] == ([320, 640, 1280], pytest.approx([0.9, 0.6, 0.24]))
    assert training["TRACE, T=1"] == ([320, 640, 1280], pytest.approx([0.8, 0.4, 0.22]))
    assert every["direct GRPO, T=1"][0] == [0, 320, 640, 1280]
    assert every["TRACE, greedy"][0] == [520, 840, 1480]  # + Step 1's 200 analysis episodes
