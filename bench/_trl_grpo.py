"""The TRL side of bench/grpo_step.py: TRL's `GRPOTrainer` playing one of our multi-turn games.

TRL (1.16) trains multi-turn agents through `rollout_func(prompts, trainer) -> dict`: the function receives
the per-process slice of the generation batch (each dataset prompt already repeated `num_generations` times
by TRL's sampler), plays the episodes, and returns per sample `prompt_ids`, `completion_ids` and `logprobs`.
Extra keys are forwarded to the reward functions, except `env_mask`, which TRL multiplies into its loss mask
(1 = a token the policy sampled, 0 = an observation the environment appended). So one completion here is
everything after the opening prompt: sampled turns and the observations between them, exactly the tokens
our trainer trains on.

Generation follows TRL's own in-process (non-vLLM) path, turn by turn: left-padded prompts, the trainer's
`generation_config` (sampling, temperature, top_k=0), `unwrap_model_for_generation`, `model.generate`. The
game loop itself is `train.episodes.run_episodes`, shared with our trainer, so both sides play the same
game under the same turn and episode token budgets; only the sampler and the trainer differ.

TRL hands `rollout_func` only the `prompt` column, so each dataset row's prompt is a one-message placeholder
carrying the task seed (`seed_prompt`); the rollout builds the real opening with `game.reset(seed)`, as our
trainer does.
"""
from __future__ import annotations

import copy
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from game_registry import GameSpec
from train.backends import Completion, RolloutBackend, SamplingParams
from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes

SEED_PROMPT_PREFIX = "trace-game-seed:"
_SEED_PATTERN = re.compile(re.escape(SEED_PROMPT_PREFIX) + r"(\d+)")


def seed_prompt(seed: int) -> list[dict[str, str]]:
    """The dataset prompt of one task: a placeholder message that carries the game seed to `rollout_func`."""
    return [{"role": "user", "content": f"{SEED_PROMPT_PREFIX}{seed}"}]


def seed_of(prompt: Any) -> int:
    """The seed a `seed_prompt` carries; ValueError for anything else."""
    content = prompt[-1].get("content") if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) else None
    match = _SEED_PATTERN.fullmatch(content) if isinstance(content, str) else None
    if match is None:
        raise ValueError(f"rollout_func got a prompt that is not a seed placeholder: {prompt!r}")
    return int(match.group(1))


class TRLGenerateBackend(RolloutBackend):
    """Samples one turn for a batch of token-id prompts the way TRL's non-vLLM path does (`model.generate`)."""

    def __init__(self, trainer: Any):
        from trl.models import unwrap_model_for_generation  # imported here: only the TRL side needs trl
        from trl.trainer.utils import pad

        self.trainer = trainer
        self._unwrap = unwrap_model_for_generation
        self._pad = pad

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        trainer = self.trainer
        device = trainer.accelerator.device
        pad_id = trainer.processing_class.pad_token_id
        tensors = [torch.tensor(list(p), dtype=torch.long) for p in prompts]
        input_ids = self._pad(tensors, padding_value=pad_id, padding_side="left",
                              pad_to_multiple_of=trainer.pad_to_multiple_of).to(device)  # [B, P]
        attention_mask = self._pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left",
                                   pad_to_multiple_of=trainer.pad_to_multiple_of).to(device)  # [B, P]
        # TRL's sampling settings, with this turn's length limit and the chat stop tokens.
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = params.max_new_tokens
        config.eos_token_id = list(params.stop_token_ids)
        config.temperature = params.temperature
        config.output_scores = True  # to return the sampling log-probs rollout_func must hand back
        config.return_dict_in_generate = True
        with self._unwrap(trainer.model_wrapped, trainer.accelerator,
                          gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                          generation_kwargs=trainer.generation_kwargs,
                          gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs) as model:
            output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        new_tokens = output.sequences[:, input_ids.size(1):]  # [B, N]
        # `scores` are the processed logits the sampler drew from (temperature applied): one [B, V] per step.
        logprobs = torch.log_softmax(torch.stack(output.scores, dim=1).float(), dim=-1)  # [B, N, V]
        token_logprobs = logprobs.gather(-1, new_tokens[..., None]).squeeze(-1)  # [B, N]
        stop = torch.tensor(list(params.stop_token_ids), device=device)
        completions = []
        for row in range(new_tokens.size(0)):
            ids = new_tokens[row].tolist()
            hits = torch.isin(new_tokens[row], stop).nonzero()
            length = int(hits[0]) + 1 if len(hits) else len(ids)  # up to and including the first stop token
            reason = "stop" if len(hits) else "length"
            completions.append(Completion(ids[:length], token_logprobs[row, :length].tolist(), reason))
        return completions


@dataclass
class RolloutRecord:
    """What one `rollout_func` call did (one per TRL optimizer step here)."""

    seconds: float  # wall time of run_episodes: sampling, game steps, tokenization
    generated_tokens: int  # tokens the policy sampled
    sequence_tokens: int  # prompt + completion tokens of all samples (what the update trains on, unpadded)
    mean_reward: float


