"""Calibrate a capability's scenarios against the base model by mutation (Step 2 for SWE-bench targets).

    python -m swebench.calibrate --capability NAME --model M [--adapter DIR]
        [--target 10] [--candidates 20] [--seed 0] [--samples 10] [--temperature 1.0] [--threshold 0.5]
        [--rounds 5] [--max-episode-tokens 16384] [--workers 2] [--isolation auto|namespace|fallback]
        [--unsafe-no-isolation] [--work-dir runs/swebench/calibrate/NAME] [--out pipeline/swebench/NAME/scenarios_parsed.json]

1. Generate --candidates scenarios (seeds --seed ...) and self-test them (failures are dropped).
2. Round r = 0, 1, ...: play --samples smoke rollouts per pending scenario at --temperature with the model,
   through the scenario game and the rollout collection code of the trainer (train/collect_rollouts.py:
   vLLM when VLLM_BASE_URLS is set, else in process). A scenario whose success rate is <= --threshold is
   accepted. The others are mutated with the round's strategy bundle (A/B/C/A/B, swebench/mutations.py),
   and every mutated scenario must pass the self-test again to stay (else it is dropped
   with the reason). Stop when --target scenarios are accepted or after --rounds rounds; what is still too
   easy then is rejected.
3. Write the accepted scenarios (at most --target) to --out, and to --work-dir: calibration.json
   ({"metrics", "errors", "warnings"} with every scenario's success rate per round), calibration_log.md
   (one section per round) and state.json.

Resumable: state.json and each round's rollouts (round_<r>_rollouts.json) are kept in --work-dir; running
the same command again continues where it stopped (a finished round is never re-sampled). Every flag but
--workers, --isolation, --unsafe-no-isolation, --work-dir and --out must stay the same (state.json records
them; another value is refused before the model loads). A round's rollouts are reused only when the info
they were written with (model, adapter, temperature, samples, --max-episode-tokens and a hash of that round's
scenarios) matches; otherwise that file is moved to --work-dir/superseded_<k>/ and the round is sampled
again. Without state.json a new calibration starts, and the round_* files of the earlier one are moved there
first, never read. With no scenario accepted, an earlier file at --out is removed (it is not this run's).

Scenario code runs only in the namespace sandbox (swebench/sandbox.py); where namespaces are
missing, --unsafe-no-isolation accepts running it without them (otherwise exit 2 with what is missing).

Exit codes: 0 --target scenarios accepted, 1 fewer, 2 bad input (flags, an unloadable model, vLLM settings, a
--work-dir whose state.json has other settings; checked before any rollout).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks.results import write_results
from common.cli import exit_code, seed_value
from common.io import atomic_write_json, atomic_write_text, check_model_folder, check_output_path, load_json
from common.run_folder import claimed_run_folder
from common.validation import InputError, check_int, check_number
from swebench.generators import GENERATORS, generate_one
from swebench.mutations import ROUND_ORDER, SCHEDULES, mutate_round
from swebench.sandbox import UNSAFE_FLAG, SandboxConfig, SandboxUnavailable, resolve_isolation
from swebench.scenario import Scenario, default_scenarios_path, publish_scenarios, save_scenarios
from swebench.selftest import self_test_many

# (scenarios file, number of scenarios, round) -> success rate per scenario, in file order
Rollouts = Callable[[Path, int, int], list[float]]
# (scenarios file, number of scenarios) -> simulations (task_id: the scenario's index in the file)
Sampler = Callable[[Path, int], list[dict[str, Any]]]


@dataclass(frozen=True)
class CalibrationConfig:
    capability: str
    target: int = 10
    candidates: int = 20
    seed: int = 0
    samples: int = 10
    threshold: float = 0.5
    rounds: int = 5
    workers: int = 2
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # What the rollouts are sampled with (checked by main). In the config record: a rerun with another model
    # or sampling setting is refused instead of resuming the first one's rounds.
    model: str = ""
    adapter: str | None = None
    temperature: float = 1.0
    max_episode_tokens: int = 16384

    def __post_init__(self) -> None:
        if self.capability not in GENERATORS:
            raise InputError(f"capability must be one of {sorted(GENERATORS)}, got {self.capability!r}")
        for name, low in (("target", 1), ("candidates", 1), ("samples", 1), ("workers", 1), ("rounds", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(f"{name} must be an int >= {low}, got {value!r}")
        if self.rounds > len(ROUND_ORDER):
            raise InputError(f"rounds must be <= {len(ROUND_ORDER)} (the A/B/C/A/B schedule), got {self.rounds}")
        if self.candidates < self.target:
            raise InputError(f"candidates ({self.candidates}) must be >= target ({self.target}); generate more "
                             "candidates than you need, some will be rejected")
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool) or not (
                0.0 <= self.threshold <= 1.0):
            raise InputError(f"threshold must be a success rate in [0, 1], got {self.threshold!r}")


def _load_state(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    state = load_json(path)
    if not isinstance(state, dict) or "round" not in state:
        raise InputError(f"{path}: not a calibration state file; delete it to start over")
    return state


def resumable_state(config: CalibrationConfig, work_dir: Path) -> dict[str, Any] | None:
    """work_dir's state.json (None without one); InputError when it was written with other settings."""
    state_path = work_dir / "state.json"
    state = _load_state(state_path)
    if state is not None and state.get("config") != _config_record(config):
        raise InputError(f"{state_path} was written with other settings ({state.get('config')}); use another "
                         "--work-dir or delete it to start over")
    return state


