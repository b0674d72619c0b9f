"""Experiment tracking: per-step scalars of a training run sent to the trackers people watch runs in.

    report_to: [tensorboard]      # a config key of every trainer (GRPO, SFT, router SFT, gate GRPO);
    --report_to tensorboard,wandb # or on the command line (TRL's spelling); none / [] = only the files

One small interface, `Tracker` (log the run name and resolved config once, log scalars per step, close),
with one back-end per library, each imported only when chosen:

    tensorboard  torch.utils.tensorboard, event files in <run folder>/tb/ (`tensorboard --logdir runs`)
    wandb        wandb.init(dir=<run folder>); WANDB_MODE=offline runs with no login (`wandb sync` later);
                 project $WANDB_PROJECT or "trace"
    trackio      trackio's local store ($TRACKIO_DIR or its default); project $TRACKIO_PROJECT or "trace"
    mlflow       MLflow's tracking URI ($MLFLOW_TRACKING_URI, else its default ./mlflow.db); experiment
                 $MLFLOW_EXPERIMENT_NAME or "trace"

The trainers' own files (`metrics.jsonl`, `sft_metrics.jsonl`, `sft_info.json`) are written as before and
first: trackers only mirror them. `open_trackers` returns a logger that fans out to the chosen trackers;
on any rank but 0 it logs nothing. A tracker that fails mid-run (disk full, server gone) is reported once
on stderr and dropped; training goes on. A resumed run (first step > 1) continues the same run in every
tracker: the run name and the trackers' run ids are kept in <run folder>/tracking.json, and TensorBoard is
told to drop the events a killed run logged after its checkpoint (`purge_step`), so no step appears twice.
wandb, trackio and MLflow cannot delete logged steps: a run killed between checkpoints logged steps that the
resumed run logs again, and those steps keep both values there (wandb online ignores the repeats instead);
metrics.jsonl keeps only the resumed ones.

Bad input fails before any model loads (exit 2 in every CLI): an unknown tracker name (`check_report_to`,
called by each config's __post_init__) names the accepted ones; a chosen tracker whose package is missing
(`require_trackers`) prints the pip command. A tracker that cannot start its run (wandb without a login online,
an MLflow server that does not answer, a TensorBoard folder that cannot be written) raises InputError from
`open_trackers`: `python -m train` opens them before its model loads (train.grpo.open_run_trackers), the other
trainers when training starts.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from common.io import atomic_write_json
from common.validation import InputError

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
# tracker -> (module whose import proves the package is there, pip command that installs it)
PACKAGES = {
    "tensorboard": ("tensorboard", "pip install tensorboard==2.21.0"),
    "wandb": ("wandb", "pip install wandb==0.31.0"),
    "trackio": ("trackio", "pip install trackio==0.43.0"),
    # mlflow-skinny is the tracking client alone; SQLAlchemy + alembic for its default local store (./mlflow.db)
    "mlflow": ("mlflow", "pip install mlflow-skinny==3.17.2 SQLAlchemy==2.1.9 alembic==1.20.1 "
                         "(or: pip install mlflow)"),
}
STATE_FILE = "tracking.json"
TB_DIR = "tb"


def check_report_to(value: Any, owner: str = "report_to") -> list[str]:
    """The tracker list of a config's `report_to`: a list, or one string with names separated by commas
    (`--report_to tensorboard,wandb`); "none" or [] = no tracker. Raises ValueError naming the accepted ones."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [part for part in value.replace(" ", ",").split(",") if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        raise InputError(f"{owner} must be a list of tracker names ({', '.join(TRACKERS)}), got {value!r}")
    names = [name.strip().lower() for name in value]
    if names == ["none"]:
        return []
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise InputError(f"{owner}: unknown tracker {', '.join(map(repr, unknown))}; accepted: "
                         f"{', '.join(TRACKERS)} (or none), e.g. --report_to tensorboard")
    return list(dict.fromkeys(names))  # each once, in the order given


