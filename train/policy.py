"""What the GRPO update trains: a frozen base model plus trainable parameters.

`Policy` is the small interface the trainer needs (forward model, trainable parameters, a reference
context for the KL term, saving). `LoraPolicy` is the Step-3 implementation: a PEFT LoRA adapter on a
frozen base; the reference policy is the same model with the adapter disabled, so no second copy of
the base is kept. Step 4 trains router gates through the same interface.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from common.io import publish_staged, staging_folder, tensor_bytes
from common.validation import InputError
from common.run_folder import follow_umask
from train.distributed import world

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_tokenizer(model: str):
    """The tokenizer of a local directory or hub id (pad token set), without the weights: what a process needs
    that only renders prompts while a vLLM server samples."""
    from huggingface_hub.errors import HFValidationError
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except HFValidationError as err:  # neither a folder nor a valid hub id
        raise InputError(f"cannot load model {model!r}: no such folder, and not a hub id ({err})") from None
    except OSError as err:
        where = "this directory" if Path(model).is_dir() else "the Hugging Face hub (no network here?)"
        raise InputError(f"cannot load the tokenizer of {model!r} from {where}: {err}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_base_model(model: str, dtype: str = "float32", device: str | torch.device = "cpu"):
    """(model, tokenizer) from a local directory or hub id; offline hub ids fail with a clear message."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from huggingface_hub.errors import HFValidationError

    local = Path(model).is_dir()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        base = AutoModelForCausalLM.from_pretrained(model, dtype=DTYPES[dtype])
    except HFValidationError as err:  # neither a folder nor a valid hub id
        raise InputError(f"cannot load model {model!r}: no such folder, and not a hub id ({err})") from None
    except OSError as err:
        where = "this directory" if local else "the Hugging Face hub (no network here?)"
        raise InputError(f"cannot load model {model!r} from {where}: {err}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return base.to(device), tokenizer


class Policy:
    """Interface: `model` (a causal LM), `trainable_parameters()`, `reference()`, `adapter_state()`,
    `write_adapter(dir, state)`, `save(dir)`, and optimizer state helpers.

    Under FSDP, `adapter_state()` and the optimizer-state helpers are collectives (every rank calls them;
    rank 0 gets full tensors); `write_adapter` writes files and is called on rank 0 only.
    """

    model: torch.nn.Module
    sharded: bool = False

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Within this context `model` computes the reference policy (for the KL term)."""
        raise NotImplementedError(f"{type(self).__name__} has no reference policy; set kl_beta: 0")
        yield  # pragma: no cover

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        raise NotImplementedError

    def write_adapter(self, directory: str | Path, state: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def save(self, directory: str | Path) -> None:
        """Collective-safe save: every rank may call it; rank 0 writes."""
        state = self.adapter_state()
        if world()[0] == 0:
            self.write_adapter(directory, state)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Full optimizer state (keys: parameter index, or parameter name under FSDP)."""
        if not self.sharded:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        if not self.sharded:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, optimizer, state, options=StateDictOptions(full_state_dict=True))


class LoraPolicy(Policy):
    """A PEFT LoRA adapter on a frozen base model."""

    def __init__(self, peft_model: torch.nn.Module):
        self.model = peft_model

    @classmethod
    def create(cls, base: torch.nn.Module, *, r: int, alpha: int, dropout: float, target_modules: list[str],
               adapter_dir: str | Path | None = None) -> "LoraPolicy":
        """Freeze `base` and add a fresh LoRA adapter, or the one saved in `adapter_dir`."""
        from peft import LoraConfig, PeftModel, get_peft_model

        for parameter in base.parameters():
            parameter.requires_grad_(False)
        if adapter_dir is not None:  # continue from saved adapter weights (resume, or a later stage)
            return cls(PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True))
        present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
        missing = sorted(set(target_modules) - present)
        if missing:
            known = sorted(present & {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
            raise ValueError(f"lora_target_modules {missing} are not modules of this model; it has e.g. {known}")
        config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                            bias="none", task_type="CAUSAL_LM")
        return cls(get_peft_model(base, config))

    def shard(self) -> None:
        """FSDP2: shard every decoder layer and the root across the ranks (frozen base and adapter alike)."""
        from torch.distributed.fsdp import fully_shard

        layers = [m for m in self.model.modules() if type(m).__name__.endswith("DecoderLayer")]
        if not layers:
            raise ValueError("--fsdp: found no *DecoderLayer modules to shard in this model")
        for layer in layers:
            fully_shard(layer)
        fully_shard(self.model)
        self.sharded = True

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        with self.model.disable_adapter():
            yield

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        """Adapter tensors in PEFT's file naming (full tensors; under FSDP only rank 0 gets them)."""
        from peft import get_peft_model_state_dict

        if not self.sharded:
            return get_peft_model_state_dict(self.model, save_embedding_layers=False)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if world()[0] != 0:
            return None
        return get_peft_model_state_dict(self.model, state_dict=full, save_embedding_layers=False)

    def write_adapter(self, directory: str | Path, state: dict[str, torch.Tensor]) -> None:
        """PEFT format (adapter_model.safetensors + adapter_config.json), written to a temp folder and
        renamed file by file, so a crash never leaves a half-written adapter."""
        write_peft_adapter(self.model.peft_config["default"], state, directory)


def write_peft_adapter(peft_config: Any, state: dict[str, torch.Tensor], directory: str | Path) -> None:
    """What `PeftModel.save_pretrained` writes, from a state dict we already hold (it may come from FSDP),
    staged and fsynced, then renamed in file by file, config first."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with staging_folder(directory, ".adapter-", tensor_bytes(tensors.values()),
                        "the adapter files there are unchanged") as staging:
        save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        peft_config.save_pretrained(str(staging))
        follow_umask(staging)  # safetensors writes 0600 files: give the adapter the user's usual modes
        publish_staged(staging, directory, sorted(os.listdir(staging), key=lambda n: n != "adapter_config.json"))


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
