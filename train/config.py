"""GRPO run configuration: one dataclass, loaded from YAML plus `--key value` overrides.

Every value is checked in `__post_init__`, and a bad one raises InputError (common/validation.py) saying how to fix it. The
resolved config is saved as `config.yaml` next to every adapter the run writes; configs/grpo.yaml restates
the defaults with comments.

Where the defaults come from. They follow the TRACE paper's training section where it gives a value, and
the reference trainer (ScalingIntelligence/TRACE, train/train_grpo.py) only where the paper is silent:

    paper:     LoRA r=16 on q, k, v, o, gate, up, down projections; AdamW, lr 1e-5; K=16 samples per group,
               G=64 groups per iteration; advantage (r - group mean) / group std; constant groups dropped;
               clipped surrogate averaged over each sequence's action tokens, then over sequences ("grpo").
    reference: lora_alpha 16, grad_clip 1.0, temperature 1.0, kl_beta 0 (no KL). (micro_batch_size only
               trades memory for speed here: the gradient does not depend on it.)
    standard:  clip_eps 0.2 (DeepSeekMath GRPO and TRL's default; the paper's clip threshold is not
               given a number in its training section).

Where the reference code differs from these defaults (set the field to reproduce it):

    clip_eps       0.28 there (DAPO's clip-higher value, applied on both sides), 0.2 here.
    weight_decay   0.01 there (torch AdamW's default: the reference passes only lr), 0.0 here.
    lora_target_modules  q, k, v, o only there; all seven projections here, as the paper.
    groups_per_iteration 4 there (re-collected up to 3 times while fewer than half the groups vary), 64 here.
    advantages     r - group mean there, then standardised over the whole batch; per-group std here.
    also there     info-gathering turns dropped from training, old tool results cut to 200 characters, one
                   importance ratio per turn (summed log-probs); none of these here.

Learning per rollout. One iteration samples `groups_per_iteration` x `group_size` episodes, then makes
`ppo_epochs` passes over them; each pass splits the iteration's groups into `minibatches_per_iteration`
mini-batches (whole groups, in a fixed order) and takes one optimizer step on each. So an iteration takes
`ppo_epochs x minibatches_per_iteration` optimizer steps, the first on-policy (ratio 1) and the others off-policy
by as much as the earlier steps moved the adapter, which the clipped ratio (clip_eps) and the optional k3 KL to
the frozen base (kl_beta) bound. In TRL's GRPOTrainer terms: `ppo_epochs` is `num_iterations` (reuses of one
generation batch) and `minibatches_per_iteration` is `steps_per_generation` (optimizer steps one generation
batch is split into). The paper's trainer states neither (its training section gives one update per batch of
G groups); the reference trainer takes one optimizer step per collected batch, i.e. 1 and 1. The learning-rate
schedule counts optimizer steps: linear warm-up over `warmup_iterations` x steps_per_iteration steps, then
`lr_schedule` (constant, or linear/cosine decay to min_lr_ratio x learning_rate at iterations x
steps_per_iteration steps); iterations without an update do not advance it.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.io import load_yaml_mapping
from common.validation import InputError, need
from train.tracking import check_report_to

LR_SCHEDULES = ("constant", "linear", "cosine")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class GRPOConfig:
    game: str = ""  # registered game name, e.g. capability_precondition_verification
    model: str = ""  # local directory (or a hub id, which fails offline with a clear message)
    output_dir: str = ""  # default: pipeline/adapters/<capability>
    game_overrides: dict[str, Any] = field(default_factory=dict)  # fields of the game's config dataclass

    # LoRA (base model frozen)
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))

    # Optimisation
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    warmup_iterations: int = 0  # linear warm-up over this many updating iterations' optimizer steps
    lr_schedule: str = "constant"  # after warm-up: constant | linear | cosine (decay to min_lr_ratio x lr)
    min_lr_ratio: float = 0.0  # the decayed schedules end at this fraction of learning_rate
    grad_clip: float = 1.0
    iterations: int = 100
    ppo_epochs: int = 1  # passes over each iteration's batch (TRL num_iterations; 1 = every step on-policy data)
    minibatches_per_iteration: int = 1  # optimizer steps per pass, each on its share of the groups (TRL steps_per_generation)
    micro_batch_size: int = 8  # sequences per forward/backward (gradient accumulation inside a step)
    shared_prefix: bool = True  # run each group's shared prompt once per micro-batch (same gradient, less compute)

    # Sampling
    groups_per_iteration: int = 64
    group_size: int = 16
    temperature: float = 1.0
    hint_fraction: float = 0.25  # share of each group sampled with the game's hint prompt
    max_episode_tokens: int = 4096
    train_seed_start: int = 1_000_000  # task seeds for training start here (evaluation uses small seeds)
    # 0: every group plays a fresh task (seed train_seed_start + iteration x groups_per_iteration + group), an
    # unlimited stream. N >= 1: a fixed pool of N tasks (seeds train_seed_start .. train_seed_start + N - 1) that the
    # groups go through pass after pass, each pass in a new order drawn from `seed` (`task_seed`), as training on a
    # finite benchmark's task set does (τ²-Bench: 50 airline + 114 retail tasks).
    task_pool: int = 0

    # GRPO
    scale_advantages: bool = True
    std_floor: float = 1e-3
    filter_constant_groups: bool = True
    clip_eps: float = 0.2
    loss_agg: str = "grpo"  # grpo | dapo | dr_grpo
    kl_beta: float = 0.0
    # dr_grpo's constant; 0 = the completion budget, the most tokens the policy can generate in one episode:
    # min(game max_turns x max_gen_tokens, max_episode_tokens) (TRL divides by max_completion_length)
    max_tokens_norm: int = 0

    # Bookkeeping
    seed: int = 0
    save_every: int = 10
    save_rollouts: bool = True
    dtype: str = "float32"  # float32 | bfloat16
    fsdp: bool = False
    # Experiment trackers that mirror metrics.jsonl (train/tracking.py): tensorboard, wandb, trackio, mlflow
    report_to: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):  # every field its declared type first (YAML and flags are read as
            # text by config_values; here a Python caller's "40" for an int is refused, not read as 40)
            setattr(self, item.name, field_value(item.name, getattr(self, item.name), item.name, from_text=False))
        need(self.lora_r >= 1, f"lora_r must be >= 1, got {self.lora_r}")
        need(self.lora_alpha > 0, f"lora_alpha must be > 0, got {self.lora_alpha}")
        need(0.0 <= self.lora_dropout < 1.0, f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        need(bool(self.lora_target_modules), "lora_target_modules must name at least one module, e.g. [q_proj, v_proj]")
        need(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "adam betas must be in [0, 1)")
        need(self.warmup_iterations >= 0, f"warmup_iterations must be >= 0, got {self.warmup_iterations}")
        need(self.grad_clip > 0, f"grad_clip must be > 0 (1.0 is the reference), got {self.grad_clip}")
        need(self.iterations >= 1, f"iterations must be >= 1, got {self.iterations}")
        need(self.ppo_epochs >= 1, f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        need(self.lr_schedule in LR_SCHEDULES,
             f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1] (a fraction of learning_rate), "
             f"got {self.min_lr_ratio}")
        need(1 <= self.minibatches_per_iteration <= self.groups_per_iteration,
             f"minibatches_per_iteration must be in [1, groups_per_iteration={self.groups_per_iteration}] (each "
             f"optimizer step needs at least one group), got {self.minibatches_per_iteration}")
        need(self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        need(self.groups_per_iteration >= 1, f"groups_per_iteration must be >= 1, got {self.groups_per_iteration}")
        need(self.group_size >= 2, f"group_size must be >= 2 (GRPO compares samples within a group), got {self.group_size}")
        need(self.temperature > 0, f"temperature must be > 0 for GRPO sampling, got {self.temperature}")
        need(0.0 <= self.hint_fraction < 1.0,
             f"hint_fraction must be in [0, 1) (some samples must use the base prompt), got {self.hint_fraction}")
        need(self.max_episode_tokens >= 16, f"max_episode_tokens must be >= 16, got {self.max_episode_tokens}")
        need(self.train_seed_start >= 0, "train_seed_start must be >= 0")
        need(not isinstance(self.task_pool, bool) and isinstance(self.task_pool, int) and self.task_pool >= 0,
             f"task_pool must be an int >= 0 (0 = a fresh task for every group; N = a fixed pool of N tasks, e.g. "
             f"164 as τ²-Bench's airline + retail), got {self.task_pool!r}")
        need(self.std_floor > 0, f"std_floor must be > 0 (reference 1e-3), got {self.std_floor}")
        need(0 < self.clip_eps < 1, f"clip_eps must be in (0, 1) (default 0.2), got {self.clip_eps}")
        need(self.loss_agg in ("grpo", "dapo", "dr_grpo"), f"loss_agg must be grpo, dapo or dr_grpo, got {self.loss_agg!r}")
        need(self.kl_beta >= 0, f"kl_beta must be >= 0, got {self.kl_beta}")
        need(self.max_tokens_norm >= 0,
             f"max_tokens_norm must be >= 0 (0 = the completion budget), got {self.max_tokens_norm}")
        need(self.save_every >= 1, f"save_every must be >= 1, got {self.save_every}")
        need(self.dtype in ("float32", "bfloat16"), f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        need(isinstance(self.game_overrides, dict), "game_overrides must be a mapping of config field -> value")

    @property
    def steps_per_iteration(self) -> int:
        """Optimizer steps of one iteration that has something to learn from: passes x mini-batches."""
        return self.ppo_epochs * self.minibatches_per_iteration

    @property
    def capability(self) -> str:
        return self.game.removeprefix("capability_")

    @property
    def n_hinted(self) -> int:
        """Hinted samples per group: the first `n_hinted` sample indices of each group."""
        return int(self.hint_fraction * self.group_size)

    def task_seed(self, iteration: int, group: int) -> int:
        """The task seed group `group` of iteration `iteration` plays (see `task_pool`)."""
        index = iteration * self.groups_per_iteration + group  # the run's group count so far
        if self.task_pool == 0:
            return self.train_seed_start + index
        passes, position = divmod(index, self.task_pool)
        order = list(range(self.task_pool))
        random.Random(f"task-pool-{self.seed}-{passes}").shuffle(order)  # str seeds are stable across runs
        return self.train_seed_start + order[position]

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir or f"pipeline/adapters/{self.capability}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TRUE_WORDS = ("true", "1", "yes")
BOOL_WORDS = (*TRUE_WORDS, "false", "0", "no")


def _number_text(text: str) -> int | float:
    """The number `text` writes: an int when it is one (exact, however large), else a float; ValueError if neither."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def typed_value(kind: str, value: Any, name: str, *, from_text: bool = True) -> Any:
    """`value` as a field of declared type `kind` ("int", "float", "bool", "str", "list[...]", "dict[...]"), or
    InputError naming `name` (e.g. `--micro_batch_size`, `run.yaml: iterations`) and the fix.

    - int: an int, or a whole number written as a float or a string (`4.0`, `"1e3"`: 4, 1000); `2.5`, `true` and
      `nan` are refused (a fraction of an iteration or a batch has no meaning; rounding would change the run).
    - float: a number or a numeric string (YAML 1.1 reads `1e-5` as a string); not a bool, not nan.
    - bool: true/false (or the words yes/no/1/0 as a string, as `--key value` gives them).
    - str: a string (a number where a name belongs is refused: quote it).
    - list: a list or tuple of strings; one string is split at commas and blanks (`--lora_target_modules
      q_proj,v_proj`);
      null is the empty list. dict: a mapping; null is the empty mapping.
    Strings are read as numbers and booleans only `from_text` (a flag, a YAML value); a Python caller's string where
    a number belongs is refused.
    """
    if not from_text and kind in ("int", "float", "bool") and isinstance(value, str):
        raise InputError(f"{name} expects {kind}, got the string {value!r}: pass the value itself, not text")
    if kind in ("int", "float"):
        expects = f"{name} expects " + ("int (a whole number)" if kind == "int" else "float (a number)")
        number = value
        if isinstance(value, str):
            try:
                number = _number_text(value.strip())
            except ValueError:
                raise InputError(f"{expects}, got {value!r}") from None
        if isinstance(number, bool) or not isinstance(number, (int, float)) or math.isnan(number):
            raise InputError(f"{expects}, got {value!r}")
        if kind == "float":
            return float(number)
        if isinstance(number, int) or (math.isfinite(number) and number.is_integer()):
            return int(number)
        hint = f": write {math.floor(number)} or {math.ceil(number)}" if math.isfinite(number) else ""
        raise InputError(f"{expects}, got {value!r}{hint}")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
            return value.strip().lower() in TRUE_WORDS
        raise InputError(f"{name} expects true or false, got {value!r}")
    if kind == "str":
        if not isinstance(value, str):
            raise InputError(f"{name} expects a string, got {value!r} ({type(value).__name__}); quote it in YAML "
                             f"(\"{value}\")")
        return value
    if kind.startswith(("list", "tuple")):
        if value is None:
            return []
        if isinstance(value, str):
            value = [part for part in value.replace(",", " ").split() if part]
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise InputError(f"{name} expects a list of names, e.g. [q_proj, v_proj] in YAML or q_proj,v_proj on "
                             f"the command line, got {value!r}")
        return list(value)
    if kind.startswith("dict"):
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InputError(f"{name} expects a mapping (key: value), got {value!r}")
        return value
    return value


