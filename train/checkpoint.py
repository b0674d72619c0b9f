"""Checkpoints that make a killed run resume to the same result.

A checkpoint folder `checkpoints/iter_000010/` holds the adapter (PEFT format), `trainer_state.safetensors`
(optimizer moments; per rank: torch CPU and CUDA RNG states and the rollout backend's state, as tensors
named `rank<R>.…`) and `trainer_state.json` (iteration, world size, optimizer hyper-parameters, scheduler
state, each rank's Python RNG state). It is written into a temporary folder and renamed into place, so a
crash leaves either the whole checkpoint or none. Nothing is loaded with pickle.

Every rank keeps its own random streams (LoRA dropout masks depend on each rank's micro-batch shapes, and
each rank samples with its own seed), so a checkpoint can only be resumed by the same number of processes:
`check_resumable` says so, with the command to use, instead of resuming some ranks from another's state.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from common.validation import InputError
from common.io import same_path, staging_folder, tensor_bytes
from common.run_folder import check_output_dir, follow_umask, looks_local, run_entries
from train.config import GRPOConfig, load_config

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


def rank_state(backend_state: dict[str, Any]) -> dict[str, Any]:
    """What one rank contributes to a checkpoint: its RNG states and its rollout backend's state."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()  # the current device's generator
    for key, value in backend_state.items():
        if not torch.is_tensor(value):
            raise TypeError(f"backend state {key!r} must be a tensor to be checkpointed")
        tensors[f"backend.{key}"] = value.detach().cpu()
    return {"tensors": tensors, "python_random": _jsonable_random_state(random.getstate())}


def save_checkpoint(
    directory: Path,
    *,
    iteration: int,
    write_adapter: Callable[[Path], None],
    optimizer_state: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank_states: list[dict[str, Any]],
) -> Path:
    """Write checkpoint `directory/iter_<iteration>` atomically (rank 0 only); returns its path.

    `rank_states[r]` is `rank_state(...)` of rank r (gathered from every rank; one entry without torchrun).
    """
    final = directory / f"{CHECKPOINT_PREFIX}{iteration:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    tensors, optimizer_meta = _flatten_optimizer_state(optimizer_state)
    for rank, state in enumerate(rank_states):
        tensors.update({f"rank{rank}.{name}": value for name, value in state["tensors"].items()})
    with staging_folder(directory, ".ckpt-", tensor_bytes(tensors.values()),
                        "the earlier checkpoints are unchanged") as staging:
        write_adapter(staging / "adapter")
        save_file(tensors, str(staging / "trainer_state.safetensors"))
        meta = {
            "iteration": iteration,
            "world_size": len(rank_states),
            "optimizer": optimizer_meta,
            "scheduler": scheduler.state_dict(),
            "python_random": [state["python_random"] for state in rank_states],
        }
        (staging / "trainer_state.json").write_text(json.dumps(meta, indent=1))
        follow_umask(staging)  # mkdtemp and safetensors make owner-only entries
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)  # the staging folder becomes the checkpoint (nothing left to remove)
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


def checkpoint_world_size(meta: dict[str, Any], tensor_names: Iterable[str]) -> int:
    """Processes that wrote the checkpoint (checkpoints from before `world_size` was recorded: counted from
    their per-rank backend states, `backend.rank<R>.…`)."""
    if "world_size" in meta:
        return int(meta["world_size"])
    ranks = {name.split(".")[1] for name in tensor_names if name.startswith("backend.rank")}
    return max(1, len(ranks))


def check_resumable(checkpoint: Path, world_size: int) -> None:
    """Raise InputError, with the command to use, when `checkpoint` was written by another number of processes
    (cheap: reads only the metadata, so `python -m train` can say so before loading the model)."""
    meta = json.loads((checkpoint / "trainer_state.json").read_text())
    with safe_open(str(checkpoint / "trainer_state.safetensors"), framework="pt") as handle:
        saved_world = checkpoint_world_size(meta, list(handle.keys()))
    if saved_world != world_size:
        how = "plain `python -m train ...`" if saved_world == 1 else f"`torchrun --nproc_per_node={saved_world} ...`"
        raise InputError(
            f"{checkpoint} was written by a run with {saved_world} process(es); this run has {world_size}. "
            f"Resume with the same number of processes ({how}): each rank's sampler and random states are saved "
            "separately, and a run with another count would sample other groups on other streams. To train on "
            "from this adapter with another count, start a new run with a new --output_dir instead."
        )


