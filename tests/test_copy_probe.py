"""bench/copy_probe.py: the copied values it finds, where their tokens are, and how it scores a model's guesses."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "assets" / "demo_base_agent"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("bench_copy_probe", REPO / "bench" / "copy_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SHIPPED), local_files_only=True)


@pytest.fixture(scope="module")
def returns(probe):
    from demo.config import load_demo_config

    storefront = load_demo_config(str(REPO / "configs" / "demo.yaml")).storefront_config(REPO)
    return probe.demonstrations(storefront, "return", 6, 5)


def test_slots_are_the_values_the_expert_copies(probe, tokenizer, returns):
    found = set()
    for record in returns:
        ids, slots = probe.copy_slots(tokenizer, record)
        for slot in slots:
            found.add(slot.slot)
            # the slot's tokens spell the value (a space or quote may ride on its first or last token), no fewer do
            spelled = tokenizer.decode([ids[t] for t in slot.positions]).strip().strip('"')
            assert spelled == slot.value, (slot, spelled)
            assert list(slot.positions) == list(range(slot.positions[0], slot.positions[-1] + 1))
            assert slot.value not in tokenizer.decode([ids[t] for t in slot.positions[1:]])
            assert slot.value not in tokenizer.decode([ids[t] for t in slot.positions[:-1]])
        calls = [c for m in record["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        writes = [c for c in calls if c["name"] == "return_delivered_order_items"]
        for write in writes:  # every item id the expert writes is a slot of that write
            item_slots = [s.value for s in slots if s.slot == "return_delivered_order_items.item_ids"]
            assert item_slots == write["arguments"]["item_ids"]
    assert {"return_delivered_order_items.item_ids", "return_delivered_order_items.payment_method_id",
            "get_order_details.order_id", probe.TEXT_SLOT} <= found
    assert not any(name.startswith("cancel") for name in found)


def test_score_aligns_guesses_with_the_next_token(probe, tokenizer, returns):
    oracle = lambda ids: ids[1:] + [0]  # noqa: E731  the true next token everywhere
    perfect = probe.score(returns, tokenizer, oracle)
    assert perfect and all(f["token_accuracy"] == 1.0 and f["value_accuracy"] == 1.0 for f in perfect.values())
    late = probe.score(returns, tokenizer, lambda ids: ids)  # off by one: repeats the current token
    assert all(f["value_accuracy"] < 1.0 for f in late.values())

    # Wrong exactly at the item ids of the writes: only that slot falls, to 0.
    slots = {tuple(ids): found for ids, found in (probe.copy_slots(tokenizer, r) for r in returns)}

    def wrong_at_item_ids(ids):
        guesses = oracle(ids)
        for slot in slots[tuple(ids)]:
            if slot.slot == "return_delivered_order_items.item_ids":
                for t in slot.positions:
                    guesses[t - 1] = -1
        return guesses
    figures = probe.score(returns, tokenizer, wrong_at_item_ids)
    assert figures["return_delivered_order_items.item_ids"]["value_accuracy"] == 0.0
    assert all(f["value_accuracy"] == 1.0 for name, f in figures.items()
               if name != "return_delivered_order_items.item_ids")


def test_runs_on_a_model_and_writes_its_figures(probe, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "copy.json"
    assert probe.main(["--model", str(tiny_model_dir), "--demonstrations", "2", "--kinds", "cancel",
                       "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert set(written["kinds"]) == {"cancel"}
    assert "cancel_pending_order.order_id" in written["kinds"]["cancel"]
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"min_write_value_accuracy={written['min_write_value_accuracy']:.3f}"
    cancel = written["kinds"]["cancel"]
    assert written["min_write_value_accuracy"] == min(f["value_accuracy"] for slot, f in cancel.items()
                                                      if slot.startswith("cancel_pending_order."))
