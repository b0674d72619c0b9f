"""Play the storefront benchmark with any agent, model-backed ones included; τ²-bench-format results.

    python -m train.play --agent hf:MODEL_DIR[:ADAPTER_DIR] --tasks 100 --seed 1 --out results.json \\
        [--config configs/storefront/cpu_demo.yaml] [--kinds cancel,return] [--temperature 1.0] [--trials 3]
    python -m train.play --agent vllm:http://localhost:8000 --tokenizer MODEL_DIR --tasks 100 --out r.json
    python -m train.play --agent expert | flawed:FLAW ...   (the same as python -m benchmarks.storefront.run)
    python -m train.play tau2 --domain retail --agent hf:MODEL_DIR --user-base-url URL --user-model M --out r.json
                                                            (τ²-bench's own tasks: python -m benchmarks.tau2_run)

The CLI of benchmarks/storefront/run.py (flags, task seeds, tables and results file are its own) with the agents
of train/agents.py: an HF model, optionally with a LoRA adapter or a routed model of Step 4, or a vLLM server.
One conversation at a time, the reference path for any agent; train/evaluate.py plays a local model's tasks
batched, far faster.
"""
from __future__ import annotations

import functools
import sys

from benchmarks.storefront import run as storefront_run
from common.cli import exit_code
from train.agents import any_agent


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tau2"]:  # τ²-bench's own tasks: benchmarks/tau2_run.py's CLI with the model agents
        from benchmarks import tau2_run

        return tau2_run.main(argv[1:], make_agent=functools.partial(any_agent,
                                                                    environment_agent=tau2_run.environment_agent),
                             prog="python -m train.play tau2")
    return storefront_run.main(argv, make_agent=any_agent, prog="python -m train.play")


if __name__ == "__main__":
    sys.exit(exit_code(main))  # Ctrl-C: one line, exit 130 (results are written only at the end)
