"""An evaluation that survives its server and its process: every scored episode is kept as it finishes.

`ResultsJournal(out, settings)` is `<out>.partial.jsonl`, next to the results file the run will write:

- line 1 `{"settings": ...}`: what decides the results (agent, seed, tasks, trials, config, sampling); a rerun
  with other settings is refused (InputError naming the difference), so two runs never mix;
- then one line per finished episode, `{"key": [task_index, trial], "simulation": ..., "task": ...}`, written
  and fsync-ed as the episode ends: a process killed at any point loses at most the episode it was playing
  (a cut-off last line is cut from the file when the journal is opened again, and that episode played again);
- or `{"key": ..., "server_error": "..."}` for an episode the agent's server could not serve after its retries
  (benchmarks.agents.ServerError): recorded, never scored as 0, and played again by the next run;
- or `{"mark": name, "value": ...}`: what a caller needs, beside the episodes, to continue exactly where it
  stopped (the batched evaluation's sampler state after each batch); the last value of a name wins.

A rerun of the same command continues from what was scored: every episode is scored exactly once. The holder
takes an `flock` on the journal, so a second process on the same results file is refused at once. When every
episode is scored, the caller writes the results file and `remove()`s the journal.

Why not write the results file itself as episodes finish: it is one JSON document (τ²-bench's format) that
readers load whole; rewriting it per episode costs O(n²) and a half-run file would look like a finished one.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from tqdm import tqdm

from benchmarks.agents import Agent, ServerError
from common.cli import Interrupted
from common.io import append_line
from common.validation import InputError

Key = tuple[int, int]  # (task index, trial)


class ResultsJournal:
    """The episodes of one run scored so far (see the module docstring)."""

    def __init__(self, out: str | os.PathLike, settings: dict[str, Any]) -> None:
        self.path = Path(f"{os.fspath(out)}.partial.jsonl")
        self.settings = json.loads(json.dumps(settings, sort_keys=True, default=str))  # as it reads back
        self.scored: dict[Key, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.errors: dict[Key, str] = {}
        self.marks: dict[str, Any] = {}
        self._handle: Any = None

    def __enter__(self) -> "ResultsJournal":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise InputError(f"{self.path} is in use by another run of the same results file; wait for it to end, "
                             "or write --out elsewhere") from None
        handle.seek(0)
        text = handle.read()
        whole = text[:text.rfind("\n") + 1]
        if whole != text:  # the line a killed process was writing: cut, so the next line starts on its own
            os.ftruncate(handle.fileno(), len(whole.encode("utf-8")))
        lines = whole.split("\n")
        self._handle = handle
        if not lines[0].strip():  # a new journal
            self._write({"settings": self.settings})
            return self
        saved = json.loads(lines[0]).get("settings")
        if saved != self.settings:
            differ = sorted(k for k in set(saved or {}) | set(self.settings)
                            if (saved or {}).get(k) != self.settings.get(k))
            handle.close()
            raise InputError(f"{self.path} holds a run with other settings ({', '.join(differ)} differ); rerun that "
                             f"command to finish it, or delete {self.path.name} to start this one over")
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                raise InputError(f"{self.path}: line {number} is not JSON; delete the file to start over") from None
            if "simulation" in entry:  # a server error of an earlier run is not kept: this run plays it again
                self.scored[(int(entry["key"][0]), int(entry["key"][1]))] = (entry["simulation"], entry["task"])
            elif "mark" in entry:
                self.marks[entry["mark"]] = entry["value"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _write(self, entry: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(entry, ensure_ascii=False) + "\n")

    def add(self, key: Key, simulation: dict[str, Any], task: dict[str, Any]) -> None:
        """Keep one scored episode (durably, before the next one starts)."""
        self._write({"key": list(key), "simulation": simulation, "task": task})
        self.scored[key] = (simulation, task)
        self.errors.pop(key, None)

    def mark(self, name: str, value: Any) -> None:
        """Keep a value the run needs to continue where it stopped (after the episodes written before it)."""
        self._write({"mark": name, "value": value})
        self.marks[name] = value

    def server_error(self, key: Key, message: str) -> None:
        """Record an episode the server could not serve (not a score: the next run plays it again)."""
        self._write({"key": list(key), "server_error": message})
        self.errors[key] = message

    def play_missing(self, keys: list[Key], play: Callable[[Key], tuple[dict[str, Any], dict[str, Any]]],
                     desc: str, progress: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Play every key of `keys` not yet scored (`play(key)` -> (simulation, task entry)), each kept as it ends;
        a ServerError is recorded as not scored (`errors`). Returns (simulations, tasks) of the scored keys in the
        order of `keys`, each task once."""
        todo = [key for key in keys if key not in self.scored]
        if len(todo) < len(keys):
            print(f"{self.path}: {len(keys) - len(todo)} of {len(keys)} episodes already scored; playing the other "
                  f"{len(todo)}", file=sys.stderr)
        bar = tqdm(total=len(keys), initial=len(keys) - len(todo), desc=desc, unit="ep", file=sys.stderr,
                   disable=not progress)
        for key in todo:
            try:
                simulation, task = play(key)
            except ServerError as err:
                self.server_error(key, str(err))
            else:
                self.add(key, simulation, task)
            bar.update(1)
        bar.close()
        scored = [self.scored[key] for key in keys if key in self.scored]
        tasks: dict[Any, dict[str, Any]] = {}
        for simulation, task in scored:
            tasks.setdefault(simulation["task_id"], task)
        return [simulation for simulation, _ in scored], list(tasks.values())

    def remove(self) -> None:
        """The run is complete and its results file written: the journal goes."""
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def kept_on_interrupt(journal: ResultsJournal, what: str) -> Iterator[None]:
    """Around a CLI's journaled run: a Ctrl-C ends it with one line saying how many `what` the journal keeps and
    how to continue (common/cli.py's Interrupted); a run that recorded nothing (interrupted, or refused by its
    server, before its first episode ended) leaves no journal behind, so a corrected command is not refused as a run
    with other settings. Used by train.evaluate and train.collect_rollouts too."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"{len(journal.scored)} {what} are kept in {journal.path}: run the same command again to "
                          "continue") from None
    finally:
        if not journal.scored and not journal.marks and not journal.errors:
            journal.remove()


def agent_settings(agent: Agent) -> dict[str, Any]:
    """The agent as a journal's settings name it: its `describe()` (for a local model, the fingerprints of its
    model and adapter folders, so other weights at the same path are another run) less where its server listens
    (a restarted server may move)."""
    return {k: v for k, v in agent.describe().items() if k != "base_url"}
