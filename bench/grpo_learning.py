"""Own-game pass rate against GRPO episodes, per capability game, for two learning-per-rollout settings.

    python bench/grpo_learning.py --run_dir runs/demo [--games precondition_verification ...]
        [--settings one_step=1x1 default] [--seeds 0 1 2] [--iterations 8] [--eval_every 4]
        [--tasks 40 --samples 2] [--out bench_out/grpo_learning]

It needs a demo run folder (`make demo`, or `python -m demo` until its `environments` step has run):
the base agent (`<run_dir>/base/model`) and the game overrides calibration chose for each capability
(`<run_dir>/environments/step.json`), so every game is played as the demo's Step 3 plays it. Each GRPO run is
the demo's (`demo.loop.grpo_config`: configs/grpo_tiny.yaml with the loop's budget, learning rate and
optimizer steps per iteration from --config), with only `ppo_epochs`, `minibatches_per_iteration` and the
learning rate changed per setting:

    one_step=1x1   one optimizer step per iteration
    default        the --config's loop as it is (its loop.ppo_epochs x loop.minibatches_per_iteration)
    NAME=ExM       E passes (ppo_epochs) x M mini-batches (minibatches_per_iteration)
    NAME=ExM@LR    the same at learning rate LR (else the demo's loop.learning_rate)

The adapter is checkpointed every --eval_every iterations and each checkpoint (and the base agent, once) plays
the game's held-out tasks (`train.evaluate`, seed --eval_seed, the demo's own_game tasks): greedy once, and
--samples samples at temperature 1. Printed per game and setting: base and final own-game pass^1 (greedy and
T=1, mean over training seeds, and each seed's gain), the same for the T=1 mean episode reward (which moves
where pass^1 stays at 0), whether a seed collapsed (its T=1 mean reward at the end below half the base's), and
the wall time; per decision class the T=1 success of the base agent and of each final adapter, the game's
constant policies (its ablations) on the same tasks (one whose skill matters on none of them plays the expert
there: shown, not a bar), and whether each seed's gain counts as learning
(`learning_verdict`: pass^1 up by 0.15 or more, no class below the base agent's, above the best constant
policy); the share of constant-reward groups (dropped by the update) per iteration is in results.json.
Writes `<out>/results.json` (every curve point) and `<out>/curves.png` (pass^1 and mean reward
against episodes). Runs whose curve is already in results.json are not run again (the bench resumes). Last
lines: `min_own_game_reward_gain_t1=` and `min_own_game_gain_t1=`, the last setting's smallest mean T=1 gain
over the games (the issue's aim for pass^1: >= 0.15).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common.cli import cli_entry, exit_code, seed_value
from common.io import atomic_write_json, load_json
from common.run_folder import check_output_dir, claimed_run_folder
from common.validation import InputError


def parse_setting(text: str) -> tuple[str, int | None, int | None, float | None]:
    """NAME=ExM[@LR] -> (NAME, E, M, LR or None); `default` -> ("default", None, None, None) (the demo's values)."""
    if text == "default":
        return "default", None, None, None
    name, _, shape = text.partition("=")
    shape, at, lr_text = shape.partition("@")
    epochs, _, minibatches = shape.partition("x")
    learning_rate = None
    if at:
        try:
            learning_rate = float(lr_text)
        except ValueError:
            learning_rate = -1.0  # refused below with the others
    if (not name or not epochs.isdigit() or not minibatches.isdigit() or int(epochs) < 1 or int(minibatches) < 1
            or (learning_rate is not None and not 0.0 < learning_rate < 1.0)):
        raise InputError(f"--settings: {text!r} is not NAME=ExM or NAME=ExM@LR (e.g. one_step=1x1, "
                         "four_steps=1x4@3e-3, LR in (0, 1)) or 'default'")
    return name, int(epochs), int(minibatches), learning_rate


def trainable_games(run_dir: Path, group_size: int) -> dict[str, dict[str, Any]]:
    """{capability: game overrides} of the capabilities the demo's Step 3 trains (demo/run.py `trainable`)."""
    from demo.trainable import not_trained_because

    marker = run_dir / "environments" / "step.json"
    if not marker.is_file():
        raise InputError(f"{marker} not found: run the demo (`make demo`) at least through its environments step")
    figures = load_json(marker)["figures"]
    return {c: e["game_overrides"] for c, e in figures["capabilities"].items()
            if not_trained_because(e, group_size, forced=figures["forced"]) is None}


def evaluate_point(model_dir: Path, adapter: Path | None, game: str, overrides: dict[str, Any], args: Any,
                   max_episode_tokens: int) -> dict[str, float]:
    """Own-game pass^1 greedy and at T=1 (and the T=1 mean reward) of one checkpoint."""
    from train.evaluate import evaluate_model, load_policy_model

    from pipeline.recalibrate import episode_classes

    model, tokenizer = load_policy_model(model_dir, adapter)
    point: dict[str, Any] = {}
    for mode, temperature, samples in (("greedy", 0.0, 1), ("t1", 1.0, args.samples)):
        simulations, hat = evaluate_model(model, tokenizer, game, n_tasks=args.tasks, seed=args.eval_seed,
                                          samples=samples, temperature=temperature, game_overrides=overrides,
                                          max_episode_tokens=max_episode_tokens)
        point[f"pass1_{mode}"] = hat["all"]["pass_hat_k"][1]
        point[f"reward_{mode}"] = statistics.fmean(s["reward_info"]["reward"] for s in simulations)
        point[f"by_class_{mode}"] = episode_classes(simulations).get("success_by_class", {})
    return point


def constant_policies(game: str, overrides: dict[str, Any], args: Any) -> dict[str, dict[str, Any]]:
    """{ablation: {"success": rate, "skill_matters": tasks, "tasks": n}} of the game's skill-less policies (always
    act, always refuse, the first method, values as written, ...) on the own-game tasks the checkpoints play
    (`train.evaluate`'s task seeds for --eval_seed and --tasks, one episode each). `skill_matters` counts the
    tasks where the game says the ablated skill decides the episode (its summary's "skill_matters"): an ablation
    whose skill matters on none of them is the expert there (`first_items` where every item of the order is
    named), not a skill-less policy, and `learning_verdict` leaves it out."""
    from game_registry import get_game
    from pipeline.recalibrate import policy_collector
    from train.evaluate import evaluation_requests

    spec = get_game(game)
    seeds = [request.seed for request in evaluation_requests(spec, args.tasks, args.eval_seed, samples=1)]
    matters_by_seed = []
    for seed in seeds:
        instance = spec.make(**overrides)
        instance.reset(seed)
        matters_by_seed.append(instance.get_summary().get("skill_matters", {}))
    out = {}
    for probe in spec.ablations:
        collect = policy_collector(lambda instance, rng, name=probe.name: instance.ablated_response(name),
                                   n_samples=1, task_seeds=seeds)
        simulations = collect(spec, overrides)
        # A game that does not say where a skill matters: every task counts as one where it does.
        matters = sum(bool(m.get(probe.name, True)) for m in matters_by_seed)
        out[probe.name] = {"success": sum(s["reward_info"]["reward"] >= 1.0 for s in simulations) / len(simulations),
                           "skill_matters": matters, "tasks": len(seeds)}
    return out


def constant_entry(entry: Any) -> tuple[float, bool]:
    """(success, is a bar) of one `constant_policies` entry: a bar unless its skill matters on none of the tasks;
    a bare rate (results.json before 2026-12-06) is a bar."""
    if isinstance(entry, dict):
        return entry["success"], entry.get("skill_matters", 1) > 0
    return float(entry), True


def skill_less(constants: dict[str, Any]) -> dict[str, float]:
    """{ablation: success} of the ablations that lack a skill these tasks need (skill_matters on one or more)."""
    return {name: rate for name, (rate, bar) in ((n, constant_entry(e)) for n, e in constants.items()) if bar}


def learning_verdict(base: dict[str, Any], final: dict[str, Any], constants: dict[str, float], mode: str = "t1",
                     min_gain: float = 0.15) -> tuple[bool, str]:
    """Whether a final checkpoint's own-game gain over the base counts as learning (issue 41 point 6): pass^1 up
    by `min_gain` or more, no decision class's success below the base agent's (a one-decision game is "learned"
    by turning into a constant policy: always refusing wins every refuse episode and loses every act one), and
    above the best skill-less policy on the same tasks (`skill_less`: an ablation whose skill matters on none of the
    tasks plays the expert there and is no bar). Returns (counts, why)."""
    gain = final[f"pass1_{mode}"] - base[f"pass1_{mode}"]
    before, after = base.get(f"by_class_{mode}", {}), final.get(f"by_class_{mode}", {})
    fallen = [f"{name} {before[name]:.2f} -> {after.get(name, 0.0):.2f}" for name in before
              if after.get(name, 0.0) < before[name] - 1e-9]
    best_name, best = max(skill_less(constants).items(), key=lambda item: item[1], default=("none", 0.0))
    reasons = []
    if gain < min_gain:
        reasons.append(f"gain {gain:+.3f} < {min_gain:+.2f}")
    if fallen:
        reasons.append(f"class success fell below the base agent's: {', '.join(fallen)}")
    if final[f"pass1_{mode}"] <= best:
        reasons.append(f"pass^1 {final[f'pass1_{mode}']:.3f} does not beat the best constant policy {best_name} "
                       f"({best:.3f})")
    if reasons:
        return False, "; ".join(reasons)
    return True, (f"gain {gain:+.3f}, every class at or above the base agent's, above {best_name} ({best:.3f})")


def train_run(game_spec: Any, model_dir: Path, folder: Path, overrides: dict[str, Any], loop: Any, args: Any,
              epochs: int | None, minibatches: int | None, learning_rate: float | None, seed: int) -> dict[str, Any]:
    """One GRPO run as the demo's Step 3 (with this setting and seed), checkpointed every --eval_every."""
    import dataclasses

    import torch

    from demo.loop import grpo_config
    from train.backends import HFBackend
    from train.checkpoint import metrics_rows
    from train.grpo import GRPOTrainer
    from train.policy import LoraPolicy, load_base_model

    config = grpo_config(game_spec.name, model_dir, folder, overrides, loop, args.iterations)
    changes: dict[str, Any] = {"seed": seed, "save_every": args.eval_every}
    if epochs is not None:
        changes.update(ppo_epochs=epochs, minibatches_per_iteration=minibatches)
    if learning_rate is not None:
        changes["learning_rate"] = learning_rate
    config = dataclasses.replace(config, **changes)  # __post_init__ validates the result again
    torch.manual_seed(config.seed)
    base, tokenizer = load_base_model(config.model, config.dtype, torch.device("cpu"))
    policy = LoraPolicy.create(base, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                               target_modules=config.lora_target_modules)
    backend = HFBackend(policy.model, tokenizer.pad_token_id, seed=config.seed)
    started = time.time()
    GRPOTrainer(config, game_spec, policy, tokenizer, backend).run()
    backend.close()
    metrics = metrics_rows(folder / "metrics.jsonl")
    return {"ppo_epochs": config.ppo_epochs, "minibatches_per_iteration": config.minibatches_per_iteration,
            "learning_rate": config.learning_rate,
            "train_seconds": round(time.time() - started, 1),
            "optimizer_steps": sum(m.get("optimizer_steps", 0.0) for m in metrics),
            # frac_constant_groups: the share of groups whose rewards were all equal, dropped by the update
            "train_curve": [{"iteration": m["iteration"], "mean_reward": m["mean_reward"],
                             "success_rate": m["success_rate"],
                             "frac_constant_groups": m.get("frac_constant_groups")} for m in metrics]}


def constants_text(constants: dict[str, Any]) -> str:
    """`always_act 0.490, first_items 1.000 (its skill matters on none of the 40 tasks: not a bar)`."""
    parts = []
    for name, entry in constants.items():
        rate, bar = constant_entry(entry)
        parts.append(f"{name} {rate:.3f}" + ("" if bar else f" (its skill matters on none of the {entry['tasks']} "
                                                              "tasks: not a bar)"))
    return ", ".join(parts)


def summarize(results: dict[str, Any]) -> list[str]:
    """One line per game and setting: base -> final pass^1 (greedy, T=1), gains per seed, collapses."""
    lines = []
    for capability, game in results["games"].items():
        base = game["base"]
        for setting, runs in game["settings"].items():
            finals = [run["curve"][-1] for run in runs.values()]
            if not finals:
                continue
            gains_t1 = [p["pass1_t1"] - base["pass1_t1"] for p in finals]
            gains_greedy = [p["pass1_greedy"] - base["pass1_greedy"] for p in finals]
            collapsed = [seed for seed, run in runs.items() if run["curve"][-1]["reward_t1"] < 0.5 * base["reward_t1"]]
            reward_gains = [p["reward_t1"] - base["reward_t1"] for p in finals]
            episodes = runs[next(iter(runs))]["curve"][-1]["episodes"]
            constants = game.get("constant_policies", {})
            verdicts = [learning_verdict(base, final, constants) for final in finals]
            classes = "; ".join(
                f"seed {seed}: " + ", ".join(f"{name} {base.get('by_class_t1', {}).get(name, 0.0):.2f}->{rate:.2f}"
                                             for name, rate in run["curve"][-1].get("by_class_t1", {}).items())
                for seed, run in runs.items())
            lines.append(f"{capability} {setting}: success per class at T=1 (base->final) {classes or '-'}; "
                         f"constant policies {constants_text(constants) or '-'}; "
                         f"learning counts on {sum(ok for ok, _ in verdicts)} of {len(verdicts)} seeds ("
                         + "; ".join(why for _, why in verdicts) + ")")
            lines.append(
                f"{capability} {setting}: pass^1 T=1 {base['pass1_t1']:.3f} -> "
                f"{statistics.fmean(p['pass1_t1'] for p in finals):.3f} (gain per seed "
                f"{', '.join(f'{g:+.3f}' for g in gains_t1)}), greedy {base['pass1_greedy']:.3f} -> "
                f"{statistics.fmean(p['pass1_greedy'] for p in finals):.3f} (gain per seed "
                f"{', '.join(f'{g:+.3f}' for g in gains_greedy)}), mean reward T=1 {base['reward_t1']:.3f} -> "
                f"{statistics.fmean(p['reward_t1'] for p in finals):.3f} (gain per seed "
                f"{', '.join(f'{g:+.3f}' for g in reward_gains)}) after {episodes} episodes; "
                f"collapsed seeds: {collapsed or 'none'}")
    return lines


def plot(results: dict[str, Any], path: Path) -> None:
    from demo.plotting import pyplot, save_figure

    plt = pyplot()
    games = list(results["games"])
    # Row 1: pass^1; row 2: mean episode reward (on games whose success needs every request of an episode
    # right, pass^1 can stay at 0 while the partial reward moves).
    figure, axes = plt.subplots(2, len(games), figsize=(4.5 * len(games), 6.4), squeeze=False)
    for row, (key, label) in enumerate((("pass1_t1", "own-game pass^1 at T=1"),
                                        ("reward_t1", "own-game mean reward at T=1"))):
        for axis, capability in zip(axes[row], games):
            game = results["games"][capability]
            for index, (setting, runs) in enumerate(game["settings"].items()):
                for run in runs.values():
                    xs = [0] + [p["episodes"] for p in run["curve"]]
                    axis.plot(xs, [game["base"][key]] + [p[key] for p in run["curve"]],
                              color=f"C{index}", alpha=0.8, label=setting)
            handles, labels = axis.get_legend_handles_labels()
            unique = dict(zip(labels, handles))
            axis.legend(unique.values(), unique.keys(), fontsize=7)
            axis.set_title(capability, fontsize=9)
            axis.set_xlabel("GRPO episodes")
            axis.set_ylabel(label)
    save_figure(figure, path)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run_dir", type=Path, required=True)
    parser.add_argument("--config", default="configs/demo.yaml", help="the demo config the run folder was made with")
    parser.add_argument("--games", nargs="*", default=None, help="capabilities (default: those Step 3 trains)")
    parser.add_argument("--settings", nargs="+", default=["one_step=1x1", "default"])
    parser.add_argument("--seeds", nargs="+", type=seed_value, default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="default: the demo's loop.iterations")
    parser.add_argument("--eval_every", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=None, help="default: the demo's own_game.tasks")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--eval_seed", type=seed_value, default=None, help="default: the demo's own_game.seed")
    parser.add_argument("--out", type=Path, default=Path("bench_out/grpo_learning"))
    args = parser.parse_args(argv)
    return run(args)


# What the figures in an --out folder were measured with: a later invocation adds settings, seeds or games to
# it, never figures of another experiment.
DECISIVE_ARGUMENTS = ("run_dir", "config", "iterations", "eval_every", "tasks", "samples", "eval_seed")


def run(args: argparse.Namespace) -> int:
    from demo.config import load_demo_config
    from demo.loop import game_for

    check_output_dir(args.out, "--out", inputs=[("--run_dir", args.run_dir), ("--config", args.config)])
    config = load_demo_config(args.config)
    loop = config.loop
    # not given: the demo's; given as 0 or below: refused below (not taken for "not given")
    args.iterations = loop.iterations if args.iterations is None else args.iterations
    args.tasks = config.own_game.tasks if args.tasks is None else args.tasks
    args.eval_seed = config.own_game.seed if args.eval_seed is None else args.eval_seed
    for name in ("iterations", "eval_every", "tasks", "samples"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1, got {getattr(args, name)}")
    settings = [parse_setting(text) for text in args.settings]
    model_dir = args.run_dir / "base" / "model"
    if not model_dir.is_dir():
        raise InputError(f"{model_dir} not found: run the demo (`make demo`) through its base step first")
    games = trainable_games(args.run_dir, loop.group_size)
    chosen = args.games if args.games is not None else list(games)
    unknown = [c for c in chosen if c not in games]
    if unknown:
        raise InputError(f"--games {unknown}: not trained by this run's Step 3; choose from {sorted(games)}")
    with claimed_run_folder(args.out, "--out", fresh=False):  # a second bench on the same folder is refused
        results_path = args.out / "results.json"
        results = load_json(results_path) if results_path.is_file() else {"games": {}}
        arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        measured_with = {k: results.get("arguments", {}).get(k, arguments[k]) for k in DECISIVE_ARGUMENTS}
        differ = [k for k in DECISIVE_ARGUMENTS if measured_with[k] != arguments[k]]
        if differ:  # the seeds already measured would be kept as they are: a mix of two experiments
            raise InputError(f"--out {args.out} holds figures measured with other {', '.join(differ)} "
                             f"({', '.join(f'{k}={measured_with[k]}' for k in differ)}); give --out a new folder")
        results["arguments"] = arguments
        episodes_per_iteration = loop.groups_per_iteration * loop.group_size
        for capability in chosen:
            spec, overrides = game_for(capability), games[capability]
            game = results["games"].setdefault(capability, {"game": spec.name, "game_overrides": overrides,
                                                             "settings": {}})
            if "base" not in game or "by_class_t1" not in game["base"]:
                game["base"] = evaluate_point(model_dir, None, spec.name, overrides, args, loop.max_episode_tokens)
                atomic_write_json(results_path, results)
            # before 2026-12-05 they played other seeds; before 2026-12-06 they did not say where the skill matters
            if game.get("constant_policy_tasks") != "evaluation+skill_matters":
                game["constant_policies"] = constant_policies(spec.name, overrides, args)
                game["constant_policy_tasks"] = "evaluation+skill_matters"
                atomic_write_json(results_path, results)
            for name, epochs, minibatches, learning_rate in settings:
                runs = game["settings"].setdefault(name, {})
                for seed in args.seeds:
                    if str(seed) in runs:
                        continue  # measured by an earlier invocation
                    folder = args.out / "runs" / capability / name / f"seed{seed}"
                    print(f"[{capability} / {name} / seed {seed}] GRPO {args.iterations} iterations", flush=True)
                    run_figures = train_run(spec, model_dir, folder, overrides, loop, args, epochs, minibatches,
                                            learning_rate, seed)
                    curve = []
                    for done in sorted(set(range(args.eval_every, args.iterations + 1, args.eval_every)) | {args.iterations}):
                        adapter = folder / "checkpoints" / f"iter_{done:06d}" / "adapter"
                        point = evaluate_point(model_dir, adapter, spec.name, overrides, args, loop.max_episode_tokens)
                        curve.append({"iteration": done, "episodes": done * episodes_per_iteration, **point})
                    runs[str(seed)] = {**run_figures, "curve": curve}
                    atomic_write_json(results_path, results)
    for line in summarize(results):
        print(line)
    plot(results, args.out / "curves.png")
    print(f"curves: {args.out / 'curves.png'}; every point: {results_path}")
    last = settings[-1][0]
    gains = [statistics.fmean(run["curve"][-1]["pass1_t1"] for run in game["settings"][last].values())
             - game["base"]["pass1_t1"] for game in results["games"].values() if game["settings"].get(last)]
    reward_gains = [statistics.fmean(run["curve"][-1]["reward_t1"] for run in game["settings"][last].values())
                    - game["base"]["reward_t1"] for game in results["games"].values() if game["settings"].get(last)]
    print(f"min_own_game_reward_gain_t1={min(reward_gains):.3f}")
    print(f"min_own_game_gain_t1={min(gains):.3f}")  # setting `last`, the smallest mean gain over the games
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
