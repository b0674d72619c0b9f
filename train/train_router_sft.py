"""Router SFT: warm-start the gates on rollouts labeled by capability (Step 4).

    python -m train.train_router_sft --config configs/moe_gate.yaml [--model DIR] [--output_dir DIR]
                                     [--report_to tensorboard,...]

Data: `sft.data` lists rollout results files (benchmarks/results.py format, e.g. what `python -m train`
saves under rollouts/ or `python -m train.collect_rollouts` writes), each with a slot label: every
assistant token of every rollout with reward >= `sft.min_reward` gets that label (the capability whose
game the rollout comes from; target-benchmark rollouts may be labeled "base", which teaches the gate when
no adapter should act). Hinted rollouts (a simulation whose `hinted` field is true: GRPO's first
`n_hinted` samples of a group, played with the game's hint in the system prompt) are left out: the hint
is a cue no target conversation shows, and the gate would learn to route on it. Token routing learns a
label per token and layer, at the position whose routing produces the token: the one before it, since position
p's forward pass gives the logits of token p + 1 (`decided_labels`; a reply's first token is decided at the
assistant header's last token); trajectory/global routing learns one label per conversation from its prompt
(the tokens before the first assistant token, which is what the router sees at inference).

With `sft.objective: reward` each entry's label is instead the slot that played its results, every slot (the base
too) has played the same tasks, and each slot's logit is fitted to that slot's mean reward on the conversation's
task (binary cross-entropy) at the deciding position of every assistant token of every unhinted conversation,
successful or not: the gate learns which slot succeeds, its top-1 the slot predicted best (train/routing_targets.py
says why).

Loss per layer, averaged over layers: cross-entropy of the gate logits against the labels (or the reward targets)
+ `sft.load_balance_weight` x Switch load balance. The cross-entropy is computed on the gate logits as
the gate produced them, with their gradient (a detached cross-entropy would leave only the balance term
to train the gate). With `sft.balance_labels` the cross-entropy is class-weighted so that every label present
carries the same total weight over the training set (gate_config.SFTConfig says why weights, not resampling).
The backbone and adapters stay frozen; the gate reads detached hidden states.

Writes to `output_dir`: gate.safetensors + gate_config.json (loadable by `moe_gate.build_capability_model`
or `load_capability_model`), moe_gate.yaml (the resolved config) and sft_metrics.jsonl (per epoch: loss,
cross-entropy, balance, training accuracy as the epoch went and held-out routing accuracy after it), whose lines
also go to the trackers of the config's `report_to` (train/tracking.py) under the names of TRACKED_SCALARS, at
step = epoch (and to the console).
The four files are written together when training ends, so a folder always holds one run's gate beside that
run's metrics: Ctrl-C (exit 130) or a crash leaves the previous run's files as they were. Router SFT does not
resume (it takes minutes); run the command again.
"""
from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F

from moe_gate import build_capability_model, load_balance_loss, save_gate
from moe_gate.model_builder import CapabilityModel
from common.io import atomic_write_jsonl
from common.validation import InputError
from common.cli import Interrupted, cli_entry, exit_code
from common.run_folder import add_overwrite_flag, check_model, check_output_dir, claimed_run_folder, sigint_deferred
from train.gate_config import MoEGateConfig, SFTConfig, load_gate_config, save_gate_config
from train.tracking import MetricLogger, open_trackers, require_trackers, scalars_of

IGNORE = -100
# sft_metrics.jsonl's keys as tracker scalars (tracker name -> key), the names GRPO and SFT runs share where they can
TRACKED_SCALARS = {"loss": "loss", "router/cross_entropy": "cross_entropy", "router/balance": "balance",
                   "accuracy/train": "train_accuracy", "accuracy/validation": "validation_accuracy"}


@dataclass
class LabeledSequence:
    token_ids: list[int]
    labels: list[int]  # slot index per token, IGNORE where the token is not labeled
    # sft.objective reward: each slot's mean reward on the sequence's task [S], the target of every labeled token
    # (whose label is then only a marker); None with label cross-entropy
    rewards: list[float] | None = None

    def prompt_only(self) -> "LabeledSequence":
        """The tokens before the first labeled one, labeled with the sequence's majority label (trajectory)."""
        labeled = [l for l in self.labels if l != IGNORE]
        first = next(i for i, l in enumerate(self.labels) if l != IGNORE)
        label = Counter(labeled).most_common(1)[0][0]
        cut = max(first, 1)
        return LabeledSequence(self.token_ids[:cut], [IGNORE] * (cut - 1) + [label], self.rewards)