def field_value(name: str, value: Any, label: str, *, from_text: bool = True) -> Any:
    """`value` as GRPOConfig field `name` (`typed_value` of its declared type; report_to: the tracker list of
    train.tracking.check_report_to, which names the accepted trackers); errors name `label`."""
    if name == "report_to":
        return check_report_to(value, label)
    return typed_value(str(_FIELD_TYPES[name]), value, label, from_text=from_text)


def _parse_override(field_type: str, key: str, text: str) -> Any:
    """`--key value` strings become the field's type; lists and mappings are parsed as YAML."""
    if field_type in ("int", "float", "bool", "str"):
        return field_value(key.replace("-", "_"), text, f"--{key}")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InputError(f"--{key}: cannot parse {text!r} as YAML: {err}") from None
    return field_value(key.replace("-", "_"), value, f"--{key}")


_FIELD_TYPES = {item.name: item.type for item in dataclasses.fields(GRPOConfig)}


def load_config(path: str | Path | None, overrides: dict[str, str] | None = None, **fixed: Any) -> GRPOConfig:
    """Build a GRPOConfig from a YAML file, then `--key value` strings, then keyword values.

    Unknown keys (in the file or on the command line) raise InputError listing the valid ones.
    """
    values = config_values(path, overrides, **fixed)
    try:
        return GRPOConfig(**values)
    except TypeError as err:
        raise InputError(f"bad config: {err}") from None


