"""Teacher-forced copying: does the model put the right value where an expert copies one from the conversation?

    python bench/copy_probe.py [--model assets/demo_base_agent] [--config configs/demo.yaml]
        [--demonstrations 150] [--kinds return exchange cancel] [--seed 424242] [--out bench_out/copy_probe.json]

Fresh expert demonstrations (no planted flaw; the demo's storefront, one request kind at a time) are run through
the model once each, teacher-forced, and at every token of every *copied value* of an assistant turn the model's
most likely next token is compared with the expert's. A copied value (a slot):
  - `<tool>.<argument>`: a string argument of a tool call (or an element of a list argument) that appears verbatim
    in an earlier user or tool message (the email, zip and order id a look-up copies; the item ids and payment
    method a write copies from the order's details);
  - `text.item_name`: an item name in the assistant's text that an earlier order look-up listed (the items a
    confirmation names, which the user asked for).
Printed per slot: values, token accuracy and value accuracy (every token of the value right); last line
`min_write_value_accuracy=X`: the lowest value accuracy of a write tool's slot (what an action needs copied).

Why: the demo's base agent never gets a return or an exchange right (README "Results": 0 of 34 returns greedy),
and its failed episodes write item ids that are in no message of the conversation. This bench says, in a minute,
which copies a model has learned, so a new base-agent recipe is judged before a 27-minute demo run.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, check_model_folder, check_output_path
from common.paths import REPO_ROOT
from common.validation import InputError, check_int

KINDS = ("return", "exchange", "cancel")
TEXT_SLOT = "text.item_name"


class CopySlot(NamedTuple):
    slot: str  # "<tool>.<argument>" or TEXT_SLOT
    value: str
    positions: tuple[int, ...]  # token positions of the value in the rendered chat (each predicted at position - 1)


def _rendered_prefixes(tokenizer: Any, record: dict[str, Any]) -> list[str]:
    """The chat template's text of messages[:i] for i = 0..len(messages); each a prefix of the next."""
    messages, tools = record["messages"], record.get("tools") or None
    texts = [""] + [tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
                    for i in range(len(messages))]
    for i in range(1, len(texts)):
        if not texts[i].startswith(texts[i - 1]):
            raise InputError(f"the chat template is not prefix-stable at message {i - 1}: messages cannot be located "
                             "in the rendered chat")
    return texts


def _order_item_names(tool_content: str) -> set[str]:
    """The item names an order look-up's answer lists (none for any other tool answer)."""
    if not tool_content.startswith("{"):
        return set()
    try:
        shown = json.loads(tool_content)
    except json.JSONDecodeError:  # a tool's plain-text answer that happens to start with "{"
        return set()
    if not isinstance(shown, dict):
        return set()
    return {item["name"] for item in shown.get("items") or [] if isinstance(item, dict)}


def copy_slots(tokenizer: Any, record: dict[str, Any]) -> tuple[list[int], list[CopySlot]]:
    """(the rendered chat's token ids, its copied values with their token positions)."""
    texts = _rendered_prefixes(tokenizer, record)
    full = texts[-1]
    encoded = tokenizer(full, return_offsets_mapping=True, add_special_tokens=False)
    offsets = encoded["offset_mapping"]
    slots: list[CopySlot] = []

    def positions(start: int, end: int) -> tuple[int, ...]:  # tokens overlapping the value's characters
        return tuple(t for t, (s, e) in enumerate(offsets) if s < end and e > start and t > 0)

    seen: list[str] = []  # the user and tool messages so far
    item_names: set[str] = set()  # the item names order look-ups listed so far
    for i, message in enumerate(record["messages"]):
        if message["role"] in ("user", "tool"):
            seen.append(message.get("content") or "")
            if message["role"] == "tool":
                item_names |= _order_item_names(seen[-1])
            continue
        if message["role"] != "assistant":
            continue
        region_start, region_end = len(texts[i]), len(texts[i + 1])
        earlier = "\n".join(seen)
        cursor = region_start
        for call in message.get("tool_calls") or []:
            for argument, value in (call.get("arguments") or {}).items():
                for element in (value if isinstance(value, list) else [value]):
                    if not isinstance(element, str) or len(element) < 2:
                        continue
                    at = full.find(element, cursor, region_end)
                    if at < 0:
                        continue
                    cursor = at + len(element)
                    if element in earlier:
                        slots.append(CopySlot(f"{call['name']}.{argument}", element, positions(at, cursor)))
        content = message.get("content") or ""
        if content and item_names:
            at = full.find(content, region_start, region_end)
            for name in item_names:
                for match in re.finditer(rf"\b{re.escape(name)}\b", content):
                    start = at + match.start()
                    slots.append(CopySlot(TEXT_SLOT, name, positions(start, start + len(name))))
    return list(encoded["input_ids"]), [slot for slot in slots if slot.positions]


