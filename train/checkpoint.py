"""Checkpoints that make a killed run resume to the same result.

A checkpoint folder `checkpoints/iter_000010/` holds the adapter (PEFT format), `trainer_state.safetensors`
(optimizer moments, RNG states as tensors) and `trainer_state.json` (iteration, optimizer hyper-parameters,
Python RNG state, scheduler state). It is written into a temporary folder and renamed into place, so a
crash leaves either the whole checkpoint or none. Nothing is loaded with pickle.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline._io import InputError

CHECKPOINT_PREFIX = "iter_"


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def save_checkpoint(
    directory: Path,
    *,
    iteration: int,
    save_adapter,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    backend_state: dict[str, Any],
) -> Path:
    """Write checkpoint `directory/iter_<iteration>` atomically; returns its path."""
    final = directory / f"{CHECKPOINT_PREFIX}{iteration:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=directory))
    try:
        save_adapter(staging / "adapter")
        tensors, optimizer_meta = _optimizer_tensors(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        for key, value in backend_state.items():
            if not torch.is_tensor(value):
                raise TypeError(f"backend state {key!r} must be a tensor to be checkpointed")
            tensors[f"backend.{key}"] = value
        save_file(tensors, str(staging / "trainer_state.safetensors"))
        meta = {
            "iteration": iteration,
            "optimizer": optimizer_meta,
            "scheduler": scheduler.state_dict(),
            "python_random": _jsonable_random_state(random.getstate()),
        }
        (staging / "trainer_state.json").write_text(json.dumps(meta, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _jsonable_random_state(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def latest_checkpoint(path: Path) -> Path:
    """`path` itself if it is a checkpoint, else the newest `iter_*` under `path` or `path/checkpoints`."""
    if (path / "trainer_state.json").is_file():
        return path
    for folder in (path, path / "checkpoints"):
        found = sorted(folder.glob(f"{CHECKPOINT_PREFIX}*")) if folder.is_dir() else []
        found = [f for f in found if (f / "trainer_state.json").is_file()]
        if found:
            return found[-1]
    raise InputError(f"{path}: no checkpoint found (expected {CHECKPOINT_PREFIX}NNNNNN/trainer_state.json)")


def load_checkpoint(
    checkpoint: Path,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, dict[str, torch.Tensor]]:
    """Restore optimizer, scheduler and RNG states; returns (iteration, backend state tensors).

    The adapter weights are loaded by the caller from `checkpoint / "adapter"` before the optimizer is
    built, so that the optimizer's parameters are the restored ones.
    """
    meta = json.loads((checkpoint / "trainer_state.json").read_text())
    tensors = load_file(str(checkpoint / "trainer_state.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for key, value in meta["optimizer"]["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    scheduler.load_state_dict(meta["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    version, internal, gauss = meta["python_random"]
    random.setstate((version, tuple(internal), gauss))
    backend = {key.removeprefix("backend."): v for key, v in tensors.items() if key.startswith("backend.")}
    return int(meta["iteration"]), backend
