"""Steps 2-4 of the CPU demo and its baselines, in process, on the base agent the demo built.

- `calibrate_capability`: Step 2 for one selected capability: its registered game (`capability_<name>`,
  drawn from the evaluation's storefront surface) is validated (`pipeline.validate_game.validate`, probes
  included), then its declared difficulty knobs are bisected in order (`pipeline.recalibrate.search_knob`)
  with rollouts of the base agent itself until its success rate is in the band: a knob that cannot reach
  the band stays at its value nearest to it while the next knob moves. Each probed value also records its
  mean reward, the estimated share of GRPO groups whose rewards differ, the decision classes' shares and the
  first mistakes of the failed episodes; a game is trained only where the base agent's full success reached the
  band (`demo.trainable.not_trained_because`). A game no value brought into the band gets a mistake census
  (`count_first_mistakes`): its first mistakes counted over at least 30 failed episodes at the settings kept.
- `train_lora`: one GRPO LoRA run (`train.grpo.GRPOTrainer`, the code of `python -m train`) on any game
  spec: a capability game (Step 3), the storefront itself (the direct-GRPO baseline) or a mix of the
  selected games (the single-adapter baseline). The GRPO loop is the same in all three. Direct GRPO keeps its
  adapter checkpoints at fractions of its budget (`checkpoint_plan`, `evaluate.efficiency_fractions`) for the
  demo's efficiency step.
- `train_gate`: Step 4: router SFT warm start on the capability runs' successful rollouts (labeled with their
  capability, hinted ones left out) and the base agent's successful Step-1 rollouts on the target (labeled
  "base"), labels balanced, or (loop.gate_labels "reward") on reward targets: each slot's gate logit fitted to
  its measured mean reward per target task (`train.routing_targets`); then GRPO over the gates only, on the mix of
  the selected games (`train.train_router_sft`, `train.grpo_gater`).
- `routing_by_kind`: how often the gate picks each slot on the target, per request kind, from a sample of
  TRACE's saved evaluation conversations (`plot_routing` draws one conversation).
"""
from __future__ import annotations

import math
import random
import shutil
from collections import Counter
from fractions import Fraction
from pathlib import Path
from common.paths import REPO_ROOT
from typing import Any, Sequence

import yaml

from benchmarks.results import load_results, make_simulation
from game_registry import GameSpec, get_game
from demo.plotting import pyplot, save_figure
from demo.trainable import FIGURES
from pipeline.recalibrate import EPISODE_FACTS, MIN_FAILED_FOR_MISTAKES, episode_classes, search_knobs
from train.backends import HFBackend
from train.checkpoint import metrics_rows
from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes

HISTORY_KEYS = ("knob", "value", *FIGURES)
# What calibration keeps of each probe besides the figures: the decision classes and the first mistakes of the
# failed episodes (`pipeline.recalibrate.episode_classes`), for the report of a game this agent cannot win.
CLASS_KEYS = ("class_shares", "success_by_class", "first_mistakes", "failed")
# A game the base agent cannot win is reported with its first mistakes counted over at least
# MIN_FAILED_FOR_MISTAKES failed episodes (issue 41): at the settings kept, the probe's own failures and then more
# rounds of fresh tasks (each calibration_tasks x calibration_samples episodes), at most CENSUS_MAX_ROUNDS of them,
# for a game it nearly always wins (then the census says how few failed).
CENSUS_MAX_ROUNDS = 4

GRPO_TINY = REPO_ROOT / "configs" / "grpo_tiny.yaml"
# Step 1's analysis results (demo/run.py's `select` step: the base agent sampled on the target storefront),
# relative to the run folder that holds the gate folder: router SFT's "base"-labeled data.
ANALYSIS_RESULTS = ("select", "analysis_seed*_sampled.json")
TARGET_GAME = "storefront"
# TRACE evaluation conversations re-scored per request kind for the routing shares (`routing_by_kind`).
ROUTING_PER_KIND = 20


