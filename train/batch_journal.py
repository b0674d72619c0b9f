"""Batched episodes that survive their process: what `train.evaluate` and `train.collect_rollouts` share.

`play_journaled(requests, keys, batch_size, backend, journal, play_batch)` plays `requests` `batch_size` at a
time through `play_batch` (-> one simulation per request) and keeps, as each batch ends, its episodes and then
the rollout backend's sampler state (`RolloutBackend.state_dict`: the in-process generator, a vLLM backend's
call counter) in a `ResultsJournal`. A batch counts as finished once its state is kept. A rerun of the same
command skips the finished batches and restarts the sampler from the state after the last of them, so its
episodes are exactly those of an uninterrupted run, at any temperature; a batch cut short (killed, Ctrl-C, a
server that failed for good) is played again whole, and its episodes an earlier run already kept are not
written twice.

Why whole batches and not episodes: the in-process sampler draws one number per row of a call (train/sampling.py),
so an episode's tokens depend on the batch it was played in; replaying a batch from its starting state is what
makes the continued run equal the uninterrupted one.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from benchmarks.results_journal import Key, ResultsJournal
from train.backends import RolloutBackend
from train.episodes import EpisodeRequest


def _mark(batch: int) -> str:
    return f"sampler_after_batch_{batch}"


def encode_state(state: dict[str, Any]) -> str:
    """A backend's state_dict (tensors) as text for a journal line."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_state(text: str) -> dict[str, Any]:
    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)


def play_journaled(requests: Sequence[EpisodeRequest], keys: Sequence[Key], batch_size: int,
                   backend: RolloutBackend, journal: ResultsJournal | None,
                   play_batch: Callable[[Sequence[EpisodeRequest]], list[dict[str, Any]]],
                   on_batch: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """One simulation per request, in the requests' order (`keys[i]` names request i in the journal). Without a
    journal, every batch is played and nothing is kept. `on_batch(n)` is told each batch's size (progress)."""
    starts = range(0, len(requests), batch_size)
    done = 0
    while journal is not None and done < len(starts) and _mark(done) in journal.marks:
        done += 1
    if done:
        backend.load_state_dict(decode_state(journal.marks[_mark(done - 1)]))
        print(f"{journal.path}: {done} of {len(starts)} batches already played ({len(journal.scored)} episodes "
              "kept); continuing", file=sys.stderr)
        if on_batch is not None:
            on_batch(min(len(requests), done * batch_size))
    simulations = []
    for number, start in enumerate(starts):
        if number < done:
            continue
        chunk = requests[start : start + batch_size]
        played = play_batch(chunk)
        if journal is None:
            simulations.extend(played)
        else:
            for key, simulation in zip(keys[start : start + batch_size], played):
                if key not in journal.scored:  # kept by a run stopped before this batch's state: the same episode
                    journal.add(key, simulation, {})
            journal.mark(_mark(number), encode_state(backend.state_dict()))
        if on_batch is not None:
            on_batch(len(chunk))
    if journal is not None:
        simulations = [journal.scored[key][0] for key in keys]
    return simulations


def folder_fingerprint(folder: str | os.PathLike | None) -> str | None:
    """sha256 over the (name, size, modification time) of a model or adapter folder's files: the journal of a run
    refuses to continue with other weights at the same path (e.g. an adapter trained again)."""
    if folder is None:
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
