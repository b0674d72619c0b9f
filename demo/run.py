"""The embedded CPU demo (`make demo`): TRACE's loop on a world whose ground truth is known.

    python -m demo [--config configs/demo.yaml] [--run-dir runs/demo] [--fresh]   (the claims' rows)
    python -m demo --profile full        (configs/demo_full.yaml: every row, diagnostics included)
    python -m demo --profile fast        (configs/demo_fast.yaml: every step, small budgets)
    python -m demo --report-to tensorboard   (then: tensorboard --logdir runs/demo)
    python -m demo --repeat 3           (Steps 3-4 and the baselines with 3 training seeds: mean, spread)

The target benchmark is the embedded storefront (`benchmarks/storefront`, sized by the config's storefront
file). The base agent is the project's tiny model, taught the task by supervised fine-tuning on expert
demonstrations in which some capabilities are planted as deficits (a share of the demonstrations comes
from flawed experts, `benchmarks/storefront/flaws.py`). Because we planted them, we know which capabilities
Step 1 should find, and the report scores it.

Steps, each writing under `<run-dir>/<step>/` and skipped when its `step.json` says it completed with the
same settings (its own config section and the steps it reads from), so an interrupted demo resumes:

  base      demonstrations -> tokenizer + tiny model -> SFT (the base agent; cached across runs)
  evaluate  the base agent on held-out storefront tasks: every evaluation seed, greedy and temperature 1
            (pass^k over samples), τ²-bench-format results
  select    Step 1 on the base agent's results on separate analysis tasks: compacted trajectories, a
            FIXED candidate list (`demo/rule_labeler.CANDIDATES`, which holds capabilities that were
            not planted), N rule-based labelers that see only the trajectory and the results' evaluation
            details (never the planted flaws or a task's hidden capability record), aggregation with
            rho, delta, K; precision and recall of the selection against the planted deficits
  environments  Step 2: each selected capability's game (its tasks drawn from the evaluation's storefront) is
            validated, probes included, and its declared difficulty knob bisected against the base agent
            (each value tried: success rate, mean reward, share of GRPO groups whose rewards differ)
  train     Step 3: one GRPO LoRA per calibrated capability
  own_game  each LoRA and the base agent on the LoRA's own game, held-out tasks at the calibrated settings
            (did the adapter learn its skill, before any transfer to the target?)
  gate      Step 4: router SFT warm start on the capability rollouts, then GRPO on the gates only
  baselines direct GRPO on the storefront itself, on unlimited fresh tasks and on a fixed pool of
            `loop.direct_task_pool` tasks (τ²-Bench's 164 by default; disjoint from the evaluation's), and one LoRA
            on the selected games mixed, each with the episodes TRACE's Steps 3-4 used
  final     every model on the evaluation tasks and seeds of `evaluate`
  efficiency  direct GRPO's checkpoints at `evaluate.efficiency_fractions` of its budget (1/4, 1/2), and TRACE at
            those shares of its own (the adapters' checkpoints the train step kept, with a gate trained on them for
            the same share of Step 4), on the final step's tasks: the report sets them beside TRACE's and direct
            GRPO's finals, TRACE @1/4 against direct GRPO's final being the paper's claim at its own ratio
  report    runs/demo/report.md and results.json; the table is printed

With `--repeat N` (the config's `repeats`) the steps from `train` on (REPEATED_STEPS) run N times, with training
seeds 0..N-1 (seed 0 is the run above; seed r writes under <run-dir>/repeats/seed<r>/), and the report adds each
model's pass^1 per repeat with its mean and spread: the spread between training runs, which the evaluation's
intervals do not cover.

A step with nothing to do (no capability selected, no game in band) says why and leaves its models out of
the table; no number is ever filled in for a model that was not trained.

With `--report-to tensorboard` (or the config's `report_to`; wandb, trackio, mlflow too) every training run the
demo starts reports to those trackers as it trains: base/sft_openings, base/sft, train/<capability>,
gate/gate_sft, gate/gate, baselines/direct and baselines/mixed, TensorBoard's event files in each one's tb/.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

from common.cli import Interrupted, cli_entry, exit_code
from common.paths import REPO_ROOT
from common.io import atomic_write_json, atomic_write_jsonl, load_json
from common.validation import InputError, check_url
from common.run_folder import check_output_dir, claimed_run_folder, follow_umask
from demo.config import PROFILES, base_settings
from demo.report_accounting import BASELINE_LABELS
from demo.selection import step_cache_dir

STEP_FILE = "step.json"
# The steps a repeat (`--repeat N`) runs again with its own training seed, under <run-dir>/repeats/<r>/: everything
# that trains, and the evaluations of what it trained. The base agent, its evaluation, Step 1 and Step 2's
# calibration are shared: none of them draws from a training seed (calibration plays the base agent with fixed
# sampler seeds), so a repeat would reproduce them exactly.
REPEATED_STEPS = ("train", "own_game", "gate", "baselines", "final", "efficiency")


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Demo:
    """Runs the steps in order; each step's fingerprint covers its settings and the fingerprints it reads."""

    def __init__(self, config: Any, run_dir: Path, fresh: bool, profile: str, rebuild_base: bool = False,
                 shipped_dir: Path | None = None):
        from demo.base_agent import SHIPPED_DIR

        self.config = config
        self.run_dir = run_dir
        self.fresh = fresh
        self.profile = profile
        self.rebuild_base = rebuild_base
        self.shipped_dir = shipped_dir or SHIPPED_DIR
        self.shipped_manifest: dict[str, Any] | None = None  # set by base_step_settings when the shipped one is used
        self.fingerprints: dict[str, str] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.storefront = config.storefront_config(REPO_ROOT)
        self.training_seed = 0  # the seed of every training run (GRPO, router SFT, gate GRPO): the repeat number
        self.steps_root = run_dir  # where REPEATED_STEPS write: run_dir, or run_dir/repeats/seed<r> in repeat r
        self.repeats: list[Demo] = []  # repeats 1..N-1 once they ran (`repeat`)

    def repeat(self, number: int) -> "Demo":
        """Repeat `number` (1, 2, ...) of this demo: the same run folder, base agent, evaluation, Step 1 and Step 2
        (their records shared), with REPEATED_STEPS run again with training seed
        `number`, under <run-dir>/repeats/seed<number>/."""
        other = copy.copy(self)
        other.training_seed = number
        other.steps_root = self.run_dir / "repeats" / f"seed{number}"
        other.records = {k: v for k, v in self.records.items() if k not in REPEATED_STEPS}
        other.fingerprints = {k: v for k, v in self.fingerprints.items() if k not in REPEATED_STEPS}
        other.repeats = []
        return other

    def step_dir(self, name: str) -> Path:
        return (self.steps_root if name in REPEATED_STEPS else self.run_dir) / name

    def step(self, name: str, settings: dict[str, Any], reads: tuple[str, ...],
             body: Callable[[Path], dict[str, Any]], force: bool = False) -> dict[str, Any]:
        fingerprint = hashlib.sha256(json.dumps(
            {"settings": settings, "reads": [self.fingerprints[r] for r in reads]}, sort_keys=True, default=str
        ).encode()).hexdigest()[:16]
        folder = self.step_dir(name)
        shown = str(folder.relative_to(self.run_dir))  # "train", or "repeats/seed1/train" in a repeat
        marker = folder / STEP_FILE
        if not (self.fresh or force) and marker.is_file():
            record = load_json(marker)
            if record.get("fingerprint") == fingerprint and record.get("complete"):
                print(f"[{shown}] up to date ({folder}); skipped — --fresh starts over", flush=True)
                self.fingerprints[name], self.records[name] = fingerprint, record
                return record["figures"]
        if folder.exists():
            shutil.rmtree(folder)
        # A step keeps its paid-for calls (the LLM labelers' answers) beside its folder, in `<name>_cache`, so a
        # rerun after a failure pays only for the missing ones; --fresh starts over without them too.
        cache = step_cache_dir(folder)
        if self.fresh and cache.exists():
            shutil.rmtree(cache)
        folder.mkdir(parents=True)
        print(f"[{shown}] running -> {folder}", flush=True)
        started = time.time()
        figures = body(folder)
        record = {"step": name, "fingerprint": fingerprint, "complete": True, "settings": settings,
                  "seconds": round(time.time() - started, 1), "device": _device(), "figures": figures}
        atomic_write_json(marker, record)  # written last: a step interrupted before this runs again
        print(f"[{shown}] done in {record['seconds']:.0f} s", flush=True)
        self.fingerprints[name], self.records[name] = fingerprint, record
        return figures

    # ---- steps ------------------------------------------------------------------------------------------

    def storefront_fields(self) -> dict[str, Any]:
        """The storefront as the demo plays it: the target's config with `evaluate.max_steps` when set."""
        fields = dataclasses.asdict(self.storefront)
        if self.config.evaluate.max_steps is not None:
            fields["max_steps"] = self.config.evaluate.max_steps
        return fields

    def base_step_settings(self) -> dict[str, Any]:
        """The base step's settings, with `"source": "shipped"` when it takes the shipped agent.

        A complete base step with these settings is kept, however it was made (a build here is not thrown away
        for the shipped agent); otherwise the shipped agent is used when its manifest matches these settings,
        and the agent is built here when it does not or with --rebuild-base. A build's settings carry no
        "source" key, so runs made before the agent was shipped stay up to date."""
        from demo.base_agent import shipped_status

        settings = base_settings(self.config, self.storefront)
        if self.rebuild_base:
            print("[base] --rebuild-base: building the base agent here", flush=True)
            return settings
        marker = self.run_dir / "base" / STEP_FILE
        if not self.fresh and marker.is_file():
            record = load_json(marker)
            kept = {k: v for k, v in record.get("settings", {}).items() if k != "source"}
            if record.get("complete") and kept == settings:
                if record["settings"].get("source") == "shipped":
                    self.shipped_manifest = load_json(self.shipped_dir / "manifest.json") \
                        if (self.shipped_dir / "manifest.json").is_file() else None
                    return {**settings, "source": "shipped"}
                return settings
        manifest, why = shipped_status(settings, self.shipped_dir)
        if manifest is None:
            print(f"[base] {why}: building the base agent here", flush=True)
            return settings
        self.shipped_manifest = manifest
        return {**settings, "source": "shipped"}

    def base(self, folder: Path) -> dict[str, Any]:
        from demo.base_agent import install_shipped

        if self.shipped_manifest is not None:
            built = self.shipped_manifest["built"]
            print(f"  the shipped base agent ({self.shipped_dir}, weights sha256 "
                  f"{self.shipped_manifest['weights_sha256'][:16]}…, built {built['date']} at {built['commit']}); "
                  "--rebuild-base builds it here instead", flush=True)
            figures = install_shipped(self.shipped_manifest, folder / "model", self.shipped_dir)
            follow_umask(folder / "model")
            return figures
        return self.build_base(folder)

    def build_base(self, folder: Path) -> dict[str, Any]:
        """Demonstrations -> tokenizer + tiny model -> SFT on copy drills, openings, whole demonstrations, item
        selections and a refresh (each stage but the whole demonstrations skipped at 0; base section of the config);
        the model in folder/model."""
        import torch

        from demo.base_agent import build_environment
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from benchmarks.storefront.demos import make_demonstrations, make_item_selections, make_openings
        from train.copy_drill import make_copy_drills
        from train.sft import SFTConfig, tokenize_chats, train_sft
        from train.tiny import build_tiny_model
        from train.tracking import open_trackers

        s = self.config.base
        demos = make_demonstrations(s.demonstrations, s.demo_seed, self.storefront, s.planted)
        atomic_write_jsonl(folder / "demonstrations.jsonl", demos)
        build_tiny_model(folder / "init", chats=demos[: s.tokenizer_chats], vocab_size=s.vocab_size,
                         hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads, seed=s.seed,
                         tools_view=s.tools_view, corpus_info={"source": "storefront demonstrations",
                                                               "chats": min(s.tokenizer_chats, len(demos))})
        tokenizer = AutoTokenizer.from_pretrained(str(folder / "init"), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(folder / "init"), local_files_only=True,
                                                     dtype=torch.float32).to(_device())
        sft = SFTConfig(epochs=s.epochs, lr=s.lr, warmup_steps=s.warmup_steps, batch_tokens=s.batch_tokens,
                        seed=s.seed, report_to=self.config.report_to)
        sft_once = dataclasses.replace(sft, epochs=1.0)

        def sft_run(chats: list[Any], config: SFTConfig, log: list[dict[str, Any]], run: str) -> dict[str, Any]:
            tracker = open_trackers(config.report_to, folder / run, kind="sft", first_step=0,
                                    config=dataclasses.asdict(config))
            try:
                return train_sft(model, chats, config, tokenizer.pad_token_id, log=log, tracker=tracker)
            finally:
                tracker.close()

        drill_figures = None
        if s.copy_drills:  # an in-context copy circuit before anything else (train/copy_drill.py)
            drills = make_copy_drills(s.copy_drills, s.demo_seed + 4, tokenizer)
            atomic_write_jsonl(folder / "copy_drills.jsonl", drills)
            drill_log: list[dict[str, Any]] = []
            drill_figures = {**sft_run(tokenize_chats(tokenizer, drills), sft_once, drill_log, "sft_copy_drills"),
                             "chats": len(drills), "log": drill_log}
        openings_figures = None
        if s.openings:  # the curriculum's first stage: copying values into calls (its own schedule)
            # Their own seed stream: other tasks than the demonstrations'.
            openings = make_openings(s.openings, s.demo_seed + 1, self.storefront)
            openings_log: list[dict[str, Any]] = []
            openings_sft = dataclasses.replace(sft, epochs=s.openings_epochs)
            openings_figures = {**sft_run(tokenize_chats(tokenizer, openings), openings_sft, openings_log,
                                          "sft_openings"),
                                "chats": len(openings), "log": openings_log}
        chats = tokenize_chats(tokenizer, demos)
        log: list[dict[str, Any]] = []
        figures = sft_run(chats, sft, log, "sft")
        late = dataclasses.replace(sft, epochs=s.late_epochs, lr=s.late_lr, warmup_steps=s.late_warmup_steps)
        late_figures: dict[str, Any] = {}
        # The late stages, each from its own seed stream (openings use demo_seed + 1) and saved beside the rest.
        for stage, n, offset, make in (("selection", s.selection, 2, make_item_selections),
                                       ("refresh", s.refresh, 3, make_demonstrations)):
            if not n:
                continue
            records = make(n, s.demo_seed + offset, self.storefront, s.planted)
            atomic_write_jsonl(folder / f"{stage}.jsonl", records)
            stage_log: list[dict[str, Any]] = []
            late_figures[stage] = {**sft_run(tokenize_chats(tokenizer, records), late, stage_log, f"sft_{stage}"),
                                   "chats": len(records), "log": stage_log}
        model.save_pretrained(folder / "model")
        tokenizer.save_pretrained(folder / "model")
        follow_umask(folder / "model")  # safetensors writes 0600 files
        atomic_write_json(folder / "model" / "sft_info.json", {"config": dataclasses.asdict(sft), **figures,
                                                               "log": log, "openings": openings_figures,
                                                               "copy_drills": drill_figures, **late_figures})
        shown = sum(r["reward"] < 1 for r in demos)
        return {**figures, "copy_drills": drill_figures, "openings": openings_figures, **late_figures,
                "parameters": sum(p.numel() for p in model.parameters()),
                "built": build_environment(self.run_dir),
                "demonstrations": len(demos), "demonstrations_failing_by_plant": shown,
                "mean_tokens": sum(len(c.input_ids) for c in chats) / len(chats), "log": log}

    def _evaluate(self, model_dir: Path, adapter: Path | None, folder: Path, seeds: list[int], n_tasks: int,
                  samples: int, label: str, greedy: bool = True, game: str = "storefront",
                  game_overrides: dict[str, Any] | None = None, max_episode_tokens: int | None = None
                  ) -> dict[str, Any]:
        """`model_dir` (+ `adapter`) on `game` (the storefront as the demo plays it unless given), every seed:
        greedy (unless `greedy` is False) and `samples` samples at evaluate.temperature; results files in `folder`."""
        from benchmarks.results import mean_reward, write_results
        from train.evaluate import evaluate_model, load_policy_model

        if game == "storefront" and game_overrides is None:
            game_overrides = self.storefront_fields()
        max_episode_tokens = max_episode_tokens or self.config.evaluate.max_episode_tokens

        model, tokenizer = load_policy_model(model_dir, adapter)
        model.to(_device())
        runs: dict[str, Any] = {}
        for seed in seeds:
            modes = [("greedy", 0.0, 1)] if greedy else []
            for mode, temperature, k in modes + [("sampled", self.config.evaluate.temperature, samples)]:
                started = time.time()
                simulations, hat = evaluate_model(
                    model, tokenizer, game, n_tasks=n_tasks, seed=seed, samples=k, temperature=temperature,
                    game_overrides=game_overrides, max_episode_tokens=max_episode_tokens)
                path = folder / f"{label}_seed{seed}_{mode}.json"
                write_results(path, simulations, None, {"model": str(model_dir), "adapter": str(adapter or ""),
                                                        "seed": seed, "temperature": temperature, "samples": k})
                reward = mean_reward(simulations)
                runs[f"{seed}/{mode}"] = {"path": str(path.relative_to(self.run_dir)), "pass_hat_k": {
                    g: {"n_tasks": v["n_tasks"], **{str(kk): p for kk, p in v["pass_hat_k"].items()}}
                    for g, v in hat.items()}, "mean_reward": reward, "seconds": round(time.time() - started, 1)}
                print(f"  {label} seed {seed} {mode}: pass^1 {hat['all']['pass_hat_k'][1]:.3f}, mean reward "
                      f"{reward:.3f} ({time.time() - started:.0f} s)", flush=True)
        return runs

    def evaluate(self, folder: Path) -> dict[str, Any]:
        e = self.config.evaluate
        return {"base": self._evaluate(self.run_dir / "base" / "model", None, folder, e.seeds, e.tasks, e.samples,
                                       "base")}

    def select(self, folder: Path) -> dict[str, Any]:
        from demo.selection import select_on_results

        s = self.config.select
        runs = self._evaluate(self.run_dir / "base" / "model", None, folder, [s.seed], s.tasks, s.samples,
                              "analysis", greedy=False)  # Step 1 reads only the sampled trajectories
        results = self.run_dir / runs[f"{s.seed}/sampled"]["path"]
        return select_on_results(results, folder, self.config.base.planted, s)

    def _base_model(self) -> tuple[Any, Any]:
        from train.evaluate import load_policy_model

        model, tokenizer = load_policy_model(self.run_dir / "base" / "model")
        return model.to(_device()), tokenizer

    def environments(self, folder: Path) -> dict[str, Any]:
        from demo.loop import calibrate_capability
        from demo.trainable import not_trained_because
        from demo.report import environment_lines

        selected = self.records["select"]["figures"]["selected"]
        forced = self.config.loop.capabilities
        if forced:
            print(f"  loop.capabilities in the config: training {', '.join(forced)} whatever Step 1 selected "
                  f"({', '.join(selected) or 'nothing'})", flush=True)
            selected = list(forced)
        if not selected:
            print("  nothing selected in Step 1: no environment to build", flush=True)
            return {"capabilities": {}, "forced": False}
        model, tokenizer = self._base_model()
        out = {}
        for capability in selected:
            # Forced capabilities are trained whatever calibration finds: no mistake census for them.
            result = calibrate_capability(capability, model, tokenizer, self.game_surface(), self.config.loop,
                                          census=not forced)
            out[capability] = result
            skipped = not_trained_because(result, self.config.loop.group_size, forced=bool(forced))
            print("\n".join(environment_lines(capability, result, skipped)), flush=True)
        atomic_write_json(folder / "environments.json", out)
        return {"capabilities": out, "forced": bool(forced)}

    def game_surface(self) -> dict[str, Any]:
        """The game overrides every capability game starts from: the evaluation's storefront as its surface, so
        it draws the target's request kinds, id forms, phrasings, items, payment mix and confirmation rule
        (benchmarks/storefront/config.py). Every field, JSON-ready: calibration saves it with the game's overrides."""
        from benchmarks.storefront.config import surface_fields

        return {"storefront": surface_fields(self.storefront)}

    def trainable(self) -> dict[str, dict[str, Any]]:
        """Capabilities with a valid game that gives GRPO a learning signal (`not_trained_because`), and the game
        overrides calibration chose."""
        from demo.trainable import not_trained_because

        figures = self.records["environments"]["figures"]
        return {c: e["game_overrides"] for c, e in figures["capabilities"].items()
                if not_trained_because(e, self.config.loop.group_size, forced=figures["forced"]) is None}

    def train(self, folder: Path) -> dict[str, Any]:
        """Step 3. Each adapter also keeps its checkpoints at `evaluate.efficiency_fractions` of its run: the
        efficiency step composes them into TRACE at those shares of its budget."""
        from demo.loop import checkpoint_plan, game_for, planned_checkpoints, train_lora

        loop = self.config.loop
        # No label: an adapter's checkpoint is no model of its own (the efficiency step labels TRACE's).
        plan = checkpoint_plan(loop.iterations, self.config.evaluate.efficiency_fractions, model=None)
        runs = {}
        for capability, overrides in self.trainable().items():
            print(f"  GRPO LoRA for {capability} ({loop.iterations} iterations"
                  + (f"; checkpoints kept for the efficiency step at iterations "
                     f"{', '.join(str(p['iteration']) for p in plan)}" if plan else "") + ")", flush=True)
            run = train_lora(game_for(capability), self.run_dir / "base" / "model", folder / capability,
                             overrides, loop, loop.iterations, report_to=self.config.report_to,
                             checkpoints_at=[p["iteration"] for p in plan], seed=self.training_seed)
            if plan:  # each checkpoint with the share of the run it stands for
                run["checkpoints"] = planned_checkpoints(plan, run)
            runs[capability] = run
        if not runs:
            print("  no capability has a valid game: no adapter trained", flush=True)
        return {"adapters": runs}

    def own_game(self, folder: Path) -> dict[str, Any]:
        from demo.loop import game_for

        g, loop = self.config.own_game, self.config.loop
        if not g.enabled:
            print("  skipped (own_game.enabled is false: a diagnostic of make demo-full)", flush=True)
            return {}
        overrides = self.trainable()
        out = {}
        for capability, run in self.records["train"]["figures"]["adapters"].items():
            spec = game_for(capability)
            out[capability] = {"game": spec.name, "game_overrides": overrides[capability]}
            for label, adapter in (("base", None), ("lora", Path(run["adapter"]))):
                out[capability][label] = self._evaluate(
                    self.run_dir / "base" / "model", adapter, folder, [g.seed], g.tasks, g.samples,
                    f"{capability}_{label}", game=spec.name, game_overrides=overrides[capability],
                    max_episode_tokens=loop.max_episode_tokens)
        if not out:
            print("  no adapters: nothing to measure", flush=True)
        return out

    def gate(self, folder: Path) -> dict[str, Any]:
        from demo.loop import target_rollouts_of, train_gate

        adapters = {c: run["adapter"] for c, run in self.records["train"]["figures"]["adapters"].items()}
        if not adapters:
            print("  no adapters: no gate", flush=True)
            return {}
        return train_gate(self.run_dir / "base" / "model", adapters, self.trainable(), folder, self.config.loop,
                          report_to=self.config.report_to, seed=self.training_seed,
                          target_rollouts=target_rollouts_of(self.run_dir / "gate"),  # Step 1's, shared
                          routing=self.routing_targets(folder, adapters, self.config.select.tasks))

    def routing_targets(self, folder: Path, adapters: dict[str, str], n_tasks: int) -> dict[str, Any] | None:
        """loop.gate_labels "reward": each adapter alone plays the first `n_tasks` of Step 1's analysis tasks (same
        seed, samples and temperature as the base agent played them there, whose Step-1 conversations stand for the
        base slot); returns {"data": router SFT's sft.data (one results file per slot), "summary"
        (`train.routing_targets.summarize`), "episodes": the new ones} for `train_gate`, or None with game labels.
        These tasks are Step 1's: other tasks than the evaluation's (`check_routing_is_held_out`)."""
        from benchmarks.results import load_results, write_results
        from demo.loop import TARGET_GAME, target_rollouts_of
        from train.routing_targets import reward_targets, summarize

        if self.config.loop.gate_labels != "reward":
            return None
        s = self.config.select
        self.check_routing_is_held_out(n_tasks)
        files: dict[str, Path] = {}
        for capability, adapter in adapters.items():
            print(f"  routing targets: {capability} alone on {n_tasks} of Step 1's analysis tasks", flush=True)
            runs = self._evaluate(self.run_dir / "base" / "model", Path(adapter), folder / "routing", [s.seed],
                                  n_tasks, s.samples, f"routing_{capability}", greedy=False)
            files[capability] = self.run_dir / runs[f"{s.seed}/sampled"]["path"]
        simulations = {c: load_results(path)["simulations"] for c, path in files.items()}
        played = {sim["task_id"] for sims in simulations.values() for sim in sims}
        base = [sim for path in target_rollouts_of(self.run_dir / "gate")
                for sim in load_results(path)["simulations"] if sim["task_id"] in played]
        files = {"base": write_results(folder / "routing" / "base_step1.json", base), **files}
        slots = list(files)
        summary = summarize(reward_targets({"base": base, **simulations}, slots), slots)
        print("  routing targets, per slot: mean reward, tasks where it is best (alone): " + ", ".join(
            f"{slot} {v['mean_reward']:.3f}, {v['best_tasks']} ({v['best_alone']})" for slot, v in summary["slots"].items())
              + f"; no slot solved {summary['unsolved']} of {summary['tasks']}", flush=True)
        return {"data": [{"path": str(path), "label": slot, "game": TARGET_GAME} for slot, path in files.items()],
                "summary": summary, "episodes": n_tasks * s.samples * len(adapters)}

    def check_routing_is_held_out(self, n_tasks: int) -> None:
        """Routing targets' tasks (Step 1's first `n_tasks`) hold no evaluation task: raise InputError otherwise."""
        from benchmarks.storefront.run import task_seed

        e, s = self.config.evaluate, self.config.select
        evaluated = {task_seed(seed, i) for seed in e.seeds for i in range(e.tasks)}
        shared = sorted(evaluated & {task_seed(s.seed, i) for i in range(n_tasks)})
        if shared:
            raise InputError(f"loop.gate_labels reward: Step 1's analysis tasks (select.seed {s.seed}) include "
                             f"evaluation tasks {shared[:5]}; use a select.seed other than evaluate.seeds")

    def trace_episodes(self) -> int:
        adapters = self.records["train"]["figures"]["adapters"]
        gate = self.records["gate"]["figures"]
        return (sum(run["episodes"] for run in adapters.values()) + gate.get("episodes", 0)
                + gate.get("routing_episodes", 0))

    def baselines(self, folder: Path) -> dict[str, Any]:
        from game_registry import get_game
        from demo.loop import checkpoint_plan, game_for, planned_checkpoints, train_lora
        from train.game_mix import mixed_spec

        loop = self.config.loop
        budget = self.trace_episodes()
        per_iteration = loop.groups_per_iteration * loop.group_size
        iterations = budget // per_iteration
        if not loop.baselines or iterations < 1:
            print("  no baselines: " + ("loop.baselines is false" if not loop.baselines else
                                        "TRACE trained nothing, so there is no budget to match"), flush=True)
            return {}
        out = {"budget_episodes": budget}
        plan = checkpoint_plan(iterations, self.config.evaluate.efficiency_fractions)
        kept = (f"; checkpoints kept for the efficiency step at iterations {', '.join(str(p['iteration']) for p in plan)}"
                if plan else "")
        pool = loop.direct_task_pool
        # The claims profile (`loop.direct_fresh` false): direct GRPO is the fixed-pool run, and keeps the checkpoints.
        headline_pool = 0 if loop.direct_fresh else pool
        if headline_pool:
            self.check_pool_is_held_out(pool)
            print(f"  direct GRPO on a fixed pool of {pool} storefront tasks: {iterations} iterations "
                  f"({iterations * loop.groups_per_iteration} groups, {iterations * loop.groups_per_iteration / pool:.2f} "
                  f"passes over the pool){kept}", flush=True)
        else:
            print(f"  direct GRPO on the storefront: {iterations} iterations ({iterations * per_iteration} episodes)"
                  + kept, flush=True)
        out["direct"] = train_lora(get_game("storefront"), self.run_dir / "base" / "model", folder / "direct",
                                   self.storefront_fields(), dataclasses.replace(loop, hint_fraction=0.0), iterations,
                                   report_to=self.config.report_to, task_pool=headline_pool,
                                   checkpoints_at=[p["iteration"] for p in plan], seed=self.training_seed)
        pool -= headline_pool  # the second, fixed-pool run: only beside a fresh-task one
        if plan:  # each checkpoint with the fraction of the budget it stands for and its model label
            out["direct"]["checkpoints"] = planned_checkpoints(plan, out["direct"])
        if pool:
            self.check_pool_is_held_out(pool)
            print(f"  direct GRPO on a fixed pool of {pool} storefront tasks: {iterations} iterations "
                  f"({iterations * loop.groups_per_iteration} groups, {iterations * loop.groups_per_iteration / pool:.2f} "
                  "passes over the pool)", flush=True)
            out["direct_pool"] = train_lora(get_game("storefront"), self.run_dir / "base" / "model",
                                            folder / "direct_pool", self.storefront_fields(),
                                            dataclasses.replace(loop, hint_fraction=0.0), iterations,
                                            report_to=self.config.report_to, task_pool=pool, seed=self.training_seed)
        games = self.trainable()
        specs = [game_for(c) for c in games]
        print(f"  one LoRA on the selected games mixed: {iterations} iterations", flush=True)
        if len(specs) > 1:
            mix = mixed_spec(specs, overrides={game_for(c).name: o for c, o in games.items()})
            out["mixed"] = train_lora(mix, self.run_dir / "base" / "model", folder / "mixed", {},
                                      dataclasses.replace(loop, hint_fraction=0.0), iterations,
                                      report_to=self.config.report_to, seed=self.training_seed)
        else:
            (overrides,) = games.values()
            out["mixed"] = train_lora(specs[0], self.run_dir / "base" / "model", folder / "mixed", overrides, loop,
                                      iterations, report_to=self.config.report_to, seed=self.training_seed)
        return out

    def check_pool_is_held_out(self, pool: int) -> None:
        """Direct GRPO's fixed pool (training seeds `train_seed_start`..) holds no task the evaluation plays (its
        seeds are hashes of the evaluation seed and task index): raise InputError naming the shared seeds."""
        from benchmarks.storefront.run import task_seed
        from demo.loop import grpo_config

        first = grpo_config("storefront", Path("."), Path("."), {}, self.config.loop, 1).train_seed_start
        evaluated = {task_seed(seed, i) for seed in self.config.evaluate.seeds for i in range(self.config.evaluate.tasks)}
        shared = sorted(s for s in evaluated if first <= s < first + pool)
        if shared:
            raise InputError(f"loop.direct_task_pool {pool}: the pool's task seeds {first}..{first + pool - 1} include "
                             f"evaluation tasks {shared[:5]}; use a smaller pool or other evaluate.seeds")

    def final(self, folder: Path) -> dict[str, Any]:
        e = self.config.evaluate
        models: dict[str, Path] = {}
        for capability, run in self.records["train"]["figures"]["adapters"].items():
            if self.config.evaluate.each_adapter:  # a diagnostic row (make demo-full)
                models[f"lora:{capability}"] = Path(run["adapter"])
        gate = self.records["gate"]["figures"].get("gate")
        if gate:
            models["TRACE"] = Path(gate)
        for name, label in BASELINE_LABELS.items():
            run = self.records["baselines"]["figures"].get(name)
            if run:
                models[label] = Path(run["adapter"])
        out: dict[str, Any] = {}
        for label, adapter in models.items():
            out[label] = self._evaluate(self.run_dir / "base" / "model", adapter, folder, e.seeds, e.tasks, e.samples,
                                        file_label(label))
        routing: dict[str, Any] = {}
        if "TRACE" in out:
            from benchmarks.results import load_results
            from demo.loop import plot_routing, routing_by_kind

            routing["by_kind"] = routing_by_kind(self.run_dir / "base" / "model", models["TRACE"],
                                                 [self.run_dir / r["path"] for r in out["TRACE"].values()])
            run = out["TRACE"][f"{e.seeds[0]}/greedy"]
            simulation = load_results(self.run_dir / run["path"])["simulations"][0]
            png = self.steps_root / "routing.png"
            routing["caption"] = plot_routing(self.run_dir / "base" / "model", models["TRACE"],
                                              simulation["messages"], png)
            routing["png"] = str(png.relative_to(self.run_dir))  # "routing.png" in the main run
        return {"models": out, "routing": routing}

    def efficiency(self, folder: Path) -> dict[str, Any]:
        """Sample efficiency: direct GRPO's checkpoints at `evaluate.efficiency_fractions` of its budget (saved by the
        baselines step) on the final step's evaluation tasks and seeds, greedy and sampled, as models
        "direct GRPO @1/4", .... TRACE at its full budget and direct GRPO's final adapter are the final step's; the
        report puts them side by side. figures: {"fractions", "checkpoints": {label: {fraction, asked, iteration,
        episodes, adapter}}, "models": {label: evaluation runs}, "why" (when nothing was evaluated)}."""
        e = self.config.evaluate
        out: dict[str, Any] = {"fractions": list(e.efficiency_fractions), "checkpoints": {}, "models": {},
                               "trace_checkpoints": {}}
        direct = self.records["baselines"]["figures"].get("direct")
        if not e.efficiency_fractions:
            out["why"] = "evaluate.efficiency_fractions is []: the efficiency step is off"
        elif not direct:
            out["why"] = "no direct GRPO run (loop.baselines is false, or TRACE trained nothing to match)"
        elif not direct.get("checkpoints"):
            out["why"] = (f"direct GRPO ran {direct['iterations']} iteration(s): no checkpoint before the last stands "
                          f"for {', '.join(map(str, e.efficiency_fractions))} of its budget")
        if "why" in out:
            print(f"  nothing to evaluate: {out['why']}", flush=True)
            return out
        for checkpoint in direct["checkpoints"]:
            label = checkpoint["label"]
            out["checkpoints"][label] = {k: checkpoint[k] for k in ("fraction", "asked", "iteration", "episodes",
                                                                    "adapter")}
            print(f"  {label}: iteration {checkpoint['iteration']} of {direct['iterations']} "
                  f"({checkpoint['episodes']} episodes)", flush=True)
            out["models"][label] = self._evaluate(
                self.run_dir / "base" / "model", Path(checkpoint["adapter"]), folder, e.seeds, e.tasks, e.samples,
                file_label(label))
        why = self.trace_checkpoints(folder, out)
        if why:
            out["trace_why"] = why
            print(f"  TRACE's own checkpoints: not measured ({why})", flush=True)
        return out

    def trace_checkpoints(self, folder: Path, out: dict[str, Any]) -> str | None:
        """TRACE at shares of its own training budget, into `out` ("trace_checkpoints", "models"): per checkpoint
        the train step kept (iteration i of each adapter's run), a gate trained as Step 4 trains it, on those
        adapters, with floor(share x loop.gate_iterations) GRPO iterations and router SFT on the rollouts of
        iterations 1..i only, then evaluated as the final step evaluates. Its label is the share of TRACE's full
        training episodes it used ("TRACE @1/4" for 2 x 128 adapter + 64 gate episodes of 1,280): with it set
        against direct GRPO's final, the paper's claim is measured at its own ratio. Returns why nothing was
        measured, or None."""
        from demo.loop import target_rollouts_of, train_gate

        e, loop = self.config.evaluate, self.config.loop
        adapters = self.records["train"]["figures"]["adapters"]
        if not adapters or not self.records["gate"]["figures"].get("gate"):
            return "no TRACE model: no adapter or no gate"
        kept = [run.get("checkpoints") or [] for run in adapters.values()]
        if not all(kept):
            return (f"the adapters ran {loop.iterations} iteration(s): no checkpoint before the last stands for "
                    f"{', '.join(map(str, e.efficiency_fractions))} of their runs")
        full = self.trace_episodes()
        whys = []
        for point in kept[0]:
            i = point["iteration"]
            at = {c: next(k for k in run["checkpoints"] if k["iteration"] == i) for c, run in adapters.items()}
            gate_iterations = math.floor(point["fraction"] * loop.gate_iterations + 1e-9)
            print(f"  TRACE at iteration {i} of {loop.iterations}: a gate of {gate_iterations} GRPO iteration(s) on "
                  "the adapters' checkpoints", flush=True)
            checkpoint_adapters = {c: k["adapter"] for c, k in at.items()}
            gate_folder = folder / f"trace_iter{i:06d}"
            # Routing targets on the same share of Step 1's tasks as of the gate's GRPO iterations.
            routing = self.routing_targets(gate_folder, checkpoint_adapters,
                                           max(1, math.floor(point["fraction"] * self.config.select.tasks + 1e-9)))
            gate = train_gate(self.run_dir / "base" / "model", checkpoint_adapters,
                              self.trainable(), gate_folder,
                              dataclasses.replace(loop, gate_iterations=gate_iterations),
                              report_to=self.config.report_to, seed=self.training_seed,
                              target_rollouts=target_rollouts_of(self.run_dir / "gate"),  # Step 1's, as Step 4
                              runs={c: run["adapter"] for c, run in adapters.items()}, through=i, routing=routing)
            if not gate.get("gate"):
                whys.append(f"iteration {i}: no gate (no router SFT data and 0 gate GRPO iterations)")
                continue
            routing_episodes = gate.get("routing_episodes", 0)
            episodes = sum(k["episodes"] for k in at.values()) + gate["episodes"] + routing_episodes
            share = Fraction(episodes, full)
            label = f"TRACE @{share.numerator}/{share.denominator}"
            out["trace_checkpoints"][label] = {
                "fraction": float(share), "asked": point["asked"], "iteration": i, "iterations": loop.iterations,
                "adapter_episodes": {c: k["episodes"] for c, k in at.items()}, "gate_iterations": gate_iterations,
                "gate_episodes": gate["episodes"], "routing_episodes": routing_episodes, "episodes": episodes,
                "gate": gate["gate"],
                "sft_data": gate["sft_data"]}
            print(f"  {label}: {episodes} of TRACE's {full} training episodes", flush=True)
            out["models"][label] = self._evaluate(self.run_dir / "base" / "model", Path(gate["gate"]), folder,
                                                  e.seeds, e.tasks, e.samples, file_label(label))
        return "; ".join(whys) if whys and not out["trace_checkpoints"] else None


