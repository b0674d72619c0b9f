"""Every training command of the README's Step 3, run for one iteration, must generate tokens and train.

The commands are read from the README itself (so a command that changes is tested as written), with
placeholders filled in: `torchrun` -> 2 gloo ranks on a free port; VLLM_BASE_URLS -> a stub vLLM server;
`capability_<name>` -> the test game `capability_letter_density`, played by the tiny model the README's own
`python -m train.tiny` line builds (a random-init model's replies already score differently there).

The commands that name a storefront game (`capability_precondition_verification`) get a model that can act in
it. The README names one (`runs/demo/base/model`, the CPU demo's base agent: 32 minutes of SFT, too long for a
test) or the user's own; a random-init model cannot stand in: every storefront game scores its noise alike, so
no group has a reward spread and no update runs. The stand-in here is `acting_model()`: a smaller tiny model
taught in about 30 s, by the project's own SFT, the oracle's episode and a wrong one-line reply on exactly the
tasks that one iteration of the command plays (its seeds and game overrides), so its samples score 1 or 0 within
a group, as an agent's would. Only the model is stood in for, and the game holds one request per episode
(`requests_per_episode: 1` added to its overrides: the stand-in memorizes whole episodes, and the games' three
requests would take minutes of SFT): the command, its config, the game, the episodes and the update are the
real ones.

Every run gets a small iteration (2 groups x 4) in its own output folder. Each must generate tokens in every
episode, run an update (a group with a reward spread) and change the adapter.

Slow (7 s to 1 min each on 2 shared cores, plus ~30 s per acting model): `make test-slow`.
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
import yaml
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from game_registry import GameSpec, get_game
from train.__main__ import parse_args
from train.config import load_config
from train.sft import SFTConfig, tokenize_chats, train_sft
from train.tiny import build_tiny_model

from test_vllm_backend import BASE, StubVLLM

REPO = Path(__file__).resolve().parent.parent
LETTER_GAME = "capability_letter_density"
SMALL = ["--iterations", "1", "--groups_per_iteration", "2", "--group_size", "4", "--save_every", "1"]
MODEL_PLACEHOLDERS = ("<MODEL_DIR>", "<MODEL>", "runs/tiny-model", "runs/demo/base/model")
WRONG_REPLY = "All done: your request is complete."  # acts on nothing: no game of this repo may pay for it

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


def acting_model(spec: GameSpec, game_overrides: dict, seeds: list[int], out: Path) -> Path:
    """A tiny model that acts in `spec` on exactly these task seeds (module docstring): taught the oracle's
    episode and a wrong first reply on each, so that at temperature 1 it plays one or the other."""
    records = []
    for seed in seeds:
        for wrong in (False, True):
            game = spec.make(**game_overrides)
            game.reset(seed)
            for _ in range(1 if wrong else spec.max_turns):
                if game.done:
                    break
                game.step(spec.extract_action(WRONG_REPLY if wrong else game.oracle_response()))
            reward = game.get_summary()["reward"]
            # The premise of the stand-in: the two episodes score apart.
            assert reward == (0.0 if wrong else 1.0), (spec.name, seed, wrong, reward)
            records.append({"messages": game.get_messages(), "tools": game.get_tool_schemas()})
    build_tiny_model(out, hidden_size=96, num_layers=2)  # 2 layers learn these few episodes in ~200 steps
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    sft = SFTConfig(epochs=100, lr=1e-2, warmup_steps=5, final_lr_ratio=1.0, batch_tokens=8192)
    figures = train_sft(model, tokenize_chats(tokenizer, records, progress=False), sft, tokenizer.pad_token_id,
                        progress=False)
    assert figures["final_loss"] < 0.05, figures  # learned both episodes (the branch costs ~ln 2 on one token)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def acting_models(tmp_path_factory):
    """acting_model() per (game, overrides, seeds), built once for the module."""
    built: dict[str, Path] = {}

    def get(spec: GameSpec, game_overrides: dict, seeds: list[int]) -> Path:
        key = json.dumps([spec.name, game_overrides, seeds], sort_keys=True)
        if key not in built:
            built[key] = acting_model(spec, game_overrides, seeds, tmp_path_factory.mktemp("acting") / "model")
        return built[key]

    return get


def _model_for(words: list[str], readme_tiny_model: Path, acting_models) -> Path:
    """The README tiny model for the letter game, an acting model for a storefront game (module docstring)."""
    at = next(i for i in range(1, len(words)) if words[i - 1:i + 1] == ["-m", "train"])
    args, overrides = parse_args(words[at + 1:] + SMALL)
    config = load_config(args.config, overrides, game=args.game, model="unused")
    if config.game == LETTER_GAME:
        return readme_tiny_model
    seeds = [config.train_seed_start + g for g in range(config.groups_per_iteration)]  # the first iteration's
    return acting_models(get_game(config.game), config.game_overrides, seeds)


def _runnable(command: str, readme_tiny_model: Path, acting_models, stub_url: str,
              out: Path) -> tuple[list[str], dict[str, str]]:
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
    words = _one_request_per_episode(words)
    model = _model_for(words, readme_tiny_model, acting_models)
    words = [str(model) if w in MODEL_PLACEHOLDERS else w for w in words]
    words = [str(out) if w.startswith("pipeline/adapters/") else w for w in words]  # --resume <the run's folder>
    return words + ["--output_dir", str(out)], env


def _one_request_per_episode(words: list[str]) -> list[str]:
    """A storefront game's command with requests_per_episode=1 added to its game overrides: the acting stand-in
    memorizes whole episodes, and three-request ones take minutes of SFT instead of ~30 s (module docstring)."""
    at = next(i for i in range(1, len(words)) if words[i - 1:i + 1] == ["-m", "train"])
    game = words[words.index("--game") + 1] if "--game" in words else ""
    if not game.startswith("capability_") or game == LETTER_GAME:
        return words
    if "--game_overrides" in words:
        i = words.index("--game_overrides")
        overrides = {**yaml.safe_load(words[i + 1]), "requests_per_episode": 1}
        return [*words[:i + 1], json.dumps(overrides), *words[i + 2:]]
    return [*words[:at + 1], "--game_overrides", json.dumps({"requests_per_episode": 1}), *words[at + 1:]]


@pytest.mark.parametrize("command", TRAIN_COMMANDS)
def test_readme_training_command_generates_tokens_and_trains(command, readme_tiny_model, acting_models, stub_server,
                                                            tmp_path):
    known = ("capability_<name>", *MODEL_PLACEHOLDERS, "pipeline/adapters/<name>")
    assert "<" not in re.sub("|".join(map(re.escape, known)), "", command), f"unknown placeholder in {command!r}"
    out = tmp_path / "run"
    argv, env = _runnable(command, readme_tiny_model, acting_models, stub_server.url, out)
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
    assert last["skipped_update"] == 0.0 and last["frac_constant_groups"] < 1.0, last
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert any(float(v.abs().max()) > 0 for k, v in adapter.items() if "lora_B" in k), last  # B starts at 0