def game_for(capability: str) -> GameSpec | None:
    """The registered game that trains `capability`, or None when there is none."""
    try:
        return get_game(f"capability_{capability}")
    except KeyError:
        return None


CALIBRATION_FIRST_SEED = 10_000  # calibration's task seeds: first_seed.. (the mistake census goes on after them)


def model_collector(model: Any, tokenizer: Any, base_overrides: dict[str, Any], n_tasks: int, n_samples: int,
                    temperature: float = 1.0, max_episode_tokens: int = 2048, first_seed: int = CALIBRATION_FIRST_SEED):
    """A `search_knob` collector: the model plays seeds first_seed.. (n_samples each) with the knob set."""
    chat = ChatTokenizer(tokenizer)

    def collect(spec: GameSpec, overrides: dict[str, Any]) -> list[dict[str, Any]]:
        backend = HFBackend(model, tokenizer.pad_token_id, seed=0)  # the same draws for every knob value
        requests = [EpisodeRequest(first_seed + i, s) for i in range(n_tasks) for s in range(n_samples)]
        episodes = run_episodes(spec, requests, backend, chat, temperature=temperature,
                                max_episode_tokens=max_episode_tokens, game_overrides={**base_overrides, **overrides})
        return [make_simulation(task_id=str(ep.request.seed), messages=ep.conversation,
                                reward_info={"reward": ep.reward, **{k: ep.summary.get(k) for k in EPISODE_FACTS}},
                                termination_reason=ep.termination_reason,
                                sample_idx=ep.request.sample_idx, seed=ep.request.seed) for ep in episodes]

    return collect


def count_first_mistakes(spec: GameSpec, model: Any, tokenizer: Any, overrides: dict[str, Any], settings: Any,
                         kept: dict[str, Any]) -> dict[str, Any] | None:
    """The mistake census of a game no probed value brought into the band: the base agent's first mistakes at the
    settings kept (`overrides`), counted over the kept probe's failed episodes and then over rounds of fresh tasks
    (seeds after calibration's) until at least MIN_FAILED_FOR_MISTAKES episodes failed or CENSUS_MAX_ROUNDS rounds were
    played. None for a game that records no first mistakes. Returns {"episodes", "failed", "success_rate",
    "first_mistakes": {class: count}, "rounds", "min_failed"}."""
    n_tasks, n_samples = settings.calibration_tasks, settings.calibration_samples
    mistakes = Counter(kept.get("first_mistakes") or {})
    episodes, rounds = kept["n_samples"], 0
    failed = round(episodes * (1.0 - kept["success_rate"]))
    while failed < MIN_FAILED_FOR_MISTAKES and rounds < CENSUS_MAX_ROUNDS:
        rounds += 1
        collect = model_collector(model, tokenizer, overrides, n_tasks, n_samples,
                                  first_seed=CALIBRATION_FIRST_SEED + rounds * n_tasks)
        simulations = collect(spec, {})
        episodes += len(simulations)
        failed += sum(sim["reward_info"]["reward"] < 1.0 for sim in simulations)
        mistakes.update(episode_classes(simulations).get("first_mistakes") or {})
    if failed and not mistakes:
        return None  # failed episodes but no first-mistake records: a game that does not classify its mistakes
    return {"episodes": episodes, "failed": failed, "success_rate": (episodes - failed) / episodes,
            "first_mistakes": dict(sorted(mistakes.items(), key=lambda item: (-item[1], item[0]))),
            "rounds": rounds, "min_failed": MIN_FAILED_FOR_MISTAKES}


