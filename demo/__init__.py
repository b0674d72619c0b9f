"""The embedded CPU demo (`make demo`, `python -m demo`): TRACE's loop on a world whose ground truth is
known. Its own room, apart from the benchmark-agnostic Step 1-2 tools in `pipeline/`:

    run.py           the steps, their fingerprints and resumption; the command line (python -m demo)
    config.py        the demo config (configs/demo.yaml, demo_fast.yaml) and its validation
    base_agent.py    the shipped base agent and its manifest (python -m demo.base_agent check|ship)
    selection.py     Step 1 on the base agent's results (rule-based or LLM labelers)
    rule_labeler.py  the rule-based stand-in labelers and the fixed candidate list
    trainable.py     which calibrated games Step 3 trains (the reward-spread rule)
    loop.py          Steps 2-4 and the baselines: calibration, GRPO runs, the gate, routing measurements
    report.py        report.md and results.json from the steps' records (never runs a model)
    plotting.py      matplotlib to files
    tau2.py          Step 1 alone on bundled real τ²-bench results (make demo-tau2)

loop.py and report.py do not import each other: both read trainable.py and plotting.py.
"""