def file_label(model: str) -> str:
    """A model's label as its results files' name stem: "lora:x" -> "lora_x", "direct GRPO (task pool)" ->
    "direct_GRPO_task_pool", "TRACE @1/4" -> "TRACE_at1of4"."""
    return (model.replace(":", "_").replace(" ", "_").replace("(", "").replace(")", "").replace("@", "at")
            .replace("/", "of"))


def summarize_runs(runs: dict[str, Any], mode: str) -> dict[str, Any]:
    """mean ± std over evaluation seeds of pass^1 (and pass^k) per group, for one mode (greedy / sampled)."""
    chosen = [run for key, run in runs.items() if key.endswith("/" + mode)]
    groups = sorted({g for run in chosen for g in run["pass_hat_k"]})
    table = {}
    for group in groups:
        per_seed = [run["pass_hat_k"][group] for run in chosen if group in run["pass_hat_k"]]
        ks = sorted({k for row in per_seed for k in row if k != "n_tasks"}, key=int)
        table[group] = {"n_tasks": sum(row["n_tasks"] for row in per_seed)}
        for k in ks:
            values = [row[k] for row in per_seed if k in row]
            table[group][f"pass^{k}"] = {"mean": statistics.fmean(values),
                                         "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return table


def write_report(demo: Demo) -> str:
    """report.md + results.json under the run folder; returns the printed table."""
    from demo.report import render_report

    from demo.loop import routing_by_kind

    text, results, table = render_report(demo.run_dir, demo.records, demo.config, summarize_runs, demo.profile,
                                         measure_routing=routing_by_kind,
                                         repeats={r.training_seed: r.records for r in demo.repeats})
    (demo.run_dir / "report.md").write_text(text, encoding="utf-8")
    atomic_write_json(demo.run_dir / "results.json", results)
    return table


@cli_entry
def main(argv: list[str] | None = None) -> int:
    from demo.config import load_demo_config
    from train.tracking import check_report_to, require_trackers

    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="default (configs/demo.yaml) or fast (configs/demo_fast.yaml)")
    parser.add_argument("--config", help="a demo config file instead of a profile's (not with --profile)")
    parser.add_argument("--run-dir", type=Path, help="where the steps write (default runs/demo, runs/demo_fast)")
    parser.add_argument("--fresh", action="store_true", help="re-run every step, even complete ones")
    parser.add_argument("--repeat", type=int, metavar="N",
                        help="run Steps 3-4, the baselines and their evaluations N times, with training seeds 0..N-1 "
                             "(the config's `repeats`, default 1): the report gives each model's mean and spread over "
                             "the repeats; the base agent, Step 1 and Step 2 are shared")
    parser.add_argument("--rebuild-base", action="store_true",
                        help="build the base agent here (SFT, about an hour on 2 cores) instead of using the shipped "
                             "one (assets/demo_base_agent, used when its manifest matches the config's base section "
                             "and storefront)")
    parser.add_argument("--labeler-url", help="Step 1 with LLM labelers at this OpenAI-compatible endpoint "
                                              "(sets select.labeler_url; the key comes from $OPENAI_API_KEY)")
    parser.add_argument("--labeler-model", help="the labelers' model name on that endpoint (select.labeler_model)")
    parser.add_argument("--report-to", "--report_to", dest="report_to",
                        help="trackers every training run reports to, comma-separated: tensorboard, wandb, trackio, "
                             "mlflow, or none (sets the config's report_to; tensorboard --logdir <run-dir> to watch)")
    args = parser.parse_args(argv)
    if args.profile is not None and args.config:  # which one would set the budgets is not the user's to guess
        print(f"error: --profile {args.profile} and --config {args.config} both name a demo config; give one "
              f"(--config FILE runs FILE, with the default profile's run folder unless --run-dir is set)",
              file=sys.stderr)
        return 2
    args.profile = args.profile or "default"
    config_path = Path(args.config) if args.config else REPO_ROOT / PROFILES[args.profile]
    run_dir = args.run_dir or REPO_ROOT / "runs" / ("demo" if args.profile == "default" else f"demo_{args.profile}")
    config = load_demo_config(config_path)
    if args.labeler_url or args.labeler_model:
        if args.labeler_url:
            check_url(args.labeler_url, "--labeler-url")  # the flag's own name in the message
        try:
            config.select = dataclasses.replace(config.select, labeler_url=args.labeler_url or "",
                                                labeler_model=args.labeler_model or "")
        except ValueError as err:
            raise InputError(f"--labeler-url/--labeler-model: {err}") from None
    if args.repeat is not None:
        if args.repeat < 1:
            raise InputError(f"--repeat must be >= 1 (1 = one run, the default), got {args.repeat}")
        config.repeats = args.repeat
    if args.report_to is not None:
        try:
            config.report_to = check_report_to(args.report_to, "--report-to")
        except ValueError as err:
            raise InputError(str(err)) from None
    require_trackers(config.report_to)  # a missing package stops the demo before any step runs
    check_labeler_key(config.select)
    check_output_dir(run_dir, "--run-dir")
    # One folder, one demo: a second demo on this run folder is refused at once (a rerun resumes its steps).
    with claimed_run_folder(run_dir, "--run-dir", fresh=False):
        demo = Demo(config, run_dir, args.fresh, args.profile, rebuild_base=args.rebuild_base)
        try:
            return _run_steps(demo, config, config_path, run_dir, args.profile)
        except KeyboardInterrupt:
            raise Interrupted(f"the steps that completed are kept in {run_dir}: run the same command again to "
                              "resume from the interrupted step") from None


