"""Every numeric flag of every swept command line, given a zero, a negative number and a word (issue 45 point 5).

The flags are read from each command's own argparse parser (the parser is captured when the command parses its
arguments), so a numeric flag added later is swept without editing this file. For each flag and each bad value
the command either refuses it at the door (exit 2, the last line of stderr names the flag, no traceback, nothing
written, the work never started) or accepts it because the value means something there, and then the pair is
in ACCEPTED with the reason. An accepted value not listed there, or a listed one that is now refused, fails the
test: the list is the documentation of what each number may be.
"""
from __future__ import annotations

import argparse
import re

import pytest

from common.cli import seed_value
from test_cli_bad_input import SWEEP, Recorder, _entry_points, _files

BAD_VALUES = ("0", "-1", "abc")
NUMERIC_TYPES = (int, float, seed_value)
# argparse's own refusal (a wrong type, a value outside `choices`, `parser.error`): the usage, then one line.
ARGPARSE_ERROR = re.compile(r"^\S.*: error: ")

# (entry point, flag, value): why the value is a valid setting rather than bad input.
ACCEPTED = {
    ("aggregate_capabilities", "--rho", "0"): "Cov >= 0: no coverage floor",
    ("aggregate_capabilities", "--delta", "0"): "Δ >= 0: any capability lacking more often in failures",
    ("aggregate_capabilities", "--delta", "-1"): "Δ is a difference of two rates, in [-1, 1] (AggregationConfig)",
    ("demo_tau2", "--rho", "0"): "as aggregate_capabilities --rho",
    ("demo_tau2", "--delta", "0"): "as aggregate_capabilities --delta",
    ("demo_tau2", "--delta", "-1"): "as aggregate_capabilities --delta",
    ("tau2_run", "--user-temperature", "0"): "the customer's greedy sampling (τ²-bench's default)",
    ("tau2_run", "--user-max-retries", "0"): "try each customer request once",
    ("bench/gate_overhead", "--target", "0"): "report only: the bench never fails on speed",
    ("bench/sft_step", "--target", "0"): "report only: the bench never fails on speed",
    ("bench/gate_overhead", "--threads", "0"): "torch's default number of threads (documented)",
    ("bench/sft_step", "--threads", "0"): "torch's default number of threads (documented)",
    **{("calibrate_environment", flag, "0"): "a largest share of groups of that kind: 0 allows none"
       for flag in ("--max-all-success-groups", "--max-all-zero-groups", "--max-constant-groups")},
    ("calibrate_environment", "--min-informative-groups", "0"): "a smallest share of groups: 0 asks for none",
    ("calibrate_environment", "--min-mean-reward", "0"): "a lower bound on the mean reward: 0 is no bound",
    ("calibrate_environment", "--min-success-rate", "0"): "a lower bound on the success rate: 0 is no bound",
    ("phase3_synthesize", "--rounds", "0"): "mutation rounds at most: 0 keeps the generated scenarios as they are",
    ("swebench.calibrate", "--rounds", "0"): "mutation rounds at most: 0 keeps the generated scenarios as they are",
    ("phase3_synthesize", "--threshold", "0"): "accept at success rate <= 0: only scenarios the model never solves",
    ("swebench.calibrate", "--threshold", "0"): "accept at success rate <= 0: only scenarios the model never solves",
    ("phase4_validate", "--fuzz-actions", "0"): "no fuzzing (the checks that play the oracle still run)",
    ("validate_game", "--fuzz-actions", "0"): "no fuzzing (the checks that play the oracle still run)",
    ("validate_game", "--probe-tolerance", "0"): "probes held exactly to their limits",
    ("swebench.generate", "--n-decoys", "0"): "no decoy helpers (0..5)",
    ("calibrate_environment", "--min-reward-std", "0"): "no floor on the reward spread",
    ("label_trajectories", "--rho", "0"): "as aggregate_capabilities --rho",
    ("label_trajectories", "--delta", "0"): "as aggregate_capabilities --delta",
    ("label_trajectories", "--delta", "-1"): "as aggregate_capabilities --delta",
    ("label_trajectories", "--backoff-base", "0"): "retry at once",
    ("label_trajectories", "--http-retries", "0"): "no retries: the first server error stops the call",
    ("label_trajectories", "--max-defaulted-share", "0"): "no pair may be defaulted to NA: any default fails the run",
    ("label_trajectories", "--max-retry-after", "0"): "accept no server-requested wait (RetryPolicy)",
    ("label_trajectories", "--propose-failed", "0"): "no failed trajectories in the proposal sample (>= 0)",
    ("label_trajectories", "--propose-passed", "0"): "no passed trajectories in the proposal sample (>= 0)",
    ("labels_to_run", "--attempt", "0"): "a run number; the file records it (>= 0)",
    ("swebench.selftest", "--min-regression", "0"): "no regression test required beside the target test",
    ("train.sft", "--final-lr-ratio", "0"): "the schedule decays to 0",
    ("bench/env_step", "--target", "0"): "report only: the bench never fails on speed",
    ("bench/rollout_backends", "--target", "0"): "report only: the bench never fails on speed",
    ("bench/scenario_selftest", "--target", "0"): "report only: the bench never fails on speed",
    ("bench/rollout_backends", "--threads", "0"): "torch's default number of threads (documented)",
    ("bench/scenario_selftest", "--mutation-rounds", "0"): "no mutation: the generated scenarios as they are",
    ("bench/game_success", "--temperatures", "0"): "greedy decoding, as --temperature 0",
    ("moe_gate.serve", "--port", "0"): "any free port (documented; the line it prints names the one taken)",
    ("phase2_capability_mining", "--rho", "0"): "as aggregate_capabilities --rho",
    ("phase2_capability_mining", "--delta", "0"): "as aggregate_capabilities --delta",
    ("phase2_capability_mining", "--delta", "-1"): "as aggregate_capabilities --delta",
    ("train.sft", "--warmup-steps", "0"): "no warm-up",
}


