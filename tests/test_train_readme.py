"""Every training command of the README's Step 3, run for one iteration on the README's tiny model.

The commands are read from the README itself (so a command that changes is tested as written), with
placeholders filled in: <MODEL>/<MODEL_DIR>/runs/tiny-model -> the tiny model built by the README's own
`python -m train.tiny` line; `torchrun` -> 2 gloo ranks on a free port; VLLM_BASE_URLS -> a stub vLLM server;
`capability_<name>` -> the test game `capability_letter_density` (a random-init model's replies already
score differently there, so an update must happen). Every run gets a small iteration (2 groups x 4) in its
own output folder. Each must generate tokens in every episode, and change the adapter, or, where the game
cannot tell a random model's replies apart (the storefront games score all noise alike), say that no update
happened and why.

Slow (7 s to 2 min each on 2 shared cores; the storefront commands are the long ones: ~1,300-token prompts,
random replies run every turn to 160 tokens): `make test-slow`.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_vllm_backend import BASE, StubVLLM  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LETTER_GAME = "capability_letter_density"
SMALL = ["--iterations", "1", "--groups_per_iteration", "2", "--group_size", "4", "--save_every", "1"]

pytestmark = pytest.mark.slow


def _readme_block(heading: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index(heading):]
    return section[section.index("```bash") + len("```bash"): section.index("```", section.index("```bash") + 7)]


def _commands(block: str) -> list[str]:
    """Shell commands of a README block: comments dropped, continuation lines joined."""
    lines = [line.split("  #")[0].rstrip() for line in block.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip()]


TRAIN_COMMANDS = [c for c in _commands(_readme_block("## Step 3: GRPO")) if " -m train " in f"{c} "]


@pytest.fixture(scope="module")
def readme_tiny_model(tmp_path_factory) -> Path:
    (build,) = [c for c in _commands(_readme_block("## Tiny models")) if "-m train.tiny" in c]
    argv = shlex.split(build)
    out = tmp_path_factory.mktemp("readme") / "tiny-model"
    argv[argv.index("--out") + 1] = str(out)
    argv[0] = sys.executable
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def stub_server(readme_tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(str(readme_tiny_model))
    server = StubVLLM(choices=[tokenizer.convert_tokens_to_ids(t) for t in ("a", "e", "x", "t")])
    yield server
    server.close()


def _runnable(command: str, model: Path, stub_url: str, out: Path) -> tuple[list[str], dict[str, str]]:
    """The README command as an argv + environment for this machine (see the module docstring)."""
    env = {**os.environ, "TRACE_GAMES_DIRS": str(REPO / "tests" / "games"), "PYTHONPATH": str(REPO)}
    command = command.replace("capability_<name>", LETTER_GAME).replace("--game ...", f"--game {LETTER_GAME}")
    words = shlex.split(command)
    while "=" in words[0] and not words[0].startswith("-"):  # leading VAR=value assignments
        name, value = words.pop(0).split("=", 1)
        env[name] = {"VLLM_BASE_URLS": stub_url, "VLLM_MODEL": BASE}.get(name, value)
    if words[0] == "torchrun":
        words = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                 *[w for w in words[1:] if not w.startswith(("--nproc_per_node", "--master-port"))]]
    elif words[0] == "python":
        words[0] = sys.executable
    for placeholder in ("<MODEL_DIR>", "<MODEL>", "runs/tiny-model"):
        words = [str(model) if w == placeholder else w for w in words]
    words = [str(out) if w.startswith("pipeline/adapters/") else w for w in words]  # --resume <the run's folder>
    return words + ["--output_dir", str(out)], env


@pytest.mark.parametrize("command", TRAIN_COMMANDS)
def test_readme_training_command_generates_tokens_and_trains(command, readme_tiny_model, stub_server, tmp_path):
    known = ("capability_<name>", "<MODEL_DIR>", "<MODEL>", "pipeline/adapters/<name>")
    assert "<" not in re.sub("|".join(map(re.escape, known)), "", command), f"unknown placeholder in {command!r}"
    out = tmp_path / "run"
    argv, env = _runnable(command, readme_tiny_model, stub_server.url, out)
    if "--resume" in argv:  # first the run to resume, from the same command without --resume
        at = argv.index("--resume")
        first = subprocess.run(argv[:at] + argv[at + 2:] + SMALL, env=env, cwd=REPO, capture_output=True, text=True,
                               timeout=900)
        assert first.returncode == 0, first.stderr[-3000:]
        argv = argv + ["--iterations", "2", "--groups_per_iteration", "2", "--group_size", "4"]
    else:
        argv = argv + SMALL
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr[-3000:]}"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert last["gen_tokens"] > 0 and last["groups_without_tokens"] == 0, last
    simulations = json.loads((out / "rollouts" / f"iter_{last['iteration']:06d}.json").read_text())["simulations"]
    assert simulations and all(s["n_generated_tokens"] > 0 for s in simulations)
    adapter = load_file(str(out / "adapter_model.safetensors"))
    changed = any(float(v.abs().max()) > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0
    if LETTER_GAME in argv:
        assert last["skipped_update"] == 0.0 and changed, last
    else:  # a storefront game: a random-init model's replies all score alike within a group
        assert changed or (last["frac_constant_groups"] == 1.0 and "no update: every group's rewards were equal"
                           in result.stdout), (last, result.stdout[-2000:])