def check_labeler_key(select: Any) -> None:
    """With LLM labelers (select.labeler_url), InputError unless their API key variable is set and not empty.

    Step 1 reads it only after the base agent and its evaluation have run (up to an hour on CPU). The labeler's
    client (pipeline.label_trajectories, common/llm_client.py) refuses an empty key even for a server without
    authentication, so the key is required here too. A resumed demo whose Step 1 is already done is refused as
    well: whether Step 1 will run again is known only once the steps before it have been checked."""
    if not select.labeler_url:
        return
    name = select.labeler_api_key_env
    if not os.environ.get(name):
        raise InputError(f"select.labeler_url {select.labeler_url}: the LLM labelers read their API key from ${name} "
                         f"(select.labeler_api_key_env), which is not set or empty; export it (any value, e.g. "
                         f"{name}=EMPTY, for a server without authentication)")


def _loop_steps(demo: Demo, config: Any, sections: dict[str, Any], storefront: dict[str, Any], fractions: list[float],
                pool: int, own: dict[str, dict[str, Any]]) -> None:
    """The steps after Step 2 (REPEATED_STEPS), in order; a repeat's settings carry its training seed. `own`: the
    settings only one step has, by step (non-default values only)."""
    seed = {"training_seed": demo.training_seed} if demo.training_seed else {}  # repeat 1's settings: the run's own
    loop = {**sections["loop"], **seed}
    # The fractions are also Step 3's setting (its adapters keep checkpoints for TRACE at those shares); [] keeps
    # the settings of runs made before.
    fractions_setting = {"efficiency_fractions": fractions} if fractions else {}
    demo.step("train", {**loop, **fractions_setting}, ("environments",), demo.train)
    demo.step("own_game", {**sections["own_game"], **seed, "temperature": config.evaluate.temperature,
                           "max_episode_tokens": config.loop.max_episode_tokens}, ("environments", "train"),
              demo.own_game)
    demo.step("gate", {**loop, **own["gate"]}, ("train",), demo.gate)
    # Without efficiency fractions the baselines' settings are what they were before the step existed.
    demo.step("baselines", {**loop, **storefront, **({"efficiency_fractions": fractions} if fractions else {}),
                            **({"direct_task_pool": pool} if pool else {}), **own["baselines"]},
              ("train", "gate"), demo.baselines)
    demo.step("final", {**sections["evaluate"], **seed, **own["final"]},
              ("evaluate", "train", "gate", "baselines"), demo.final)
    demo.step("efficiency", {**sections["evaluate"], **seed, **storefront, "efficiency_fractions": fractions},
              ("train", "gate", "baselines"), demo.efficiency)