def accepted_anywhere(flag: str, value: str) -> bool:
    """Values every command takes: seed 0, and temperature 0 (greedy decoding)."""
    return value == "0" and ("seed" in flag or flag == "--temperature")


class _Started(Exception):
    """Raised by the stand-in for a command's work: the value was accepted; nothing after it runs."""


class WorkRecorder(Recorder):
    def __call__(self, *args, **kwargs):
        super().__call__(*args, **kwargs)
        raise _Started


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser the command built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def numeric_flags(main, argv: list[str], monkeypatch) -> dict[str, set[str]]:
    """{flag: the names an error may call it by} for `main`'s numeric flags (NUMERIC_TYPES), the chosen
    subcommand's included: each of its option strings, and its destination (`--max-chars` is `max_chars` in a
    config's message)."""
    def capture(self, args=None, namespace=None):
        raise _Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        try:
            main(argv)
        except _Parsed as parsed:
            parser = parsed.parser
        else:
            raise AssertionError("the command did not parse its arguments with argparse")
    flags = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(argv[0])
            actions = sub._actions if sub is not None else []
        else:
            actions = [action]
        for one in actions:
            if one.option_strings and one.type in NUMERIC_TYPES:
                flags[max(one.option_strings, key=len)] = {*one.option_strings, one.dest}
    return flags


def run_flag(main, argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of one command line, argparse's own exit included."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    except _Started:
        code = None
    return code, capsys.readouterr().err


# Commands whose accepted values run real work at default sizes: swept with the slow tests (make test stays under
# 5 minutes).
SLOW_TO_SWEEP = {"bench/sft_step": "--target 0 and --threads 0 are accepted, so the whole bench runs (~7 s)"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_TO_SWEEP else name
                                  for name in sorted(SWEEP)])
def test_every_numeric_flag_refuses_zero_negative_and_words(name, tmp_path, tiny_model_dir, monkeypatch, capsys):
    main, argvs, (module, work) = _entry_points(tmp_path, tiny_model_dir, monkeypatch)[name]
    (tmp_path / "folder").mkdir()
    (tmp_path / "a_file").write_text("keep me\n")
    argv = argvs["ok"]
    flags = numeric_flags(main, argv, monkeypatch)
    if not flags:
        return  # nothing to sweep (test_cli_bad_input.py sweeps its files and outputs)
    started = WorkRecorder()
    monkeypatch.setattr(module, work, started)
    code, err = run_flag(main, argv, capsys)
    assert started.calls, f"the valid command line stops before its work: exit {code}, {err.strip()[-500:]!r}"
    problems, accepted = [], set()
    for flag, names in flags.items():
        for value in BAD_VALUES:
            started = WorkRecorder()
            monkeypatch.setattr(module, work, started)
            before = _files(tmp_path)
            code, err = run_flag(main, [*argv, f"{flag}={value}"], capsys)
            if started.calls:
                if not accepted_anywhere(flag, value):
                    accepted.add((name, flag, value))
                continue
            lines = err.strip().splitlines()
            named = bool(lines) and any(re.search(rf"(^|[^\w-]){re.escape(n)}([^\w-]|$)", lines[-1]) for n in names)
            if code != 2 or not named or "Traceback" in err or _files(tmp_path) != before:
                problems.append(f"{flag}={value}: exit {code}, {err.strip()[-300:]!r}")
            elif len(lines) > 1 and not ARGPARSE_ERROR.match(lines[-1]):
                problems.append(f"{flag}={value}: more than one line: {err.strip()!r}")
    listed = {key for key in ACCEPTED if key[0] == name}
    assert not problems, "\n".join(problems)
    assert accepted - listed == set(), f"accepted without a reason in ACCEPTED: {sorted(accepted - listed)}"
    assert listed - accepted == set(), f"in ACCEPTED but refused now (remove them): {sorted(listed - accepted)}"


def test_the_sweep_finds_a_planted_flag_that_accepts_anything(monkeypatch, capsys):
    """A command with an unchecked count: its zero and negative values reach the work and are reported."""
    work = Recorder()

    def main(argv):
        parser = argparse.ArgumentParser()
        parser.add_argument("--tasks", type=int, default=3)
        args = parser.parse_args(argv)
        work(args.tasks)
        return 0

    assert numeric_flags(main, [], monkeypatch) == {"--tasks": {"--tasks", "tasks"}}
    assert run_flag(main, ["--tasks=-1"], capsys)[0] == 0
    assert work.calls == [(-1,)]
