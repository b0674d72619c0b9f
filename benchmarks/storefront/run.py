"""Run an agent on the storefront benchmark and write τ²-bench-format results.

    python -m benchmarks.storefront.run --agent expert --tasks 40 --seed 0 --out runs/x/results.json
    python -m benchmarks.storefront.run --agent flawed:skip_status_check ...   (a planted-failure expert)
    python -m train.play --agent hf:MODEL_DIR[:ADAPTER_DIR] --tasks 100 --seed 1 \\
        --out results.json [--kinds cancel,return] [--temperature 1.0] [--trials 3]
    python -m train.play --agent vllm:http://localhost:8000 --tokenizer MODEL_DIR ...

The environment side loads no models: this module's CLI plays the environment's own agents (the expert and its
planted-failure variants); `python -m train.play` is the same CLI (same flags, same results) with the
model-backed agents of train/agents.py as well.

Task i (0-based) gets the seed derived from (--seed, i); each task holds one to three requests drawn
from the config's mix. Each task is played --trials times (trial 0..K-1, one simulation each; the
customer words things differently per trial). Prints the pass rate (reward == 1) and τ²-bench's pass^k for
k = 1..--trials per request kind (a task counts under every kind it holds) and overall; the results file's
`info["pass_hat_k"]` holds the same pass^k figures: {"all" | kind: {"n_tasks": N, "1": pass^1, ..., "K": pass^K}}.

Every episode is kept as it finishes in `<out>.partial.jsonl` (benchmarks/results_journal.py): a run killed or
interrupted continues where it stopped when the same command runs again, and an episode the agent's server cannot
serve after its retries is counted (exit 1, the results file not written) and played again by the rerun.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import time
from typing import Any, Callable

from tqdm import tqdm

from benchmarks.agents import Agent, ContextFull, ExpertAgent, check_served_model_flags
from benchmarks.results import make_simulation, pass_hat_k, pass_rates, write_results
from benchmarks.results_journal import ResultsJournal, agent_settings, kept_on_interrupt
from benchmarks.storefront.env import StorefrontConfig, StorefrontGame
from benchmarks.storefront.flaws import FlawedExpertAgent
from benchmarks.storefront.user_sim import REQUEST_KINDS
from game_registry import parse_hermes_action
from common.cli import cli_entry, exit_code, seed_value
from common.io import check_output_path, load_yaml_mapping
from common.validation import InputError, check_number


def task_seed(seed: int, index: int) -> int:
    """The seed of task `index` in a run with base `seed` (stable across Python versions and machines)."""
    digest = hashlib.sha256(f"storefront-run:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def play_episode(game: StorefrontGame, agent: Agent, seed: int, agent_seed: int | None = None, trial: int = 0
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Play one episode (task `seed`, customer wording of `trial`) to the end; return (messages, summary).
    The agent samples with `agent_seed` (default: the task's `seed`)."""
    game.reset(seed, trial=trial)
    agent.begin_episode(game, seed=seed if agent_seed is None else agent_seed)
    tools = game.get_tool_schemas()
    while not game.done:  # the game ends itself (user stop, max_steps, too many format errors, transfer)
        try:
            text = agent.respond(game.get_messages(), tools)
        except ContextFull:  # the agent's model cannot read further: the episode ends where it is
            game.end_episode("context_full")
            break
        game.step(parse_hermes_action(text))
    return game.get_messages(), game.get_summary()