def load_checkpoint(
    checkpoint: Path, *, scheduler: torch.optim.lr_scheduler.LRScheduler, rank: int = 0, world_size: int = 1
) -> tuple[int, dict[str, Any], dict[str, torch.Tensor]]:
    """Restore scheduler and this rank's RNG states; returns (iteration, optimizer state dict, this rank's
    backend state tensors). Raises InputError when the checkpoint was written by another number of processes.

    The adapter weights are loaded by the caller from `checkpoint / "adapter"` before the optimizer is
    built, so that the optimizer's parameters are the restored ones; the caller then loads the optimizer
    state (through the policy, which knows whether it is sharded).
    """
    check_resumable(checkpoint, world_size)
    meta = json.loads((checkpoint / "trainer_state.json").read_text())
    tensors = load_file(str(checkpoint / "trainer_state.safetensors"))
    optimizer_state = _unflatten_optimizer_state(tensors, meta["optimizer"])
    scheduler.load_state_dict(meta["scheduler"])
    prefix = f"rank{rank}."
    if f"{prefix}rng.torch" in tensors:
        torch.set_rng_state(tensors[f"{prefix}rng.torch"])
        if torch.cuda.is_available() and f"{prefix}rng.cuda" in tensors:
            torch.cuda.set_rng_state(tensors[f"{prefix}rng.cuda"])
        version, internal, gauss = meta["python_random"][rank]
        backend = {key.removeprefix(f"{prefix}backend."): v for key, v in tensors.items()
                   if key.startswith(f"{prefix}backend.")}
    else:  # written before per-rank states: rank 0's RNG only, backend states under `backend.rank<R>.`
        torch.set_rng_state(tensors["rng.torch"])
        version, internal, gauss = meta["python_random"]
        old_prefix = f"backend.rank{rank}."
        backend = {key.removeprefix(old_prefix): v for key, v in tensors.items() if key.startswith(old_prefix)}
    random.setstate((version, tuple(internal), gauss))
    return int(meta["iteration"]), optimizer_state, backend


# ------------------------------------------------------------------------------------------------------
# --resume RUN: the run continues in its own folder, with the config it saved there
# ------------------------------------------------------------------------------------------------------
# What a resume may change (the start line says so): how long to train, how often to checkpoint, what is logged.
RESUME_MAY_CHANGE = ("iterations", "save_every", "save_rollouts", "report_to")


@dataclass
class ResumePlan:
    checkpoint: Path  # the checkpoint the run continues from
    run_dir: Path  # the run folder holding it (and config.yaml)
    config: GRPOConfig  # the saved config, with the changes RESUME_MAY_CHANGE allows and output_dir set
    done: int  # iterations the checkpoint has done
    changes: list[str]  # what differs from the saved run, e.g. "iterations 16 -> 32"

    @property
    def finished(self) -> bool:
        return self.done >= self.config.iterations


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder of `RUN/checkpoints/iter_N` (a checkpoint outside a run's checkpoints/: its parent)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def _same_value(name: str, a: object, b: object) -> bool:
    if name == "model" and isinstance(a, str) and isinstance(b, str) and (looks_local(a) or looks_local(b)):
        return same_path(a, b)
    return a == b


def plan_resume(resume: Path, requested: dict[str, object], world_size: int, saved_path: Path | None = None,
                prefix: str = "--") -> ResumePlan:
    """What `--resume RUN` does: continue RUN's latest checkpoint (or the checkpoint named) in RUN, with the GRPO
    config RUN saved (`saved_path`, default RUN/config.yaml). Checks only metadata: call it before any model loads.

    `requested` holds the fields the command line and its --config file set. Raises InputError (one line) when the
    checkpoint was written by another number of processes, when a requested field differs from the saved one and
    is not in RESUME_MAY_CHANGE (naming each, as `prefix` + field: --learning_rate, grpo.learning_rate), when
    iterations is below what is done, or when `output_dir` names another folder that is not empty (a new or empty
    one gets the continued run; RUN then stays as it is).
    """
    checkpoint = latest_checkpoint(resume)
    check_resumable(checkpoint, world_size)
    run_dir = run_folder_of(checkpoint)
    saved_path = saved_path or run_dir / "config.yaml"
    if not saved_path.is_file():
        raise InputError(f"--resume {resume}: no {saved_path.name} in {run_dir}; --resume takes the output folder of a "
                         "training run (or one of its checkpoints/iter_N folders)")
    saved = load_config(saved_path)
    requested = dict(requested)
    output = requested.pop("output_dir", None)
    wanted = dataclasses.replace(saved, **requested)  # validated again (ValueError)
    differ = [name for name in requested if not _same_value(name, getattr(saved, name), getattr(wanted, name))]
    refused = [name for name in differ if name not in RESUME_MAY_CHANGE]
    if refused:
        named = ", ".join(f"{prefix}{name} {json.dumps(getattr(wanted, name))} (the run has "
                          f"{json.dumps(getattr(saved, name))})" for name in refused)
        raise InputError(f"--resume {resume}: {named}: a resume continues the run as {saved_path} saved it; leave "
                         f"{'that value' if len(refused) == 1 else 'those values'} out (only "
                         f"{', '.join(prefix + n for n in RESUME_MAY_CHANGE)} may change), or start a new run in a "
                         "new --output_dir")
    done = int(json.loads((checkpoint / "trainer_state.json").read_text())["iteration"])
    if wanted.iterations < done:
        raise InputError(f"{prefix}iterations {wanted.iterations}: {checkpoint} has already done {done} iterations; "
                         f"pass {prefix}iterations above {done} to train on, or leave it out")
    changes = [f"{name} {json.dumps(getattr(saved, name))} -> {json.dumps(getattr(wanted, name))}" for name in differ]
    target = run_dir
    if output and not same_path(output, run_dir):
        target = check_output_dir(output, "--output_dir")
        if target.is_dir() and run_entries(target):  # (rank 0 may hold it already: its lock is no run file)
            raise InputError(f"--output_dir {output}: a resume continues in its own run folder {run_dir}; leave out "
                             f"--output_dir, or give a new empty folder to continue {checkpoint.name} there "
                             f"({run_dir} then stays as it is)")
        changes.append(f"continues in {target} ({run_dir} stays as it is)")
    return ResumePlan(checkpoint, run_dir, dataclasses.replace(wanted, output_dir=str(target)), done, changes)