def calibrate_capability(capability: str, model: Any, tokenizer: Any, game_overrides: dict[str, Any],
                         settings: Any, census: bool = True) -> dict[str, Any]:
    """Validate the capability's game and move its declared difficulty knobs (`search_knobs`) into the band; with
    `census`, a game no value brought into the band gets its first mistakes counted (`count_first_mistakes`)."""
    from pipeline.validate_game import validate, with_overrides

    spec = game_for(capability)
    if spec is None:
        return {"status": "no_game", "detail": f"no registered game capability_{capability}: not trained"}
    # Validated as it will be calibrated and trained: on the evaluation's storefront surface.
    report = validate(with_overrides(spec, game_overrides), seeds=settings.validate_seeds,
                      fuzz_actions=settings.fuzz_actions, probes=True)
    result: dict[str, Any] = {"game": spec.name, "validated": report["passed"], "validation_failures": report["failures"],
                              "validation_seconds": report["seconds"]}
    if not report["passed"]:
        return {**result, "status": "invalid", "detail": "; ".join(report["failures"])}
    if not spec.difficulty_knobs:
        return {**result, "status": "no_knob", "value": None, "game_overrides": dict(game_overrides)}
    collect = model_collector(model, tokenizer, game_overrides, settings.calibration_tasks,
                              settings.calibration_samples)
    search = search_knobs(spec, collect, band=tuple(settings.band), max_rounds=settings.max_rounds,
                          group_size=settings.group_size)
    history = [{**{k: probe[k] for k in HISTORY_KEYS}, **{k: probe[k] for k in CLASS_KEYS if k in probe}}
               for probe in search["history"]]
    result = {**result, **{k: search[k] for k in ("status", "knob", "value", *FIGURES, "group_size", "settings", "band")},
              "history": history, "game_overrides": {**game_overrides, **search["settings"]}}
    if census and search["status"] != "in_band":  # no probed value reached the band (the search stops at one)
        kept = next((p for p in reversed(search["history"])
                     if p["knob"] == search["knob"] and p["value"] == search["value"]), None)
        counted = None if kept is None else count_first_mistakes(spec, model, tokenizer, result["game_overrides"],
                                                                  settings, kept)
        if counted is not None:
            result["mistake_census"] = counted
    return result




def grpo_config(game: str, model_dir: Path, output_dir: Path, game_overrides: dict[str, Any], settings: Any,
                iterations: int, report_to: list[str] | None = None, checkpoints_at: Sequence[int] = (),
                task_pool: int = 0, seed: int = 0) -> Any:
    """The GRPO config of one demo run: configs/grpo_tiny.yaml with the demo's budget, learning rate and optimizer
    steps per iteration (and trackers). It saves a
    checkpoint at the last iteration and, with `checkpoints_at`, at every multiple of their greatest common divisor
    (the trainer saves every `save_every` iterations), so at each of them. `task_pool`: the run's tasks (0: a fresh
    one per group; N: a fixed pool of N, `GRPOConfig.task_pool`). `seed`: the run's training seed (torch, the
    sampler, the pool's order), the demo's repeat number."""
    from train.config import load_config

    return load_config(str(GRPO_TINY), game=game, model=str(model_dir), output_dir=str(output_dir),
                       game_overrides=dict(game_overrides), iterations=iterations,
                       groups_per_iteration=settings.groups_per_iteration, group_size=settings.group_size,
                       learning_rate=settings.learning_rate, max_episode_tokens=settings.max_episode_tokens,
                       hint_fraction=settings.hint_fraction, ppo_epochs=settings.ppo_epochs,
                       minibatches_per_iteration=settings.minibatches_per_iteration,
                       save_every=math.gcd(*checkpoints_at) if checkpoints_at else max(1, iterations),
                       micro_batch_size=8, report_to=list(report_to or []), task_pool=task_pool, seed=seed)


