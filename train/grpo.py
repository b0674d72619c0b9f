"""GRPO training of one capability adapter (Step 3).

Before the first iteration (`run`): every opening prompt of the first iteration must fit
`max_episode_tokens` (else the episodes could not generate a token: the run stops with InputError, exit 2,
naming the prompt length and the budget), and a sampler that reports its own log-probs (vLLM) at a
temperature other than 1 must report them after temperature (`--logprobs-mode processed_logprobs`).

One iteration:
  1. Sample. `groups_per_iteration` task seeds (each rank takes every world_size-th group; fresh tasks, or a
     fixed pool of `task_pool` tasks gone through pass after pass: `GRPOConfig.task_seed`); `group_size`
     episodes per seed, the first `hint_fraction * group_size` of them with the game's hint prompt. All
     episodes of the rank are played together through the rollout backend (in-process HF or vLLM).
     An episode that generated no token (its prompt filled the budget) drops its whole group; an iteration
     in which no episode generated a token stops the run (InputError) instead of logging a normal line.
  2. Score. Reward = the game's summary reward at the end of the episode (done, max_turns or the token
     budget). Advantage = reward - group mean, divided by max(group std, std_floor) when
     `scale_advantages`; groups whose rewards are all equal are dropped (`filter_constant_groups`).
  3. Old log-probs from one source. Hinted samples get the base prompt in place of the hint prompt, token for
     token otherwise, so the adapter learns the hinted behaviour without the hint; their old log-probs are
     the trainer's under the new prompt. When the sampler is not the trainer's own fp32 model
     (`backend.logprobs_match_trainer` False: vLLM, or bf16), every other sample is re-scored by the trainer
     too (as the reference trainer does), so the step-0 ratio is exactly 1 for every token; the sampler's
     own log-probs are kept only for the `sampler_kl` diagnostic. Chosen over keeping the sampler's
     log-probs and refusing above an approx-KL tolerance: one extra no-grad forward per sequence buys a
     batch in which clipping never reacts to numerical noise, with no tolerance to tune.
  4. Update. PPO clipped surrogate (clip_eps), aggregated per `loss_agg` (grpo: per-sequence mean; dapo:
     global token mean; dr_grpo: a constant, the completion budget, as TRL's max_completion_length) with
     denominators counted over the whole step on all ranks, so micro-batching and data parallelism do not
     change the gradient. Optional k3 KL to the reference policy (the adapter disabled). Gradients are
     averaged over ranks (one flat all-reduce; a rank without a loss token contributes zeros), clipped to
     `grad_clip`. AdamW steps once per mini-batch of whole groups (`minibatches_per_iteration`) in each of
     `ppo_epochs` passes (train/config.py: how this maps to TRL). Observation and prompt tokens are masked out.
     The learning-rate schedule (warm-up, then constant or linear/cosine decay) steps once per optimizer step;
     an iteration with nothing to learn from does not move it. Logged clip fraction, ratio and approx KL are token-weighted means.
  5. Sync. The backend is told about the new weights (vLLM loads the adapter under a fresh name).

Metrics: `mean_reward` and `success_rate` are over base-prompt episodes only (the ones that show progress:
hinted episodes are helped by the hint); `*_all_episodes` include the hinted ones. Rank 0 appends one line per
iteration to metrics.jsonl, then sends it to the trackers of `report_to` under the names of TRACKED_SCALARS
(train/tracking.py), at step = iteration.

The update only sees `policy.model` and `policy.trainable_parameters()`: it trains a LoRA adapter here
and router gates in Step 4 without knowing which.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from benchmarks.results import write_results
from game_registry import GameSpec
from common.io import append_line
from common.validation import InputError
from common.run_folder import sigint_deferred
from train.backends import RolloutBackend, SamplingParams
from train.checkpoint import load_checkpoint, metrics_rows, rank_state, save_checkpoint, set_aside_after
from train.config import GRPOConfig, save_config
from train.distributed import world as world_info
from train.episodes import (
    ChatTokenizer,
    Episode,
    EpisodeRequest,
    episode_to_simulation,
    rescored_under_base_prompt,
    run_episodes,
    start_episode,
)
from train.grpo_loss import RolloutBatch, group_advantages, grpo_loss, loss_normaliser
from train.logprobs import token_logprobs, token_logprobs_after_prefix
from train.policy import Policy
from train.tracking import MetricLogger, open_trackers, scalars_of


@dataclass
class Sequence:
    """One training sequence: token ids with the loss mask and the old policy's log-probs."""

    token_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float
    prompt_len: int = 0  # tokens of the prompt, shared by every sequence of the group (0: unknown)
    group: int = 0  # the group (task seed) of the iteration it comes from: mini-batches take whole groups


@dataclass
class MicroBatch:
    """Sequences of one update step; with `prefix`, `batch` holds only what follows the shared prefix."""

    batch: RolloutBatch
    prefix: torch.Tensor | None = None  # [P] ids shared by every row, run once


