"""Shared pytest fixtures."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

# A shell starts background jobs (`cmd &`, nohup) with SIGINT ignored, and an ignored signal stays ignored in
# every child: a test's Ctrl-C of a child would do nothing (see tests/signals.py). Python's own handler here is
# reset to the default action by exec(), so every child of the test run can be interrupted, whoever started it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _own_scenarios_may_run_unisolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where namespaces are missing (a container without CAP_SYS_ADMIN), the tests, which run only the
    repository's own scenarios, opt in to the unisolated sandbox explicitly (swebench/sandbox.py
    refuses it otherwise); tests of the refusal itself clear the variable in their own fixtures. Not where the
    sandbox is required (TRACE_REQUIRE_SANDBOX=1, `.ci/run`): there a missing sandbox fails the tests."""
    from swebench import sandbox

    if not sandbox.namespace_support()[0] and not sandbox.sandbox_required():
        monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Qwen3 model + BPE tokenizer (built-in corpus), built once per test session.

    vocab target 400, hidden 64, 2 layers, 2 heads, seed 0 (its tiny_build.json records them); builds in a
    few seconds. Load it with `AutoTokenizer.from_pretrained(...)` / `AutoModelForCausalLM.from_pretrained(...)`.
    Treat the folder as read-only: other tests share it.
    """
    from train.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    return build_tiny_model(out, vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, seed=0)
