"""Settings of the closed-loop CPU demo (`configs/demo.yaml`, `configs/demo_fast.yaml`).

Each section configures one step of `demo/run.py`; a step is re-run only when its own section, or a
step it reads from, changed. Unknown keys and invalid values raise with the fix spelled out.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.storefront.demos import check_planted
from common.io import load_yaml_mapping
from common.validation import InputError, check_url
from demo.trainable import TRAIN_BAND
from train.chat_template import TOOLS_VIEWS
from train.tracking import check_report_to

# moe_gate.model_builder.MODES (not imported here: it loads torch); tests/test_direct_task_pool.py checks they agree.
GATE_MODES = ("token", "trajectory", "global")
# What router SFT learns the slots from (loop.gate_labels): "game", each capability's GRPO rollouts labeled with it and
# the base agent's Step-1 target rollouts labeled "base"; "reward", routing targets (train/routing_targets.py): each
# adapter alone plays Step 1's analysis tasks, and each slot is labeled on the tasks where its mean reward is the best.
GATE_LABELS = ("game", "reward")

# `python -m demo --profile NAME` (and `make demo` / `make demo-full` / `make demo-fast`): the config each reads
PROFILES = {"default": "configs/demo.yaml", "full": "configs/demo_full.yaml", "fast": "configs/demo_fast.yaml"}


def _positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{owner}.{name} must be an int >= 1, got {value!r}")


def _number(owner: str, name: str, value: Any, low: float, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InputError(f"{owner}.{name} must be a number in [{low}, {high}], got {value!r}")


def _count(owner: str, name: str, value: Any, zero: str = "") -> None:
    """An int >= 0; `zero` says what 0 means, in the message."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{owner}.{name} must be an int >= 0{f' ({zero})' if zero else ''}, got {value!r}")


def check_efficiency_fractions(value: Any) -> None:
    """evaluate.efficiency_fractions: a list of numbers strictly between 0 and 1, strictly increasing."""
    fix = ("evaluate.efficiency_fractions must list fractions of direct GRPO's budget strictly between 0 and 1, in "
           "increasing order without repeats, e.g. [0.25, 0.5] (the final adapter, 1, is always evaluated; [] turns "
           f"the efficiency step off), got {value!r}")
    if not isinstance(value, list) or any(isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1
                                          for f in value):
        raise InputError(fix)
    if any(b <= a for a, b in zip(value, value[1:])):
        raise InputError(fix)


@dataclass
class BaseAgentSettings:
    """Step 0: the base agent (tokenizer + tiny model built on demonstrations, then SFT)."""

    demonstrations: int = 5000
    demo_seed: int = 0
    planted: dict[str, float] = field(default_factory=lambda: {"skip_status_check": 0.7,
                                                               "wrong_refund_method": 0.7})
    tokenizer_chats: int = 2000  # demonstrations the BPE is trained on
    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    tools_view: str = "compact"
    # First of all, SFT on this many copy drills (train/copy_drill.py: repeat a random token string) from the
    # untrained model, at lr / warmup_steps, one pass: an in-context copy circuit before any demonstration. 0 skips it.
    copy_drills: int = 0
    # Curriculum: first SFT on expert openings (demonstrations cut after the first order look-up, where
    # values are copied into calls), then on the whole demonstrations. 0 skips it.
    openings: int = 0
    openings_epochs: float = 1.0
    epochs: float = 1.0
    lr: float = 2e-3
    warmup_steps: int = 50
    batch_tokens: int = 8192
    seed: int = 0
    # After the whole demonstrations, two more stages (0 skips each): `selection` return/exchange demonstrations
    # cut through their write (selecting an order's items by content and copying their ids), then `refresh` fresh
    # whole demonstrations (the turns after the write, which the selection stage does not show). Both from their own
    # seed streams, with the same planted flaws, at late_lr with late_warmup_steps, late_epochs passes each.
    selection: int = 0
    refresh: int = 0
    late_epochs: float = 1.0
    late_lr: float = 1e-3
    late_warmup_steps: int = 20

    def __post_init__(self) -> None:
        owner = "base"
        for name in ("demonstrations", "tokenizer_chats", "vocab_size", "hidden_size", "num_layers", "num_heads",
                     "batch_tokens"):
            _positive_int(owner, name, getattr(self, name))
        self.planted = check_planted(self.planted, "base.planted")
        if self.tools_view not in TOOLS_VIEWS:
            raise InputError(f"base.tools_view must be one of {', '.join(TOOLS_VIEWS)}, got {self.tools_view!r}")
        _number(owner, "epochs", self.epochs, 1e-6)
        _number(owner, "openings_epochs", self.openings_epochs, 1e-6)
        _number(owner, "lr", self.lr, 1e-9, 1.0)
        _count(owner, "openings", self.openings, "0 skips the openings curriculum")
        _count(owner, "copy_drills", self.copy_drills, "0 skips the copy drills")
        _count(owner, "selection", self.selection, "0 skips that stage")
        _count(owner, "refresh", self.refresh, "0 skips that stage")
        _count(owner, "late_warmup_steps", self.late_warmup_steps)
        _number(owner, "late_epochs", self.late_epochs, 1e-6)
        _number(owner, "late_lr", self.late_lr, 1e-9, 1.0)