def calibrate(config: CalibrationConfig, rollouts: Rollouts, work_dir: Path,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) the calibration; returns the final state (accepted scenarios under "accepted")."""
    work_dir.mkdir(parents=True, exist_ok=True)
    state_path = work_dir / "state.json"
    state = resumable_state(config, work_dir)
    if state is None:
        _set_aside_earlier_rounds(work_dir, log)
        scenarios = [generate_one(config.capability, config.seed + i) for i in range(config.candidates)]
        results = self_test_many(scenarios, config.sandbox, config.workers, progress=False)
        state = {"config": _config_record(config), "round": 0, "accepted": [], "rejected": {},
                 "pending": [s.to_dict() for s, r in zip(scenarios, results) if r.ok],
                 "history": {s.id: [] for s in scenarios}, "log": []}
        for scenario, result in zip(scenarios, results):
            if not result.ok:
                state["rejected"][scenario.id] = f"self-test: {result.reason}"
        state["log"].append(f"## Candidates\n\n{len(state['pending'])} of {len(scenarios)} generated scenarios pass "
                            f"the self-test.")
        atomic_write_json(state_path, state)
    while state["pending"] and len(state["accepted"]) < config.target and state["round"] <= config.rounds:
        round_index = state["round"]
        pending = [Scenario.from_dict(s) for s in state["pending"]]
        scenarios_file = work_dir / f"round_{round_index}_scenarios.json"
        save_scenarios(scenarios_file, pending)
        rates = rollouts(scenarios_file, len(pending), round_index)
        if len(rates) != len(pending):
            raise RuntimeError(f"round {round_index}: {len(rates)} success rates for {len(pending)} scenarios")
        lines = [f"## Round {round_index}", ""]
        to_mutate: list[Scenario] = []
        for scenario, rate in zip(pending, rates):
            state["history"].setdefault(scenario.id, []).append(round(rate, 4))
            if rate <= config.threshold and len(state["accepted"]) < config.target:
                state["accepted"].append(scenario.to_dict())
                lines.append(f"- {scenario.id}: success {rate:.2f} <= {config.threshold}: accepted")
            elif rate <= config.threshold:
                state["rejected"][scenario.id] = "not needed: the target is reached"
            elif round_index >= min(config.rounds, len(ROUND_ORDER)):
                state["rejected"][scenario.id] = f"still too easy after {round_index} mutation rounds ({rate:.2f})"
                lines.append(f"- {scenario.id}: success {rate:.2f}: rejected (no round left)")
            else:
                to_mutate.append(scenario)
                lines.append(f"- {scenario.id}: success {rate:.2f} > {config.threshold}: mutate with "
                             f"{ROUND_ORDER[round_index]} ({' + '.join(SCHEDULES[config.capability][ROUND_ORDER[round_index]])})")
        next_pending: list[dict[str, Any]] = []
        if to_mutate and len(state["accepted"]) < config.target:
            mutated = [mutate_round(s, round_index) for s in to_mutate]
            results = self_test_many(mutated, config.sandbox, config.workers, progress=False)
            for scenario, result in zip(mutated, results):
                if result.ok:
                    next_pending.append(scenario.to_dict())
                else:
                    state["rejected"][scenario.id] = f"mutation round {round_index} broke the self-test: {result.reason}"
                    lines.append(f"- {scenario.id}: the mutated version fails the self-test ({result.reason}): dropped")
        state["pending"] = next_pending
        state["round"] = round_index + 1
        state["log"].append("\n".join(lines))
        atomic_write_json(state_path, state)
        log(f"round {round_index}: {len(state['accepted'])}/{config.target} accepted, {len(next_pending)} mutated "
            f"for the next round")
    _write_reports(config, state, work_dir)
    return state


def _config_record(config: CalibrationConfig) -> dict[str, Any]:
    return {"capability": config.capability, "target": config.target, "candidates": config.candidates,
            "seed": config.seed, "samples": config.samples, "threshold": config.threshold, "rounds": config.rounds,
            "model": config.model, "adapter": config.adapter, "temperature": config.temperature,
            "max_episode_tokens": config.max_episode_tokens}


def _set_aside(paths: list[Path], work_dir: Path) -> Path:
    """Move `paths` into a new work_dir/superseded_<k>/ (kept for the user, never read again); returns it."""
    index = 0
    while (work_dir / f"superseded_{index}").exists():
        index += 1
    folder = work_dir / f"superseded_{index}"
    folder.mkdir()
    for path in paths:
        path.rename(folder / path.name)
    return folder


def _set_aside_earlier_rounds(work_dir: Path, log: Callable[[str], None]) -> None:
    """Without state.json the round_* files belong to an earlier calibration: its rollouts would be taken for
    the new scenarios' (other scenarios, maybe more of them), so they are moved away before round 0."""
    earlier = sorted(work_dir.glob("round_*.json"))
    if earlier:
        folder = _set_aside(earlier, work_dir)
        log(f"no state.json: a new calibration starts; {len(earlier)} round file(s) of an earlier one moved to "
            f"{folder}")