class RouterBatch(NamedTuple):
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], IGNORE on padding and unlabeled tokens
    rewards: torch.Tensor | None = None  # [B, S]: each slot's reward target (sft.objective reward)


def collate(sequences: list[LabeledSequence], pad_token_id: int, device: torch.device) -> RouterBatch:
    longest = max(len(s.token_ids) for s in sequences)
    input_ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)  # [B, T]
    labels = torch.full((len(sequences), longest), IGNORE, dtype=torch.long)  # [B, T]
    for row, seq in enumerate(sequences):
        n = len(seq.token_ids)
        input_ids[row, :n] = torch.tensor(seq.token_ids)
        attention_mask[row, :n] = 1
        labels[row, :n] = torch.tensor(seq.labels)
    rewards = (torch.tensor([seq.rewards for seq in sequences], dtype=torch.float32, device=device)  # [B, S]
               if sequences[0].rewards is not None else None)
    return RouterBatch(input_ids.to(device), attention_mask.to(device), labels.to(device), rewards)


def label_weights(sequences: list[LabeledSequence], n_slots: int) -> torch.Tensor:
    """Class weights [S] that give every label present the same total weight: n / (k x n_label), with n the
    labeled tokens of `sequences`, k the labels present and n_label those of one label; 0 for absent labels.

    Weighted this way a label's tokens sum to n / k whatever its count, so a label with few rollouts (the base
    slot's target rollouts) pulls the gate as much as one with many (a capability's GRPO rollouts)."""
    counts = torch.zeros(n_slots, dtype=torch.float64)  # [S]
    for seq in sequences:
        for label in seq.labels[1:]:  # a first token has no position before it to decide it (`decided_labels`)
            if label != IGNORE:
                counts[label] += 1
    present = counts > 0  # [S]
    weights = torch.zeros(n_slots, dtype=torch.float64)  # [S]
    weights[present] = counts.sum() / (int(present.sum()) * counts[present])
    return weights.float()


