"""Tests against a REAL vLLM server: skipped unless TRACE_VLLM_URL is set.

`make test-vllm` (scripts/test_vllm.sh) builds the server's virtualenv, starts vLLM on a tiny model and
runs this folder with these variables set:

    TRACE_VLLM_URL        http://127.0.0.1:PORT of a server started with --enable-lora, --max-lora-rank >= 8,
                          --logprobs-mode processed_logprobs, --max-model-len >= 1024 and
                          VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
    TRACE_VLLM_MODEL      its --served-model-name
    TRACE_VLLM_MODEL_DIR  the local folder it serves (the trainer and the reference log-probs load it too;
                          it must be a Qwen-style model with the TRACE chat template, e.g. train.tiny's)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

NEEDED = ("TRACE_VLLM_URL", "TRACE_VLLM_MODEL", "TRACE_VLLM_MODEL_DIR")


@dataclass(frozen=True)
class RealServer:
    url: str
    model: str  # served base model name
    model_dir: Path  # the same weights, loaded in process for reference log-probs


@pytest.fixture(scope="session", autouse=True)
def _needs_a_real_server() -> None:
    if not os.environ.get("TRACE_VLLM_URL"):
        pytest.skip("needs a real vLLM server: run `make test-vllm` (it sets TRACE_VLLM_URL)")
    missing = [name for name in NEEDED if not os.environ.get(name)]
    if missing:
        pytest.fail(f"TRACE_VLLM_URL is set but {missing} are not; see tests/vllm/conftest.py")


@pytest.fixture(scope="session")
def real_server(_needs_a_real_server: None) -> RealServer:
    return RealServer(os.environ["TRACE_VLLM_URL"].rstrip("/"), os.environ["TRACE_VLLM_MODEL"],
                      Path(os.environ["TRACE_VLLM_MODEL_DIR"]))
