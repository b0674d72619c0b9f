"""Work queue over the selected capabilities (the export of aggregate_capabilities).

    python -m pipeline.capabilities next [--file F] [--json] [--claim]  # PENDING capability with the highest mean Δ
    python -m pipeline.capabilities mark NAME STATUS [--file F] # STATUS: PENDING / IN_PROGRESS / DONE
    python -m pipeline.capabilities list [--file F]

Each benchmark keeps its own list (`<output_dir>selected_capabilities.json` of its configs:
`pipeline/selected_capabilities.json` for τ²-Bench, `pipeline/swebench/selected_capabilities.json` for
SWE-bench), so the prompts pass `--file`; it may come before or after the command, and the
TRACE_SELECTED environment variable sets it for a whole shell. Without either, the file is
`pipeline/selected_capabilities.json`.

`next` exits 1 when nothing is PENDING; a missing/broken file, an unknown name or status exit 2.
`mark` rewrites the file atomically and keeps every other key of the entries (e.g. environment_path).

Several agents may share one list: `mark`, `next --claim` and the aggregation's merge of a new selection
(`aggregate_capabilities.write_outputs`) read, change and write the file under an exclusive lock (`locked`:
fcntl.flock on `.<file name>.lock` beside it, removed when released), so concurrent commands never lose each
other's updates. `next` alone only reads: two agents running `next` then `mark NAME IN_PROGRESS` can both get
the same capability (the second `mark` warns). `next --claim` picks the capability and marks it IN_PROGRESS in
one locked step, so each agent gets its own.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import sys
from pathlib import Path
from typing import Iterator

from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, load_json
from common.validation import InputError

DEFAULT_FILE = "pipeline/selected_capabilities.json"
FILE_VARIABLE = "TRACE_SELECTED"
STATUSES = ("PENDING", "IN_PROGRESS", "DONE")


def load_selected(path: str | Path) -> list[dict]:
    """Read the selected-capabilities list; InputError unless it is a list of {skill, status, mean_delta, ...}."""
    data = load_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of capabilities (the --export of aggregate_capabilities)")
    seen = set()
    for index, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("skill"), str):
            raise InputError(f"{path}: entry {index} needs a string 'skill'")
        if entry.get("status") not in STATUSES:
            raise InputError(f"{path}: entry {entry['skill']!r} has status {entry.get('status')!r}; "
                             f"expected one of {', '.join(STATUSES)}")
        mean_delta = entry.get("mean_delta")
        if isinstance(mean_delta, bool) or not isinstance(mean_delta, (int, float)) or not math.isfinite(mean_delta):
            raise InputError(f"{path}: entry {entry['skill']!r} needs a numeric 'mean_delta'")
        if entry["skill"] in seen:
            raise InputError(f"{path}: capability {entry['skill']!r} is listed twice")
        seen.add(entry["skill"])
    return data


def lock_path_for(path: str | Path) -> Path:
    """The lock file of the list at `path`: `.<name>.lock` in the same folder."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the list at `path` (blocking until other holders release it) for a
    load -> change -> write of it. The lock is fcntl.flock on `lock_path_for(path)`, which the holder removes
    when it is done; a waiter that then holds a removed file locks the new one instead. Where no lock file can be
    created (the folder is missing or read-only) the block runs unlocked: the list cannot be written there
    anyway, and reading or writing it fails with its own message."""
    lock_path = lock_path_for(path)
    handle = None
    while handle is None:
        try:
            handle = open(lock_path, "a+", encoding="utf-8")
        except OSError:
            break
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            same_file = os.fstat(handle.fileno()).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same_file = False
        if not same_file:  # the previous holder removed it as we opened it: lock the file now at the path
            handle.close()
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            with contextlib.suppress(OSError):
                lock_path.unlink()  # still under the flock: a waiter on this file sees it gone and locks a new one
            handle.close()


def next_pending(entries: list[dict]) -> dict | None:
    """The PENDING entry with the highest mean Δ (first in file order on ties), or None."""
    pending = [entry for entry in entries if entry["status"] == "PENDING"]
    return max(pending, key=lambda entry: entry["mean_delta"]) if pending else None


def mark(entries: list[dict], name: str, status: str) -> list[dict]:
    """Set the status of capability `name` (in place, also returned); InputError for an unknown name/status."""
    status = status.upper()
    if status not in STATUSES:
        raise InputError(f"unknown status {status!r}; use one of {', '.join(STATUSES)}")
    for entry in entries:
        if entry["skill"] == name:
            entry["status"] = status
            return entries
    known = ", ".join(entry["skill"] for entry in entries) or "(none)"
    raise InputError(f"unknown capability {name!r}; known: {known}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.capabilities",
                                     description="Pick and mark capabilities from the selected list.")
    file_help = f"selected list (default ${FILE_VARIABLE}, else {DEFAULT_FILE})"
    parser.add_argument("--file", dest="top_file", default=None, help=file_help)
    sub = parser.add_subparsers(dest="command", required=True)
    next_parser = sub.add_parser("next", help="print the PENDING capability with the highest mean Δ")
    next_parser.add_argument("--json", action="store_true", help="print the whole entry as JSON")
    next_parser.add_argument("--claim", action="store_true",
                             help="also mark it IN_PROGRESS, in one locked step (agents sharing the list each get "
                                  "their own capability)")
    mark_parser = sub.add_parser("mark", help="set the status of a capability")
    mark_parser.add_argument("name")
    mark_parser.add_argument("status", help="PENDING, IN_PROGRESS or DONE")
    sub.add_parser("list", help="print every capability with its status")
    for sub_parser in sub.choices.values():
        sub_parser.add_argument("--file", default=None, help=file_help)
    args = parser.parse_args(argv)
    if args.file and args.top_file and args.file != args.top_file:
        print(f"error: two different --file values ({args.top_file}, {args.file}); give one", file=sys.stderr)
        return 2
    args.file = args.file or args.top_file or os.environ.get(FILE_VARIABLE) or DEFAULT_FILE
    if args.command == "mark":
        with locked(args.file):  # load -> change -> write with no other writer in between
            entries = load_selected(args.file)
            before = next((entry["status"] for entry in entries if entry["skill"] == args.name), None)
            mark(entries, args.name, args.status)
            atomic_write_json(args.file, entries)
        print(f"{args.name}: {args.status.upper()}")
        if before == "IN_PROGRESS" and args.status.upper() == "IN_PROGRESS":
            print(f"warning: {args.name} was already IN_PROGRESS in {args.file}: another agent may be working on it "
                  f"(`next --claim` gives each agent its own capability)", file=sys.stderr)
        return 0
    if args.command == "next":
        with locked(args.file) if args.claim else contextlib.nullcontext():
            entries = load_selected(args.file)
            entry = next_pending(entries)
            if entry is not None and args.claim:
                entry["status"] = "IN_PROGRESS"
                atomic_write_json(args.file, entries)
        if entry is None:
            print(f"no PENDING capability in {args.file}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(entry, indent=2, ensure_ascii=False))
        else:
            print(entry["skill"])
            print(entry.get("description", ""))
    else:
        entries = load_selected(args.file)
        for entry in entries:
            print(f"{entry['status']:<12} {entry['mean_delta']:+.3f}  {entry['skill']}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