def shared_prefix_micro_batches(sequences: list[Sequence], size: int, pad_token_id: int,
                                device: torch.device) -> list[MicroBatch]:
    """Micro-batches of sequences sharing one prompt; the prompt (minus its last token) becomes the prefix.

    The last prompt token stays in the continuation as column 0 (masked): the logits at it predict the first
    generated token, so `token_logprobs_after_prefix` gives every loss token exactly its full-sequence value.
    """
    by_prompt: dict[tuple[int, ...], list[Sequence]] = {}
    for seq in sequences:
        by_prompt.setdefault(tuple(seq.token_ids[: seq.prompt_len]), []).append(seq)
    out = []
    for prompt, members in by_prompt.items():
        cut = len(prompt) - 1
        for start in range(0, len(members), size):
            tails = [Sequence(s.token_ids[cut:], s.loss_mask[cut:], s.old_logprobs[cut:], s.advantage)
                     for s in members[start : start + size]]
            prefix = torch.tensor(prompt[:cut], dtype=torch.long, device=device)
            out.append(MicroBatch(pad_batch(tails, pad_token_id, device), prefix))
    return out


def split_by_group(sequences: list[Sequence], parts: int) -> list[list[Sequence]]:
    """`parts` mini-batches of whole groups, in the order the groups come, sizes differing by at most one group
    (fewer groups than parts: the last parts are empty)."""
    groups: dict[int, list[Sequence]] = {}
    for seq in sequences:
        groups.setdefault(seq.group, []).append(seq)
    members = list(groups.values())
    size, extra = divmod(len(members), parts)
    out, start = [], 0
    for part in range(parts):
        end = start + size + (1 if part < extra else 0)
        out.append([seq for group in members[start:end] for seq in group])
        start = end
    return out


def lr_factor_schedule(config: GRPOConfig) -> Callable[[int], float]:
    """LambdaLR's factor of `learning_rate` for the step after `step` optimizer steps (train/config.py)."""
    warmup = config.warmup_iterations * config.steps_per_iteration
    total = config.iterations * config.steps_per_iteration

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if config.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        decay = 1.0 - progress if config.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * decay

    return factor


def apply_scheduled_rate(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set the optimizer's rate to what this run's schedule gives at the restored step.

    A restored optimizer state carries the rate of the schedule it was saved under, and LambdaLR cannot save its
    function: a resume with more --iterations re-plans a linear/cosine decay (lr_factor_schedule), and without
    this its first step would take the old plan's rate and the second jump to the new one's.
    """
    step = scheduler.last_epoch  # optimizer steps done; the next one takes the rate the schedule gives here
    rates = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = rate
    scheduler._last_lr = rates  # what get_last_lr() reports (LambdaLR keeps it there; set as its step() does)


def pad_batch(sequences: list[Sequence], pad_token_id: int, device: torch.device) -> RolloutBatch:
    """Right-padded RolloutBatch; column t of every tensor is about token t."""
    longest = max(len(s.token_ids) for s in sequences)
    size = (len(sequences), longest)
    input_ids = torch.full(size, pad_token_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros(size, dtype=torch.long)  # [B, T]
    loss_mask = torch.zeros(size, dtype=torch.float32)  # [B, T]
    old_logprobs = torch.zeros(size, dtype=torch.float32)  # [B, T]
    for row, seq in enumerate(sequences):
        n = len(seq.token_ids)
        input_ids[row, :n] = torch.tensor(seq.token_ids)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(seq.loss_mask, dtype=torch.float32)
        old_logprobs[row, :n] = torch.tensor(seq.old_logprobs)
    advantages = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)  # [B]
    return RolloutBatch(input_ids, attention_mask, loss_mask, old_logprobs, advantages).to(device)


def _collective_device() -> str:
    """Where small collective tensors live: NCCL (chosen on GPU machines by train/__main__.py) takes only CUDA."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _all_sum(values: list[float]) -> list[float]:
    rank, world = world_info()
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor)
    return tensor.tolist()


def _all_max(value: int) -> int:
    rank, world = world_info()
    if world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.long, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor)


# Loss statistics that are means over loss tokens; logged as token-weighted means over the whole step.
TOKEN_MEAN_STATS = ("clip_fraction", "clip_low_fraction", "clip_high_fraction", "ratio_mean", "approx_kl")
# The start check calls a sampler's log-probs raw when they are this many times closer to the trainer's
# temperature-1 log-probs than to its log-probs at the run's temperature (bf16 noise is far below that).
RAW_LOGPROBS_RATIO = 2.0
PROBE_TOKENS = 16
# What the trackers (`report_to`) get each iteration: tracker name -> metrics.jsonl key. The names are shared by
# every GRPO run (capability LoRA, gate GRPO, the demo's baselines), so runs overlay in any tracker; a key an
# iteration does not have (no update: no kl / clip_ratio) is left out of that step.
TRACKED_SCALARS = {
    "reward/mean": "mean_reward",  # base-prompt episodes: the figure that shows progress
    "reward/mean_all_episodes": "mean_reward_all_episodes",
    "success/rate": "success_rate",
    "success/rate_all_episodes": "success_rate_all_episodes",
    "groups/constant_fraction": "frac_constant_groups",
    "groups/without_tokens": "groups_without_tokens",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "kl": "approx_kl",  # policy vs the sampling (old) policy, token-weighted
    "kl_ref": "kl_ref",  # k3 KL to the base model (kl_beta > 0)
    "clip_ratio": "clip_fraction",
    "clip_ratio/low": "clip_low_fraction",
    "clip_ratio/high": "clip_high_fraction",
    "ratio/mean": "ratio_mean",
    "sampler_kl": "sampler_kl",
    "update/skipped": "skipped_update",
    "lr": "lr",
    "tokens_per_s/generation": "gen_tokens_per_s",
    "tokens_per_s/train": "train_tokens_per_s",
    "tokens/generated": "gen_tokens",
    "episodes_total": "episodes_total",
    "time/iteration_s": "seconds",
}