@dataclass
class EvaluateSettings:
    """Held-out storefront tasks: greedy and temperature-1 runs on every seed (the same for every model)."""

    tasks: int = 100
    seeds: list[int] = field(default_factory=lambda: [1000, 2000, 3000])
    samples: int = 4  # temperature-1 samples per task (pass^k for k = 1..samples)
    temperature: float = 1.0
    max_episode_tokens: int = 4096
    # Assistant turns per storefront episode the demo plays (evaluation, Step 1's analysis runs, direct GRPO),
    # like τ²-bench's `--max-steps`: a run setting, not part of a task. None keeps the storefront config's
    # max_steps. The expert demonstrations of the base step always use the storefront's own limit.
    max_steps: int | None = None
    # Sample efficiency (the `efficiency` step, after `final`): direct GRPO's checkpoints at these fractions of its
    # budget (TRACE's Steps 3-4 training episodes), and TRACE at these fractions of its own (its adapters'
    # checkpoints with a gate trained on them), play the same evaluation tasks as the final step, against TRACE's and
    # direct GRPO's finals. [] turns the step off. Not part of the evaluate, select or final steps' settings:
    # changing it re-runs Step 3 and the baselines (which save the checkpoints) and the steps after them.
    efficiency_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5])
    # The final step also evaluates each capability LoRA alone (a diagnostic row: `make demo-full`); false keeps
    # the rows that decide the paper's claims. Only the final step's setting.
    each_adapter: bool = True

    def __post_init__(self) -> None:
        for name in ("tasks", "samples", "max_episode_tokens"):
            _positive_int("evaluate", name, getattr(self, name))
        check_efficiency_fractions(self.efficiency_fractions)
        if not isinstance(self.each_adapter, bool):
            raise InputError(f"evaluate.each_adapter must be true or false, got {self.each_adapter!r}")
        if self.max_steps is not None:
            _positive_int("evaluate", "max_steps", self.max_steps)
        if not isinstance(self.seeds, list) or not self.seeds or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in self.seeds):
            raise InputError(f"evaluate.seeds must be a non-empty list of ints, got {self.seeds!r}")
        _number("evaluate", "temperature", self.temperature, 1e-6, 10.0)