def _write_reports(config: CalibrationConfig, state: dict[str, Any], work_dir: Path) -> None:
    accepted = [s["id"] for s in state["accepted"]]
    errors = [] if len(accepted) >= config.target else [
        f"only {len(accepted)} of {config.target} scenarios accepted (success rate <= {config.threshold})"]
    metrics = {"accepted": accepted, "rejected": state["rejected"], "success_rate_per_round": state["history"],
               "rounds_run": state["round"], "threshold": config.threshold, "samples": config.samples}
    atomic_write_json(work_dir / "calibration.json", {"metrics": metrics, "errors": errors, "warnings": []})
    atomic_write_text(work_dir / "calibration_log.md",
                      f"# Calibration of {config.capability}\n\n" + "\n\n".join(state["log"]) + "\n")


# --------------------------------------------------------------------------------------------------
# Rollouts through the trainer's collection code
# --------------------------------------------------------------------------------------------------
def saved_rollouts(sample: Sampler, work_dir: Path, settings: dict[str, Any], samples: int,
                   log: Callable[[str], None] = print) -> Rollouts:
    """Rollouts kept per round in round_<r>_rollouts.json, whose info records `settings`, `samples` and the
    hash of the round's scenarios file; a file whose info differs is set aside and the round sampled again."""

    def run(scenarios_file: Path, count: int, round_index: int) -> list[float]:
        out = work_dir / f"round_{round_index}_rollouts.json"
        info = {**settings, "samples": samples, "round": round_index,
                "scenarios_sha256": hashlib.sha256(scenarios_file.read_bytes()).hexdigest()}
        simulations = _finished_round(out, info, work_dir, log)
        if simulations is None:
            simulations = sample(scenarios_file, count)
            write_results(out, simulations, info=info)
        return _success_rates(simulations, count, samples)

    return run


def _finished_round(out: Path, info: dict[str, Any], work_dir: Path,
                    log: Callable[[str], None]) -> list[dict[str, Any]] | None:
    """The simulations of `out` when it was sampled with `info` (a finished round of an interrupted run), else
    None; a file from other scenarios or settings is set aside, so it is never read for this round."""
    if not out.is_file():
        return None
    data = load_json(out)
    if isinstance(data, dict) and data.get("info") == info and isinstance(data.get("simulations"), list):
        return data["simulations"]
    folder = _set_aside([out], work_dir)
    log(f"{out.name} was sampled for other scenarios or settings: moved to {folder}; sampling the round again")
    return None


def _success_rates(simulations: list[dict[str, Any]], count: int, samples: int) -> list[float]:
    rates = [0.0] * count
    for sim in simulations:
        rates[int(sim["task_id"])] += float(sim["reward_info"].get("success") is True) / samples
    return rates


