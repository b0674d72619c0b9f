"""Batched evaluation of a local model (optionally with a LoRA adapter or a routed Step-4 model) on a game.

    python -m train.evaluate --model DIR [--adapter DIR] --game storefront --tasks 100 --seed 1000 \\
        [--samples 4] [--temperature 1.0] [--config configs/storefront/cpu_demo.yaml] --out results.json

Every episode of a run is played at once through the in-process rollout backend (`train.episodes`), so 100
storefront tasks take seconds on the tiny model, where `python -m train.play --agent hf:...` plays them
one by one (it stays the reference path for any agent). Task i gets the seed `GameSpec.task_seed(seed, i)`
(default `benchmarks.storefront.run.task_seed`; τ²-bench's games play seed + i), so two runs with the same
`--seed` play the same tasks. `--samples K` plays each task K times; as in τ²-bench's trials, sample k of a
task is played with the customer's wording k where the game has wordings (the storefront's `reset(seed,
trial=k)`), so pass^k is the chance that the agent passes the same task K times, however the customer puts it,
and stays meaningful at temperature 0. Games without wordings replay the same opening with independent samples.

A routed Step-4 model in trajectory/global mode decides once per episode: the backend prefills each turn's whole
conversation, and the model routes every row from its first prompt (its tokens through the first assistant
header of the tokenizer's chat template, the opening prompt every turn starts with; `evaluate_model` gives the
model the tokenizer's header), so turn k routes as turn 1 did.

Writes τ²-bench-format results (`benchmarks.results`), with `info["pass_hat_k"]` per request kind for games
whose episodes report `request_kinds` (the storefront does), and prints the table.

A run survives its process: the command keeps every batch's episodes, then the sampler's state, in
`<out>.partial.jsonl` (benchmarks/results_journal.py) as the batch ends, so a run killed or interrupted is
continued by the same command from the first batch it had not finished, with the sampler where it was: the
results equal an uninterrupted run's, at any temperature. The journal's lock refuses a second process on the
same `--out` at once, and other settings (another model's weights, seed, config, ...) on the same file.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.results import pass_hat_k, write_results
from benchmarks.results_journal import Key, ResultsJournal, kept_on_interrupt
from benchmarks.storefront.run import task_seed
from common.io import check_model_folder, check_output_path
from common.validation import InputError, check_number
from common.cli import cli_entry, exit_code, seed_value
from game_registry import GameImportError, GameSpec, get_game
from train.backends import HFBackend
from train.batch_journal import folder_fingerprint, play_journaled
from train.episodes import ChatTokenizer, EpisodeRequest, check_prompts_fit, episode_to_simulation, run_episodes
from train.policy import load_tokenizer


def request_kinds(sim: dict[str, Any]) -> list[str]:
    """The request kinds a simulation's episode reported (empty for games without kinds)."""
    return list(dict.fromkeys((sim.get("reward_info") or {}).get("request_kinds") or []))


EVAL_BATCH_SIZE = 128  # episodes played at once