@dataclass
class GameRolloutFunc:
    """`rollout_func` for TRL's GRPOTrainer: plays the game episodes of the prompts it is given."""

    spec: GameSpec
    chat: ChatTokenizer
    temperature: float
    max_episode_tokens: int
    records: list[RolloutRecord] = field(default_factory=list)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        seen: dict[int, int] = {}
        requests = []
        for prompt in prompts:  # TRL repeats each prompt num_generations times; number the copies
            seed = seed_of(prompt)
            requests.append(EpisodeRequest(seed=seed, sample_idx=seen.get(seed, 0), hinted=False))
            seen[seed] = seen.get(seed, 0) + 1
        started = time.perf_counter()
        episodes = run_episodes(self.spec, requests, TRLGenerateBackend(trainer), self.chat,
                                temperature=self.temperature, max_episode_tokens=self.max_episode_tokens)
        seconds = time.perf_counter() - started
        empty = [ep.request.seed for ep in episodes if len(ep.token_ids) <= ep.prompt_len]
        if empty:  # TRL indexes completion_ids[-1]; an episode with no turn would crash it obscurely
            raise ValueError(f"episodes of seeds {sorted(set(empty))} have no completion tokens: their prompt fills "
                             f"max_episode_tokens={self.max_episode_tokens}; raise the episode budget")
        self.records.append(RolloutRecord(
            seconds=seconds,
            generated_tokens=sum(ep.n_generated for ep in episodes),
            sequence_tokens=sum(len(ep.token_ids) for ep in episodes),
            mean_reward=sum(ep.reward for ep in episodes) / len(episodes),
        ))
        return {
            "prompt_ids": [ep.token_ids[: ep.prompt_len] for ep in episodes],
            "completion_ids": [ep.token_ids[ep.prompt_len :] for ep in episodes],
            "logprobs": [ep.logprobs[ep.prompt_len :] for ep in episodes],
            "env_mask": [ep.loss_mask[ep.prompt_len :] for ep in episodes],
            "episode_reward": [ep.reward for ep in episodes],
        }


def episode_reward(prompts: list[Any], completions: list[Any], episode_reward: list[float], **kwargs: Any) -> list[float]:
    """TRL reward function: the game's end-of-episode reward, forwarded by `GameRolloutFunc`."""
    del prompts, completions, kwargs
    return [float(r) for r in episode_reward]


@dataclass
class TRLSettings:
    """The knobs that must equal our trainer's for a fair comparison."""

    model_dir: str
    seeds: list[int]  # dataset order: iteration i uses seeds[i * groups : (i + 1) * groups]
    steps: int  # optimizer steps to run (warm-up included)
    group_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    temperature: float
    max_episode_tokens: int
    lora_r: int
    lora_alpha: int
    lora_target_modules: list[str]
    seed: int


@dataclass
class TRLRun:
    step_seconds: list[float]  # wall time of each optimizer step
    rollouts: list[RolloutRecord]


def run_trl(spec: GameSpec, settings: TRLSettings, between_steps: Callable[[int], None] | None = None) -> TRLRun:
    """Train `settings.steps` GRPO steps with TRL on CPU; return per-step wall times and rollout records.

    `between_steps(step)` runs after each optimizer step (step = 1, 2, ...) and is not counted in any step's
    time: the benchmark runs one iteration of our trainer there, so both trainers see the same machine load.
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.x
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        """Wall time of every optimizer step (generation happens inside the step), minus `between_steps`."""

        def __init__(self) -> None:
            self.step_seconds: list[float] = []
            self.resumed = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.resumed = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_seconds.append(time.perf_counter() - self.resumed)
            if between_steps is not None:
                between_steps(state.global_step)
            self.resumed = time.perf_counter()  # what TRL does after this callback counts toward the next step

    tokenizer = AutoTokenizer.from_pretrained(settings.model_dir)
    if tokenizer.pad_token_id is None:  # as train.policy.load_base_model does
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(settings.model_dir, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": [seed_prompt(s) for s in settings.seeds], "seed": settings.seeds})
    rollout = GameRolloutFunc(spec, ChatTokenizer(tokenizer), settings.temperature, settings.max_episode_tokens)
    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="trl-grpo-bench-") as output_dir:
        args = GRPOConfig(
            output_dir=output_dir, report_to="none", push_to_hub=False, save_strategy="no",
            logging_strategy="no", disable_tqdm=True, use_cpu=True, bf16=False, fp16=False,
            # Same work as one iteration of our trainer: the whole generation batch, one optimizer step.
            max_steps=settings.steps, per_device_train_batch_size=settings.micro_batch_size,
            gradient_accumulation_steps=settings.gradient_accumulation_steps, num_generations=settings.group_size,
            num_iterations=1, shuffle_dataset=False, seed=settings.seed,
            # Our trainer's optimisation: AdamW, constant lr, no weight decay, grad clip 1, no KL, clip 0.2,
            # per-sequence mean loss (loss_type grpo), advantages scaled by the group std.
            learning_rate=settings.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, optim="adamw_torch", beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group",
            temperature=settings.temperature, top_p=1.0, top_k=0, max_completion_length=settings.max_episode_tokens,
            # Ours keeps every activation (no checkpointing); TRL's default True would recompute the forward.
            gradient_checkpointing=False, dataloader_num_workers=0,
        )
        peft_config = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=0.0,
                                 target_modules=list(settings.lora_target_modules), bias="none", task_type="CAUSAL_LM")
        torch.manual_seed(settings.seed)  # the LoRA init draws from the global generator, as ours does
        trainer = GRPOTrainer(model=model, reward_funcs=[episode_reward], args=args, train_dataset=dataset,
                              processing_class=tokenizer, peft_config=peft_config, rollout_func=rollout,
                              callbacks=[timer])
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary on stdout
        trainer.train()
    if len(timer.step_seconds) != settings.steps or len(rollout.records) != settings.steps:
        raise RuntimeError(f"TRL ran {len(timer.step_seconds)} optimizer steps and {len(rollout.records)} rollouts; "
                           f"expected {settings.steps} of each (one generation per step)")
    return TRLRun(step_seconds=timer.step_seconds, rollouts=rollout.records)
