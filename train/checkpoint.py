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
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from common.io import InputError

CHECKPOINT_PREFIX = "iter_"


def _flatten_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of an optimizer state dict (keys: parameter index, or name under FSDP) + the JSON rest."""
    tensors, scalars = {}, {}
    for param_key, entry in state["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer::{param_key}::{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{param_key}::{name}"] = value
    key_type = "int" if all(isinstance(k, int) for k in state["state"]) else "str"
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars, "key_type": key_type}


def _unflatten_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    convert = int if meta["key_type"] == "int" else str
    state: dict[Any, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer::"):
            _, param_key, name = key.split("::", 2)
            state.setdefault(convert(param_key), {})[name] = value
    for key, value in meta["scalars"].items():
        param_key, name = key.split("::", 1)
        state.setdefault(convert(param_key), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    directory: Path,
    *,
    iteration: int,
    write_adapter: Callable[[Path], None],
    optimizer_state: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    backend_state: dict[str, Any],
) -> Path:
    """Write checkpoint `directory/iter_<iteration>` atomically (rank 0 only); returns its path."""
    final = directory / f"{CHECKPOINT_PREFIX}{iteration:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=directory))
    try:
        write_adapter(staging / "adapter")
        tensors, optimizer_meta = _flatten_optimizer_state(optimizer_state)
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
    checkpoint: Path, *, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> tuple[int, dict[str, Any], dict[str, torch.Tensor]]:
    """Restore scheduler and RNG states; returns (iteration, optimizer state dict, backend state tensors).

    The adapter weights are loaded by the caller from `checkpoint / "adapter"` before the optimizer is
    built, so that the optimizer's parameters are the restored ones; the caller then loads the optimizer
    state (through the policy, which knows whether it is sharded).
    """
    meta = json.loads((checkpoint / "trainer_state.json").read_text())
    tensors = load_file(str(checkpoint / "trainer_state.safetensors"))
    optimizer_state = _unflatten_optimizer_state(tensors, meta["optimizer"])
    scheduler.load_state_dict(meta["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    version, internal, gauss = meta["python_random"]
    random.setstate((version, tuple(internal), gauss))
    backend = {key.removeprefix("backend."): v for key, v in tensors.items() if key.startswith("backend.")}
    return int(meta["iteration"]), optimizer_state, backend