def checkpoint_plan(iterations: int, fractions: Sequence[float], model: str | None = "direct GRPO"
                    ) -> list[dict[str, Any]]:
    """The checkpoints of a GRPO run of `iterations` that stand for `fractions` of its budget: per fraction, the
    iteration by which the run had used at most that share of its episodes (rounded down, at least 1), and its label
    by the share it really is ("direct GRPO @1/4" for 5 of 20 iterations; 1 of 3 iterations is "@1/3", whatever
    fraction asked for it; `model` names the run; None: no label, for a run that is no model of its own). A
    fraction that lands on the last iteration (the final adapter, evaluated anyway) or on an iteration an earlier
    fraction took is left out."""
    plan: list[dict[str, Any]] = []
    for wanted in fractions:
        iteration = max(1, math.floor(wanted * iterations + 1e-9))
        if iteration >= iterations or any(p["iteration"] == iteration for p in plan):
            continue
        share = Fraction(iteration, iterations)
        plan.append({"fraction": float(share), "asked": wanted, "iteration": iteration,
                     **({"label": f"{model} @{share.numerator}/{share.denominator}"} if model else {})})
    return plan


def planned_checkpoints(plan: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """A `train_lora` run's kept "checkpoints", each with its `checkpoint_plan` entry (fraction, asked, label), in
    the plan's order."""
    by_iteration = {c["iteration"]: c for c in run["checkpoints"]}
    return [{**p, **by_iteration[p["iteration"]]} for p in plan]


def train_lora(spec: GameSpec, model_dir: Path, output_dir: Path, game_overrides: dict[str, Any], settings: Any,
               iterations: int, report_to: list[str] | None = None, checkpoints_at: Sequence[int] = (),
               task_pool: int = 0, seed: int = 0) -> dict[str, Any]:
    """One GRPO LoRA run (reporting to the trackers of `report_to`, TensorBoard's in output_dir/tb); returns its
    per-iteration metrics (reward curve) and the episodes it used.

    With `checkpoints_at` (iterations before the last), "checkpoints" lists the adapter the run had at each of
    them, {"iteration", "episodes", "adapter"} (output_dir/checkpoints/iter_XXXXXX/adapter); the trainer saves
    every multiple of their greatest common divisor, and those not asked for (other than the last) are removed.

    `task_pool` N > 0 trains on a fixed pool of N tasks (`GRPOConfig.task_pool`); "tasks" then gives the pool, the
    distinct tasks the run played and its passes over the pool (groups played / N)."""
    import torch

    from train.grpo import GRPOTrainer
    from train.policy import LoraPolicy, load_base_model

    checkpoints_at = sorted(set(checkpoints_at))
    if any(isinstance(i, bool) or not isinstance(i, int) or not 1 <= i < iterations for i in checkpoints_at):
        raise ValueError(f"checkpoints_at must list iterations in [1, {iterations - 1}], got {checkpoints_at!r}")
    config = grpo_config(spec.name, model_dir, output_dir, game_overrides, settings, iterations, report_to,
                         checkpoints_at, task_pool, seed)
    torch.manual_seed(config.seed)
    base, tokenizer = load_base_model(config.model, config.dtype, torch.device("cuda" if torch.cuda.is_available()
                                                                                  else "cpu"))
    policy = LoraPolicy.create(base, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                               target_modules=config.lora_target_modules)
    backend = HFBackend(policy.model, tokenizer.pad_token_id, seed=config.seed)
    trainer = GRPOTrainer(config, spec, policy, tokenizer, backend)
    trainer.run()
    backend.close()
    metrics = metrics_rows(output_dir / "metrics.jsonl")
    per_iteration = settings.groups_per_iteration * settings.group_size
    out = {"adapter": str(output_dir), "iterations": iterations, "episodes": iterations * per_iteration,
           "curve": [{"iteration": m["iteration"], "mean_reward": m["mean_reward_all_episodes"],
                      "success_rate": m["success_rate"]} for m in metrics]}
    seeds = [config.task_seed(i, g) for i in range(iterations) for g in range(config.groups_per_iteration)]
    out["tasks"] = {"pool": task_pool, "groups": len(seeds), "distinct": len(set(seeds)),
                    "passes": len(seeds) / task_pool if task_pool else None}
    if checkpoints_at:
        out["checkpoints"] = kept_checkpoints(output_dir / "checkpoints", checkpoints_at, iterations, per_iteration)
    return out


def kept_checkpoints(folder: Path, iterations_at: Sequence[int], last: int, per_iteration: int
                     ) -> list[dict[str, Any]]:
    """The checkpoints of `iterations_at` under `folder` (a GRPO run's checkpoints/) as {"iteration", "episodes",
    "adapter"}; every other checkpoint but the last iteration's is removed. A missing one raises: the trainer was
    asked to save it."""
    from train.checkpoint import CHECKPOINT_PREFIX

    wanted = {folder / f"{CHECKPOINT_PREFIX}{i:06d}": i for i in iterations_at}
    missing = [str(path) for path in wanted if not (path / "adapter" / "adapter_config.json").is_file()]
    if missing:
        raise RuntimeError(f"GRPO saved no adapter checkpoint at {', '.join(missing)}")
    for path in sorted(folder.glob(f"{CHECKPOINT_PREFIX}*")):
        if path not in wanted and path.name != f"{CHECKPOINT_PREFIX}{last:06d}":
            shutil.rmtree(path)
    return [{"iteration": i, "episodes": i * per_iteration, "adapter": str(path / "adapter")}
            for path, i in wanted.items()]


def target_rollouts_of(folder: Path) -> list[Path]:
    """Step 1's analysis results files of the demo run whose gate folder is `folder` (ANALYSIS_RESULTS)."""
    where, pattern = ANALYSIS_RESULTS
    return sorted((folder.parent / where).glob(pattern))


def sft_data(adapters: dict[str, str], target_rollouts: list[Path], runs: dict[str, str] | None = None,
             through: int | None = None) -> list[dict[str, str]]:
    """Router SFT's `sft.data`: every GRPO rollouts file of each capability run labeled with the capability, and
    the base agent's rollouts on the target labeled "base". `runs`: {capability: the GRPO run folder whose
    rollouts/ to read} (default: the adapter folders themselves, a run's final adapter); `through`: only the
    rollouts of iterations 1..through (a gate over the adapters' checkpoint at that iteration learns from no
    rollout played after it).

    Without target rollouts no token is ever labeled "base": the base slot then wins only ties, and the gate
    sends most target tokens to some adapter even where the base agent alone does the task. The base agent's
    own successful target conversations are the cheapest examples of "no adapter needed": Step 1 already
    played them (other tasks than the evaluation's), so they cost no new rollout."""
    data = []
    for capability, adapter in adapters.items():
        rollouts = sorted((Path((runs or adapters)[capability]) / "rollouts").glob("iter_*.json"))
        if through is not None:
            rollouts = [path for path in rollouts if int(path.stem.removeprefix("iter_")) <= through]
        data += [{"path": str(path), "label": capability, "game": f"capability_{capability}"} for path in rollouts]
    data += [{"path": str(path), "label": "base", "game": TARGET_GAME} for path in target_rollouts]
    return data


def sft_data_counts(data: list[dict[str, str]], min_reward: float) -> tuple[dict[str, int], dict[str, int]]:
    """({label: rollouts router SFT trains on}, {label: successful rollouts left out because hinted}), counted by
    the rule router SFT applies (`train_router_sft.usable_simulations`)."""
    from train.train_router_sft import usable_simulations

    used: dict[str, int] = {}
    hinted: dict[str, int] = {}
    for entry in data:
        kept, left_out = usable_simulations(load_results(entry["path"])["simulations"], min_reward)
        used[entry["label"]] = used.get(entry["label"], 0) + len(kept)
        hinted[entry["label"]] = hinted.get(entry["label"], 0) + left_out
    return used, hinted


def train_gate(model_dir: Path, adapters: dict[str, str], games: dict[str, dict[str, Any]], folder: Path,
               settings: Any, report_to: list[str] | None = None,
               target_rollouts: list[Path] | None = None, seed: int = 0, runs: dict[str, str] | None = None,
               through: int | None = None, routing: dict[str, Any] | None = None) -> dict[str, Any]:
    """Router SFT warm start, then GRPO over the gates (both reporting to the trackers of `report_to`: folder/gate_sft
    and folder/gate); returns the gate folder, the GRPO curve and the router SFT data per label. `runs`, `through`:
    the GRPO runs and iterations whose rollouts router SFT reads (`sft_data`; a gate over adapter checkpoints).

    Router SFT (`sft_data`) learns each capability from its GRPO run's successful unhinted rollouts and "base"
    from the base agent's successful rollouts on the target, `target_rollouts` (None: Step 1's analysis
    results of the run this gate folder belongs to, `target_rollouts_of`), with labels balanced
    (`SFTConfig.balance_labels`): a label's rollout count does not decide how often the gate picks it.
    figures["sft_data"] = {label: rollouts trained on} is part of what TRACE used; figures["sft_hinted_left_out"]
    counts the successful hinted rollouts left out. `seed`: router SFT's and gate GRPO's training seed.

    `routing` (loop.gate_labels "reward": {"data": one results file per slot on the same target tasks, "summary",
    "episodes": the new episodes they played}, `Demo.routing_targets`): router SFT fits each slot's logit to its
    measured reward instead (`sft.objective: reward`, train/routing_targets.py), with no load-balance term (the
    target is the slot that succeeds, not an even load), and the episodes count in figures["routing_episodes"]."""
    from train import grpo_gater, train_router_sft

    if target_rollouts is None:
        target_rollouts = target_rollouts_of(folder)
    data = routing["data"] if routing else sft_data(adapters, target_rollouts, runs, through)
    overrides = {f"capability_{c}": games[c] for c in adapters}
    # Two or more games: gate GRPO on their mix, overrides per game; one game: it is grpo.game itself.
    mix = len(overrides) > 1
    config = {
        "model": str(model_dir), "adapters": adapters, "mode": settings.gate_mode, "include_base_slot": True,
        "output_dir": str(folder / "gate_sft"), "init_gate": "", "dtype": "float32", "seed": seed,
        "report_to": list(report_to or []),
        # Reward targets at 1e-4: on the demo's routing data (2026-12-06, 540 conversations, 60 held out) held-out
        # binary cross-entropy after epochs 1/2/4/8 was 0.667/0.696/0.762/0.674 at 1e-3, its top-1 slot flipping
        # between epochs, and 0.685/0.663/0.664 after 1/2/4 at 1e-4.
        "sft": {"data": data, "min_reward": 1.0, "epochs": settings.gate_sft_epochs,
                "learning_rate": 1e-4 if routing else 1e-3,
                "batch_size": 8, "load_balance_weight": 0.0 if routing else 0.01,
                "max_tokens": settings.max_episode_tokens, "validation_fraction": 0.1,
                "balance_labels": routing is None, "objective": "reward" if routing else "label"},
        "grpo_games": list(overrides) if mix else [],
        "grpo_game_overrides": overrides if mix else {},
        "grpo": {"game": "" if mix else next(iter(overrides)),
                 "game_overrides": {} if mix else next(iter(overrides.values())),
                 "learning_rate": settings.learning_rate, "iterations": settings.gate_iterations,
                 "groups_per_iteration": settings.groups_per_iteration, "group_size": settings.group_size,
                 "temperature": 1.0, "hint_fraction": 0.0, "max_episode_tokens": settings.max_episode_tokens,
                 "micro_batch_size": 8, "save_every": max(1, settings.gate_iterations)},
    }
    path = folder / "moe_gate.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by demo/run.py (Step 4 of the CPU demo).\n"
                    + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    # Reward targets train on every scored, unhinted conversation, failures too (min reward 0).
    used, hinted = sft_data_counts(data, 0.0 if routing else config["sft"]["min_reward"])
    figures: dict[str, Any] = {"config": str(path), "sft_data": used, "sft_hinted_left_out": hinted,
                               "sft_balance_labels": config["sft"]["balance_labels"],
                               "sft_target_rollouts": [str(p) for p in target_rollouts] if routing is None else [],
                               "sft_labels": "reward" if routing else "game",
                               **({"routing_targets": routing["summary"], "routing_episodes": routing["episodes"]}
                                  if routing else {})}
    print(("  router SFT data (conversations per slot, reward targets): " if routing else
           "  router SFT data (successful rollouts per label): ")
          + ", ".join(f"{label} {n}" for label, n in used.items())
          + (f"; hinted ones left out: {sum(hinted.values())}" if any(hinted.values()) else ""), flush=True)
    init_gate: list[str] = []
    if sum(used.values()):
        code = train_router_sft.main(["--config", str(path)])
        if code != 0:
            raise RuntimeError(f"router SFT exited with {code}")
        figures["sft_gate"] = str(folder / "gate_sft")
        init_gate = ["--init_gate", str(folder / "gate_sft")]
    else:
        print("  no successful unhinted rollout to warm-start the gate on: router SFT skipped, the gate starts "
              "from zero (uniform logits: every token goes to the base slot)", flush=True)
        if settings.gate_iterations == 0:
            print("  loop.gate_iterations is 0 too: no gate, so no TRACE model", flush=True)
            return {**figures, "gate": None, "curve": [], "episodes": 0}
    if settings.gate_iterations > 0:
        code = grpo_gater.main(["--config", str(path), *init_gate, "--output_dir", str(folder / "gate")])
        if code != 0:
            raise RuntimeError(f"gate GRPO exited with {code}")
        metrics = metrics_rows(folder / "gate" / "metrics.jsonl")
        figures["gate"] = str(folder / "gate")
        figures["curve"] = [{"iteration": m["iteration"], "mean_reward": m["mean_reward_all_episodes"],
                             "success_rate": m["success_rate"]} for m in metrics]
        figures["episodes"] = settings.gate_iterations * settings.groups_per_iteration * settings.group_size
    else:
        figures["gate"] = str(folder / "gate_sft")
        figures["curve"], figures["episodes"] = [], 0
    return figures


def plot_routing(base_dir: Path, gate_dir: Path, messages: list[dict[str, Any]], path: Path) -> str:
    """Which slot decided each assistant token of one conversation, per layer (PNG); returns a caption.

    The conversation is rendered with the target's tools, as it was played; a token's slot is the one chosen at
    the position before it, whose forward pass produced it (`train.train_router_sft.decided_labels`)."""
    from matplotlib.patches import Patch

    from moe_gate import load_capability_model
    plt = pyplot()

    model, tokenizer = load_capability_model(gate_dir, base_model=str(base_dir))
    grid = deciding_slots(model, tokenizer, messages, get_game(TARGET_GAME).make().get_tool_schemas())  # [L, A]
    names = list(model.slot_names)
    figure, axis = plt.subplots(figsize=(9, 2.2 + 0.25 * grid.shape[0]))
    cmap = plt.get_cmap("tab10", len(names))
    axis.imshow(grid.numpy(), aspect="auto", interpolation="nearest", cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5)
    axis.set_xlabel("assistant tokens of one held-out storefront episode (in order)")
    axis.set_ylabel("decoder layer")
    axis.set_yticks(range(grid.shape[0]))
    handles = [Patch(color=cmap(i), label=name) for i, name in enumerate(names)]
    axis.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(names))
    axis.set_title("TRACE routing: the slot each layer's gate chose for each generated token")
    save_figure(figure, path)
    shares = {name: float((grid == i).float().mean()) for i, name in enumerate(names)}
    return ("Share of assistant tokens × layers per slot: "
            + ", ".join(f"{name} {share:.0%}" for name, share in shares.items()) + ".")


