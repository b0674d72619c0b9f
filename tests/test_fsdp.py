"""FSDP2 training on CPU (gloo): 2 ranks shard the frozen base and the adapter; rollouts come from a stub
vLLM server (in-process generation from a sharded model is not supported). The sharded run must reach
the same adapter as a plain data-parallel run on the same rollouts, save PEFT files once per version,
and, resumed from a checkpoint, end exactly where the uninterrupted run ended.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_vllm_backend import BASE, StubVLLM

REPO = Path(__file__).resolve().parent.parent
GAME = "capability_letter_density"


@pytest.fixture
def stub():
    server = StubVLLM(choices=list(range(260, 400)))  # merged BPE tokens: rewards differ inside a group
    yield server
    server.close()


def _torchrun(model_dir: Path, out: Path, stub_url: str, *extra: str) -> subprocess.CompletedProcess:
    # --standalone: torchrun binds a free port itself (no window for another process to take a probed one)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "train",
               "--game", GAME, "--model", str(model_dir), "--output_dir", str(out), "--groups_per_iteration", "4",
               "--group_size", "4", "--lora_r", "4", "--learning_rate", "3e-2", "--max_episode_tokens", "128",
               "--save_every", "1", *extra]
    env = {**os.environ, "TRACE_GAMES_DIRS": str(REPO / "tests" / "games"), "PYTHONPATH": str(REPO),
           "VLLM_BASE_URLS": stub_url, "VLLM_MODEL": BASE}
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def _comparable(metrics_file: Path) -> list[dict]:
    timing = {"gen_tokens_per_s", "train_tokens_per_s", "seconds"}
    return [{k: v for k, v in json.loads(l).items() if k not in timing} for l in metrics_file.read_text().splitlines()]


@pytest.mark.slow  # 11-12 s: a sharded 2-rank run beside a DDP one
def test_fsdp_matches_data_parallel(tiny_model_dir, tmp_path, stub):
    # same math on both sides (sharded runs do not use the shared-prefix path)
    plain = _torchrun(tiny_model_dir, tmp_path / "ddp", stub.url, "--iterations", "2", "--shared_prefix", "false")
    assert plain.returncode == 0, plain.stderr[-3000:]
    sharded = _torchrun(tiny_model_dir, tmp_path / "fsdp", stub.url, "--iterations", "2", "--fsdp", "true")
    assert sharded.returncode == 0, sharded.stderr[-3000:]

    a = load_file(str(tmp_path / "ddp" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "fsdp" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and a
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in b.items() if "lora_B" in k), "no update happened"
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-5), key
    config = json.loads((tmp_path / "fsdp" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"

    # every version was loaded once per run (rank 0 loads; both ranks sample from it)
    loads = [body["lora_name"] for path, body in stub.requests if path == "/v1/load_lora_adapter"]
    assert len(loads) == len(set(loads)) == 4, loads


@pytest.mark.slow  # 16-25 s on 2 shared cores: two sharded runs
def test_fsdp_resumed_run_ends_where_the_uninterrupted_one_did(tiny_model_dir, tmp_path, stub):
    sharded = _torchrun(tiny_model_dir, tmp_path / "fsdp", stub.url, "--iterations", "3", "--fsdp", "true")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    # resumed from iteration 2 into its own folder (the stub samples by seed: the same rollouts again)
    resumed = _torchrun(tiny_model_dir, tmp_path / "resumed", stub.url, "--iterations", "3", "--fsdp", "true",
                        "--resume", str(tmp_path / "fsdp" / "checkpoints" / "iter_000002"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 2" in resumed.stdout
    straight = load_file(str(tmp_path / "fsdp" / "adapter_model.safetensors"))
    again = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    at_two = load_file(str(tmp_path / "fsdp" / "checkpoints" / "iter_000002" / "adapter" / "adapter_model.safetensors"))
    assert straight.keys() == again.keys() and straight
    assert all(torch.equal(straight[k], again[k]) for k in straight), "resumed adapter differs"
    assert not all(torch.equal(straight[k], at_two[k]) for k in straight), "iteration 3 changed nothing"
    assert _comparable(tmp_path / "resumed" / "metrics.jsonl") == _comparable(tmp_path / "fsdp" / "metrics.jsonl")[2:]