def trainer_rollouts(capability: str, model: str, adapter: str | None, samples: int, temperature: float,
                     max_episode_tokens: int, work_dir: Path, sampling_seed: int = 0,
                     sandbox: SandboxConfig | None = None, log: Callable[[str], None] = print) -> Rollouts:
    """Success rates from `train.collect_rollouts.collect` on the scenario game (model loaded once)."""
    import torch

    from swebench.game import make_spec
    from train.backends import HFBackend
    from train.collect_rollouts import collect
    from train.episodes import ChatTokenizer
    from train.policy import load_base_model
    from train.vllm_backend import backend_from_env

    spec = make_spec(capability)
    base, tokenizer = load_base_model(model)
    backend = backend_from_env(work_dir / ".vllm_adapters", seed=sampling_seed)
    if backend is None:
        if adapter:
            from peft import PeftModel

            base = PeftModel.from_pretrained(base, adapter)
        torch.manual_seed(sampling_seed)
        backend = HFBackend(base, tokenizer.pad_token_id, seed=sampling_seed)
    elif adapter:
        backend.served_model = adapter
    chat = ChatTokenizer(tokenizer)
    sandbox = sandbox or SandboxConfig()
    overrides = {"isolation": sandbox.isolation, "allow_unisolated": sandbox.allow_unisolated}

    def sample(scenarios_file: Path, count: int) -> list[dict[str, Any]]:
        return collect(spec, backend, chat, seeds=list(range(count)), samples=samples, temperature=temperature,
                       max_episode_tokens=max_episode_tokens,
                       game_overrides={"scenarios_path": str(scenarios_file), **overrides})

    settings = {"capability": capability, "model": model, "adapter": adapter, "temperature": temperature,
                "max_episode_tokens": max_episode_tokens}
    return saved_rollouts(sample, work_dir, settings, samples, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swebench.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--capability", required=True, choices=sorted(GENERATORS))
    parser.add_argument("--model", required=True, help="base model: local directory or hub id (or the served name)")
    parser.add_argument("--adapter", default=None, help="PEFT adapter (in process) or served adapter name (vLLM)")
    parser.add_argument("--target", type=int, default=10, help="scenarios to accept")
    parser.add_argument("--candidates", type=int, default=20, help="scenarios generated at the start")
    parser.add_argument("--seed", type=seed_value, default=0, help="generator seed of the first candidate")
    parser.add_argument("--samples", type=int, default=10, help="smoke rollouts per scenario and round")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threshold", type=float, default=0.5, help="accept at success rate <= this")
    parser.add_argument("--rounds", type=int, default=5, help="mutation rounds at most (A/B/C/A/B)")
    parser.add_argument("--max-episode-tokens", type=int, default=16384)
    parser.add_argument("--workers", type=int, default=2, help="parallel self-tests")
    parser.add_argument("--isolation", choices=("auto", "namespace", "fallback"), default="auto")
    parser.add_argument(UNSAFE_FLAG, dest="unsafe_no_isolation", action="store_true",
                        help="run the scenario code without namespace isolation where namespaces are missing "
                             "(unsafe: see swebench/sandbox.py)")
    parser.add_argument("--work-dir", type=Path, default=None, help="default runs/swebench/calibrate/<capability>")
    parser.add_argument("--out", type=Path, default=None,
                        help="default pipeline/swebench/<capability>/scenarios_parsed.json")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path("runs/swebench/calibrate") / args.capability
    out = args.out or default_scenarios_path(args.capability)
    try:
        config = CalibrationConfig(args.capability, args.target, args.candidates, args.seed, args.samples,
                                   args.threshold, args.rounds, args.workers,
                                   SandboxConfig(isolation=args.isolation,
                                                 allow_unisolated=args.unsafe_no_isolation),
                                   model=args.model, adapter=args.adapter, temperature=args.temperature,
                                   max_episode_tokens=args.max_episode_tokens)
        resolve_isolation(config.sandbox.isolation, config.sandbox.allow_unisolated)  # before any model loads
        check_number(args.temperature, "--temperature", 0.0)  # NaN included: it would crash in the sampler
        check_int(args.max_episode_tokens, "--max-episode-tokens", 256)
        inputs = [("--model", args.model), ("--adapter", args.adapter)]
        check_output_path(out, "--out", inputs)
        check_output_path(work_dir / "state.json", "--work-dir", inputs)
        if Path(args.model).exists():  # a local folder (else a hub id or a served name)
            check_model_folder(args.model, "--model")
        # One work folder, one calibration: a second one is refused at once (a rerun resumes from state.json).
        with claimed_run_folder(work_dir, "--work-dir", fresh=False):
            resumable_state(config, work_dir)  # a rerun with other settings is refused before the model loads
            rollouts = trainer_rollouts(args.capability, args.model, args.adapter, args.samples, args.temperature,
                                        args.max_episode_tokens, work_dir, sandbox=config.sandbox)
            state = calibrate(config, rollouts, work_dir)
    except (InputError, ValueError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    accepted = [Scenario.from_dict(s) for s in state["accepted"]][: config.target]
    print(f"{len(accepted)}/{config.target} {args.capability} scenarios accepted; "
          f"{publish_scenarios(out, accepted, 'accepted')}; log: {work_dir / 'calibration_log.md'}")
    return 0 if len(accepted) >= config.target else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
