"""Read back what a run sent to its trackers, with each tracker's own reader, and compare it with the run's file.

Used by tests/test_tracking.py, test_grpo_train.py, test_gate_training.py and test_demo.py. Every series is a
list of (step, value) in the order the reader returns it, so a step logged twice shows up twice.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

# The names every GRPO run (python -m train, gate GRPO, the demo's runs) logs, and the metrics.jsonl key of each:
# the contract two runs overlay on. Written out here, not imported, so a renamed or dropped scalar fails a test.
GRPO_NAMES = {
    "reward/mean": "mean_reward", "reward/mean_all_episodes": "mean_reward_all_episodes",
    "success/rate": "success_rate", "success/rate_all_episodes": "success_rate_all_episodes",
    "groups/constant_fraction": "frac_constant_groups", "groups/without_tokens": "groups_without_tokens",
    "loss": "loss", "grad_norm": "grad_norm", "kl": "approx_kl", "kl_ref": "kl_ref", "clip_ratio": "clip_fraction",
    "clip_ratio/low": "clip_low_fraction", "clip_ratio/high": "clip_high_fraction", "ratio/mean": "ratio_mean",
    "sampler_kl": "sampler_kl", "update/skipped": "skipped_update", "lr": "lr",
    "tokens_per_s/generation": "gen_tokens_per_s", "tokens_per_s/train": "train_tokens_per_s",
    "tokens/generated": "gen_tokens", "episodes_total": "episodes_total", "time/iteration_s": "seconds",
}
SFT_NAMES = {"loss": "loss", "accuracy/token": "token_accuracy", "lr": "lr", "tokens_per_s/train": "tokens_per_s"}
ROUTER_NAMES = {"loss": "loss", "router/cross_entropy": "cross_entropy", "router/balance": "balance",
                "accuracy/train": "train_accuracy", "accuracy/validation": "validation_accuracy"}


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def expected_series(file_rows: list[dict[str, Any]], names: dict[str, str], step_key: str) -> dict[str, list]:
    """What the trackers must hold: for each name, (step, value) of every row that has its key (a number)."""
    out: dict[str, list] = {}
    for name, key in names.items():
        series = [(int(row[step_key]), float(row[key])) for row in file_rows
                  if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)]
        if series:
            out[name] = series
    return out


def assert_same_series(logged: dict[str, list], expected: dict[str, list], float32: bool = False) -> None:
    """Same names, same steps (each once, in order) and the same values (to float32 for TensorBoard, which
    stores scalars as 32-bit floats)."""
    assert sorted(logged) == sorted(expected), (sorted(set(logged) ^ set(expected)), sorted(logged))
    for name, series in expected.items():
        got = logged[name]
        assert [s for s, _ in got] == [s for s, _ in series], (name, got, series)
        want = [np.float32(v) if float32 else v for _, v in series]
        assert [np.float32(v) if float32 else v for _, v in got] == want, (name, got, series)


# ---- TensorBoard ---------------------------------------------------------------------------------------------
def _accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})  # 0: keep every event
    accumulator.Reload()
    return accumulator


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the event files in `folder` (a run's tb/), read by TensorBoard's EventAccumulator."""
    accumulator = _accumulator(folder)
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def tensorboard_texts(folder: Path) -> dict[str, list[tuple[int, str]]]:
    """Every text summary (add_text) in `folder`: tag -> [(step, text)]."""
    from tensorboard.util import tensor_util

    accumulator = _accumulator(folder)
    out = {}
    for tag in accumulator.Tags()["tensors"]:
        out[tag] = [(event.step, tensor_util.make_ndarray(event.tensor_proto).item().decode())
                    for event in accumulator.Tensors(tag)]
    return out


# ---- wandb (offline run files) -------------------------------------------------------------------------------
_BLOCK = 32 * 1024
_WANDB_HEADER = 7  # ":W&B" + magic (2 bytes) + version (1 byte)


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a .wandb file: LevelDB's log format (32 KiB blocks of chunks: crc32, length, type)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    records, pending, offset = [], b"", _WANDB_HEADER
    while offset + 7 <= len(data):
        if _BLOCK - offset % _BLOCK < 7:  # a block's tail too short for a chunk header is padding
            offset += _BLOCK - offset % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:  # zero padding
            continue
        if kind == 1:  # FULL
            records.append(chunk)
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            records.append(pending + chunk)
            pending = b""
    return records


def wandb_offline_runs(folder: Path, run_id: str) -> list[Path]:
    """The offline run files of `run_id` under `folder/wandb` (a resumed run adds one), oldest first."""
    return sorted((folder / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))


def wandb_history(folder: Path, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], list[dict[str, Any]]]:
    """(scalar series, run records: name and config, one per run file) of every offline run file of `run_id`, read
    with wandb's own record protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    series: dict[str, list[tuple[int, float]]] = {}
    runs: list[dict[str, Any]] = []
    for path in wandb_offline_runs(folder, run_id):
        for data in _wandb_records(path):
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "history":
                values = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                          for item in record.history.item}
                for key, value in values.items():
                    if not key.startswith("_"):  # wandb's own _step, _runtime, _timestamp
                        series.setdefault(key, []).append((record.history.step.num, value))
            elif kind == "run":
                runs.append({"name": record.run.display_name, "config": {
                    item.key: json.loads(item.value_json) for item in record.run.config.update
                    if not item.key.startswith("_")}})
    return series, runs
