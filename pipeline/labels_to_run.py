"""Turn flat per-trajectory labels into one aggregation run file.

    python -m pipeline.labels_to_run LABELS.jsonl --outcomes OUT.jsonl --attempt N --out run_N.json [--missing-as NA]

A label line is `{"trajectory_id", "capability", "label"}` with label NA / PRESENT / LACKING (any case);
outcomes are `_summarize` records (`id`, `passed`). Trajectories whose `passed` is null cannot be used:
they are left out (with a warning), and so are their label lines. Every capability mentioned must label
every usable trajectory; a gap is an error unless `--missing-as` fills it (the count is reported).
A labels file without a single label line is an error (a labeler that labeled nothing is not a run).
The output is checked with `aggregate_capabilities.validate_run` before it is written; --out is checked
before any file is read.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Sequence

from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, check_output_path, load_jsonl
from common.validation import InputError
from pipeline.aggregate_capabilities import CATEGORIES, FAILED_KEYS, PASSED_KEYS, validate_run


class SkippedTrajectoryWarning(UserWarning):
    """Trajectories with unknown outcome were left out, or missing labels were filled."""


def _trajectory_id(value: object, where: str) -> str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise InputError(f"{where}: 'trajectory_id' must be a non-empty string (got {value!r})")


def _outcome_table(outcomes: Sequence[dict]) -> tuple[dict[str, bool], list[str]]:
    """(usable id -> passed, in file order; ids with unknown outcome)."""
    usable: dict[str, bool] = {}
    unknown: list[str] = []
    seen: set[str] = set()
    for number, record in enumerate(outcomes, start=1):
        where = f"outcomes record {number}"
        if not isinstance(record, dict) or "id" not in record or "passed" not in record:
            raise InputError(f"{where}: expected a _summarize record with 'id' and 'passed'")
        traj_id = str(record["id"])
        if traj_id in seen:
            raise InputError(f"{where}: trajectory id {traj_id!r} occurs twice in the outcomes")
        seen.add(traj_id)
        passed = record["passed"]
        if passed is None:
            unknown.append(traj_id)
        elif isinstance(passed, bool):
            usable[traj_id] = passed
        else:
            raise InputError(f"{where}: 'passed' must be true, false or null (got {passed!r})")
    return usable, unknown


def labels_to_run(records: Sequence[dict], outcomes: Sequence[dict], attempt: int,
                  missing_as: str | None = None) -> dict:
    """Build a run object `{attempt, totals, labels}` from flat label records and `_summarize` outcomes.

    Raises InputError for an unknown trajectory id or label, conflicting labels of one pair, or (unless
    `missing_as` names a label to fill in) a trajectory without a label for a capability that others have.
    Issues SkippedTrajectoryWarning for trajectories with unknown outcome and for filled-in labels.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise InputError(f"attempt must be a non-negative integer (got {attempt!r})")
    fill = None
    if missing_as is not None:
        fill = missing_as.upper()
        if fill not in CATEGORIES:
            raise InputError(f"--missing-as {missing_as!r}: use one of {', '.join(CATEGORIES)}")
    if not records:
        raise InputError("no label records (an empty labels file?): this labeler labeled nothing; run it again "
                         "rather than turning it into a run file")
    usable, unknown = _outcome_table(outcomes)
    unknown_set = set(unknown)
    if unknown:
        warnings.warn(f"{len(unknown)} trajectories with unknown outcome (passed = null) left out: "
                      f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}", SkippedTrajectoryWarning)
    chosen: dict[str, dict[str, str]] = {}  # capability -> trajectory id -> label
    for number, record in enumerate(records, start=1):
        where = f"label record {number}"
        if not isinstance(record, dict) or not {"trajectory_id", "capability", "label"} <= record.keys():
            raise InputError(f"{where}: expected {{'trajectory_id', 'capability', 'label'}}")
        traj_id = _trajectory_id(record["trajectory_id"], where)
        capability = record["capability"]
        if not isinstance(capability, str) or not capability:
            raise InputError(f"{where}: 'capability' must be a non-empty string")
        label = record["label"].upper() if isinstance(record["label"], str) else None
        if label not in CATEGORIES:
            raise InputError(f"{where}: unknown label {record['label']!r}; use NA, PRESENT or LACKING")
        if traj_id in unknown_set:
            continue
        if traj_id not in usable:
            raise InputError(f"{where}: unknown trajectory id {traj_id!r} (not in the outcomes file)")
        previous = chosen.setdefault(capability, {}).setdefault(traj_id, label)
        if previous != label:
            raise InputError(f"{where}: trajectory {traj_id!r} is labeled both {previous} and {label} for "
                             f"capability {capability!r}")
    labels = {}
    n_filled = 0
    for capability, by_id in chosen.items():
        missing = [traj_id for traj_id in usable if traj_id not in by_id]
        if missing and fill is None:
            raise InputError(f"capability {capability!r} has no label for {len(missing)} trajectories "
                             f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); label them or "
                             "pass --missing-as NA")
        n_filled += len(missing)
        lists = {key: [] for key in FAILED_KEYS + PASSED_KEYS}
        for traj_id, passed in usable.items():  # outcome-file order, so the output is deterministic
            code = CATEGORIES.index(by_id.get(traj_id, fill))
            lists[(PASSED_KEYS if passed else FAILED_KEYS)[code]].append(traj_id)
        labels[capability] = {key: lists[key] for key in ("lacking_failed", "present_failed", "na_failed",
                                                          "lacking_passed", "present_passed", "na_passed")}
    if n_filled:
        warnings.warn(f"filled {n_filled} missing (trajectory, capability) labels with {fill}", SkippedTrajectoryWarning)
    n_passed = sum(usable.values())
    run = {"attempt": attempt, "totals": {"total_failed": len(usable) - n_passed, "total_passed": n_passed},
           "labels": labels}
    validate_run(run, "labels_to_run output")
    return run


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.labels_to_run",
                                     description="Convert flat label records into an aggregation run file.")
    parser.add_argument("labels", help="JSONL of {trajectory_id, capability, label}")
    parser.add_argument("--outcomes", required=True, help="_summarize output JSONL (id, passed)")
    parser.add_argument("--attempt", type=int, required=True, help="run number stored in the file")
    parser.add_argument("--out", required=True, help="run file to write")
    parser.add_argument("--missing-as", default=None, help="label for missing pairs (NA); default: error")
    args = parser.parse_args(argv)
    check_output_path(args.out, "--out", [("the labels file", args.labels), ("--outcomes", args.outcomes)])
    records = load_jsonl(args.labels)
    outcomes = load_jsonl(args.outcomes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedTrajectoryWarning)
        try:
            run = labels_to_run(records, outcomes, args.attempt, missing_as=args.missing_as)
        except InputError as err:  # name the files: the API only knows record numbers
            raise InputError(f"{args.labels} / {args.outcomes}: {err}") from None
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    atomic_write_json(Path(args.out), run)
    totals = run["totals"]
    print(f"wrote {args.out}: {len(run['labels'])} capabilities, {totals['total_failed']} failed + "
          f"{totals['total_passed']} passed trajectories", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