def evaluate_model(model: torch.nn.Module, tokenizer: Any, game: str, *, n_tasks: int, seed: int, samples: int = 1,
                   temperature: float = 0.0, game_overrides: dict[str, Any] | None = None,
                   max_episode_tokens: int = 4096, sampler_seed: int = 0, batch_size: int = EVAL_BATCH_SIZE,
                   journal: ResultsJournal | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Play `n_tasks` × `samples` episodes; returns (simulations, pass^k by request kind and "all").

    With a `journal`, each finished batch's episodes and then the sampler's state are kept in it, and the batches
    an earlier run finished are not played again (the sampler restarts from the state after the last of them)."""
    if n_tasks < 1 or samples < 1:
        raise ValueError(f"n_tasks and samples must be >= 1, got {n_tasks} and {samples}")
    spec = get_game(game)
    chat = ChatTokenizer(tokenizer)
    route_once_per_episode(model, tokenizer)
    backend = HFBackend(model, tokenizer.pad_token_id, seed=sampler_seed)
    requests = evaluation_requests(spec, n_tasks, seed, samples)
    keys: list[Key] = [(task, sample) for task in range(n_tasks) for sample in range(samples)]  # requests' order

    def play_batch(chunk: list[EpisodeRequest]) -> list[dict[str, Any]]:
        played = []
        for ep in run_episodes(spec, chunk, backend, chat, temperature=temperature,
                               max_episode_tokens=max_episode_tokens, game_overrides=game_overrides):
            sim = episode_to_simulation(ep, sim_id=f"{ep.request.seed}-s{ep.request.sample_idx}")
            sim["trial"] = ep.request.sample_idx  # pass^k groups a task's samples (wordings) as its trials
            played.append(sim)
        return played

    simulations = play_journaled(requests, keys, batch_size, backend, journal, play_batch)
    hat = {**pass_hat_k(simulations, samples), **pass_hat_k(simulations, samples, groups=request_kinds)}
    return simulations, hat


def route_once_per_episode(model: torch.nn.Module, tokenizer: Any) -> None:
    """Give a routed trajectory/global model the tokenizer's assistant header, so each episode routes from its
    first prompt on every turn (moe_gate/model_builder.py); other models are left as they are."""
    from moe_gate.model_builder import CapabilityModel, assistant_header_ids

    if isinstance(model, CapabilityModel) and model.mode != "token":
        model.set_assistant_header(assistant_header_ids(tokenizer))


def evaluation_requests(spec: GameSpec, n_tasks: int, seed: int, samples: int) -> list[EpisodeRequest]:
    """Every (task, sample) episode of a run; sample k plays the customer's wording k where the game has wordings."""
    trials = "trial" in inspect.signature(spec.make().reset).parameters  # the customer's wordings
    seed_of = spec.task_seed or task_seed
    return [EpisodeRequest(seed_of(seed, i), s, trial=s if trials else 0)
            for i in range(n_tasks) for s in range(samples)]


def format_pass_table(hat: dict[str, Any]) -> str:
    """One row per group ("all" last): tasks and pass^k for each k."""
    groups = sorted(g for g in hat if g != "all") + ["all"]
    ks = sorted({k for g in groups for k in hat[g]["pass_hat_k"]})
    width = max([12, *map(len, groups)])
    lines = [f"{'kind':{width}s} {'tasks':>6s}" + "".join(f" {f'pass^{k}':>7s}" for k in ks)]
    for group in groups:
        row = hat[group]["pass_hat_k"]
        lines.append(f"{group:{width}s} {hat[group]['n_tasks']:6d}"
                     + "".join(f" {row[k]:7.3f}" if k in row else f" {'-':>7s}" for k in ks))
    return "\n".join(lines)


def load_policy_model(model_dir: str | Path, adapter_dir: str | Path | None = None) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, tokenizer): a transformers folder, with a PEFT adapter (merged into the weights) or a
    routed gate folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from moe_gate import load_capability_model

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: model folder not found")
    if adapter_dir is not None:
        check_adapter_folder(adapter_dir, "adapter")
    if adapter_dir is not None and (Path(adapter_dir) / "gate_config.json").is_file():  # a Step-4 routed model
        model, tokenizer = load_capability_model(adapter_dir, base_model=str(model_dir))
        return model.eval(), tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    if adapter_dir is not None:
        # Merged into the weights for evaluation: the same function to float rounding, without two extra
        # matmuls per adapted layer at every decoding step (the demo's final step evaluates five adapters).
        model = load_peft_adapter(model, adapter_dir, model_dir).merge_and_unload()
    return model.eval(), tokenizer


ADAPTER_FILES = ("adapter_config.json", "gate_config.json")  # a PEFT adapter's, a Step-4 gate folder's


def check_adapter_folder(adapter_dir: str | Path, flag: str = "--adapter") -> None:
    """InputError unless `adapter_dir` is a PEFT adapter or a gate folder (the config file of either): an empty or
    wrong folder would otherwise be found only after the base model has loaded."""
    folder = Path(adapter_dir)
    if not folder.is_dir():
        raise InputError(f"{flag} {adapter_dir}: adapter folder not found")
    if not any((folder / name).is_file() for name in ADAPTER_FILES):
        raise InputError(f"{flag} {adapter_dir}: neither a PEFT adapter (adapter_config.json) nor a gate folder "
                         "(gate_config.json); give the folder a training run wrote")


