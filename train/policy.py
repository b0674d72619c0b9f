"""What the GRPO update trains: a frozen base model plus trainable parameters.

`Policy` is the small interface the trainer needs (forward model, trainable parameters, a reference
context for the KL term, saving). `LoraPolicy` is the Step-3 implementation: a PEFT LoRA adapter on a
frozen base; the reference policy is the same model with the adapter disabled, so no second copy of
the base is kept. Step 4 trains router gates through the same interface.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from pipeline._io import InputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_base_model(model: str, dtype: str = "float32", device: str | torch.device = "cpu"):
    """(model, tokenizer) from a local directory or hub id; offline hub ids fail with a clear message."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(model).is_dir()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        base = AutoModelForCausalLM.from_pretrained(model, dtype=DTYPES[dtype])
    except OSError as err:
        where = "this directory" if local else "the Hugging Face hub (no network here?)"
        raise InputError(f"cannot load model {model!r} from {where}: {err}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return base.to(device), tokenizer


class Policy:
    """Interface: `model` (a causal LM), `trainable_parameters()`, `reference()`, `save(dir)`."""

    model: torch.nn.Module

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Within this context `model` computes the reference policy (for the KL term)."""
        raise NotImplementedError(f"{type(self).__name__} has no reference policy; set kl_beta: 0")
        yield  # pragma: no cover

    def save(self, directory: str | Path) -> None:
        raise NotImplementedError


class LoraPolicy(Policy):
    """A PEFT LoRA adapter on a frozen base model."""

    def __init__(self, base: torch.nn.Module, *, r: int, alpha: int, dropout: float, target_modules: list[str],
                 adapter_dir: str | Path | None = None):
        from peft import LoraConfig, PeftModel, get_peft_model

        for parameter in base.parameters():
            parameter.requires_grad_(False)
        if adapter_dir is not None:  # continue from saved adapter weights (resume, or a later stage)
            self.model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
        else:
            present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
            missing = sorted(set(target_modules) - present)
            if missing:
                raise ValueError(f"lora_target_modules {missing} are not modules of this model; it has e.g. "
                                 f"{sorted(present & {'q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'})}")
            config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                                bias="none", task_type="CAUSAL_LM")
            self.model = get_peft_model(base, config)

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        with self.model.disable_adapter():
            yield

    def save(self, directory: str | Path) -> None:
        """PEFT format (adapter_model.safetensors + adapter_config.json), written to a temp folder and
        renamed file by file, so a crash never leaves a half-written adapter."""
        save_adapter_atomically(self.model, directory)


def save_adapter_atomically(peft_model: torch.nn.Module, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".adapter-", dir=directory))
    try:
        peft_model.save_pretrained(str(staging), safe_serialization=True)
        for name in sorted(os.listdir(staging)):  # config before weights: both are complete files
            os.replace(staging / name, directory / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
