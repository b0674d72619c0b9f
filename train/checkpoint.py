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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from common.validation import InputError
from common.io import (atomic_write_text, fsync_path, fsync_tree, jsonl_lines, same_path, staging_folder,
                       tensor_bytes)
from common.run_folder import check_output_dir, follow_umask, looks_local, run_entries, sigint_deferred
from train.config import GRPOConfig, load_config

CHECKPOINT_PREFIX = "iter_"
METRICS_NAME = "metrics.jsonl"
ABANDONED_NAME = "abandoned"  # RUN/abandoned/<date-time>/: what a resume from an earlier iteration set aside


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
        fsync_tree(staging)  # on disk before the rename: a power loss leaves the whole checkpoint or none
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)  # the staging folder becomes the checkpoint (nothing left to remove)
        fsync_path(directory)  # the rename itself
    return final


def _jsonable_random_state(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"


def read_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json; InputError naming the file when it is missing, cut short or not a
    checkpoint's state (a zero-length file after a power loss, say)."""
    path = checkpoint / STATE_JSON
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: not found; {checkpoint} is not a complete checkpoint") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: damaged ({type(err).__name__}: {err}); resume from an earlier checkpoint "
                         f"(--resume {checkpoint.parent}/{CHECKPOINT_PREFIX}N)") from None
    if not isinstance(meta, dict) or isinstance(meta.get("iteration"), bool) or not isinstance(meta.get("iteration"),
                                                                                              int):
        raise InputError(f"{path}: damaged (no iteration number); resume from an earlier checkpoint "
                         f"(--resume {checkpoint.parent}/{CHECKPOINT_PREFIX}N)")
    return meta