def load_peft_adapter(model: torch.nn.Module, adapter_dir: str | Path, model_dir: str | Path) -> torch.nn.Module:
    """`model` with the PEFT adapter of `adapter_dir`; an adapter trained on another base (its weights' shapes
    differ: torch's load_state_dict raises RuntimeError "size mismatch") raises InputError naming both folders."""
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, str(adapter_dir))
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise  # not a mismatch of shapes: a bug or a failure of the machine, shown as it is
        raise InputError(f"adapter {adapter_dir} does not match the base model {model_dir} (its weights' shapes differ: "
                         "it was trained on another base model); give the base model it was trained on") from None


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="base model folder")
    parser.add_argument("--adapter", help="PEFT adapter folder or a moe_gate gate folder")
    parser.add_argument("--game", default="storefront", help="registered game (default storefront)")
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--seed", type=seed_value, default=1000, help="base task seed (default 1000)")
    parser.add_argument("--samples", type=int, default=1, help="episodes per task (pass^k over samples)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--config", help="YAML of the game's config fields (storefront: StorefrontConfig; τ²-bench: "
                                         "Tau2Config with the split and the customer's endpoint)")
    parser.add_argument("--max-episode-tokens", type=int, default=4096)
    parser.add_argument("--out", required=True, help="results JSON to write")
    args = parser.parse_args(argv)
    # Everything is checked before the model is loaded: flags, the output path, the game, the model folder, and
    # that the opening prompts leave room to generate (tokenizer only); then the journal's lock and settings.
    if args.tasks < 1 or args.samples < 1:
        raise InputError("--tasks and --samples must be >= 1")
    check_number(args.temperature, "--temperature", 0.0)
    check_output_path(args.out, "--out", [("--config", args.config), ("--model", args.model),
                                          ("--adapter", args.adapter)])
    spec = lookup_game(args.game)
    overrides = game_config_overrides(args.game, args.config)
    check_model_folder(args.model, "--model")
    if args.adapter is not None:
        check_adapter_folder(args.adapter)
    try:
        chat = ChatTokenizer(load_tokenizer(args.model))
        check_prompts_fit(spec, evaluation_requests(spec, args.tasks, args.seed, args.samples), chat,
                          args.max_episode_tokens, overrides)
    except ValueError as err:  # the tokenizer's loader, or a game's own check of its overrides
        raise InputError(str(err)) from None
    # What decides the results: a rerun with the same settings continues the journal, another is refused.
    settings = {"game": args.game, "tasks": args.tasks, "seed": args.seed, "samples": args.samples,
                "temperature": args.temperature, "config": overrides, "max_episode_tokens": args.max_episode_tokens,
                "batch_size": EVAL_BATCH_SIZE, "model": [str(args.model), folder_fingerprint(args.model)],
                "adapter": [args.adapter, folder_fingerprint(args.adapter)]}
    started = time.time()
    with ResultsJournal(args.out, settings) as journal, kept_on_interrupt(journal, "scored episodes"):
        try:
            model, tokenizer = load_policy_model(args.model, args.adapter)
        except InputError:
            raise  # already says what to fix
        except ValueError as err:  # transformers / peft refusing a folder's files
            raise InputError(f"{args.adapter or args.model}: cannot be loaded ({err})") from None
        simulations, hat = evaluate_model(model, tokenizer, args.game, n_tasks=args.tasks, seed=args.seed,
                                          samples=args.samples, temperature=args.temperature,
                                          game_overrides=overrides, max_episode_tokens=args.max_episode_tokens,
                                          batch_size=EVAL_BATCH_SIZE, journal=journal)
    info = {"game": args.game, "model": str(args.model), "adapter": args.adapter, "num_tasks": args.tasks,
            "samples": args.samples, "seed": args.seed, "temperature": args.temperature, "config": overrides,
            "seconds": round(time.time() - started, 1),
            "pass_hat_k": {g: {"n_tasks": v["n_tasks"], **{str(k): p for k, p in v["pass_hat_k"].items()}}
                           for g, v in hat.items()}}
    write_results(args.out, simulations, None, info)
    journal.remove()
    print(format_pass_table(hat))
    print(f"wrote {args.out} ({info['seconds']} s)")
    return 0


def lookup_game(name: str) -> GameSpec:
    """The registered game `name`; an unknown name or a game file that fails to import raise InputError."""
    try:
        return get_game(name)
    except KeyError as err:
        raise InputError(err.args[0]) from None
    except GameImportError as err:
        raise InputError(str(err)) from None


def game_config_overrides(game: str, config_path: str | None) -> dict[str, Any] | None:
    """The game's config fields from a YAML file (validated by building one game with them), or None. The
    storefront's file goes through its own loader (a partial file keeps the defaults of the rest)."""
    if not config_path:
        return None
    if game == "storefront":
        from benchmarks.storefront.run import load_config

        return dataclasses.asdict(load_config(config_path))
    from common.io import load_yaml_mapping
    from game_registry import check_game_overrides

    spec = lookup_game(game)
    if spec.config_cls is None:
        raise InputError(f"--config {config_path}: game {game!r} has no config fields to set")
    fields = load_yaml_mapping(config_path)
    check_game_overrides(spec, fields, where=f"--config {config_path}:")
    return fields


if __name__ == "__main__":
    sys.exit(exit_code(main))  # Ctrl-C: one line, exit 130 (the finished batches stay in the journal)
