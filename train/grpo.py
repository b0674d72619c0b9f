"""GRPO training of one capability adapter (Step 3).

One iteration:
  1. Sample. `groups_per_iteration` task seeds (each rank takes every world_size-th group); `group_size`
     episodes per seed, the first `hint_fraction * group_size` of them with the game's hint prompt. All
     episodes of the rank are played together through the rollout backend (in-process HF or vLLM).
  2. Score. Reward = the game's summary reward at the end of the episode (done, max_turns or the token
     budget). Advantage = reward - group mean, divided by max(group std, std_floor) when
     `scale_advantages`; groups whose rewards are all equal are dropped (`filter_constant_groups`).
  3. Re-score hinted samples. Their prompt is swapped for the base prompt, token for token otherwise,
     and their old log-probs are recomputed under it, so the adapter learns the hinted behaviour without
     the hint. Other samples keep their sampling log-probs as old log-probs.
  4. Update. PPO clipped surrogate (clip_eps), aggregated per `loss_agg` (grpo: per-sequence mean; dapo:
     global token mean; dr_grpo: constant normaliser) with denominators counted over the whole step on
     all ranks, so micro-batching and data parallelism do not change the gradient. Optional k3 KL to the
     reference policy (the adapter disabled). Gradients are averaged over ranks, clipped to `grad_clip`,
     AdamW steps `ppo_epochs` times per iteration. Observation and prompt tokens are masked out.
  5. Sync. The backend is told about the new weights (vLLM loads the adapter under a fresh name).

The update only sees `policy.model` and `policy.trainable_parameters()`: it trains a LoRA adapter here
and router gates in Step 4 without knowing which.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from benchmarks.results import write_results
from game_registry import GameSpec
from common.io import atomic_write_text
from train.backends import RolloutBackend
from train.checkpoint import load_checkpoint, save_checkpoint
from train.config import GRPOConfig, save_config
from train.distributed import world as world_info
from train.episodes import (
    ChatTokenizer,
    Episode,
    EpisodeRequest,
    episode_to_simulation,
    rescored_under_base_prompt,
    run_episodes,
)
from train.grpo_loss import RolloutBatch, group_advantages, grpo_loss, loss_normaliser
from train.logprobs import token_logprobs, token_logprobs_after_prefix
from train.policy import Policy


@dataclass
class Sequence:
    """One training sequence: token ids with the loss mask and the old policy's log-probs."""

    token_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float
    prompt_len: int = 0  # tokens of the prompt, shared by every sequence of the group (0: unknown)


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


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, spec: GameSpec, policy: Policy, tokenizer: Any, backend: RolloutBackend):
        self.config, self.spec, self.policy, self.backend = config, spec, policy, backend
        self.chat = ChatTokenizer(tokenizer)
        self.pad_token_id = tokenizer.pad_token_id
        self.device = next(policy.model.parameters()).device
        self.rank, self.world_size = world_info()
        self.output_dir = config.resolved_output_dir()
        self.parameters = policy.trainable_parameters()
        if not self.parameters:
            raise ValueError("the policy has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=config.learning_rate, weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2),
        )
        warmup = config.warmup_iterations
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda it: min(1.0, (it + 1) / warmup) if warmup else 1.0
        )
        self.start_iteration = 0

    # ---------------------------------------------------------------------------------------------
    def resume_from(self, checkpoint: Path) -> None:
        iteration, optimizer_state, backend_state = load_checkpoint(checkpoint, scheduler=self.scheduler)
        self.policy.load_optimizer_state(self.optimizer, optimizer_state)
        prefix = f"rank{self.rank}."
        self.backend.load_state_dict({k.removeprefix(prefix): v for k, v in backend_state.items() if k.startswith(prefix)})
        self.backend.sync_weights(self.policy, iteration)
        self.start_iteration = iteration
        metrics = self.output_dir / "metrics.jsonl"
        if self.rank == 0 and metrics.exists():  # drop lines of iterations after the checkpoint
            kept = [l for l in metrics.read_text().splitlines() if l and json.loads(l)["iteration"] <= iteration]
            atomic_write_text(metrics, "".join(line + "\n" for line in kept))

    def requests(self, iteration: int) -> list[EpisodeRequest]:
        """This rank's episodes: every world_size-th group of the iteration, `group_size` samples each."""
        c = self.config
        first_seed = c.train_seed_start + iteration * c.groups_per_iteration
        return [
            EpisodeRequest(seed=first_seed + group, sample_idx=k, hinted=k < c.n_hinted)
            for group in range(self.rank, c.groups_per_iteration, self.world_size)
            for k in range(c.group_size)
        ]

    # ---------------------------------------------------------------------------------------------
    def sequences(self, episodes: list[Episode]) -> tuple[list[Sequence], dict[str, float]]:
        """Advantages per group; kept episodes as training sequences (hinted ones re-scored)."""
        c = self.config
        rewards = torch.tensor([ep.reward for ep in episodes], dtype=torch.float32).view(-1, c.group_size)  # [G, K]
        advantages, keep = group_advantages(
            rewards, scale=c.scale_advantages, std_floor=c.std_floor, filter_constant_groups=c.filter_constant_groups
        )
        sequences = []
        rescore: list[int] = []
        for index, ep in enumerate(episodes):
            group, k = divmod(index, c.group_size)
            if not bool(keep[group]):
                continue
            if ep.request.hinted:
                ids, mask, prompt_len = rescored_under_base_prompt(ep, self.spec, self.chat)
                rescore.append(len(sequences))
                sequences.append(Sequence(ids, mask, [0.0] * len(ids), float(advantages[group, k]), prompt_len))
            else:
                sequences.append(Sequence(ep.token_ids, ep.loss_mask, ep.logprobs, float(advantages[group, k]),
                                          ep.prompt_len))
        if rescore or self.policy.sharded:
            self._recompute_old_logprobs([sequences[i] for i in rescore])
        constant = (rewards.max(dim=1).values - rewards.min(dim=1).values).abs() <= 1e-8
        return sequences, {"groups": float(len(constant)), "constant_groups": float(constant.sum())}

    def _lockstep_count(self, local: int) -> int:
        """Under FSDP every rank must run the same number of forward passes (they are collectives)."""
        if not self.policy.sharded or self.world_size == 1:
            return local
        count = torch.tensor([local], dtype=torch.long, device=_collective_device())
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count)

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
                                      temperature=self.config.temperature)  # [B, T]
            for row, seq in enumerate(chunk):
                values = logprobs[row, : len(seq.token_ids)] * batch.loss_mask[row, : len(seq.token_ids)]
                seq.old_logprobs = values.tolist()

    def _logprobs(self, micro: MicroBatch) -> torch.Tensor:
        batch, temperature = micro.batch, self.config.temperature
        if micro.prefix is None:
            return token_logprobs(self.policy.model, batch.input_ids, batch.attention_mask, temperature=temperature)
        return token_logprobs_after_prefix(self.policy.model, micro.prefix, batch.input_ids, batch.attention_mask,
                                           temperature=temperature)

    def update(self, sequences: list[Sequence]) -> dict[str, float]:
        """`ppo_epochs` optimizer steps on this iteration's sequences (all ranks take part)."""
        c = self.config
        # Under FSDP every rank must run the same number of forwards; the shared-prefix path runs two per
        # micro-batch, so sharded runs keep the plain one.
        if c.shared_prefix and not self.policy.sharded and all(s.prompt_len > 1 for s in sequences):
            micro_batches = shared_prefix_micro_batches(sequences, c.micro_batch_size, self.pad_token_id, self.device)
        else:
            micro_batches = [
                MicroBatch(pad_batch(sequences[i : i + c.micro_batch_size], self.pad_token_id, self.device))
                for i in range(0, len(sequences), c.micro_batch_size)
            ]
        normaliser = loss_normaliser([mb.batch for mb in micro_batches])
        if self.world_size > 1:
            normaliser = normaliser.all_reduce()
        stats_sum: dict[str, float] = {}
        if normaliser.tokens == 0:  # every group was constant on every rank: nothing to learn from
            return {"loss": 0.0, "grad_norm": 0.0, "skipped_update": 1.0}
        self.policy.model.train()
        grad_norm = torch.tensor(0.0)
        n_real = len(micro_batches)
        micro_batches += [MicroBatch(self._dummy_batch())] * (self._lockstep_count(n_real) - n_real)
        for _ in range(c.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=False)
            for index, micro in enumerate(micro_batches):
                batch = micro.batch
                if index >= n_real:  # FSDP lockstep: a forward/backward that contributes zero gradient
                    (token_logprobs(self.policy.model, batch.input_ids, batch.attention_mask).sum() * 0.0).backward()
                    continue
                new_logprobs = self._logprobs(micro)  # [B, T]
                ref_logprobs = None
                if c.kl_beta > 0:
                    with torch.no_grad(), self.policy.reference():
                        ref_logprobs = self._logprobs(micro)
                loss, stats = grpo_loss(
                    new_logprobs, batch, clip_eps=c.clip_eps, loss_agg=c.loss_agg, kl_beta=c.kl_beta,
                    ref_logprobs=ref_logprobs, max_tokens_norm=c.max_tokens_norm or c.max_episode_tokens,
                    normaliser=normaliser,
                )
                loss.backward()
                stats_sum["loss"] = stats_sum.get("loss", 0.0) + float(loss.detach()) / c.ppo_epochs
                for key in ("clip_fraction", "ratio_mean", "approx_kl", "kl_ref"):
                    if key in stats:
                        stats_sum[key] = stats_sum.get(key, 0.0) + stats[key] / n_real / c.ppo_epochs
            if self.world_size > 1 and not self.policy.sharded:  # FSDP averages in its reduce-scatter
                for parameter in self.parameters:
                    dist.all_reduce(parameter.grad)
                    parameter.grad.div_(self.world_size)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, c.grad_clip)
            self.optimizer.step()
        if self.world_size > 1:  # rank 0 logs these, so make them about the whole step, not rank 0's share
            self._average_stats_over_ranks(stats_sum, n_real)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        stats_sum["grad_norm"] = float(grad_norm)
        stats_sum["skipped_update"] = 0.0
        return stats_sum

    def _average_stats_over_ranks(self, stats: dict[str, float], n_real: int) -> None:
        """Each rank's loss already uses the global denominator, so the step's loss is the mean over ranks;
        per-micro-batch means (clip fraction, ratio, KL) are weighted by each rank's micro-batch count."""
        keys = ["clip_fraction", "ratio_mean", "approx_kl"] + (["kl_ref"] if self.config.kl_beta > 0 else [])
        totals = _all_sum([stats.get("loss", 0.0), float(n_real)] + [stats.get(k, 0.0) * n_real for k in keys])
        stats["loss"] = totals[0] / self.world_size
        for key, total in zip(keys, totals[2:]):
            stats[key] = total / max(totals[1], 1.0)

    # ---------------------------------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        c = self.config
        if self.rank == 0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            save_config(c, self.output_dir / "config.yaml")
        last: dict[str, float] = {}
        bar = tqdm(range(self.start_iteration, c.iterations), desc=f"GRPO {c.game}", unit="it",
                   disable=self.rank != 0 or None, initial=self.start_iteration, total=c.iterations)
        for iteration in bar:
            last = self.iteration(iteration)
            if self.rank == 0:
                summary = (f"iter {iteration + 1}/{c.iterations}  reward {last['mean_reward']:.3f}  "
                           f"success {last['success_rate']:.3f}  constant {last['frac_constant_groups']:.2f}  "
                           f"gen {last['gen_tokens_per_s']:.0f} tok/s  train {last['train_tokens_per_s']:.0f} tok/s  "
                           f"loss {last['loss']:+.4f}")
                tqdm.write(summary)
        if self.world_size > 1 and not self.policy.sharded:  # sharded weights are one copy by construction
            self.check_ranks_agree()
        return last

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
        sequences, group_stats = self.sequences(episodes)
        train_started = time.perf_counter()
        update_stats = self.update(sequences)
        self.scheduler.step()
        train_seconds = time.perf_counter() - train_started
        self.backend.sync_weights(self.policy, iteration + 1)

        successes = sum(1 for ep in episodes if ep.summary.get("success", ep.reward >= 1.0))
        totals = _all_sum([
            sum(ep.reward for ep in episodes), float(successes), float(len(episodes)),
            float(sum(ep.n_generated for ep in episodes)), float(sum(len(s.token_ids) for s in sequences)),
            group_stats["groups"], group_stats["constant_groups"], gen_seconds, train_seconds,
        ])
        reward_sum, success_sum, n_episodes, gen_tokens, train_tokens, groups, constant, gen_s, train_s = totals
        metrics = {
            "iteration": iteration + 1,
            "mean_reward": reward_sum / n_episodes,
            "success_rate": success_sum / n_episodes,
            "frac_constant_groups": constant / groups,
            "n_episodes": int(n_episodes),
            "gen_tokens": int(gen_tokens),
            "gen_tokens_per_s": gen_tokens / max(gen_s / self.world_size, 1e-9),
            "train_tokens_per_s": train_tokens / max(train_s / self.world_size, 1e-9),
            "lr": self.scheduler.get_last_lr()[0],
            "seconds": time.perf_counter() - started,
            **update_stats,
        }
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
        backend_state = {f"rank{self.rank}.{k}": v for k, v in self.backend.state_dict().items()}
        if checkpoint_due and self.world_size > 1:  # every rank's sampler state, so a resume samples identically
            states: list[Any] = [None] * self.world_size
            dist.all_gather_object(states, backend_state)
            backend_state = {k: v for part in states for k, v in part.items()}
        adapter_state = optimizer_state = None
        if checkpoint_due:  # collectives under FSDP: every rank takes part, rank 0 gets full tensors
            adapter_state = self.policy.adapter_state()
            optimizer_state = self.policy.optimizer_state(self.optimizer)
        if self.rank == 0:
            with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps({k: _finite(v) for k, v in metrics.items()}) + "\n")
            if c.save_rollouts:
                info = {"game": c.game, "iteration": done, "model": c.model, "temperature": c.temperature}
                write_results(self.output_dir / "rollouts" / f"iter_{done:06d}.json", simulations, info=info)
            if checkpoint_due:
                self.policy.write_adapter(self.output_dir, adapter_state)
                save_checkpoint(
                    self.output_dir / "checkpoints", iteration=done,
                    write_adapter=lambda path: self.policy.write_adapter(path, adapter_state),
                    optimizer_state=optimizer_state, scheduler=self.scheduler, backend_state=backend_state,
                )
        if self.world_size > 1:
            dist.barrier()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