def _tensor_names(checkpoint: Path) -> list[str]:
    """The tensor names of trainer_state.safetensors (its header only); InputError when it cannot be read."""
    path = checkpoint / STATE_TENSORS
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (OSError, SafetensorError) as err:  # a file cut short: "Error while deserializing header"
        raise InputError(f"{path}: damaged or missing ({type(err).__name__}: {err}); resume from an earlier "
                         f"checkpoint (--resume {checkpoint.parent}/{CHECKPOINT_PREFIX}N)") from None


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be resumed (a damaged state file, no adapter), or None when it is intact."""
    try:
        read_state(checkpoint)
        _tensor_names(checkpoint)
    except InputError as err:
        return str(err).split(";")[0]
    adapter = checkpoint / "adapter"
    if not adapter.is_dir() or not any(f.stat().st_size for f in adapter.iterdir() if f.is_file()):
        return f"{adapter}: missing or empty"
    return None


def checkpoint_iteration(folder: Path) -> int | None:
    """N of a folder named iter_N, else None."""
    digits = folder.name.removeprefix(CHECKPOINT_PREFIX)
    return int(digits) if folder.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() else None


def latest_checkpoint(path: Path) -> Path:
    """`path` itself if it is a checkpoint, else the newest intact `iter_*` under `path` or `path/checkpoints`.

    A checkpoint named itself must be intact (else InputError naming the damaged file). Among a run's checkpoints
    a damaged newest one (a state file cut short by a power loss) is passed over for the newest intact one, with a
    warning on stderr naming it; a resume from there sets the damaged one aside (`set_aside_after`)."""
    if (path / STATE_JSON).is_file():
        problem = checkpoint_problem(path)
        if problem:
            raise InputError(f"--resume {path}: {problem}; resume from an earlier checkpoint "
                             f"(--resume {path.parent}/{CHECKPOINT_PREFIX}N) or from the run folder")
        return path
    for folder in (path, path / "checkpoints"):
        found = sorted(folder.glob(f"{CHECKPOINT_PREFIX}*")) if folder.is_dir() else []
        found = [f for f in found if (f / STATE_JSON).is_file()]
        damaged = []
        for candidate in reversed(found):
            problem = checkpoint_problem(candidate)
            if problem is None:
                for bad, why in damaged:
                    print(f"warning: {why}: passing over {bad.name} for the earlier {candidate.name}",
                          file=sys.stderr)
                return candidate
            damaged.append((candidate, problem))
        if damaged:
            raise InputError(f"{path}: no intact checkpoint: " + "; ".join(f"{why}" for _, why in damaged)
                             + ": start a new run (--overwrite), nothing here can be resumed")
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
    saved_world = checkpoint_world_size(read_state(checkpoint), _tensor_names(checkpoint))
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
    meta = read_state(checkpoint)
    tensors = load_file(str(checkpoint / STATE_TENSORS))
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
    flags: list[str] = dataclasses.field(default_factory=list)  # the changes as `--key value`: ["--iterations", "32"]

    @property
    def finished(self) -> bool:
        return self.done >= self.config.iterations

    @property
    def elsewhere(self) -> bool:
        """Whether the run continues in another folder than the checkpoint's own run folder."""
        return not same_path(self.config.resolved_output_dir(), self.run_dir)


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder of `RUN/checkpoints/iter_N` (a checkpoint outside a run's checkpoints/: its parent)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def _same_value(name: str, a: object, b: object) -> bool:
    if name == "model" and isinstance(a, str) and isinstance(b, str) and (looks_local(a) or looks_local(b)):
        return same_path(a, b)
    return a == b


def plan_resume(resume: Path, requested: dict[str, object], world_size: int, saved_path: Path | None = None,
                prefix: str = "--", start_files: tuple[str, ...] = ()) -> ResumePlan:
    """What `--resume RUN` does: continue RUN's latest checkpoint (or the checkpoint named) in RUN, with the GRPO
    config RUN saved (`saved_path`, default RUN/config.yaml). Checks only metadata: call it before any model loads.

    `requested` holds the fields the command line and its --config file set. Raises InputError (one line) when the
    checkpoint was written by another number of processes, when a requested field differs from the saved one and
    is not in RESUME_MAY_CHANGE (naming each, as `prefix` + field: --learning_rate, grpo.learning_rate), when
    iterations is below what is done, or when `output_dir` names another folder that is not empty (a new or empty
    one gets the continued run, and so does one holding only what an interrupted attempt at this same resume wrote
    before its first checkpoint: RESUME_START_ENTRIES and the command's own `start_files`; RUN then stays as it is).
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
    done = int(read_state(checkpoint)["iteration"])
    if wanted.iterations < done:
        raise InputError(f"{prefix}iterations {wanted.iterations}: {checkpoint} has already done {done} iterations; "
                         f"pass {prefix}iterations above {done} to train on, or leave it out")
    changes = [f"{name} {json.dumps(getattr(saved, name))} -> {json.dumps(getattr(wanted, name))}" for name in differ]
    if "iterations" in differ and wanted.lr_schedule != "constant":  # train.grpo.apply_scheduled_rate
        changes.append(f"the {wanted.lr_schedule} learning-rate decay now ends at iteration {wanted.iterations}: "
                       f"the rate goes on from what that schedule gives at iteration {done}")
    flags = [item for name in differ for item in (f"--{name}", _flag_value(getattr(wanted, name)))]
    target = run_dir
    if output and not same_path(output, run_dir):
        target = check_output_dir(output, "--output_dir")
        # (rank 0 may hold it already: its lock is no run file)
        if target.is_dir() and run_entries(target) and not _own_start(target, saved, done, start_files):
            raise InputError(f"--output_dir {output}: a resume continues in its own run folder {run_dir}; leave out "
                             f"--output_dir, or give a new empty folder to continue {checkpoint.name} there "
                             f"({run_dir} then stays as it is)")
        changes.append(f"continues in {target} ({run_dir} stays as it is)")
    return ResumePlan(checkpoint, run_dir, dataclasses.replace(wanted, output_dir=str(target)), done, changes, flags)


def _flag_value(value: object) -> str:
    """A config value as `--key value` text (train.config reads it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "none"
    return str(value)


# What a resume into a new --output_dir may have left there before its first checkpoint (and what its trackers write)
RESUME_START_ENTRIES = {"config.yaml", METRICS_NAME, "rollouts", "checkpoints", "tracking.json", "tb", "wandb",
                        "vllm_adapters", ABANDONED_NAME}


def _own_start(target: Path, saved: GRPOConfig, done: int, start_files: tuple[str, ...] = ()) -> bool:
    """Whether `target` holds nothing but an earlier, interrupted attempt at this same resume (continuing a
    checkpoint of `done` iterations of the run `saved` describes) that wrote no checkpoint: its config.yaml (if
    any) is the run's, and its metrics lines and rollouts are all of iterations after `done`. Running the resume
    again there is safe: `set_aside_after` moves those files aside before training."""
    if not set(run_entries(target)) <= RESUME_START_ENTRIES | set(start_files):
        return False
    try:
        latest_checkpoint(target)
    except InputError:
        pass  # no (intact) checkpoint: as expected
    else:
        return False
    if (target / "config.yaml").exists():
        try:
            there = load_config(target / "config.yaml")
        except InputError:
            return False
        for item in dataclasses.fields(GRPOConfig):
            if item.name not in (*RESUME_MAY_CHANGE, "output_dir") and \
                    not _same_value(item.name, getattr(there, item.name), getattr(saved, item.name)):
                return False
    try:
        rows = [row for _, row in metrics_lines(target / METRICS_NAME) if row is not None]
    except InputError:
        return False
    rollouts = [_rollout_iteration(f) for f in (target / "rollouts").glob("*")] if (target / "rollouts").is_dir() else []
    return all(row["iteration"] > done for row in rows) and all(n is not None and n > done for n in rollouts)


# ------------------------------------------------------------------------------------------------------
# metrics.jsonl, and what a resume sets aside
# ------------------------------------------------------------------------------------------------------
def metrics_lines(path: Path) -> list[tuple[str, dict[str, Any] | None]]:
    """(line, row) for each non-blank line of a run's metrics.jsonl (none when the file does not exist). A last
    line that a kill or power loss cut short has row None (common/io.py's append_line: readers skip it); a broken
    line before the last one raises InputError naming the file and line."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = [line for line in jsonl_lines(text) if line.strip()]
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err})") from None
    out: list[tuple[str, dict[str, Any] | None]] = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or isinstance(row.get("iteration"), bool) or \
                not isinstance(row.get("iteration"), int):
            if number < len(lines):
                raise InputError(f"{path}: line {number} is not a metrics line ({line[:80]!r}); only a last line "
                                 "cut short by a kill is expected: fix or remove that line, then run again")
            row = None
        out.append((line, row))
    return out


def metrics_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl, without a last line cut short."""
    return [row for _, row in metrics_lines(path) if row is not None]


def _rollout_iteration(path: Path) -> int | None:
    """N of rollouts/iter_N.json, else None."""
    return checkpoint_iteration(path.with_suffix("")) if path.suffix == ".json" else None


def _unique_folder(parent: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, count = parent / stamp, 1
    while folder.exists():
        count += 1
        folder = parent / f"{stamp}-{count}"
    return folder


def set_aside_after(run_dir: Path, done: int) -> Path | None:
    """Before a run continues from iteration `done` in `run_dir`: move what a later attempt left there into one
    new folder, `run_dir/abandoned/<date-time>/` (same layout; nothing is deleted), and say so on stdout: the
    checkpoints after `done`, the metrics lines and rollout files of iterations after `done`, a last metrics line
    cut short, and, when later checkpoints go, the top-level adapter they wrote (replaced by a copy of
    checkpoints/iter_<done>'s, the one the run continues from). Afterwards the folder reads as a run stopped at
    `done`: `--resume run_dir` picks iter_<done>, metrics.jsonl ends at `done`. Returns the new folder, or None
    when there was nothing to move. Call it on rank 0 only, with the folder claimed (no other process writes it)."""
    checkpoints = run_dir / "checkpoints"
    later = [f for f in sorted(checkpoints.glob(f"{CHECKPOINT_PREFIX}*")) if f.is_dir()
             and (checkpoint_iteration(f) or 0) > done] if checkpoints.is_dir() else []
    rollouts_dir = run_dir / "rollouts"
    rollouts = [f for f in sorted(rollouts_dir.glob(f"{CHECKPOINT_PREFIX}*.json"))
                if (_rollout_iteration(f) or 0) > done] if rollouts_dir.is_dir() else []
    metrics = run_dir / METRICS_NAME
    lines = metrics_lines(metrics)
    kept = [line for line, row in lines if row is not None and row["iteration"] <= done]
    dropped = [line for line, row in lines if row is None or row["iteration"] > done]
    ends_whole = not metrics.is_file() or metrics.read_bytes().endswith(b"\n") or not lines
    if not (later or rollouts or dropped):
        if not ends_whole:  # a whole last line without its newline: the next append would join it
            atomic_write_text(metrics, "".join(line + "\n" for line in kept))
        return None
    resumed = checkpoints / f"{CHECKPOINT_PREFIX}{done:06d}" / "adapter"
    adapter_names = sorted(f.name for f in resumed.iterdir() if f.is_file()) if resumed.is_dir() and later else []
    adapter_files = [run_dir / name for name in adapter_names if (run_dir / name).is_file()]
    aside = _unique_folder(run_dir / ABANDONED_NAME)
    moved: list[str] = []
    with sigint_deferred():  # Ctrl-C: each entry is in one place or the other, never lost
        aside.mkdir(parents=True)
        (aside / "README.txt").write_text(
            f"Set aside on {time.strftime('%Y-%m-%d %H:%M:%S')} when the run in {run_dir} was resumed from iteration "
            f"{done}: what an earlier attempt had written there after iteration {done} (same layout as the run "
            "folder). Nothing of it is used by the resumed run.\n", encoding="utf-8")
        if later:  # first: from here on `--resume run_dir` picks iter_<done>, whatever happens next
            (aside / "checkpoints").mkdir()
            for folder in later:
                os.replace(folder, aside / "checkpoints" / folder.name)
            moved.append(f"checkpoints {', '.join(f.name for f in later)}")
        if dropped:
            atomic_write_text(aside / METRICS_NAME, "".join(line + "\n" for line in dropped))
            atomic_write_text(metrics, "".join(line + "\n" for line in kept))
            moved.append(f"{len(dropped)} metrics line(s) of {METRICS_NAME}")
        if rollouts:
            (aside / "rollouts").mkdir()
            for path in rollouts:
                os.replace(path, aside / "rollouts" / path.name)
            moved.append(f"{len(rollouts)} rollout file(s)")
        if adapter_files:
            for path in adapter_files:
                os.replace(path, aside / path.name)
            for name in adapter_names:  # the run folder's adapter is its latest checkpoint's again
                staged = run_dir / f".{name}.restore"
                shutil.copyfile(resumed / name, staged)
                fsync_path(staged)
                os.replace(staged, run_dir / name)
            moved.append(f"the top-level adapter ({', '.join(adapter_names)}; now {resumed.parent.name}'s again)")
        fsync_path(run_dir)
    print(f"resuming {run_dir} at iteration {done}: set aside what an earlier attempt wrote after it "
          f"({'; '.join(moved)}) in {aside}; nothing was deleted", flush=True)
    return aside