def run_benchmark(agent: Agent, n_tasks: int, seed: int, trials: int = 1, config: StorefrontConfig | None = None,
                  progress: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play `n_tasks` × `trials` episodes; return (simulations, task entries) for the results file.

    Trial t of a task replays the same task (same DB, requests and facts) with the customer's wording and
    request order drawn for that trial, and the agent sampling with its own seed."""
    game = StorefrontGame(config or StorefrontConfig())
    simulations, tasks = [], {}
    bar = tqdm(total=n_tasks * trials, desc="storefront", unit="ep", file=sys.stderr, disable=not progress)
    for index in range(n_tasks):
        for trial in range(trials):
            simulation, task = play_task(game, agent, seed, index, trial)
            simulations.append(simulation)
            tasks.setdefault(simulation["task_id"], task)
            bar.update(1)
    bar.close()
    return simulations, list(tasks.values())


def play_task(game: StorefrontGame, agent: Agent, seed: int, index: int, trial: int
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(simulation, task entry) of trial `trial` of task `index` in a run with base `seed`."""
    started = time.time()
    episode_seed = task_seed(seed, index)
    # Each trial samples with its own seed: one seed for all trials would repeat trial 0 K times.
    agent_seed = episode_seed if trial == 0 else task_seed(episode_seed, trial)
    messages, summary = play_episode(game, agent, episode_seed, agent_seed, trial=trial)
    task = game.task
    reward_info = {k: v for k, v in summary.items() if k not in ("termination_reason", "task_id", "trial")}
    simulation = make_simulation(
        task_id=task.task_id, messages=messages, reward_info=reward_info,
        termination_reason=summary["termination_reason"], trial=trial, sample_idx=0, seed=episode_seed,
        duration=round(time.time() - started, 4), request_kinds=task.request_kinds)
    return simulation, task.to_json()


def run_journaled(agent: Agent, n_tasks: int, seed: int, trials: int, config: StorefrontConfig,
                  journal: ResultsJournal, progress: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`run_benchmark` for the CLI: the episodes `journal` holds are not played again, every other one is kept in
    it as it finishes, and an episode whose server fails (ServerError) is recorded there as not scored. Returns
    (simulations, tasks) of the scored episodes, in task order; `journal.errors` holds the others."""
    game = StorefrontGame(config)
    keys = [(index, trial) for index in range(n_tasks) for trial in range(trials)]
    return journal.play_missing(keys, lambda key: play_task(game, agent, seed, *key), "storefront", progress)


def load_config(path: str | None, kinds: tuple[str, ...] | None = None) -> StorefrontConfig:
    """StorefrontConfig from a YAML file of its fields (defaults for the rest), restricted to `kinds` (InputError for
    a kind the config gives no weight: restricting cannot add a kind to the mix)."""
    fields = load_yaml_mapping(path) if path else {}
    known = {f.name for f in dataclasses.fields(StorefrontConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InputError(f"{path}: {', '.join(unknown)} {'is not a field' if len(unknown) == 1 else 'are not fields'} "
                         f"of StorefrontConfig; fields: {', '.join(sorted(known))}")
    if isinstance(fields.get("request_counts"), list):
        fields["request_counts"] = tuple(fields["request_counts"])
    try:
        config = StorefrontConfig(**fields)
    except ValueError as err:
        raise InputError(f"{path or 'the default config'}: {err}") from None
    if kinds:  # a kind the config gives no weight would be dropped from the mix while the results list it
        weighted = [k for k, w in config.kind_weights.items() if w > 0]
        missing = [k for k in kinds if k not in weighted]
        if missing:
            raise InputError(f"--kinds {','.join(kinds)}: {', '.join(missing)} "
                             f"{'has' if len(missing) == 1 else 'have'} no weight in {path or 'the default config'}, "
                             f"whose kinds are {', '.join(weighted)}; choose --kinds among them, or give "
                             f"{', '.join(missing)} a weight > 0 in the config's kind_weights")
        config = dataclasses.replace(config, kind_weights={k: w for k, w in config.kind_weights.items() if k in kinds})
    return config


def _parse_kinds(text: str | None) -> tuple[str, ...] | None:
    if text is None:  # not given: the config's mix (an empty --kinds '' is an error below, not "all kinds")
        return None
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in REQUEST_KINDS]
    if unknown or not kinds:
        raise InputError(f"--kinds: unknown request kind {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(REQUEST_KINDS)}")
    return kinds


def request_kinds(sim: dict[str, Any]) -> list[str]:
    """The request kinds of a simulation's task (each once)."""
    return list(dict.fromkeys(sim["request_kinds"]))


def pass_hat_k_by_kind(simulations: list[dict[str, Any]], k_max: int) -> dict[str, dict[str, Any]]:
    """pass^k for k = 1..k_max overall ("all") and per request kind (see benchmarks.results.pass_hat_k)."""
    return {**pass_hat_k(simulations, k_max), **pass_hat_k(simulations, k_max, groups=request_kinds)}


def format_table(simulations: list[dict[str, Any]], hat: dict[str, dict[str, Any]], k_max: int) -> str:
    """One row per request kind, then "all": passed episodes, episodes, pass rate and a pass^k column per k
    ("-" where no task of the row has k scored trials)."""
    kinds = sorted({kind for sim in simulations for kind in request_kinds(sim)})
    width = max([14, *map(len, kinds)])
    ks = range(1, k_max + 1)
    header = f"{'kind':{width}s} {'passed':>8s} {'n':>5s} {'pass rate':>10s}"
    lines = [header + "".join(f" {f'pass^{k}':>7s}" for k in ks)]
    for label, sims in [*((kind, [s for s in simulations if kind in request_kinds(s)]) for kind in kinds),
                        ("all", simulations)]:
        row, hats = pass_rates(sims)["all"], hat[label]["pass_hat_k"]
        lines.append(f"{label:{width}s} {row['passed']:8d} {row['n']:5d} {row['pass_rate']:10.3f}"
                     + "".join(f" {hats[k]:7.3f}" if k in hats else f" {'-':>7s}" for k in ks))
    return "\n".join(lines)


def format_stats(simulations: list[dict[str, Any]]) -> dict[str, Any]:
    """How well the agent kept the tool-call format over all episodes: assistant turns that were tool calls,
    plain replies or malformed (format errors), the share of turns that parsed, and the share of tool-call
    attempts (valid calls + malformed turns) that were valid."""
    turns = sum(int(sim["reward_info"].get("steps", 0)) for sim in simulations)
    malformed = sum(int(sim["reward_info"].get("format_errors", 0)) for sim in simulations)
    calls = sum(1 for sim in simulations for m in sim["messages"] if m.get("role") == "assistant" and m.get("tool_calls"))
    return {"turns": turns, "tool_call_turns": calls, "reply_turns": turns - calls - malformed,
            "malformed_turns": malformed, "valid_format_rate": round(1 - malformed / turns, 4) if turns else None,
            "valid_tool_call_rate": round(calls / (calls + malformed), 4) if calls + malformed else None}


def environment_agent(args: argparse.Namespace) -> Agent:
    """The environment's own players: `expert` and `flawed:FLAW` (benchmarks/storefront/flaws.py); InputError
    for anything else (model agents are train/agents.py's, played by `python -m train.play`)."""
    if args.agent == "expert":
        return ExpertAgent()
    if args.agent.startswith("flawed:"):  # a planted-failure expert
        try:
            return FlawedExpertAgent(args.agent.removeprefix("flawed:"))
        except ValueError as err:
            raise InputError(f"--agent {args.agent}: {err}") from None
    if args.agent.partition(":")[0] in ("hf", "vllm"):
        raise InputError(f"--agent {args.agent}: a model agent; play it with `python -m train.play` (the same "
                         "flags: the environment side loads no models)")
    raise InputError(f"--agent {args.agent}: bad agent spec; use 'expert' or 'flawed:FLAW' (model agents: "
                     "`python -m train.play --agent hf:MODEL_DIR[:ADAPTER_DIR] | vllm:URL`)")


@cli_entry
def main(argv: list[str] | None = None, make_agent: Callable[[argparse.Namespace], Agent] = environment_agent,
         prog: str | None = None) -> int:
    """The CLI; `make_agent(args)` builds the agent from the parsed flags after every other check (it may load
    a model), raising InputError for a bad spec."""
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Run an agent on the storefront benchmark (τ²-bench results JSON).")
    parser.add_argument("--agent", required=True,
                        help="expert | flawed:FLAW (with python -m train.play also hf:MODEL_DIR[:ADAPTER_DIR] | "
                             "vllm:URL)")
    parser.add_argument("--tasks", type=int, required=True, help="number of tasks")
    parser.add_argument("--seed", type=seed_value, default=0, help="base seed; task seeds derive from it (default 0)")
    parser.add_argument("--out", required=True, help="results JSON to write")
    parser.add_argument("--config", help="YAML of StorefrontConfig fields (the task mix, id lengths, limits), e.g. "
                                         "configs/storefront/cpu_demo.yaml; left-out fields keep their defaults")
    parser.add_argument("--kinds", help=f"only these request kinds, comma-separated from {','.join(REQUEST_KINDS)} "
                                        "(default: the config's mix)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--trials", type=int, default=1, help="episodes per task (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn (default 256)")
    parser.add_argument("--tokenizer", help="vllm: folder with the tokenizer and chat template")
    parser.add_argument("--model", help="vllm: served model name (default: the server's first model)")
    parser.add_argument("--api-key-env", metavar="NAME",
                        help="vllm: the environment variable holding the endpoint's API key (a hosted model); only "
                             "that variable is read and the key is written nowhere (default: no key)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    # every flag and the output path before the agent is built (an hf model load takes a while)
    check_served_model_flags(args)
    if args.tasks < 1:
        raise InputError(f"--tasks must be >= 1, got {args.tasks}")
    if args.trials < 1:
        raise InputError(f"--trials must be >= 1, got {args.trials}")
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    check_number(args.temperature, "--temperature", 0.0)
    if args.api_key_env is not None and not os.environ.get(args.api_key_env):
        raise InputError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty; "
                         f"export {args.api_key_env}=<key> (the key itself never goes on the command line)")
    check_output_path(args.out, "--out", [("--config", args.config), ("--model", args.model),
                                          ("--tokenizer", args.tokenizer)])
    kinds = _parse_kinds(args.kinds)
    config = load_config(args.config, kinds)
    agent = make_agent(args)
    # What decides the results: a rerun with the same settings continues the journal, another is refused.
    settings = {"agent": agent_settings(agent), "tokenizer": args.tokenizer, "tasks": args.tasks,
                "seed": args.seed, "trials": args.trials, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "config": dataclasses.asdict(config)}
    with ResultsJournal(args.out, settings) as journal, kept_on_interrupt(journal, "scored episodes"):
        simulations, tasks = run_journaled(agent, args.tasks, args.seed, args.trials, config, journal,
                                           progress=not args.no_progress)
        if journal.errors:
            print(f"error: {len(journal.errors)} of {args.tasks * args.trials} episodes could not be scored (the "
                  f"agent's server failed after its retries; first: {next(iter(journal.errors.values()))}); the "
                  f"{len(journal.scored)} scored ones are kept in {journal.path}: run the same command again to "
                  "play the others", file=sys.stderr)
            return 1
    info = {
        "benchmark": "storefront", "num_tasks": args.tasks, "num_trials": args.trials, "seed": args.seed,
        "kinds": [k for k, w in config.kind_weights.items() if w > 0], "config": dataclasses.asdict(config),
        "max_steps": config.max_steps, "max_errors": config.max_errors,
        "agent_info": {**agent.describe(), "spec": args.agent},
        "user_info": {"implementation": "benchmarks.storefront.user_sim.UserSimulator"},
        "environment_info": {"domain_name": "storefront", "policy": StorefrontGame(config).policy,
                             "tool_defs": StorefrontGame.toolkit_class.schemas()},
    }
    hat = pass_hat_k_by_kind(simulations, args.trials)
    info["pass_hat_k"] = {label: {"n_tasks": group["n_tasks"], **{str(k): v for k, v in group["pass_hat_k"].items()}}
                          for label, group in hat.items()}
    info["format"] = fmt = format_stats(simulations)
    write_results(args.out, simulations, tasks, info)
    journal.remove()
    print(format_table(simulations, hat, args.trials))
    print(f"format: {fmt['turns']} assistant turns: {fmt['tool_call_turns']} tool calls, {fmt['reply_turns']} replies, "
          f"{fmt['malformed_turns']} malformed (valid format rate {fmt['valid_format_rate']}, valid tool-call rate "
          f"{fmt['valid_tool_call_rate']})", file=sys.stderr)  # stdout keeps the table + path
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))  # Ctrl-C: one line, exit 130 (the scored episodes stay in the journal)
