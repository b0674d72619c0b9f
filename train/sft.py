"""Supervised fine-tuning of a whole causal LM on chat demonstrations, loss on assistant tokens only.

    python -m train.sft --model DIR --data demos.jsonl --out DIR [--epochs 1] [--lr 2e-3] [--batch-tokens 8192]
                        [--report_to tensorboard,...]

The CPU demo builds its base agent with it (`demo/run.py`): the tiny model, trained on storefront
demonstrations with planted deficits (`benchmarks/storefront/demos.py`).

Algorithm: AdamW (betas 0.9/0.95, no weight decay on a model this small), linear warm-up then cosine decay
to `final_lr_ratio` of the peak, gradient clipping at 1. The loss is the mean cross-entropy over assistant
tokens (the chat template's `{% generation %}` spans: each assistant turn's text, tool calls and its
`<|im_end|>`). Batches hold chats of similar length up to `batch_tokens` tokens, padding included, so short
chats are not padded to the longest one; batch order is shuffled with the run's seed.

Shared prefix (`share_prefix`, on by default): the chats of a batch usually open with the same system
prompt and tools (a third of a storefront demonstration), which nothing trains. The batch's longest common
untrained opening runs through the model once, its keys/values are repeated for every row (gradients flow
back from every row), and only the rest runs per row: the same loss and gradients up to float rounding,
1.35x the tokens/s on storefront demonstrations (bench/sft_step.py).

Logged: about 100 rows per run (`log`, saved in sft_info.json: step, loss, token accuracy, lr, seconds, tokens/s),
each also sent to the trackers of `report_to` (train/tracking.py) under the names of TRACKED_SCALARS, at the
row's step (0-based optimizer step); TensorBoard's event files go to <out>/tb/.

Checked before the model loads (exit 2, one line): --out is a folder that can be created and is not --model
(the trained model would replace the one it starts from), --model is a model folder, --data holds chat records
(each message an object with a string role, tools a list of schemas), the numbers are finite.
The model is saved when training ends, staged and then moved into --out; Ctrl-C (exit 130) leaves --out as it
was. It does not resume: run the command again.

Why not TRL's SFTTrainer: on this 2-core machine the same data trained 1.5x faster with this loop (length-
grouped, token-budget batches; measured ~6,900 vs ~4,600 tokens/s, ../shared/design/CPU-DEMO-SIZING.md), and
the base agent's SFT is the longest step of the demo. TRL also needs the records pre-tokenized (passing raw
`messages`/`tools` through `datasets` adds null keys to the tool schemas and changes the rendered prompt), so
its remaining value here would be the training loop itself, which is ~40 lines below.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch
from tqdm import tqdm

from common.cli import Interrupted, cli_entry, exit_code
from common.io import atomic_write_json, check_model_folder, load_jsonl, publish_staged, staging_folder, tensor_bytes
from common.validation import InputError, check_number
from common.run_folder import add_overwrite_flag, check_output_dir, claimed_run_folder, follow_umask, sigint_deferred
from train.logprobs import logits_after_prefix
from train.tracking import MetricLogger, check_report_to, open_trackers, require_trackers, scalars_of

INFO_FILE = "sft_info.json"
# The `log` rows' keys as tracker scalars (tracker name -> key), named as GRPO's where they mean the same
TRACKED_SCALARS = {"loss": "loss", "accuracy/token": "token_accuracy", "lr": "lr", "tokens_per_s/train": "tokens_per_s"}


@dataclass
class SFTConfig:
    epochs: float = 1.0  # passes over the data (a fraction stops part-way)
    lr: float = 2e-3  # peak learning rate
    warmup_steps: int = 50
    final_lr_ratio: float = 0.1  # the cosine decay ends at lr * final_lr_ratio
    batch_tokens: int = 8192  # padded tokens per batch
    max_grad_norm: float = 1.0
    seed: int = 0
    share_prefix: bool = True  # run a batch's common untrained opening once (module docstring)
    report_to: list[str] = field(default_factory=list)  # trackers (train/tracking.py), e.g. [tensorboard]

    def __post_init__(self) -> None:
        self.report_to = check_report_to(self.report_to, "SFTConfig.report_to")
        # Finite as well as positive: --epochs inf would fail computing the step count after the model loaded, and
        # --lr inf would train to non-finite weights and save them as if all went well.
        for name in ("epochs", "lr"):
            check_number(getattr(self, name), f"SFTConfig.{name}", 0, low_open=True)
        check_number(self.final_lr_ratio, "SFTConfig.final_lr_ratio", 0, 1)
        for name in ("warmup_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"SFTConfig.{name} must be an int >= 0, got {value!r}")
        if isinstance(self.batch_tokens, bool) or not isinstance(self.batch_tokens, int) or self.batch_tokens < 64:
            raise InputError(f"SFTConfig.batch_tokens must be an int >= 64 (e.g. 8192), got {self.batch_tokens!r}")
        if not isinstance(self.share_prefix, bool):
            raise InputError(f"SFTConfig.share_prefix must be true or false, got {self.share_prefix!r}")
        check_number(self.max_grad_norm, "SFTConfig.max_grad_norm", 0, low_open=True)


class TokenizedChat(NamedTuple):
    input_ids: list[int]
    assistant_mask: list[int]  # 1 where the token is trained


class Batch(NamedTuple):
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], -100 outside assistant tokens and on padding
    # Leading columns every row shares, none of them (nor the token after them) trained: run once (0: none).
    prefix_len: int = 0


# A shared opening shorter than this runs per row: a separate pass for a few tokens costs more than it saves.
MIN_SHARED_PREFIX = 32


def tokenize_chats(tokenizer: Any, records: Sequence[dict[str, Any]], progress: bool = True) -> list[TokenizedChat]:
    """Each record's messages and tools through the tokenizer's chat template, with the assistant mask."""
    out = []
    for number, record in enumerate(tqdm(records, desc="tokenize", unit="chat", file=sys.stderr,
                                         disable=not progress or len(records) < 200)):
        encoded = tokenizer.apply_chat_template(
            record["messages"], tools=record.get("tools") or None, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )
        mask = list(encoded["assistant_masks"])
        if not any(mask):
            raise InputError(f"record {number}: no assistant tokens (does the chat template mark "
                             "{% generation %} spans, and does the chat have an assistant turn?)")
        out.append(TokenizedChat(list(encoded["input_ids"]), mask))
    return out


def shared_prefix_len(chats: Sequence[TokenizedChat]) -> int:
    """Leading tokens every chat shares such that no chat trains on them or on the token right after them
    (position t's output predicts token t + 1, so the last shared position's output must be untrained too)."""
    first = chats[0].input_ids
    common = len(first)
    for chat in chats[1:]:
        ids = chat.input_ids
        n = min(common, len(ids))
        common = next((i for i in range(n) if ids[i] != first[i]), n)
    first_trained = min(chat.assistant_mask.index(1) for chat in chats)
    length = min(common, first_trained - 1)
    return length if length >= MIN_SHARED_PREFIX and len(chats) > 1 else 0


def make_batches(chats: Sequence[TokenizedChat], batch_tokens: int, pad_id: int, rng: random.Random,
                 share_prefix: bool = False) -> list[Batch]:
    """Length-grouped batches of at most `batch_tokens` padded tokens, in shuffled order (with `share_prefix`,
    each records the opening its chats share: `shared_prefix_len`)."""
    order = sorted(range(len(chats)), key=lambda i: (len(chats[i].input_ids), rng.random()))
    groups: list[list[int]] = []
    for index in order:
        group = groups[-1] if groups else None
        # Sorted by length, so the chat being added is the longest of its group.
        if group is None or (len(group) + 1) * len(chats[index].input_ids) > batch_tokens:
            groups.append([index])
        else:
            group.append(index)
    rng.shuffle(groups)
    batches = []
    for group in groups:
        longest = max(len(chats[i].input_ids) for i in group)
        input_ids = torch.full((len(group), longest), pad_id, dtype=torch.long)  # [B, T]
        attention_mask = torch.zeros((len(group), longest), dtype=torch.long)  # [B, T]
        labels = torch.full((len(group), longest), -100, dtype=torch.long)  # [B, T]
        for row, index in enumerate(group):
            ids, mask = chats[index]
            n = len(ids)
            input_ids[row, :n] = torch.tensor(ids)
            attention_mask[row, :n] = 1
            labels[row, :n] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(ids), -100)
        prefix_len = shared_prefix_len([chats[i] for i in group]) if share_prefix else 0
        batches.append(Batch(input_ids, attention_mask, labels, prefix_len))
    return batches


def lr_at(step: int, total_steps: int, config: SFTConfig) -> float:
    """Linear warm-up to the peak, then cosine decay to peak * final_lr_ratio at `total_steps`."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    return config.lr * (config.final_lr_ratio + (1 - config.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int, int]:
    """(mean loss over trained tokens, trained tokens, correctly predicted trained tokens)."""
    shared = batch.prefix_len
    if shared:  # the opening once, its keys/values repeated for every row; only the rest runs per row
        _, logits = logits_after_prefix(model, batch.input_ids[0, :shared], batch.input_ids[:, shared:],
                                        batch.attention_mask[:, shared:])  # [B, T-S, V]
    else:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [B, T, V]
    # Position t predicts token t+1; the opening's outputs predict untrained tokens only (shared_prefix_len).
    shifted_logits = logits[:, :-1, :]  # [B, T-S-1, V]
    targets = batch.labels[:, shared + 1 :]  # [B, T-S-1]
    loss = torch.nn.functional.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.size(-1)).float(), targets.reshape(-1), ignore_index=-100
    )
    trained = targets != -100
    correct = int(((shifted_logits.argmax(-1) == targets) & trained).sum())
    return loss, int(trained.sum()), correct