def deciding_slots(model: Any, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
                   ) -> Any:
    """The slot each layer chose for each assistant token of one conversation: a tensor [L, A].

    One full forward pass of the conversation as the chat template renders it with `tools` (as the episode was
    played and as router SFT reads it), with `record_routing()`: with token routing a position's slot depends only
    on the tokens up to it, so this is the slot it had when it was generated. A token's slot is the one chosen at
    the position that produced it (the one before it: `train.train_router_sft.deciding_positions`)."""
    import torch

    from train.train_router_sft import deciding_positions, encode_conversation

    ids, assistant = encode_conversation(tokenizer, messages, tools)
    mask = torch.tensor(deciding_positions(assistant), dtype=torch.bool)  # [T]
    with torch.no_grad(), model.record_routing() as record:
        model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)  # only the routing matters
    slots = record.slots()  # {layer: [1, T]}
    return torch.stack([slots[layer][0] for layer in sorted(slots)])[:, mask]  # [L, A]


def routing_counts(model: Any, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
                   ) -> Any:
    """Routing decisions per slot over one conversation's assistant tokens and every layer (`deciding_slots`): a
    tensor of counts [S]."""
    import torch

    return torch.bincount(deciding_slots(model, tokenizer, messages, tools).flatten(), minlength=model.n_slots)