@dataclass
class SelectSettings:
    """Step 1 on the base agent's results on its own analysis tasks (never the evaluation seeds)."""

    tasks: int = 100
    seed: int = 500
    samples: int = 2
    runs: int = 10
    k: int = 8
    rho: float = 0.10
    delta: float = 0.20
    miss_rate: float = 0.15
    false_alarm_rate: float = 0.05
    # An OpenAI-compatible endpoint for LLM labelers (pipeline.label_trajectories) instead of the rules;
    # the API key is read from the environment variable `labeler_api_key_env`.
    labeler_url: str = ""
    labeler_model: str = ""
    labeler_api_key_env: str = "OPENAI_API_KEY"
    propose: bool = False  # with an LLM labeler: Phase 1 proposes the candidates instead of the fixed list

    def __post_init__(self) -> None:
        if bool(self.labeler_url) != bool(self.labeler_model):
            raise InputError("select.labeler_url and select.labeler_model go together: give both (an LLM labeler) "
                             "or neither (the rule-based labelers)")
        if self.propose and not self.labeler_url:
            raise InputError("select.propose needs an LLM labeler (select.labeler_url and select.labeler_model)")
        if self.labeler_url:  # here, not at Step 1 after the base agent and its evaluation have run
            check_url(self.labeler_url, "select.labeler_url")
        for name in ("tasks", "samples", "runs", "k"):
            _positive_int("select", name, getattr(self, name))
        if self.k > self.runs:
            raise InputError(f"select.k={self.k} is more than select.runs={self.runs}; use k <= runs (default 8 of 10)")
        for name in ("rho", "delta", "miss_rate", "false_alarm_rate"):
            _number("select", name, getattr(self, name), -1.0 if name == "delta" else 0.0, 1.0)


@dataclass
class LoopSettings:
    """Steps 2-4 and the baselines (one GRPO budget: groups x group size per iteration for every run)."""

    # Seeds pipeline.validate_game plays per check: the class-prior rule judges an ablation above its limit only
    # over 200 seeds or more (pipeline.probes.PRIOR_MIN_SEEDS); fewer leave a WARN.
    validate_seeds: int = 200
    fuzz_actions: int = 200
    calibration_tasks: int = 24
    calibration_samples: int = 4
    # The base agent's full-success rate calibration aims for, and that a game must reach at some knob value to be
    # trained (demo.trainable.TRAIN_BAND): a game it never wins teaches partial credit alone.
    band: list[float] = field(default_factory=lambda: list(TRAIN_BAND))
    max_rounds: int = 3
    iterations: int = 10  # GRPO iterations per capability adapter
    gate_sft_epochs: int = 2
    gate_iterations: int = 4  # GRPO iterations on the gate (0: router SFT only)
    # How the gate routes (moe_gate: "token", the paper's token-level top-1 in every layer; "trajectory", one slot
    # per conversation from its prompt; "global", one learned slot for everything; the last two by router SFT
    # alone, gate_iterations 0).
    gate_mode: str = "token"
    # Router SFT's labels (GATE_LABELS). "reward" plays select.tasks x select.samples new target episodes per
    # adapter (counted in TRACE's training episodes, so in the baselines' budget); the efficiency step's TRACE at a
    # share of its budget plays that share of the tasks.
    gate_labels: str = "game"
    groups_per_iteration: int = 8
    group_size: int = 8
    learning_rate: float = 1e-3
    # Optimizer steps per GRPO iteration of every LoRA run (adapters, direct GRPO, single-adapter GRPO; not the
    # gate): `ppo_epochs` passes over the iteration's episodes, each split into `minibatches_per_iteration`
    # mini-batches (train.config.GRPOConfig). 1 x 1 is one on-policy step per iteration.
    ppo_epochs: int = 1
    minibatches_per_iteration: int = 1
    # Share of each capability GRPO group sampled with the game's hint prompt. 0: measured on the shipped base
    # agent (bench/game_success.py --hint, 64 episodes at T=1, the games' defaults on the demo's surface) the
    # hint takes success from 0.344 to 0.000 on precondition and 0.250 to 0.000 on tool-calling precision: a
    # prompt it never saw in SFT makes it write malformed turns (34-39 of 64 episodes' first mistake).
    hint_fraction: float = 0.0
    max_episode_tokens: int = 2048
    baselines: bool = True  # direct GRPO on the storefront and one adapter on the games mixed, same budget
    # Direct GRPO's second setting: a fixed pool of this many target tasks (training seeds, disjoint from the
    # evaluation's), gone through pass after pass, beside its run on unlimited fresh tasks; 0 leaves it out. The
    # default is τ²-Bench's task count (50 airline + 114 retail), the finite set the paper's GRPO trains on.
    direct_task_pool: int = 164
    # Direct GRPO's run on unlimited fresh target tasks (the efficiency step's checkpoints are then its). false: the
    # only direct GRPO run is the fixed-pool one, which then keeps the checkpoints (the claims profile, `make demo`).
    direct_fresh: bool = True
    # Train these capabilities whatever Step 1 selected ([] = Step 1's selection). For runs that must exercise
    # every step even when the base agent is too weak for Step 1 (the fast profile); the report says so.
    capabilities: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("validate_seeds", "calibration_tasks", "calibration_samples", "max_rounds", "iterations",
                     "groups_per_iteration", "group_size", "max_episode_tokens", "ppo_epochs",
                     "minibatches_per_iteration"):
            _positive_int("loop", name, getattr(self, name))
        if self.minibatches_per_iteration > self.groups_per_iteration:
            raise InputError(f"loop.minibatches_per_iteration ({self.minibatches_per_iteration}) must be at most "
                             f"loop.groups_per_iteration ({self.groups_per_iteration}): each optimizer step needs at "
                             "least one group; lower it or raise groups_per_iteration")
        for name in ("fuzz_actions", "gate_sft_epochs", "gate_iterations", "direct_task_pool"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"loop.{name} must be an int >= 0, got {value!r}"
                                 + (" (0 leaves direct GRPO's fixed-pool run out; 164 is τ²-Bench's task count)"
                                    if name == "direct_task_pool" else ""))
        if (not isinstance(self.band, list) or len(self.band) != 2
                or not all(isinstance(b, (int, float)) for b in self.band) or not 0 <= self.band[0] <= self.band[1] <= 1):
            raise InputError(f"loop.band must be [low, high] with 0 <= low <= high <= 1, got {self.band!r}")
        if self.gate_mode not in GATE_MODES:
            raise InputError(f"loop.gate_mode must be one of {', '.join(GATE_MODES)}, got {self.gate_mode!r}")
        if self.gate_labels not in GATE_LABELS:
            raise InputError(f"loop.gate_labels must be one of {', '.join(GATE_LABELS)}, got {self.gate_labels!r}")
        if self.gate_mode != "token" and self.gate_iterations:
            raise InputError(f"loop.gate_mode {self.gate_mode!r} needs loop.gate_iterations: 0 (gate GRPO, "
                             "train.grpo_gater, trains token routing only; a trajectory or global router is trained "
                             "by router SFT alone)")
        _number("loop", "learning_rate", self.learning_rate, 1e-9, 1.0)
        _number("loop", "hint_fraction", self.hint_fraction, 0.0, 1.0)
        if not isinstance(self.baselines, bool):
            raise InputError(f"loop.baselines must be true or false, got {self.baselines!r}")
        if not isinstance(self.direct_fresh, bool):
            raise InputError(f"loop.direct_fresh must be true or false, got {self.direct_fresh!r}")
        if not self.direct_fresh and self.direct_task_pool == 0:
            raise InputError("loop.direct_fresh false needs loop.direct_task_pool > 0 (direct GRPO then trains on that "
                             "fixed pool of target tasks alone); set a pool, e.g. 40, or direct_fresh true")
        from demo.rule_labeler import candidate_names

        known = list(candidate_names())
        if not isinstance(self.capabilities, list) or any(c not in known for c in self.capabilities):
            raise InputError(f"loop.capabilities must list candidate capabilities ({', '.join(known)}), "
                             f"got {self.capabilities!r}")


