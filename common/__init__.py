"""Helpers every step may import (Step 1's pipeline, Step 2's environments, Step 3's trainer, Step 4's gates).

io.py: atomic writes with the umask's mode, JSON/YAML reading that raises `InputError` naming the file,
and the checks every CLI runs at the door (`check_output_path`, `check_number`).
"""
import warnings

# peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` whenever it wraps a model: a FutureWarning
# users can do nothing about, printed on every LoRA load. That message alone is silenced.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