def train_sft(model: torch.nn.Module, chats: Sequence[TokenizedChat], config: SFTConfig, pad_id: int,
              progress: bool = True, log: list[dict[str, Any]] | None = None,
              tracker: MetricLogger | None = None) -> dict[str, Any]:
    """Train `model` in place; returns figures (steps, tokens, seconds, tokens/s, last losses). About 100 rows go
    to `log` and `tracker` (the caller opens and closes it: `open_trackers(config.report_to, ...)`)."""
    if not chats:
        raise InputError("no demonstrations to train on")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    epoch_batches = make_batches(chats, config.batch_tokens, pad_id, rng, config.share_prefix)
    total_steps = max(1, math.ceil(len(epoch_batches) * config.epochs))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                  betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    started, tokens, window = time.time(), 0, []
    bar = tqdm(total=total_steps, desc="sft", unit="step", file=sys.stderr, disable=not progress)
    batches: list[Batch] = []
    for step in range(total_steps):
        if not batches:  # a new epoch: regroup with fresh randomness
            batches = (list(epoch_batches) if step == 0
                       else make_batches(chats, config.batch_tokens, pad_id, rng, config.share_prefix))
        batch = batches.pop()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total_steps, config)
        loss, n_trained, n_correct = batch_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        tokens += int(batch.attention_mask.sum())
        window = (window + [(loss.item(), n_correct / max(1, n_trained))])[-50:]
        if (log is not None or tracker) and (step % max(1, total_steps // 100) == 0 or step + 1 == total_steps):
            elapsed = time.time() - started
            row = {"step": step, "loss": window[-1][0], "token_accuracy": n_correct / max(1, n_trained),
                   "lr": optimizer.param_groups[0]["lr"], "seconds": round(elapsed, 1),
                   "tokens_per_s": round(tokens / max(elapsed, 1e-9), 1)}
            if log is not None:
                log.append(row)
            if tracker:
                tracker.log_scalars(scalars_of(row, TRACKED_SCALARS), step=step)
        bar.set_postfix(loss=f"{sum(w[0] for w in window) / len(window):.3f}",
                        acc=f"{sum(w[1] for w in window) / len(window):.3f}")
        bar.update(1)
    bar.close()
    model.eval()
    seconds = time.time() - started
    return {"steps": total_steps, "tokens": tokens, "seconds": round(seconds, 1),
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
            "final_loss": sum(w[0] for w in window) / len(window),
            "final_token_accuracy": sum(w[1] for w in window) / len(window)}


def check_records(records: Sequence[Any], data: str) -> None:
    """InputError unless `records` are chat records (a `messages` list each), e.g. benchmarks.storefront.demos'."""
    if not records:
        raise InputError(f"--data {data}: no records; give chat demonstrations, one JSON object {{messages, tools}} per "
                         "line (e.g. python -m benchmarks.storefront.demos writes them)")
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            keys = sorted(record)[:6] if isinstance(record, dict) else type(record).__name__
            raise InputError(f"--data {data}: record {number} has no `messages` list (it has {keys}); --data takes "
                             "chat records {messages, tools}, one per line")
        check_record_shape(record, f"--data {data}: record {number}")


def check_record_shape(record: dict[str, Any], where: str) -> None:
    """InputError unless each message is an object with a string `role` and `tools`, when given, is a list of
    objects (tool schemas): the chat template refuses anything else only after the model has loaded."""
    for index, message in enumerate(record["messages"]):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f"{where}: messages[{index}] must be an object with a string 'role' (e.g. "
                             f'{{"role": "user", "content": "..."}}), got {message!r:.80}')
    tools = record.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        raise InputError(f"{where}: tools must be a list of tool schemas (JSON objects), got {tools!r:.80}")


def save_model(model: Any, tokenizer: Any, out: Path, info: dict[str, Any]) -> None:
    """Model, tokenizer and sft_info.json into `out`: staged beside it, then moved in file by file while Ctrl-C waits,
    so `out` holds the previous files or this run's, not half of a model."""
    out.mkdir(parents=True, exist_ok=True)
    with staging_folder(out, ".sft-", tensor_bytes(model.parameters()),
                        "the model files there are unchanged") as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        follow_umask(staging)  # safetensors writes 0600 files
        with sigint_deferred():
            publish_staged(staging, out)
            atomic_write_json(out / INFO_FILE, info)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.sft", description=__doc__.split("\n\n")[0])
    defaults = SFTConfig()
    parser.add_argument("--model", required=True, help="model folder (transformers) to start from")
    parser.add_argument("--data", required=True, help="JSONL chat records {messages, tools}")
    parser.add_argument("--out", required=True, help="folder to save the trained model and tokenizer (not --model)")
    add_overwrite_flag(parser)
    for name, value in asdict(defaults).items():
        if isinstance(value, bool):  # --share-prefix / --no-share-prefix
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=value)
        elif name == "report_to":  # TRL's spelling, and the dashed one of this CLI's other flags
            parser.add_argument("--report_to", "--report-to", default="", dest="report_to",
                                help="trackers, comma-separated: tensorboard, wandb, trackio, mlflow, or none")
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    config = SFTConfig(**{k: getattr(args, k) for k in asdict(defaults)})
    out = check_output_dir(args.out, "--out", inputs=[("--model", args.model)])
    records = load_jsonl(args.data)
    check_records(records, args.data)
    require_trackers(config.report_to)  # a missing package stops the run before the model loads
    check_model_folder(args.model, "--model")
    # One folder, one run: a second process is refused, another run's model is replaced only with --overwrite.
    with claimed_run_folder(out, "--out", fresh=True, overwrite=args.overwrite, restore_on_failure=True):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log: list[dict[str, Any]] = []
        try:
            try:
                tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32)
            except OSError as err:
                raise InputError(f"--model {args.model}: cannot load the model ({err})") from None
            try:
                chats = tokenize_chats(tokenizer, records)
            except InputError as err:
                raise InputError(f"{args.data}: {err}") from None
            tracker = open_trackers(config.report_to, out, kind="sft", first_step=0,  # rows start at step 0
                                    config={**asdict(config), "model": str(args.model), "data": str(args.data)})
            try:
                figures = train_sft(model, chats, config, tokenizer.pad_token_id, log=log, tracker=tracker)
            finally:
                tracker.close()
            save_model(model, tokenizer, out, {"config": asdict(config), "base_model": str(args.model),
                                               "data": str(args.data), "n_chats": len(chats), **figures, "log": log})
        except KeyboardInterrupt:
            raise Interrupted(f"nothing saved to {out} (train.sft does not resume): run the same command again") from None
    print(f"train.sft: {figures['steps']} steps, {figures['tokens_per_s']:.0f} tokens/s, "
          f"loss {figures['final_loss']:.3f}, token accuracy {figures['final_token_accuracy']:.3f} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