def config_values(path: str | Path | None, overrides: dict[str, str] | None = None, **fixed: Any) -> dict[str, Any]:
    """The fields `load_config` sets explicitly (the rest keep their defaults), typed, not yet validated."""
    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    if path is not None:
        loaded = load_yaml_mapping(path)
        unknown = sorted(set(loaded) - set(fields))
        if unknown:
            raise InputError(f"{path}: unknown keys {unknown}; valid keys: {sorted(fields)}")
        for key, value in loaded.items():  # (YAML 1.1 reads `1e-5`, no dot, as a string: typed_value reads it)
            values[key] = field_value(key, value, f"{path}: {key}")
    for key, text in (overrides or {}).items():
        name = key.replace("-", "_")
        if name not in fields:
            raise InputError(f"unknown option --{key}; valid keys: {sorted(fields)}")
        values[name] = _parse_override(str(fields[name].type), key, text)
    values.update({k: v for k, v in fixed.items() if v is not None})
    return values


def save_config(config: GRPOConfig, path: str | Path) -> None:
    from common.io import atomic_write_text

    # This config's output_dir is the run's own folder, which holds the run: a rerun needs a new folder (the
    # placeholder works as typed), and `--resume <that folder>` continues the run instead.
    header = f"# Resolved GRPO config. Reproduce with: python -m train --output_dir NEW_FOLDER --config {path}\n"
    atomic_write_text(path, header + yaml.safe_dump(config.to_dict(), sort_keys=False))
