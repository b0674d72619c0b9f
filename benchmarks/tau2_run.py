"""Run an agent on τ²-bench's own retail or airline tasks, with τ²-bench's customer and grading; τ²-bench results JSON.

    export CUSTOMER_KEY=...    # only when the customer's server needs a key
    python -m benchmarks.tau2_run --domain retail --split test --agent expert \\
        --user-base-url https://api.openai.com/v1 --user-model gpt-4.1 --user-api-key-env CUSTOMER_KEY \\
        [--tasks 20] [--trials 4] --out runs/tau-bench/base/retail_test.json
    python -m train.play tau2 --agent hf:MODEL_DIR[:ADAPTER_DIR] ...        (the same flags, model agents)
    python -m train.play tau2 --agent vllm:http://localhost:8000 --tokenizer MODEL_DIR ...

Task i is the split's i-th task (τ²-bench's own ids and order; `--tasks N` plays the first N, default all); each
is played `--trials` times (the customer model is asked with a seed per trial; τ²-bench's trials differ by the
customer's sampling; the agent samples with a seed hashed from `--seed`, the task and the trial:
`episode_agent_seed`). The episode is benchmarks/tau2_game.py's: τ²-bench's agent prompt and tools, tau2's
environment, the customer at `--user-base-url`, τ²-bench's evaluator. `--agent expert` plays each task's gold
actions and then tells what the task says to tell: a check of the customer endpoint, the runner and the grading
(it scores 1 wherever the customer ends the conversation after the agent's last reply).

The results file is τ²-bench's format (`benchmarks.results`): `simulations` with τ²-bench's task ids, trials,
messages and `reward_info` (the reward and tau2's breakdown), `tasks` as the package gives them, `info` with the
agent, the customer (model and URL, never a key) and the domain's policy and tools; Step 1 (its summarizer and
labeler) reads it as it reads `tau2 run`'s files. Every episode is kept as it finishes in
`<out>.partial.jsonl` (benchmarks/results_journal.py): a run stopped by Ctrl-C, a kill or a failing server
continues where it stopped when the same command runs again; an episode whose agent or customer server fails after
its retries is not scored (exit 1) and is played by the rerun.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any, Callable

from benchmarks.agents import Agent, ContextFull, ExpertAgent, check_served_model_flags
from benchmarks.results import make_simulation, pass_hat_k, pass_rates, write_results
from benchmarks.results_journal import ResultsJournal, agent_settings, kept_on_interrupt
from benchmarks.tau2_target import DOMAINS, SPLITS, require_tau2
from common.cli import cli_entry, exit_code, seed_value
from common.io import check_output_path
from common.llm_client import FatalAPIError
from common.validation import InputError, check_number, check_url, nothing_listens
from game_registry import parse_hermes_action


def environment_agent(args: argparse.Namespace) -> Agent:
    """The environment's own player, `expert` (the task's gold actions); InputError for anything else (model agents
    are train/agents.py's, played by `python -m train.play tau2`)."""
    if args.agent == "expert":
        return ExpertAgent()
    if args.agent.partition(":")[0] in ("hf", "vllm"):
        raise InputError(f"--agent {args.agent}: a model agent; play it with `python -m train.play tau2` (the same "
                         "flags: the environment side loads no models)")
    raise InputError(f"--agent {args.agent}: bad agent spec; use 'expert' (model agents: `python -m train.play tau2 "
                     "--agent hf:MODEL_DIR[:ADAPTER_DIR] | vllm:URL`)")


def check_customer_server(base_url: str) -> None:
    """InputError when nothing listens at the customer's URL (asked once, before any episode); a server that
    answers anything, or a slow network, is left to the client's retries."""
    base = check_url(base_url, "--user-base-url").rstrip("/")
    if nothing_listens(f"{base}/models"):
        raise InputError(f"--user-base-url {base_url}: no server listens there (connection refused); start the "
                         "customer's model server or fix the URL")


# How the agent's seed of an episode derives from (--seed, task, trial); recorded in the journal's settings, so a run
# journaled under another scheme is refused, never continued with seeds of two schemes.
AGENT_SEED_SCHEME = "sha256('tau2-run:{seed}:{task}:{trial}')[:4]"


def episode_agent_seed(seed: int, index: int, trial: int) -> int:
    """The agent's seed for trial `trial` of task `index` in a run with base `seed`: a hash, so distinct
    (seed, task, trial) draw unrelated seeds (an arithmetic scheme such as seed + 1000·trial + task gives run
    `--seed 1000`'s first trial the seeds of run `--seed 0`'s second), the same on every machine and Python."""
    digest = hashlib.sha256(f"tau2-run:{seed}:{index}:{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def play_task(game: Any, agent: Agent, index: int, trial: int, agent_seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(simulation, task entry) of trial `trial` of the split's task `index`."""
    started = time.time()
    game.reset(index, trial=trial)
    agent.begin_episode(game, seed=agent_seed)
    tools = game.get_tool_schemas()
    while not game.done:
        try:
            text = agent.respond(game.get_messages(), tools)
        except ContextFull:  # τ²-bench ends an agent that errs (agent_error) and scores it 0
            game.end_episode("context_full")
            break
        game.step(parse_hermes_action(text))
    summary = game.get_summary()
    # tau2's RewardInfo (reward, db_check, action_checks, communicate_checks, reward_breakdown) and the turn counts
    reward_info = {**summary["tau2_reward_info"], "reward": summary["reward"], "steps": summary["steps"],
                   "format_errors": summary["format_errors"]}
    simulation = make_simulation(task_id=summary["task_id"], messages=game.get_messages(), reward_info=reward_info,
                                 termination_reason=summary["termination_reason"], trial=trial, sample_idx=0,
                                 seed=agent_seed, duration=round(time.time() - started, 4))
    return simulation, game.task.model_dump(mode="json")


def run_journaled(game: Any, agent: Agent, n_tasks: int, trials: int, seed: int, journal: ResultsJournal,
                  progress: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every (task, trial) not yet in `journal`, each kept there as it ends; (simulations, tasks) of the scored
    episodes in task order. An episode whose agent or customer server fails for good is recorded as not scored
    (`journal.errors`)."""
    keys = [(index, trial) for index in range(n_tasks) for trial in range(trials)]
    return journal.play_missing(
        keys, lambda key: play_task(game, agent, *key, agent_seed=episode_agent_seed(seed, *key)),
        f"τ²-bench {game.domain.name}", progress)


@cli_entry
def main(argv: list[str] | None = None, make_agent: Callable[[argparse.Namespace], Agent] = environment_agent,
         prog: str | None = None) -> int:
    """The CLI; `make_agent(args)` builds the agent after every other check (it may load a model)."""
    parser = argparse.ArgumentParser(prog=prog or "python -m benchmarks.tau2_run",
                                     description="Run an agent on τ²-bench's own tasks (τ²-bench results JSON).")
    parser.add_argument("--domain", required=True, choices=DOMAINS)
    parser.add_argument("--split", default="test", choices=SPLITS, help="the domain's task split (default test)")
    parser.add_argument("--agent", required=True,
                        help="expert (the gold actions) | with python -m train.play tau2: hf:MODEL_DIR[:ADAPTER_DIR] | "
                             "vllm:URL")
    parser.add_argument("--tasks", type=int, help="play the split's first N tasks (default: all)")
    parser.add_argument("--trials", type=int, default=1, help="episodes per task (pass^k over trials; default 1)")
    parser.add_argument("--seed", type=seed_value, default=0, help="the agent's sampling seeds derive from it")
    parser.add_argument("--out", required=True, help="results JSON to write")
    parser.add_argument("--user-base-url", required=True, help="the customer model's OpenAI-compatible URL (…/v1)")
    parser.add_argument("--user-model", required=True, help="the customer model's name at that server")
    parser.add_argument("--user-api-key-env", metavar="NAME", default="",
                        help="the environment variable holding the customer server's key (default: none)")
    parser.add_argument("--user-temperature", type=float, default=0.0, help="the customer's sampling (τ²-bench: 0)")
    parser.add_argument("--user-max-retries", type=int, default=6,
                        help="retries of a customer request after a 429, 5xx, timeout or dropped connection (default 6)")
    parser.add_argument("--max-steps", type=int, default=50, help="agent turns per episode (default 50)")
    parser.add_argument("--temperature", type=float, default=0.0, help="the agent's sampling temperature")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="per agent turn (default 512)")
    parser.add_argument("--tokenizer", help="vllm: folder with the tokenizer and chat template")
    parser.add_argument("--model", help="vllm: served model name (default: the server's first model)")
    parser.add_argument("--api-key-env", metavar="NAME",
                        help="vllm: the environment variable holding the agent endpoint's key (default: no key)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    check_served_model_flags(args)
    for flag, value in (("--trials", args.trials), ("--max-steps", args.max_steps),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if args.user_max_retries < 0:
        raise InputError(f"--user-max-retries must be >= 0, got {args.user_max_retries}")
    if args.tasks is not None and args.tasks < 1:
        raise InputError(f"--tasks must be >= 1, got {args.tasks}")
    check_number(args.temperature, "--temperature", 0.0)
    check_number(args.user_temperature, "--user-temperature", 0.0)
    for flag, name in (("--api-key-env", args.api_key_env), ("--user-api-key-env", args.user_api_key_env)):
        if name and not os.environ.get(name):
            raise InputError(f"{flag} {name}: that environment variable is not set or empty; export {name}=<key> "
                             "(the key itself never goes on the command line)")
    check_output_path(args.out, "--out", [("--model", args.model), ("--tokenizer", args.tokenizer)])
    check_url(args.user_base_url, "--user-base-url")
    return play_and_write(args, make_agent)


def play_and_write(args: argparse.Namespace, make_agent: Callable[[argparse.Namespace], Agent]) -> int:
    """The run, after the flags were checked: the package, the split's size, the customer's server and the agent
    before the first episode, then every episode (journaled), then the results file. Returns the exit code."""
    require_tau2()
    from benchmarks.tau2_game import Tau2Config, Tau2Game, split_tasks

    config = Tau2Config(split=args.split, user_base_url=args.user_base_url, user_model=args.user_model,
                        user_api_key_env=args.user_api_key_env, user_temperature=args.user_temperature,
                        user_max_retries=args.user_max_retries, max_steps=args.max_steps)
    n_split = len(split_tasks(args.domain, args.split))
    if args.tasks is not None and args.tasks > n_split:
        raise InputError(f"--tasks {args.tasks}: the {args.domain} {args.split} split has {n_split} tasks")
    n_tasks = args.tasks or n_split
    check_customer_server(args.user_base_url)
    agent = make_agent(args)
    game = Tau2Game(args.domain, config)
    user_info = {"implementation": "benchmarks.tau2_user.Tau2User", "model": args.user_model,
                 "temperature": args.user_temperature}  # retries are left out: they do not change a score
    settings = {"agent": agent_settings(agent), "tokenizer": args.tokenizer, "domain": args.domain, "split": args.split,
                "tasks": n_tasks, "trials": args.trials, "seed": args.seed, "agent_seeds": AGENT_SEED_SCHEME,
                "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "max_steps": args.max_steps,
                "user": user_info}
    with ResultsJournal(args.out, settings) as journal, kept_on_interrupt(journal, "scored episodes"):
        try:
            simulations, tasks = run_journaled(game, agent, n_tasks, args.trials, args.seed, journal,
                                               progress=not args.no_progress)
        except FatalAPIError as err:  # a bad key, model or URL: every episode would fail the same way
            raise InputError(f"the customer's server refused the request: {err}") from None
        if journal.errors:
            print(f"error: {len(journal.errors)} of {n_tasks * args.trials} episodes could not be scored (a server "
                  f"failed after its retries; first: {next(iter(journal.errors.values()))}); the "
                  f"{len(journal.scored)} scored ones are kept in {journal.path}: run the same command again to "
                  "play the others", file=sys.stderr)
            return 1
    hat = pass_hat_k(simulations, args.trials)
    info = {"benchmark": "tau2", "domain": args.domain, "split": args.split, "num_tasks": n_tasks,
            "num_trials": args.trials, "seed": args.seed, "agent_seeds": AGENT_SEED_SCHEME,
            "max_steps": args.max_steps,
            "agent_info": {**agent.describe(), "spec": args.agent}, "user_info": {**user_info,
                                                                                 "base_url": args.user_base_url},
            "environment_info": {"domain_name": args.domain, "policy": game.get_system_prompt(),
                                 "tool_defs": game.get_tool_schemas()},
            "pass_hat_k": {"all": {"n_tasks": hat["all"]["n_tasks"],
                                   **{str(k): v for k, v in hat["all"]["pass_hat_k"].items()}}}}
    write_results(args.out, simulations, tasks, info)
    journal.remove()
    rates = pass_rates(simulations)["all"]
    print(f"{args.domain} {args.split}: {rates['passed']} of {rates['n']} episodes passed (pass rate "
          f"{rates['pass_rate']:.3f}); " + ", ".join(f"pass^{k} {v:.3f}" for k, v in hat["all"]["pass_hat_k"].items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))  # Ctrl-C: one line, exit 130 (the scored episodes stay in the journal)