def score(records: Sequence[dict[str, Any]], tokenizer: Any,
          next_tokens: Callable[[list[int]], Sequence[int]]) -> dict[str, dict[str, float]]:
    """Per slot: values, tokens, token and value accuracy; `next_tokens(ids)[t]` is the model's guess for ids[t+1]."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # values, values right, tokens, tokens right
    for record in records:
        ids, slots = copy_slots(tokenizer, record)
        if not slots:
            continue
        guesses = next_tokens(ids)
        for slot in slots:
            right = [guesses[t - 1] == ids[t] for t in slot.positions]
            entry = counts[slot.slot]
            entry[0] += 1
            entry[1] += all(right)
            entry[2] += len(right)
            entry[3] += sum(right)
    return {name: {"values": v, "value_accuracy": vr / v, "tokens": t, "token_accuracy": tr / t}
            for name, (v, vr, t, tr) in sorted(counts.items())}


def model_next_tokens(model: Any) -> Callable[[list[int]], list[int]]:
    """The model's argmax next token at every position of one chat (one forward pass, no gradient)."""
    import torch

    def guess(ids: list[int]) -> list[int]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # [T, V]
        return logits.argmax(-1).tolist()
    return guess


def demonstrations(config: Any, kind: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` flawless expert demonstrations of `kind` requests on `config`'s storefront (one request each)."""
    import dataclasses

    from benchmarks.storefront.demos import make_demonstrations

    storefront = dataclasses.replace(config, kind_weights={kind: 1.0})
    return make_demonstrations(n, seed, storefront, {}, progress=False)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "assets" / "demo_base_agent"))
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--demonstrations", type=int, default=150, help="per request kind")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--seed", type=int, default=424242, help="demonstration seed (the base agent's are 0 and 1)")
    parser.add_argument("--out", default="bench_out/copy_probe.json")
    args = parser.parse_args(argv)
    check_int(args.demonstrations, "--demonstrations", 1)
    check_int(args.seed, "--seed", 0)
    check_output_path(args.out, "--out", [("--model", args.model), ("--config", args.config)])
    check_model_folder(args.model, "--model")
    from demo.config import load_demo_config
    config = load_demo_config(args.config)
    storefront = config.storefront_config(REPO_ROOT)

    import torch

    from train.policy import load_base_model

    started = time.perf_counter()
    model, tokenizer = load_base_model(args.model, "float32", torch.device("cpu"))
    model.eval()
    guess = model_next_tokens(model)
    results: dict[str, Any] = {"model": args.model, "config": args.config, "demonstrations": args.demonstrations,
                               "seed": args.seed, "kinds": {}}
    for kind in args.kinds:
        figures = score(demonstrations(storefront, kind, args.demonstrations, args.seed), tokenizer, guess)
        results["kinds"][kind] = figures
        print(f"{kind} ({args.demonstrations} demonstrations):", flush=True)
        for slot, f in figures.items():
            print(f"  {slot:52s} values {f['values']:4d}  token accuracy {f['token_accuracy']:.3f}  "
                  f"value accuracy {f['value_accuracy']:.3f}", flush=True)
    from benchmarks.storefront.tools import StorefrontTools

    writes = StorefrontTools.write_tools()
    write_figures = [f["value_accuracy"] for figures in results["kinds"].values() for slot, f in figures.items()
                     if slot.split(".")[0] in writes]
    results["min_write_value_accuracy"] = min(write_figures) if write_figures else None
    results["seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_json(Path(args.out), results)
    print(f"seconds {results['seconds']} (wrote {args.out})", flush=True)
    shown = "n/a" if results["min_write_value_accuracy"] is None else f"{results['min_write_value_accuracy']:.3f}"
    print(f"min_write_value_accuracy={shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