def shares_by_kind(conversations: list[tuple[list[str], Any]], slot_names: list[str]) -> dict[str, Any]:
    """{kind: {"conversations", "decisions", "shares": {slot: share}}} from (request kinds, counts [S] as
    `routing_counts` gives them) per conversation, plus "all" over every conversation once. A conversation with
    several requests counts under each of its kinds (as the per-kind pass rates count it); shares sum to 1 per
    kind that has a decision."""
    import torch

    totals: dict[str, Any] = {}
    members: dict[str, int] = {}
    for kinds, counts in conversations:
        for kind in [*dict.fromkeys(kinds), "all"]:
            totals[kind] = totals.get(kind, torch.zeros(len(slot_names), dtype=torch.long)) + counts  # [S]
            members[kind] = members.get(kind, 0) + 1
    order = sorted(k for k in totals if k != "all") + (["all"] if "all" in totals else [])
    out = {}
    for kind in order:
        total = int(totals[kind].sum())
        out[kind] = {"conversations": members[kind], "decisions": total,
                     "shares": {name: (float(totals[kind][i]) / total if total else 0.0)
                                for i, name in enumerate(slot_names)}}
    return out


def routing_by_kind(base_dir: Path, gate_dir: Path, results_paths: list[Path], per_kind: int = ROUTING_PER_KIND,
                    seed: int = 0) -> dict[str, Any]:
    """How often the gate picks each slot on the target, per request kind: `shares_by_kind` over up to
    `per_kind` conversations of each kind drawn (with `seed`) from TRACE's evaluation results files (one drawn
    for a kind also counts under the other kinds of its episode, when it has several requests).

    A share is over assistant tokens x layers (each layer's gate decides per token), as `plot_routing`'s caption.
    One conversation says little (the issue measured 62% of tokens on one adapter that alone lowers one kind);
    a few per kind show whether the gate sends a kind's tokens to an adapter that hurts it. Each conversation
    costs one forward pass of the routed model, no generation."""
    from moe_gate import load_capability_model
    from train.evaluate import request_kinds

    simulations = [sim for path in results_paths for sim in load_results(path)["simulations"]]
    by_kind: dict[str, list[int]] = {}
    for index, sim in enumerate(simulations):
        for kind in request_kinds(sim) or ["(none)"]:
            by_kind.setdefault(kind, []).append(index)
    rng = random.Random(seed)
    chosen = sorted({i for kind in sorted(by_kind)
                     for i in rng.sample(by_kind[kind], min(per_kind, len(by_kind[kind])))})
    model, tokenizer = load_capability_model(gate_dir, base_model=str(base_dir))
    tools = get_game(TARGET_GAME).make().get_tool_schemas()
    conversations = [(request_kinds(simulations[i]) or ["(none)"],
                      routing_counts(model, tokenizer, simulations[i]["messages"], tools)) for i in chosen]
    return {"slots": list(model.slot_names), "per_kind": per_kind, "sources": [str(p) for p in results_paths],
            "kinds": shares_by_kind(conversations, list(model.slot_names))}