def decided_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels [B, T] of tokens -> labels [B, T] of the positions whose routing decides them: position p's routed
    forward pass gives the logits that predict token p + 1, so a labeled token's decision is made one position
    earlier (an assistant turn's first token by the last token of the assistant header, which the chat template's
    assistant mask leaves out), and the last position decides nothing. IGNORE where no labeled token follows.

    Labeling the tokens themselves instead left the header's last position untrained, and the gate's extrapolation
    there sent the first token of each reply to the base slot (measured on the demo: 48 of 62 first divergences
    from the chosen adapter's own greedy path were there, in layers 1-3)."""
    decided = torch.full_like(labels, IGNORE)  # [B, T]
    decided[:, :-1] = labels[:, 1:]
    return decided


def deciding_positions(assistant: list[int]) -> list[int]:
    """The chat template's assistant mask [T] -> 1 at the positions whose routing decides an assistant token (the
    position before each one: see `decided_labels`), 0 elsewhere."""
    return [*assistant[1:], 0]


def router_loss(model: CapabilityModel, batch: RouterBatch, load_balance_weight: float,
                class_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy of the gate logits (+ lambda x load balance), averaged over the layers that decided.

    `class_weights` [S] (`label_weights`): a weighted cross-entropy, sum_i w[y_i] CE_i / sum_i w[y_i] per layer
    (torch's weighted mean), so each label counts by its weight rather than its number of tokens.

    With reward targets (`batch.rewards`, sft.objective reward) the "cross_entropy" is the binary cross-entropy of
    each slot's logit against its reward target, mean over decisions and slots, and "accuracy" the share of
    decisions whose top-1 slot has the task's highest target, over the tasks some slot solved ("tokens" counts
    those)."""
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
    with model.record_routing(keep_logits=True) as record:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=positions,
              use_cache=False, logits_to_keep=1)  # only the gate logits matter: skip the vocabulary projection
    events = [e for e in record.events if e.logits is not None]
    if model.mode == "token":
        decided = decided_labels(batch.labels)  # [B, T]: the label of the token each position's routing predicts
        keep = decided != IGNORE  # [B, T]
        targets = decided[keep]  # [n]
        rows = keep.nonzero()[:, 0]  # [n]: the sequence of each decision
    else:  # one label per sequence: the label of its (single) labeled token
        keep = (batch.labels != IGNORE).any(dim=1)  # [B]
        targets = batch.labels.max(dim=1).values[keep]  # [n]
        rows = keep.nonzero()[:, 0]  # [n]
    rewards = batch.rewards[rows] if batch.rewards is not None else None  # [n, S]
    solved = rewards.max(dim=-1).values > 0 if rewards is not None else None  # [n]
    ce_total = torch.zeros((), device=batch.input_ids.device)
    balance_total = torch.zeros((), device=batch.input_ids.device)
    correct = 0.0
    weight = None if class_weights is None else class_weights.to(batch.input_ids.device)  # [S]
    for event in events:
        chosen = event.logits[keep].float()  # [n, S]
        if rewards is None:
            ce_total = ce_total + F.cross_entropy(chosen, targets, weight=weight)
            correct += float((chosen.argmax(-1) == targets).float().mean())
        else:
            ce_total = ce_total + F.binary_cross_entropy_with_logits(chosen, rewards)
            picked = rewards.gather(1, chosen.argmax(-1, keepdim=True)).squeeze(1)  # [n]: the top-1 slot's target
            best = picked >= rewards.max(dim=-1).values  # [n]
            correct += float(best[solved].float().mean()) if bool(solved.any()) else 0.0
        balance_total = balance_total + load_balance_loss(event.logits, keep)
    n = max(len(events), 1)
    ce, balance = ce_total / n, balance_total / n
    loss = ce + load_balance_weight * balance
    decisions = targets.numel() if solved is None else solved.sum()
    return loss, {"loss": float(loss.detach()), "cross_entropy": float(ce.detach()), "balance": float(balance.detach()),
                  "accuracy": correct / n, "tokens": float(decisions)}


@torch.no_grad()
def routing_accuracy(model: CapabilityModel, sequences: list[LabeledSequence], pad_token_id: int,
                     batch_size: int = 8) -> float:
    """Share of labeled tokens (sequences, for trajectory/global) whose top-1 slot is the label, over layers."""
    if not sequences:
        return float("nan")
    device = next(model.parameters()).device
    correct = total = 0.0
    for start in range(0, len(sequences), batch_size):
        _, stats = router_loss(model, collate(sequences[start : start + batch_size], pad_token_id, device), 0.0)
        correct += stats["accuracy"] * stats["tokens"]
        total += stats["tokens"]
    return correct / max(total, 1.0)


def train_router(model: CapabilityModel, train: list[LabeledSequence], sft: SFTConfig, *, pad_token_id: int,
                 validation: list[LabeledSequence] | None = None, seed: int = 0,
                 log: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """`sft.epochs` passes over `train` with AdamW on the gate parameters only; returns per-epoch metrics.

    With `sft.balance_labels` the cross-entropy's class weights (`label_weights`) come from the whole training
    set, once: a batch's own counts would weight the same token differently from one batch to the next."""
    if not train:
        raise InputError("router SFT has no training sequences: check sft.data paths, labels and min_reward")
    if model.mode != "token":
        train = [s.prompt_only() for s in train]
        validation = [s.prompt_only() for s in validation or []]
    device = next(model.parameters()).device
    class_weights = label_weights(train, model.n_slots) if sft.balance_labels else None  # [S]
    parameters = model.gate_parameters()
    optimizer = torch.optim.AdamW(parameters, lr=sft.learning_rate, weight_decay=sft.weight_decay)
    order = random.Random(seed)
    model.eval()  # hard top-1 routing as at inference; the gate logits still carry gradients
    history = []
    for epoch in range(1, sft.epochs + 1):
        shuffled = list(train)
        order.shuffle(shuffled)
        sums: dict[str, float] = {}
        steps = 0
        for start in range(0, len(shuffled), sft.batch_size):
            batch = collate(shuffled[start : start + sft.batch_size], pad_token_id, device)
            loss, stats = router_loss(model, batch, sft.load_balance_weight, class_weights)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            for key in ("loss", "cross_entropy", "balance"):
                sums[key] = sums.get(key, 0.0) + stats[key]
            # Training accuracy as the epoch went (each batch before its step): a second pass over the training set
            # would double router SFT's time.
            sums["correct"] = sums.get("correct", 0.0) + stats["accuracy"] * stats["tokens"]
            sums["decisions"] = sums.get("decisions", 0.0) + stats["tokens"]
        correct, decisions = sums.pop("correct"), sums.pop("decisions")
        metrics = {"epoch": epoch, **{k: v / steps for k, v in sums.items()},
                   "train_accuracy": correct / max(decisions, 1.0)}
        if validation:
            metrics["validation_accuracy"] = routing_accuracy(model, validation, pad_token_id, sft.batch_size)
        history.append(metrics)
        if log is not None:
            log(metrics)
    return history


# ------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------
def _tool_schemas(game: str) -> list[dict[str, Any]]:
    if not game:
        return []
    from game_registry import get_game

    return get_game(game).make().get_tool_schemas()


def is_hinted(simulation: dict[str, Any]) -> bool:
    """Whether a rollout was played with the game's hint prompt: its `hinted` field, which train/episodes.py's
    `episode_to_simulation` writes for every GRPO rollout; a record without it (an evaluation's, a target
    benchmark's) had no hint."""
    return simulation.get("hinted") is True


def usable_simulations(simulations: list[dict[str, Any]], min_reward: float) -> tuple[list[dict[str, Any]], int]:
    """(the scored rollouts with reward >= min_reward that were not hinted, the number of such rollouts left out
    because they were hinted). One rule for the data and for the counts a caller reports."""
    from benchmarks.results import simulation_reward

    kept, hinted = [], 0
    for sim in simulations:
        reward = simulation_reward(sim)
        if reward is None or reward < min_reward:
            continue
        if is_hinted(sim):
            hinted += 1
        else:
            kept.append(sim)
    return kept, hinted


def encode_conversation(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                        max_tokens: int | None = None) -> tuple[list[int], list[int]]:
    """(token ids, assistant mask: 1 on assistant tokens) of a conversation as the chat template renders it with
    `tools`, cut at `max_tokens` (None: whole). Router SFT and the demo's routing shares read conversations the
    same way."""
    encoded = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
    ids, assistant = list(encoded["input_ids"]), list(encoded["assistant_masks"])
    return (ids, assistant) if max_tokens is None else (ids[:max_tokens], assistant[:max_tokens])


def labeled_sequences(simulations: list[dict[str, Any]], label: int, tokenizer: Any, *,
                      tools: list[dict[str, Any]], max_tokens: int) -> list[LabeledSequence]:
    """Each simulation's conversation with its assistant tokens labeled `label` (none kept without one)."""
    out = []
    for sim in simulations:
        ids, assistant = encode_conversation(tokenizer, sim["messages"], tools, max_tokens)
        labels = [label if flag else IGNORE for flag in assistant]
        if any(l != IGNORE for l in labels):
            out.append(LabeledSequence(ids, labels))
    return out


def sequences_from_results(path: str | Path, label: int, tokenizer: Any, *, tools: list[dict[str, Any]],
                           min_reward: float, max_tokens: int) -> list[LabeledSequence]:
    """Every rollout of a results file with reward >= min_reward that was not hinted (`usable_simulations`), its
    assistant tokens labeled `label`."""
    from benchmarks.results import load_results

    kept, _ = usable_simulations(load_results(path)["simulations"], min_reward)
    return labeled_sequences(kept, label, tokenizer, tools=tools, max_tokens=max_tokens)


def reward_sequences(config: MoEGateConfig, tokenizer: Any) -> list[LabeledSequence]:
    """sft.objective reward: every unhinted conversation of every `sft.data` entry (its label: the slot that played
    it), its assistant tokens marked, with its task's reward targets (`train.routing_targets.reward_targets`, in
    slot order)."""
    from benchmarks.results import load_results
    from train.routing_targets import reward_targets

    played: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for entry in config.sft.data:
        sims, _ = usable_simulations(load_results(entry.path)["simulations"], 0.0)  # every scored, unhinted one
        played.setdefault(entry.label, []).extend((sim, entry.game) for sim in sims)
    slots = config.slot_names
    targets = reward_targets({slot: [sim for sim, _ in pairs] for slot, pairs in played.items()}, slots)
    sequences = []
    for slot, pairs in played.items():
        found = 0
        for sim, game in pairs:
            ids, assistant = encode_conversation(tokenizer, sim["messages"], _tool_schemas(game), config.sft.max_tokens)
            if any(assistant):
                sequences.append(LabeledSequence(ids, [0 if flag else IGNORE for flag in assistant],
                                                 targets[str(sim["task_id"])]))
                found += 1
        print(f"router SFT (reward targets): {found} conversations played by {slot!r}")
    print(f"router SFT (reward targets): {len(targets)} tasks; mean reward per slot "
          + ", ".join(f"{slot} {sum(t[i] for t in targets.values()) / max(len(targets), 1):.3f}"
                      for i, slot in enumerate(slots)))
    return sequences


def load_sft_sequences(config: MoEGateConfig, tokenizer: Any) -> tuple[list[LabeledSequence], list[LabeledSequence]]:
    """(train, validation) sequences from `sft.data`, split by `validation_fraction` with the config's seed; with
    sft.objective reward, `reward_sequences`."""
    from benchmarks.results import load_results

    sequences = reward_sequences(config, tokenizer) if config.sft.objective == "reward" else []
    for entry in config.sft.data if config.sft.objective == "label" else []:
        kept, hinted = usable_simulations(load_results(entry.path)["simulations"], config.sft.min_reward)
        found = labeled_sequences(kept, config.slot_names.index(entry.label), tokenizer,
                                  tools=_tool_schemas(entry.game), max_tokens=config.sft.max_tokens)
        print(f"router SFT: {len(found)} rollouts from {entry.path} labeled {entry.label!r}"
              + (f" ({hinted} hinted ones left out)" if hinted else ""))
        sequences.extend(found)
    random.Random(config.seed).shuffle(sequences)
    held = int(len(sequences) * config.sft.validation_fraction)
    return sequences[held:], sequences[:held]


def check_sft_data(config: MoEGateConfig) -> None:
    """InputError unless every `sft.data` entry names a readable results file and a registered game (or none).

    The loaders first read them after the base model and every adapter have loaded (minutes on a large model), so
    a typo in a path or a game name would cost that wait; reading each file here parses it twice, which is cheap
    beside the model load."""
    from benchmarks.results import load_results
    from game_registry import lookup_game

    for entry in config.sft.data:
        try:
            load_results(entry.path)  # a missing file, broken JSON, no 'simulations' list: the message names the file
        except InputError as err:
            raise InputError(f"sft.data: {err}") from None
        if entry.game:
            try:
                lookup_game(entry.game)  # an unknown name: the message lists the registered games
            except InputError as err:
                raise InputError(f"sft.data {entry.path}: {err}") from None


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.train_router_sft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML config, e.g. configs/moe_gate.yaml")
    parser.add_argument("--model", default=None, help="base model folder (overrides the config's model)")
    parser.add_argument("--output_dir", default=None, help="where the gate goes (overrides the config)")
    parser.add_argument("--report_to", "--report-to", default=None,
                        help="trackers, comma-separated: tensorboard, wandb, trackio, mlflow, or none "
                             "(overrides the config)")
    add_overwrite_flag(parser)
    args = parser.parse_args(argv)
    config = load_gate_config(args.config, model=args.model, output_dir=args.output_dir, report_to=args.report_to)
    out = check_output_dir(config.output_dir, "output_dir", inputs=[("the base model", config.model)])
    require_trackers(config.report_to)  # a missing package stops the run before the model loads
    check_sft_data(config)
    check_model(config.model)
    with claimed_run_folder(out, "output_dir", fresh=True, overwrite=args.overwrite, restore_on_failure=True):
        return _train_gate(config, out)


def _train_gate(config: MoEGateConfig, out: Path) -> int:
    from train.policy import load_base_model

    tracker = MetricLogger()
    try:
        torch.manual_seed(config.seed)
        base, tokenizer = load_base_model(config.model, config.dtype)
        model = build_capability_model(base, config.adapters, gate=config.init_gate or None, mode=config.mode,
                                       include_base_slot=config.include_base_slot, estimator=config.estimator,
                                       tau=config.gumbel_tau)
        train, validation = load_sft_sequences(config, tokenizer)
        tracker = open_trackers(config.report_to, out, kind="router_sft", config=config.to_dict())

        def log(metrics: dict[str, Any]) -> None:
            tracker.log_scalars(scalars_of(metrics, TRACKED_SCALARS), step=metrics["epoch"])
            print("router SFT epoch {epoch}: loss {loss:.4f}  ce {cross_entropy:.4f}  balance {balance:.3f}  "
                  "train accuracy {train_accuracy:.3f}".format(**metrics)
                  + (f"  held-out accuracy {metrics['validation_accuracy']:.3f}" if "validation_accuracy" in metrics else ""))

        history = train_router(model, train, config.sft, pad_token_id=tokenizer.pad_token_id, validation=validation,
                               seed=config.seed, log=log)
        with sigint_deferred():  # the gate, its config and its metrics: all of this run, or all of the last one
            save_gate(model, out, extra={"command": "train.train_router_sft", "epochs": len(history),
                                         "final": history[-1]})
            save_gate_config(config, out / "moe_gate.yaml", "python -m train.train_router_sft")
            atomic_write_jsonl(out / "sft_metrics.jsonl", history)
    except (InputError, ValueError, KeyError) as err:  # ValueError, KeyError: the model and results files' loaders
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        raise Interrupted(f"nothing written to {out} (a gate already there is unchanged); run the same "
                          "command again to train the gate") from None
    finally:
        tracker.close()
    print(f"router SFT: gate written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