def rank_requests(config: GRPOConfig, iteration: int, rank: int, world_size: int) -> list[EpisodeRequest]:
    """Rank `rank`'s episodes of `iteration`: every world_size-th group, `group_size` samples each."""
    return [
        EpisodeRequest(seed=config.task_seed(iteration, group), sample_idx=k, hinted=k < config.n_hinted)
        for group in range(rank, config.groups_per_iteration, world_size)
        for k in range(config.group_size)
    ]


def check_prompts_fit(config: GRPOConfig, spec: GameSpec, chat: ChatTokenizer, iteration: int, rank: int = 0,
                      world_size: int = 1) -> None:
    """Stop before training when an opening prompt (base or hinted) of the iteration's tasks leaves no room
    in `max_episode_tokens`: such episodes generate nothing, every group is constant, and the run would
    train nothing while looking normal. Needs only the tokenizer (python -m train calls it before the model
    loads). Collective: every rank checks its groups, all raise together."""
    c = config
    longest, where = 0, ""
    for request in rank_requests(c, iteration, rank, world_size):
        if request.sample_idx not in (0, c.n_hinted):  # one hinted and one base prompt per group
            continue
        episode = start_episode(spec, spec.make(**c.game_overrides), request, chat)
        if episode.prompt_len > longest:
            longest = episode.prompt_len
            where = f"seed {request.seed}, {'hinted' if request.hinted else 'base'} prompt"
    overall = _all_max(longest)
    if overall < c.max_episode_tokens:
        return
    one_turn = overall + spec.max_gen_tokens
    raise InputError(
        f"the opening prompt of {c.game} is {overall} tokens" + (f" ({where})" if longest == overall else "")
        + f", but max_episode_tokens is {c.max_episode_tokens}: no episode could generate a token and nothing "
        f"would be trained. Raise --max_episode_tokens above the prompt (at least {one_turn} for one full turn "
        f"of {spec.max_gen_tokens} tokens; {spec.max_turns} turns plus observations need more)."
    )


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, spec: GameSpec, policy: Policy, tokenizer: Any, backend: RolloutBackend,
                 run_kind: str = "grpo"):
        self.config, self.spec, self.policy, self.backend = config, spec, policy, backend
        self.chat = ChatTokenizer(tokenizer)
        self.pad_token_id = tokenizer.pad_token_id
        self.device = next(policy.model.parameters()).device
        self.rank, self.world_size = world_info()
        self.output_dir = config.resolved_output_dir()
        self.parameters = policy.trainable_parameters()
        if not self.parameters:
            raise ValueError("the policy has no trainable parameters")
        # dr_grpo's constant: the most tokens the policy can generate in one episode (TRL divides by
        # max_completion_length); a config value > 0 overrides it.
        self.completion_budget = config.max_tokens_norm or min(spec.max_turns * spec.max_gen_tokens,
                                                               config.max_episode_tokens)
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=config.learning_rate, weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2),
        )
        # The schedule steps once per optimizer step (train/config.py: warm-up, then constant or decay).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor_schedule(config))
        self.start_iteration = 0
        self.tracker = MetricLogger()  # `run` opens the trackers of config.report_to (rank 0)
        self.run_kind = run_kind  # names the run in the trackers (gate_grpo for train.grpo_gater)

    # ---------------------------------------------------------------------------------------------
    def resume_from(self, checkpoint: Path) -> None:
        iteration, optimizer_state, backend_state = load_checkpoint(
            checkpoint, scheduler=self.scheduler, rank=self.rank, world_size=self.world_size)
        self.policy.load_optimizer_state(self.optimizer, optimizer_state)
        apply_scheduled_rate(self.scheduler)
        self.backend.load_state_dict(backend_state)
        self.backend.sync_weights(self.policy, iteration)
        self.start_iteration = iteration
        if self.rank == 0:  # what an earlier attempt wrote after the checkpoint goes aside (python -m train has
            set_aside_after(self.output_dir, iteration)  # done it before the model loaded: then nothing is left)

    def requests(self, iteration: int) -> list[EpisodeRequest]:
        """This rank's episodes: every world_size-th group of the iteration, `group_size` samples each."""
        return rank_requests(self.config, iteration, self.rank, self.world_size)

    # ---------------------------------------------------------------------------------------------
    def check_prompts_fit(self, iteration: int | None = None) -> None:
        """The module's `check_prompts_fit` for this trainer's rank at `iteration` (default: where it starts)."""
        check_prompts_fit(self.config, self.spec, self.chat, self.start_iteration if iteration is None else iteration,
                          self.rank, self.world_size)

    @torch.no_grad()
    def check_sampler_logprobs(self) -> None:
        """A sampler that reports its own log-probs (vLLM) must report them after temperature.

        vLLM returns log-probs of the raw logits unless the server runs with `--logprobs-mode
        processed_logprobs`. Training does not use them (sequences are re-scored), but they are the
        `sampler_kl` diagnostic and the only check that the server samples what the trainer scores, so a
        server that returns raw ones stops the run. Test: one completion per server at the run's temperature,
        scored by the trainer at that temperature and at 1; the server's numbers must not be clearly closer to
        the temperature-1 ones. Skipped at temperatures near 1, where the two cannot be told apart.
        """
        c = self.config
        if self.backend.logprobs_match_trainer or abs(c.temperature - 1.0) < 0.05:
            return
        request = self.requests(self.start_iteration)[-1]  # a base-prompt sample
        prompt = start_episode(self.spec, self.spec.make(**c.game_overrides), request, self.chat).token_ids
        probes = self.backend.probe(prompt, SamplingParams(max_new_tokens=PROBE_TOKENS, temperature=c.temperature))
        was_training = self.policy.model.training
        self.policy.model.eval()
        raw: list[str] = []
        try:
            for server, completion in probes:  # the same servers on every rank: the same forwards under FSDP
                ids = torch.tensor([prompt + completion.token_ids], device=self.device)  # [1, P + N]
                mask = torch.ones_like(ids)
                tail = slice(len(prompt), ids.shape[1])
                at_temperature = token_logprobs(self.policy.model, ids, mask, temperature=c.temperature)[0, tail]
                at_one = token_logprobs(self.policy.model, ids, mask)[0, tail]  # [N]
                reported = torch.tensor(completion.logprobs, dtype=torch.float32, device=self.device)  # [N]
                off_temperature = float((reported - at_temperature).abs().mean())
                off_one = float((reported - at_one).abs().mean())
                if off_one * RAW_LOGPROBS_RATIO < off_temperature:
                    raw.append(f"{server} (mean |difference| to the trainer's log-probs: {off_one:.3g} at "
                               f"temperature 1, {off_temperature:.3g} at {c.temperature})")
        finally:
            self.policy.model.train(was_training)
        if _all_max(len(raw)):  # every rank stops, not only the one that saw it
            raise InputError(
                f"the vLLM server returns log-probs of the raw logits, not of the temperature-{c.temperature} "
                f"distribution it samples: {'; '.join(raw) or 'seen by another rank'}. Restart the server with "
                "`--logprobs-mode processed_logprobs` (vLLM >= 0.10.2), or train at --temperature 1."
            )

    # ---------------------------------------------------------------------------------------------
    def sequences(self, episodes: list[Episode]) -> tuple[list[Sequence], dict[str, float]]:
        """Advantages per group; kept episodes as training sequences, with old log-probs from the trainer
        where the sampler's cannot be used (hinted samples always; every sample unless
        `backend.logprobs_match_trainer`). Groups with an episode that generated nothing are dropped."""
        c = self.config
        rewards = torch.tensor([ep.reward for ep in episodes], dtype=torch.float32).view(-1, c.group_size)  # [G, K]
        advantages, keep = group_advantages(
            rewards, scale=c.scale_advantages, std_floor=c.std_floor, filter_constant_groups=c.filter_constant_groups
        )
        empty = torch.tensor([ep.n_generated == 0 for ep in episodes]).view(-1, c.group_size).any(dim=1)  # [G]
        keep = keep & ~empty
        rescore_all = not self.backend.logprobs_match_trainer
        sequences: list[Sequence] = []
        rescore: list[int] = []
        sampler_logprobs: dict[int, list[float]] = {}  # sequence index -> the sampler's own log-probs
        for index, ep in enumerate(episodes):
            group, k = divmod(index, c.group_size)
            if not bool(keep[group]):
                continue
            advantage = float(advantages[group, k])
            if ep.request.hinted:
                ids, mask, prompt_len = rescored_under_base_prompt(ep, self.spec, self.chat)
                rescore.append(len(sequences))
                sequences.append(Sequence(ids, mask, [0.0] * len(ids), advantage, prompt_len, group))
                continue
            if rescore_all:
                rescore.append(len(sequences))
                sampler_logprobs[len(sequences)] = ep.logprobs
            sequences.append(Sequence(ep.token_ids, ep.loss_mask, list(ep.logprobs), advantage, ep.prompt_len, group))
        if rescore or self.policy.sharded:  # under FSDP every rank takes part in the forwards
            self._recompute_old_logprobs([sequences[i] for i in rescore])
        constant = (rewards.max(dim=1).values - rewards.min(dim=1).values).abs() <= 1e-8
        stats = {"groups": float(len(constant)), "constant_groups": float(constant.sum()),
                 "groups_without_tokens": float(empty.sum()), "sampler_kl_sum": 0.0, "sampler_tokens": 0.0}
        for index, sampled in sampler_logprobs.items():
            mask = torch.tensor(sequences[index].loss_mask, dtype=torch.bool)  # [T]
            log_ratio = (torch.tensor(sequences[index].old_logprobs) - torch.tensor(sampled))[mask]  # trainer - sampler
            # k3 estimate of KL(sampler || trainer) from the sampler's own samples
            stats["sampler_kl_sum"] += float((torch.exp(log_ratio) - 1.0 - log_ratio).sum())
            stats["sampler_tokens"] += float(mask.sum())
        return sequences, stats

    def _lockstep_count(self, local: int) -> int:
        """Under FSDP every rank must run the same number of forward passes (they are collectives)."""
        if not self.policy.sharded or self.world_size == 1:
            return local
        return _all_max(local)

    def _dummy_batch(self) -> RolloutBatch:
        """A two-token batch with nothing to learn from, for ranks that ran out of real micro-batches."""
        return pad_batch([Sequence([self.pad_token_id] * 2, [0, 0], [0.0, 0.0], 0.0)], self.pad_token_id, self.device)

    @torch.no_grad()
    def _recompute_old_logprobs(self, sequences: list[Sequence]) -> None:
        size = self.config.micro_batch_size
        n_chunks = self._lockstep_count(math.ceil(len(sequences) / size))
        # Old log-probs are those of the sampling policy, which samples in eval mode: no LoRA dropout here
        # (the model is left in train mode by the previous update).
        was_training = self.policy.model.training
        self.policy.model.eval()
        try:
            self._recompute_chunks(sequences, size, n_chunks)
        finally:
            self.policy.model.train(was_training)

    def _recompute_chunks(self, sequences: list[Sequence], size: int, n_chunks: int) -> None:
        for chunk_index in range(n_chunks):
            chunk = sequences[chunk_index * size : (chunk_index + 1) * size]
            if not chunk:
                dummy = self._dummy_batch()
                token_logprobs(self.policy.model, dummy.input_ids, dummy.attention_mask)
                continue
            batch = pad_batch(chunk, self.pad_token_id, self.device)
            logprobs = token_logprobs(self.policy.model, batch.input_ids, batch.attention_mask,
                                      temperature=self.config.temperature, needed=batch.loss_mask.bool())  # [B, T]
            for row, seq in enumerate(chunk):
                values = logprobs[row, : len(seq.token_ids)] * batch.loss_mask[row, : len(seq.token_ids)]
                seq.old_logprobs = values.tolist()

    def _logprobs(self, micro: MicroBatch) -> torch.Tensor:
        """[B, T] log-probs of the micro-batch's loss tokens (0 elsewhere: the loss reads no other; the model
        computes logits only where they predict one, `train.logprobs`)."""
        batch, temperature = micro.batch, self.config.temperature
        needed = batch.loss_mask.bool()  # [B, T]
        if micro.prefix is None:
            return token_logprobs(self.policy.model, batch.input_ids, batch.attention_mask, temperature=temperature,
                                  needed=needed)
        return token_logprobs_after_prefix(self.policy.model, micro.prefix, batch.input_ids, batch.attention_mask,
                                           temperature=temperature, needed=needed)

    def _micro_batches(self, sequences: list[Sequence]) -> list[MicroBatch]:
        c = self.config
        # Under FSDP every rank must run the same number of forwards; the shared-prefix path runs two per
        # micro-batch, so sharded runs keep the plain one.
        if c.shared_prefix and not self.policy.sharded and all(s.prompt_len > 1 for s in sequences):
            return shared_prefix_micro_batches(sequences, c.micro_batch_size, self.pad_token_id, self.device)
        return [MicroBatch(pad_batch(sequences[i : i + c.micro_batch_size], self.pad_token_id, self.device))
                for i in range(0, len(sequences), c.micro_batch_size)]

    def _micro_batch_loss(self, micro: MicroBatch, normaliser: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Policy forward (+ reference forward with kl_beta > 0) and the loss of one micro-batch. FSDP padding
        micro-batches go through here too, so every rank runs the same forwards in the same order."""
        c = self.config
        new_logprobs = self._logprobs(micro)  # [B, T]
        ref_logprobs = None
        if c.kl_beta > 0:
            with torch.no_grad(), self.policy.reference():
                ref_logprobs = self._logprobs(micro)  # [B, T]
        return grpo_loss(
            new_logprobs, micro.batch, clip_eps=c.clip_eps, loss_agg=c.loss_agg, kl_beta=c.kl_beta,
            ref_logprobs=ref_logprobs, max_tokens_norm=self.completion_budget, normaliser=normaliser,
        )

    def _all_reduce_gradients(self) -> None:
        """DDP: average the trainable gradients over ranks in one flat all-reduce. A parameter whose gradient
        was never created (a rank whose groups were all dropped runs no backward) contributes zeros."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numel]
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        offset = 0
        for parameter in self.parameters:
            chunk = flat[offset : offset + parameter.numel()].view_as(parameter)
            offset += parameter.numel()
            if parameter.grad is None:
                parameter.grad = chunk.clone()
            else:
                parameter.grad.copy_(chunk)

    def update(self, sequences: list[Sequence]) -> dict[str, float]:
        """`ppo_epochs` passes over this iteration's sequences, one optimizer step per mini-batch of whole groups
        (`minibatches_per_iteration`); all ranks take part in every step, with or without sequences of their
        own. A mini-batch without a loss token on any rank is skipped (no step, the schedule does not move)."""
        c = self.config
        minibatches = [self._micro_batches(part) for part in split_by_group(sequences, c.minibatches_per_iteration)]
        normalisers = []
        for micro_batches in minibatches:
            normaliser = loss_normaliser([mb.batch for mb in micro_batches])
            normalisers.append(normaliser.all_reduce() if self.world_size > 1 else normaliser)
        if all(n.tokens == 0 for n in normalisers):  # every group was constant on every rank: nothing to learn from
            return {"loss": 0.0, "grad_norm": 0.0, "skipped_update": 1.0, "optimizer_steps": 0.0}
        self.policy.model.train()
        loss_sum, token_count, grad_norms = 0.0, 0.0, []
        weighted = dict.fromkeys(TOKEN_MEAN_STATS + (("kl_ref",) if c.kl_beta > 0 else ()), 0.0)
        for _ in range(c.ppo_epochs):
            for micro_batches, normaliser in zip(minibatches, normalisers):
                if normaliser.tokens == 0:
                    continue
                step_loss, step_tokens, step_stats, grad_norm = self._optimizer_step(micro_batches, normaliser)
                loss_sum += step_loss
                token_count += step_tokens
                for key in weighted:
                    weighted[key] += step_stats[key]
                grad_norms.append(float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm))
        # The whole update's figures on every rank (rank 0 logs them). Each rank's loss already uses its step's
        # global denominator divided by world_size, so a step's loss is the sum over ranks / world_size.
        totals = _all_sum([loss_sum, token_count, *weighted.values()])
        out = {"loss": totals[0] / self.world_size / len(grad_norms)}
        for key, total in zip(weighted, totals[2:]):
            out[key] = total / max(totals[1], 1.0)
        out["grad_norm"] = sum(grad_norms) / len(grad_norms)  # mean over the steps, before clipping
        out["optimizer_steps"] = float(len(grad_norms))
        out["skipped_update"] = 0.0
        return out

    def _optimizer_step(self, micro_batches: list[MicroBatch], normaliser: Any) -> tuple[float, float, dict, Any]:
        """One optimizer step on one mini-batch: (its loss on this rank, its loss tokens, token-weighted stat
        sums, the gradient norm before clipping). FSDP ranks run the same number of forwards (padding batches)."""
        c = self.config
        n_real = len(micro_batches)
        micro_batches = micro_batches + [MicroBatch(self._dummy_batch())] * (self._lockstep_count(n_real) - n_real)
        self.optimizer.zero_grad(set_to_none=False)
        loss_sum, token_count = 0.0, 0.0
        weighted = dict.fromkeys(TOKEN_MEAN_STATS + (("kl_ref",) if c.kl_beta > 0 else ()), 0.0)
        for index, micro in enumerate(micro_batches):
            loss, stats = self._micro_batch_loss(micro, normaliser)
            loss.backward()  # a padding micro-batch has no loss token: zero loss, zero gradient
            if index >= n_real:
                continue
            loss_sum += float(loss.detach())
            token_count += stats["loss_tokens"]
            for key in weighted:
                weighted[key] += stats[key] * stats["loss_tokens"]
        if self.world_size > 1 and not self.policy.sharded:  # FSDP averages in its reduce-scatter
            self._all_reduce_gradients()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, c.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return loss_sum, token_count, weighted, grad_norm

    # ---------------------------------------------------------------------------------------------
    def run(self, tracker: MetricLogger | None = None, *, prompts_checked: bool = False) -> dict[str, float]:
        """Train from `start_iteration` to `iterations`. `tracker`: the run's trackers, opened by the caller
        (`open_run_trackers`, python -m train does so before the model loads); None: opened here. With
        `prompts_checked` the caller has run `check_prompts_fit` for the start iteration already."""
        c = self.config
        try:
            if not prompts_checked:
                self.check_prompts_fit()
            self.check_sampler_logprobs()
            if self.rank == 0:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                save_config(c, self.output_dir / "config.yaml")
            self.tracker = tracker if tracker is not None else open_run_trackers(
                c, self.start_iteration, self.rank, self.run_kind)
            return self._run_iterations()
        finally:
            self.tracker.close()
            if tracker is not None:
                tracker.close()  # (nothing to do when it was self.tracker)
            self.tracker = MetricLogger()

    def _run_iterations(self) -> dict[str, float]:
        c = self.config
        last: dict[str, float] = {}
        # (iteration, mean reward) of the best iteration so far, for the collapse hint of rank 0's console line
        best = self._best_logged_reward() if self.rank == 0 else None
        zero_streak = 0  # consecutive iterations, ending at the current one, in which every episode scored 0
        bar = tqdm(range(self.start_iteration, c.iterations), desc=f"GRPO {c.game}", unit="it",
                   disable=self.rank != 0 or None, initial=self.start_iteration, total=c.iterations)
        for iteration in bar:
            last = self.iteration(iteration)
            if self.rank == 0:
                zero_streak = zero_streak + 1 if last["mean_reward_all_episodes"] == 0.0 else 0
                tqdm.write(self.summary_line(last, best, zero_streak))
                if best is None or last["mean_reward_all_episodes"] > best[1]:
                    best = (int(last["iteration"]), last["mean_reward_all_episodes"])
        if self.world_size > 1 and not self.policy.sharded:  # sharded weights are one copy by construction
            self.check_ranks_agree()
        return last

    def _best_logged_reward(self) -> tuple[int, float] | None:
        """(iteration, mean reward over all episodes) of the best iteration in metrics.jsonl before a resume."""
        path = self.output_dir / "metrics.jsonl"
        if self.start_iteration == 0 or not path.exists():
            return None
        rows = [r for r in metrics_rows(path)  # (without a last line a kill cut short)
                if r["iteration"] <= self.start_iteration and r.get("mean_reward_all_episodes")]
        best = max(rows, key=lambda r: r["mean_reward_all_episodes"], default=None)
        return (int(best["iteration"]), best["mean_reward_all_episodes"]) if best else None

    def summary_line(self, m: dict[str, float], best_earlier: tuple[int, float] | None = None,
                     zero_streak: int = 2) -> str:
        """One console line per iteration; an iteration without an update says why instead of a loss.

        With an update it shows the gradient norm beside the loss: on-policy, the first step's clipped loss is
        about 0 by construction (ratio 1, advantages centred within each group), so the loss alone looks like
        nothing happened. `best_earlier` is (iteration, mean reward) of this run's best iteration so far and
        `zero_streak` the number of consecutive all-zero iterations ending at this one. When every episode scores 0
        after an iteration that scored, either the last update collapsed the policy or the draw was unlucky (with
        sparse rewards, 64 episodes can all miss). A skipped update leaves the policy unchanged, so the next
        iteration tells them apart: the first all-zero iteration says so, the second says the policy has likely
        collapsed (with no reward spread GRPO cannot climb back) and what to change. (The demo of 2026-12-02 had
        one all-zero iteration, 4 of 8, and the unchanged policy scored 0.10 at iteration 5.)"""
        c = self.config
        line = (f"iter {m['iteration']}/{c.iterations}  reward {m['mean_reward']:.3f}  success {m['success_rate']:.3f}"
                f"  (all episodes {m['mean_reward_all_episodes']:.3f})  constant {m['frac_constant_groups']:.2f}  "
                f"gen {m['gen_tokens_per_s']:.0f} tok/s  ")
        if m["skipped_update"]:
            why = ("every group's rewards were equal, nothing to learn from" if m["frac_constant_groups"] == 1.0
                   else "no group had both a reward spread and generated tokens")
            if m["mean_reward_all_episodes"] == 0.0 and best_earlier and best_earlier[1] > 0.0:
                why += f"; every episode scored 0 after iteration {best_earlier[0]} averaged {best_earlier[1]:.3f}"
                if zero_streak >= 2:
                    why += (f" ({zero_streak} iterations in a row): the policy has likely collapsed and cannot recover "
                            f"without a reward spread (retrain with a lower learning_rate than {c.learning_rate:g})")
                else:
                    why += (": the policy is unchanged, so the next iteration shows whether this was an unlucky draw "
                            "or a collapse")
            return line + f"no update: {why}"
        return line + (f"train {m['train_tokens_per_s']:.0f} tok/s  loss {m['loss']:+.4f}  "
                       f"grad norm {m['grad_norm']:.3g}")

    def check_ranks_agree(self) -> None:
        """Raise if the trainable weights differ between ranks (they must: same init, averaged gradients)."""
        with torch.no_grad():
            flat = torch.cat([p.detach().double().flatten() for p in self.parameters])
            digest = torch.stack([flat.sum(), (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum()])
        digests = [torch.zeros_like(digest) for _ in range(self.world_size)]
        dist.all_gather(digests, digest)
        if any(not torch.equal(d, digests[0]) for d in digests):
            raise RuntimeError(f"ranks disagree on the trainable weights: {[d.tolist() for d in digests]}")
        if self.rank == 0:
            print(f"all {self.world_size} ranks agree on the trainable weights (checksum {digests[0].tolist()})")

    def iteration(self, iteration: int) -> dict[str, float]:
        c = self.config
        started = time.perf_counter()
        episodes = run_episodes(
            self.spec, self.requests(iteration), self.backend, self.chat,
            temperature=c.temperature, max_episode_tokens=c.max_episode_tokens, game_overrides=c.game_overrides,
        )
        gen_seconds = time.perf_counter() - started
        (empty,) = _all_sum([float(sum(ep.n_generated == 0 for ep in episodes))])
        if empty == c.groups_per_iteration * c.group_size:
            shortest = min(ep.prompt_len for ep in episodes)
            raise InputError(
                f"iteration {iteration + 1}: no episode generated a token: every opening prompt (from {shortest} "
                f"tokens) fills max_episode_tokens={c.max_episode_tokens}. Raise --max_episode_tokens."
            )
        sequences, group_stats = self.sequences(episodes)
        train_started = time.perf_counter()
        update_stats = self.update(sequences)  # steps the schedule once per optimizer step
        train_seconds = time.perf_counter() - train_started
        self.backend.sync_weights(self.policy, iteration + 1)

        def success(ep: Episode) -> bool:
            return bool(ep.summary.get("success", ep.reward >= 1.0))

        base = [ep for ep in episodes if not ep.request.hinted]
        totals = _all_sum([
            sum(ep.reward for ep in base), float(sum(success(ep) for ep in base)), float(len(base)),
            sum(ep.reward for ep in episodes), float(sum(success(ep) for ep in episodes)), float(len(episodes)),
            float(sum(ep.n_generated for ep in episodes)), float(sum(len(s.token_ids) for s in sequences)),
            group_stats["groups"], group_stats["constant_groups"], group_stats["groups_without_tokens"],
            group_stats["sampler_kl_sum"], group_stats["sampler_tokens"], gen_seconds, train_seconds,
        ])
        (base_reward, base_success, n_base, reward_sum, success_sum, n_episodes, gen_tokens, train_tokens, groups,
         constant, without_tokens, sampler_kl_sum, sampler_tokens, gen_s, train_s) = totals
        metrics = {
            "iteration": iteration + 1,
            "mean_reward": base_reward / n_base,  # base-prompt episodes: the figure that shows progress
            "success_rate": base_success / n_base,
            "mean_reward_all_episodes": reward_sum / n_episodes,  # hinted episodes included
            "success_rate_all_episodes": success_sum / n_episodes,
            "frac_constant_groups": constant / groups,
            "groups_without_tokens": int(without_tokens),
            "n_episodes": int(n_episodes),
            "n_base_episodes": int(n_base),
            "gen_tokens": int(gen_tokens),
            "gen_tokens_per_s": gen_tokens / max(gen_s / self.world_size, 1e-9),
            "train_tokens_per_s": train_tokens / max(train_s / self.world_size, 1e-9),
            # Every iteration plays groups_per_iteration x group_size episodes over all ranks (a resume too).
            "episodes_total": (iteration + 1) * c.groups_per_iteration * c.group_size,
            "lr": self.scheduler.get_last_lr()[0],
            "seconds": time.perf_counter() - started,
            **update_stats,
        }
        if sampler_tokens:  # how far the sampler's own log-probs were from the trainer's (re-scored runs)
            metrics["sampler_kl"] = sampler_kl_sum / sampler_tokens
        self._write_artifacts(iteration + 1, episodes, metrics)
        return metrics

    def _write_artifacts(self, done: int, episodes: list[Episode], metrics: dict[str, float]) -> None:
        c = self.config
        simulations = [episode_to_simulation(ep, sim_id=f"it{done}-{ep.request.seed}-{ep.request.sample_idx}")
                       for ep in episodes] if c.save_rollouts else []
        if self.world_size > 1 and c.save_rollouts:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, simulations)
            simulations = [s for part in gathered for s in part]
        final = done == c.iterations
        checkpoint_due = done % c.save_every == 0 or final
        rank_states: list[Any] = []
        if checkpoint_due:  # every rank's sampler and RNG states, so a resume continues each rank's streams
            rank_states = [rank_state(self.backend.state_dict())]
            if self.world_size > 1:
                rank_states = [None] * self.world_size
                dist.all_gather_object(rank_states, rank_state(self.backend.state_dict()))
        adapter_state = optimizer_state = None
        if checkpoint_due:  # collectives under FSDP: every rank takes part, rank 0 gets full tensors
            adapter_state = self.policy.adapter_state()
            optimizer_state = self.policy.optimizer_state(self.optimizer)
        if self.rank == 0:
            with sigint_deferred():  # Ctrl-C: this iteration's files all written, or none
                self._write_files(done, simulations, metrics, checkpoint_due, adapter_state, optimizer_state,
                                  rank_states)
        if self.world_size > 1:
            dist.barrier()

    def _write_files(self, done: int, simulations: list[Any], metrics: dict[str, float], checkpoint_due: bool,
                     adapter_state: Any, optimizer_state: Any, rank_states: list[Any]) -> None:
        """Rank 0's files of iteration `done`: the metrics line, the rollouts, the adapter and the checkpoint."""
        c = self.config
        append_line(self.output_dir / "metrics.jsonl", json.dumps({k: _finite(v) for k, v in metrics.items()}) + "\n")
        self.tracker.log_scalars(scalars_of(metrics, TRACKED_SCALARS), step=done)  # the file first: the record
        if c.save_rollouts:
            info = {"game": c.game, "iteration": done, "model": c.model, "temperature": c.temperature}
            write_results(self.output_dir / "rollouts" / f"iter_{done:06d}.json", simulations, info=info)
        if checkpoint_due:
            self.policy.write_adapter(self.output_dir, adapter_state)
            save_checkpoint(
                self.output_dir / "checkpoints", iteration=done,
                write_adapter=lambda path: self.policy.write_adapter(path, adapter_state),
                optimizer_state=optimizer_state, scheduler=self.scheduler, rank_states=rank_states,
            )


def open_run_trackers(config: GRPOConfig, start_iteration: int, rank: int, kind: str = "grpo") -> MetricLogger:
    """The trackers of `config.report_to` for a run that starts after `start_iteration` iterations (rank 0 only;
    InputError when one cannot start a run: call it before the model loads)."""
    return open_trackers(config.report_to, config.resolved_output_dir(), kind=kind, config=config.to_dict(),
                         first_step=start_iteration + 1, rank=rank)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