@cli_entry
def _run_steps(demo: Demo, config: Any, config_path: Path, run_dir: Path, profile: str) -> int:
    from demo.config import SECTIONS

    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"TRACE CPU demo ({profile} profile, {config_path.relative_to(REPO_ROOT) if config_path.is_relative_to(REPO_ROOT) else config_path}) "
          f"on {_device()} -> {run_dir}", flush=True)
    sections = {name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS}
    # The efficiency fractions are the baselines' (which checkpoints they keep) and the efficiency step's settings,
    # not the evaluate, select or final steps' (whose fingerprints stay those of runs made before the key existed):
    # changing them re-runs the baselines and the steps after them.
    fractions = sections["evaluate"].pop("efficiency_fractions")
    # Likewise the fixed task pool is only the baselines' (direct GRPO's second run) setting, and whether direct GRPO
    # also runs on fresh tasks; whether each adapter is evaluated alone is only the final step's. (Their defaults
    # leave the fingerprints of runs made before the keys existed.)
    pool = sections["loop"].pop("direct_task_pool")
    direct_fresh = sections["loop"].pop("direct_fresh")
    each_adapter = sections["evaluate"].pop("each_adapter")
    # How the gate routes is the gate step's setting alone (the steps after it read its fingerprint).
    gate_mode = sections["loop"].pop("gate_mode")
    gate_labels = sections["loop"].pop("gate_labels")
    own = {"baselines": {} if direct_fresh else {"direct_fresh": False},
           "final": {} if each_adapter else {"each_adapter": False},
           "gate": {**({} if gate_mode == "token" else {"gate_mode": gate_mode}),
                    **({} if gate_labels == "game" else {"gate_labels": gate_labels})}}
    storefront = {"storefront": demo.storefront_fields()}
    if config.loop.gate_labels == "reward":  # before any step: the routing targets' tasks are Step 1's
        demo.check_routing_is_held_out(config.select.tasks)
    demo.step("base", demo.base_step_settings(), (), demo.base, force=demo.rebuild_base)
    demo.step("evaluate", {**sections["evaluate"], **storefront}, ("base",), demo.evaluate)
    demo.step("select", {**sections["select"], **storefront, "evaluate": sections["evaluate"]}, ("base",),
              demo.select)
    demo.step("environments", sections["loop"], ("base", "select"), demo.environments)
    _loop_steps(demo, config, sections, storefront, fractions, pool, own)
    for number in range(1, config.repeats):
        repeat = demo.repeat(number)
        print(f"repeat {number + 1} of {config.repeats}: Steps 3-4, the baselines and their evaluations with "
              f"training seed {number} -> {repeat.steps_root}", flush=True)
        _loop_steps(repeat, config, sections, storefront, fractions, pool, own)
        demo.repeats.append(repeat)
    table = write_report(demo)
    print()
    print(table)
    print(f"\nreport: {run_dir / 'report.md'}; numbers: {run_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