def scalars_of(row: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A metrics-file row as tracker scalars: `names` maps each tracker name to the row's key (keys the row does
    not have are left out)."""
    return {name: row[key] for name, key in names.items() if key in row}


def require_trackers(names: Iterable[str]) -> None:
    """Raise InputError with the pip command when a chosen tracker's package is not installed (call it before
    the model loads, so the run stops at once). Imports the chosen libraries only."""
    for name in names:
        module, pip = PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise InputError(f"report_to: {name} needs the {module!r} package, which is not installed ({err}); "
                             f"install it with: {pip}") from None


class Tracker(Protocol):
    """One experiment tracker. `failures`: the exceptions it may raise mid-run (disk full, server gone), which
    the caller turns into a warning instead of stopping the training."""

    failures: tuple[type[BaseException], ...]

    def log_config(self, run_name: str, config: dict[str, Any]) -> None: ...

    def log_scalars(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------------------
# Back-ends
# ---------------------------------------------------------------------------------------------------------
class TensorBoardTracker:
    def __init__(self, directory: Path, first_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.failures = (OSError,)  # the event writer's thread re-raises its OSError on the next call
        # purge_step: readers drop what earlier runs in this folder logged at steps >= first_step (a killed run's
        # steps after its checkpoint, or an earlier run's whole series when the folder is trained again).
        try:
            self.writer = SummaryWriter(str(directory / TB_DIR), purge_step=first_step)
        except OSError as err:
            raise InputError(f"report_to: tensorboard cannot write to {directory / TB_DIR} ({err})") from None

    def log_config(self, run_name: str, config: dict[str, Any]) -> None:
        import yaml

        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("run", f"**{run_name}**\n\n    " + text.replace("\n", "\n    "), global_step=0)

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()  # a run watched live shows each step as it ends

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, directory: Path, run_name: str, run_id: str | None, config: dict[str, Any] | None):
        import wandb

        self.failures = (wandb.errors.Error, OSError)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "trace"), name=run_name, id=run_id,
                                  resume="allow" if run_id else None, dir=str(directory), config=config,
                                  settings=wandb.Settings(console="off"))  # leave the trainer's console alone
        except wandb.errors.UsageError as err:  # e.g. no API key online; an offline run never needs one
            raise InputError(f"report_to: wandb could not start a run ({err}); log in with `wandb login`, or set "
                             "WANDB_MODE=offline to log locally and `wandb sync` later") from None
        self.run_id = self.run.id

    def log_config(self, run_name: str, config: dict[str, Any]) -> None:
        pass  # given to wandb.init (a resumed run keeps the config it started with)

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, run_name: str, resume: bool, config: dict[str, Any] | None):
        import trackio
        from trackio.exceptions import TrackioAPIError

        # trackio writes to its local SQLite store (or a Space/server) from a background thread
        self.failures = (OSError, sqlite3.Error, TrackioAPIError)
        self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "trace"), name=run_name, config=config,
                                resume="allow" if resume else "never", embed=False, auto_log_cpu=False,
                                auto_log_gpu=False)

    def log_config(self, run_name: str, config: dict[str, Any]) -> None:
        pass  # given to trackio.init

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, run_name: str, run_id: str | None):
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        # OSError covers requests' connection errors (RequestException is an OSError) to a tracking server
        self.failures = (MlflowException, OSError)
        self.client = MlflowClient()
        try:
            if run_id is None:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "trace")
                experiment = self.client.get_experiment_by_name(name)
                experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
                run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            else:
                self.client.update_run(run_id, status="RUNNING")
        except self.failures as err:
            raise InputError(f"report_to: mlflow could not start a run at {self.client.tracking_uri} ({err}); "
                             "check MLFLOW_TRACKING_URI") from None
        self.run_id = run_id

    def log_config(self, run_name: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        # MLflow's limits: 6,000 characters a value (a long list, e.g. router SFT's data files, is cut), 100 a batch
        params = [Param(key, (value if isinstance(value, str) else json.dumps(value))[:6000])
                  for key, value in _flatten(config).items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ---------------------------------------------------------------------------------------------------------
# The logger the trainers use
# ---------------------------------------------------------------------------------------------------------
class MetricLogger:
    """Fans scalars out to the trackers of one run; drops (with one warning) a tracker that fails mid-run.
    With no tracker (the default, and on every rank but 0) every call does nothing."""

    def __init__(self, trackers: dict[str, Tracker] | None = None):
        self.trackers = dict(trackers or {})

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, what: str, call: Callable[[Tracker], None], names: Iterable[str] | None = None,
              closing: bool = False) -> None:
        chosen = set(self.trackers if names is None else names)
        for name, tracker in list(self.trackers.items()):
            if name not in chosen:
                continue
            try:
                call(tracker)
            except tracker.failures as err:
                del self.trackers[name]
                if not closing:
                    try:  # release what it holds (files, threads); it failed once already, so no second warning
                        tracker.close()
                    except tracker.failures:
                        pass
                print(f"warning: {name}: {what} failed ({type(err).__name__}: {err}); nothing more goes to {name} "
                      "from this run, training goes on and the run's own metrics file is complete",
                      file=sys.stderr, flush=True)

    def log_config(self, run_name: str, config: dict[str, Any], only: Iterable[str] | None = None) -> None:
        """Once per run, when it starts (`only`: these trackers; the others continue a run that has it)."""
        self._each("logging the config", lambda t: t.log_config(run_name, config), only)

    def log_scalars(self, scalars: dict[str, Any], step: int) -> None:
        """Numbers only (None, NaN and infinities, which JSON files record as null, are left out)."""
        clean = {k: float(v) for k, v in scalars.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if clean:
            self._each(f"logging step {step}", lambda t: t.log_scalars(clean, step))

    def close(self) -> None:
        self._each("closing the run", lambda t: t.close(), closing=True)
        self.trackers.clear()


def open_trackers(report_to: Iterable[str], directory: str | os.PathLike, *, kind: str, config: dict[str, Any],
                  first_step: int = 1, rank: int = 0) -> MetricLogger:
    """The logger of one training run writing to `directory` (its output folder).

    `kind` names the trainer (grpo, sft, router_sft, gate_grpo) in the run name; `first_step` is the first step this
    run logs (0 or 1 for a run from scratch: its `config`, the resolved config, is logged once); a run resumed at
    `first_step` > 1 continues the run named in `directory/tracking.json`. Raises InputError when a package is
    missing or a tracker cannot start a run.
    """
    names = check_report_to(report_to)
    if rank != 0 or not names:
        return MetricLogger()
    require_trackers(names)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state_path = directory / STATE_FILE
    resumed = first_step > 1
    state: dict[str, Any] = {}
    if resumed and state_path.is_file():
        state = json.loads(state_path.read_text(encoding="utf-8"))
    run_name = state.get("run_name") or f"{kind}-{directory.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    trackers: dict[str, Tracker] = {}
    before = state.get("report_to", [])  # trackers the run had before this resume: they continue their run
    started = False
    try:
        for name in names:
            if name == "tensorboard":
                trackers[name] = TensorBoardTracker(directory, first_step)
            elif name == "wandb":  # wandb keeps the config a resumed run started with
                run_id = state.get("wandb_id") if name in before else None
                trackers[name] = WandbTracker(directory, run_name, run_id, None if run_id else config)
            elif name == "trackio":  # trackio stores one config per run, replaced by each init: give it again
                trackers[name] = TrackioTracker(run_name, name in before, config)
            else:
                trackers[name] = MlflowTracker(run_name, state.get("mlflow_run_id") if name in before else None)
        started = True
    finally:
        if not started:  # a tracker failed to start: close the ones already started, then let the error out
            MetricLogger(trackers).close()
    ids = {f"{name}_{'id' if name == 'wandb' else 'run_id'}": tracker.run_id
           for name, tracker in trackers.items() if hasattr(tracker, "run_id")}
    atomic_write_json(state_path, {"run_name": run_name, "report_to": names, **ids})
    logger = MetricLogger(trackers)
    logger.log_config(run_name, config, only=[name for name in names if name not in before])
    return logger
