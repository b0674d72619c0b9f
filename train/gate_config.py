"""Configuration of Step 4's gate training (`configs/moe_gate.yaml`): the routed model, the router SFT
warm start (`train.train_router_sft`) and GRPO over the gates (`train.grpo_gater`).

One YAML file holds all three: top-level keys describe the routed model, `sft:` the warm start and
`grpo:` the fields of train/config.py's GRPOConfig (its `lora_*` fields do not apply and are refused).
Every value is checked in `__post_init__`; a bad one raises InputError (common/validation.py) saying how to fix it. The resolved
config is saved as `moe_gate.yaml` next to every gate the commands write.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.io import atomic_write_text, load_yaml_mapping
from common.validation import InputError, need
from train.config import GRPOConfig, field_value
from train.tracking import check_report_to

MODES = ("token", "trajectory", "global")
ESTIMATORS = ("straight_through", "gumbel")


@dataclass
class SFTData:
    """One rollout results file (benchmarks/results.py format) whose assistant tokens all get `label`."""

    path: str
    label: str  # a slot name: an adapter name, or "base" (e.g. for target-benchmark rollouts)
    game: str = ""  # registered game whose tool schemas the conversations were rendered with ("" = none)

    def __post_init__(self) -> None:
        need(bool(self.path), "sft.data entries need a path to a rollout results file")
        need(bool(self.label), f"sft.data entry {self.path}: give a label (an adapter name or 'base')")


SFT_OBJECTIVES = ("label", "reward")


@dataclass
class SFTConfig:
    """Router SFT (`train.train_router_sft`).

    `balance_labels`: every label (slot) carries the same total weight in the cross-entropy, by class weights
    n_labeled / (n_labels_present x n_labeled_with_that_label) over the training set (tokens in token mode,
    conversations otherwise). Without it the label with the most data wins every token the gate cannot tell
    apart: the base slot, whose successful target rollouts are few beside GRPO's capability rollouts, would
    win only ties. Class weights rather than resampling to equal counts: undersampling throws away most of
    the larger labels' data and oversampling repeats the few base rollouts (more steps, memorised
    conversations), and both balance conversations where token routing needs tokens balanced (a target
    conversation is not as long as a capability game's).
    """

    data: list[SFTData] = field(default_factory=list)
    min_reward: float = 1.0  # only rollouts with at least this reward are used (successful ones)
    epochs: int = 3
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 8  # sequences per optimizer step
    load_balance_weight: float = 0.01  # lambda of the Switch load-balance term
    max_tokens: int = 4096  # longer conversations are cut (the labels of the cut part are lost)
    validation_fraction: float = 0.1  # held-out sequences for the routing accuracy reported per epoch
    balance_labels: bool = False  # weight the cross-entropy so that every label counts the same (see above)
    # "label": cross-entropy against each data entry's label (its rollouts with reward >= min_reward). "reward": each
    # entry's label is the slot that played its results; per task, every slot's mean reward is the target of that
    # slot's gate logit (binary cross-entropy) on every conversation played there, successful or not
    # (train/routing_targets.py says why); every slot, the base included, must have played the same tasks.
    objective: str = "label"

    def __post_init__(self) -> None:
        self.data = [d if isinstance(d, SFTData) else SFTData(**d) for d in self.data]
        need(0.0 <= self.min_reward <= 1.0, f"sft.min_reward must be in [0, 1], got {self.min_reward}")
        need(self.epochs >= 1, f"sft.epochs must be >= 1, got {self.epochs}")
        need(self.learning_rate > 0, f"sft.learning_rate must be > 0, got {self.learning_rate}")
        need(self.weight_decay >= 0, f"sft.weight_decay must be >= 0, got {self.weight_decay}")
        need(self.batch_size >= 1, f"sft.batch_size must be >= 1, got {self.batch_size}")
        need(self.load_balance_weight >= 0, f"sft.load_balance_weight must be >= 0, got {self.load_balance_weight}")
        need(self.max_tokens >= 16, f"sft.max_tokens must be >= 16, got {self.max_tokens}")
        need(0.0 <= self.validation_fraction < 1.0,
              f"sft.validation_fraction must be in [0, 1), got {self.validation_fraction}")
        need(isinstance(self.balance_labels, bool),
              f"sft.balance_labels must be true or false (a YAML boolean, unquoted), got {self.balance_labels!r}")
        need(self.objective in SFT_OBJECTIVES, f"sft.objective must be one of {list(SFT_OBJECTIVES)}, got "
                                               f"{self.objective!r}")
        need(not (self.objective == "reward" and self.balance_labels),
             "sft.balance_labels weights labels, and sft.objective reward has none (each slot's reward is a target "
             "of its own): set balance_labels: false")


@dataclass
class MoEGateConfig:
    model: str = ""  # base model folder (the one the adapters were trained on)
    adapters: dict[str, str] = field(default_factory=dict)  # capability name -> PEFT adapter folder, slot order
    mode: str = "token"  # token | trajectory | global
    include_base_slot: bool = True
    # straight_through | gumbel: how gates in train mode turn logits into gate values (moe_gate/gater.py). Router SFT
    # runs the model in eval mode and fits the logits, so it ignores both (and gumbel_tau); grpo_gater refuses gumbel.
    # Either way the value given here is used and recorded, whatever an init_gate was saved with.
    estimator: str = "straight_through"
    gumbel_tau: float = 1.0
    output_dir: str = "pipeline/gates/token"
    init_gate: str = ""  # gate folder to start from (e.g. the SFT warm start for grpo_gater); "" = zero init
    dtype: str = "float32"
    seed: int = 0
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: dict[str, Any] = field(default_factory=dict)  # GRPOConfig fields (train/config.py)
    grpo_games: list[str] = field(default_factory=list)  # >= 2 games: grpo_gater trains on their mix (not grpo.game)
    grpo_game_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # game -> config fields, in the mix
    # Trackers for router SFT and gate GRPO (train/tracking.py: tensorboard, wandb, trackio, mlflow); grpo.report_to
    # overrides it for gate GRPO
    report_to: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.sft, dict):
            self.sft = SFTConfig(**self.sft)
        need(isinstance(self.adapters, dict) and bool(self.adapters),
              "adapters must map each capability name to its PEFT adapter folder, e.g. "
              "{precondition_verification: pipeline/adapters/precondition_verification}")
        need("base" not in self.adapters, "adapters: 'base' is the base model's name (the serving front and the KL "
                                          "reference take it for the base), even with include_base_slot: false; "
                                          "rename that adapter")
        need(len(self.slot_names) >= 2, f"a gate needs at least 2 slots to choose from, got {self.slot_names}: list "
                                        "two or more adapters, or set include_base_slot: true")
        need(self.mode in MODES, f"mode must be one of {list(MODES)}, got {self.mode!r}")
        need(self.estimator in ESTIMATORS, f"estimator must be one of {list(ESTIMATORS)}, got {self.estimator!r}")
        need(self.gumbel_tau > 0, f"gumbel_tau must be > 0, got {self.gumbel_tau}")
        need(self.dtype in ("float32", "bfloat16"), f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        need(isinstance(self.grpo, dict), "grpo must be a mapping of GRPOConfig fields (see train/config.py)")
        lora = sorted(k for k in self.grpo if k.startswith("lora_"))
        need(not lora, f"grpo: {lora} configure a LoRA; grpo_gater trains only the gates, remove them")
        need(isinstance(self.grpo_game_overrides, dict) and all(
            isinstance(v, dict) for v in self.grpo_game_overrides.values()),
              f"grpo_game_overrides must map a game name to a mapping of its config fields, got "
              f"{self.grpo_game_overrides!r}")
        need(set(self.grpo_game_overrides) <= set(self.grpo_games),
              f"grpo_game_overrides names games outside grpo_games: "
              f"{sorted(set(self.grpo_game_overrides) - set(self.grpo_games))}")
        need(isinstance(self.grpo_games, list) and len(self.grpo_games) != 1,
              f"grpo_games must list at least two games to mix (or none; one game goes in grpo.game), "
              f"got {self.grpo_games!r}")
        self.report_to = check_report_to(self.report_to)
        slots = self.slot_names
        for entry in self.sft.data:
            need(entry.label in slots, f"sft.data {entry.path}: label {entry.label!r} is not a slot; slots are {slots}")

    @property
    def slot_names(self) -> list[str]:
        return (["base"] if self.include_base_slot else []) + list(self.adapters)

    def grpo_config(self, **fixed: Any) -> GRPOConfig:
        """The GRPOConfig of `grpo:` (model, output_dir, seed, dtype and report_to from the top level unless set
        there)."""
        return GRPOConfig(**self.grpo_values(**fixed))

    def grpo_values(self, **fixed: Any) -> dict[str, Any]:
        """The fields `grpo_config` sets (the rest keep GRPOConfig's defaults); unknown keys raise InputError."""
        values = {"model": self.model, "output_dir": self.output_dir, "seed": self.seed, "dtype": self.dtype,
                  "report_to": self.report_to, **self.grpo, **{k: v for k, v in fixed.items() if v is not None}}
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise InputError(f"grpo: unknown keys {unknown}; valid keys: {sorted(names)}")
        # YAML values (`learning_rate: 1e-3` is text to YAML 1.1) read as GRPOConfig reads its own file's
        return {key: field_value(key, value, f"grpo: {key}") for key, value in values.items()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(MoEGateConfig)}


def load_gate_config(path: str | Path | None, **overrides: Any) -> MoEGateConfig:
    """MoEGateConfig from YAML plus keyword overrides (None values ignored); unknown keys raise InputError."""
    values = load_yaml_mapping(path) if path is not None else {}
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise InputError(f"{path}: unknown keys {unknown}; valid keys: {sorted(_FIELDS)}")
    if isinstance(values.get("sft"), dict):
        sft_fields = {f.name for f in dataclasses.fields(SFTConfig)}
        bad = sorted(set(values["sft"]) - sft_fields)
        if bad:
            raise InputError(f"{path}: unknown sft keys {bad}; valid keys: {sorted(sft_fields)}")
        for key in ("learning_rate", "weight_decay", "load_balance_weight", "min_reward", "validation_fraction"):
            if isinstance(values["sft"].get(key), str):  # YAML 1.1 reads `1e-3` (no dot) as a string
                try:
                    values["sft"][key] = float(values["sft"][key])
                except ValueError:
                    raise InputError(f"{path}: sft.{key} expects a number, got {values['sft'][key]!r}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return MoEGateConfig(**values)
    except TypeError as err:
        raise InputError(f"bad config: {err}") from None


def save_gate_config(config: MoEGateConfig, path: str | Path, command: str) -> None:
    header = f"# Resolved moe_gate config. Reproduce with: {command} --config {path}\n"
    atomic_write_text(path, header + yaml.safe_dump(config.to_dict(), sort_keys=False))