@dataclass
class OwnGameSettings:
    """After Step 3: each capability LoRA and the base agent on that capability's own game, at the settings
    calibration chose, on held-out tasks (`train.evaluate`'s task seeds, 32-bit hashes of `seed` and the task
    index, not the consecutive seeds calibration (10,000..) and training (1,000,000..) play). It tells whether
    an adapter learned its skill at all, before any question of transfer to the target."""

    tasks: int = 40
    seed: int = 7000
    samples: int = 2  # temperature-1 samples per task (greedy plays each task once)
    enabled: bool = True  # a diagnostic step: `make demo-full` runs it, the claims profile (`make demo`) does not

    def __post_init__(self) -> None:
        for name in ("tasks", "samples"):
            _positive_int("own_game", name, getattr(self, name))
        if not isinstance(self.enabled, bool):
            raise InputError(f"own_game.enabled must be true or false, got {self.enabled!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InputError(f"own_game.seed must be an int >= 0, got {self.seed!r}")


@dataclass
class DemoConfig:
    storefront: str = "configs/storefront/cpu_demo.yaml"  # StorefrontConfig fields of the target benchmark
    storefront_overrides: dict[str, Any] = field(default_factory=dict)
    base: BaseAgentSettings = field(default_factory=BaseAgentSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    select: SelectSettings = field(default_factory=SelectSettings)
    loop: LoopSettings = field(default_factory=LoopSettings)
    own_game: OwnGameSettings = field(default_factory=OwnGameSettings)
    # Trackers every training run of the demo reports to (train/tracking.py; also --report-to on the command line):
    # one run per step and adapter, TensorBoard's under <run-dir>/<step>/.../tb/. Not part of any step's settings:
    # changing it re-runs nothing.
    report_to: list[str] = field(default_factory=list)
    # Runs of Steps 3-4, the baselines and their evaluations, with training seeds 0..repeats-1 (also --repeat on the
    # command line); the report gives their mean and spread. Not part of any step's settings: repeat r's steps
    # carry its seed, so raising it runs only the new repeats.
    repeats: int = 1

    def __post_init__(self) -> None:
        self.report_to = check_report_to(self.report_to)
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise InputError(f"repeats must be an int >= 1 (1 = one run of every step; 3 = Steps 3-4 and the "
                             f"baselines with training seeds 0, 1, 2), got {self.repeats!r}")

    def storefront_config(self, root: Path) -> Any:
        """The StorefrontConfig of the demo's target (file + overrides), validated."""
        from benchmarks.storefront.run import load_config

        config = load_config(str(root / self.storefront))
        fields = dataclasses.asdict(config)
        unknown = sorted(set(self.storefront_overrides) - set(fields))
        if unknown:
            raise InputError(f"storefront_overrides: {', '.join(unknown)} not a StorefrontConfig field")
        try:
            return dataclasses.replace(config, **self.storefront_overrides)
        except ValueError as err:
            raise InputError(f"storefront_overrides: {err}") from None


SECTIONS = {"base": BaseAgentSettings, "evaluate": EvaluateSettings, "select": SelectSettings,
            "loop": LoopSettings, "own_game": OwnGameSettings}


def load_demo_config(path: str | Path) -> DemoConfig:
    """DemoConfig from YAML; left-out keys keep their defaults. Raises InputError naming the file."""
    data = load_yaml_mapping(path)
    known = {f.name for f in dataclasses.fields(DemoConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"{path}: unknown section(s) {', '.join(unknown)}; sections: {', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    try:
        for name, value in data.items():
            if name in SECTIONS:
                if not isinstance(value, dict):
                    raise ValueError(f"section {name} must be a mapping of its settings")
                allowed = {f.name for f in dataclasses.fields(SECTIONS[name])}
                bad = sorted(set(value) - allowed)
                if bad:
                    raise ValueError(f"{name}: unknown key(s) {', '.join(bad)}; keys: {', '.join(sorted(allowed))}")
                kwargs[name] = SECTIONS[name](**value)
            else:
                kwargs[name] = value
        return DemoConfig(**kwargs)
    except (ValueError, TypeError) as err:
        raise InputError(f"{path}: {err}") from None


# The late stages' keys: left out of the base agent's settings when neither stage runs, so that the fingerprints
# of agents built (and shipped) before the stages existed stay theirs.
LATE_STAGE_KEYS = ("selection", "refresh", "late_epochs", "late_lr", "late_warmup_steps")


def base_settings(config: Any, storefront: Any) -> dict[str, Any]:
    """The base agent's recipe: the config's `base` section and the storefront config its demonstrations come from
    (the demonstrations are played on the target's own config, its max_steps, not evaluate.max_steps)."""
    settings = {**dataclasses.asdict(config.base), "storefront": dataclasses.asdict(storefront)}
    if not settings["selection"] and not settings["refresh"]:  # no late stages: the recipe of agents built before them
        for name in LATE_STAGE_KEYS:
            settings.pop(name)
    if not settings["copy_drills"]:  # likewise for agents built before the copy drills
        settings.pop("copy_drills")
    return json.loads(json.dumps(settings, default=str))  # as step.json stores it (lists, not tuples)
