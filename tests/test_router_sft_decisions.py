"""Router SFT trains the gate where it decides a token: position p's routed forward pass predicts token p + 1, so an
assistant token's label belongs to the position before it (the assistant header's last token for a reply's first
token), as the demo measured when the header was left untrained (train/train_router_sft.py, `decided_labels`)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moe_gate import build_capability_model
from moe_gate.smoke_test import make_adapters, make_tiny_base
from train.train_router_sft import IGNORE, LabeledSequence, collate, decided_labels, deciding_positions, router_loss


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    adapters = make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)
    torch.manual_seed(0)
    built = build_capability_model(make_tiny_base(), adapters, mode="token")
    with torch.no_grad():  # gates that disagree from position to position, so the positions matter
        for parameter in built.gate_parameters():
            parameter.normal_(0.0, 1.0)
    return built


def test_a_labeled_tokens_decision_is_the_position_before_it():
    labels = torch.tensor([[IGNORE, IGNORE, 2, 1, IGNORE, 0]])
    assert decided_labels(labels).tolist() == [[IGNORE, 2, 1, IGNORE, 0, IGNORE]]
    assert deciding_positions([0, 0, 1, 1, 0, 1]) == [0, 1, 1, 0, 1, 0]


@pytest.mark.parametrize("rewards", [None, [0.0, 1.0, 0.5]])
def test_router_loss_is_the_gate_logits_at_the_deciding_positions_against_the_next_tokens_labels(model, rewards):
    tokens = [3, 5, 7, 2, 4, 6, 5, 3]
    labels = [IGNORE, IGNORE, IGNORE, 2, 2, 1, IGNORE, IGNORE]  # assistant tokens 3..5: decided at 2..4
    batch = collate([LabeledSequence(tokens, labels, rewards)], 0, torch.device("cpu"))
    _, stats = router_loss(model, batch, 0.0)
    with torch.no_grad(), model.record_routing(keep_logits=True) as record:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    deciding = [e.logits[0, 2:5].float() for e in record.events]  # per layer [3, S]
    if rewards is None:
        expected = sum(F.cross_entropy(logits, torch.tensor([2, 2, 1])) for logits in deciding) / len(deciding)
        assert stats["tokens"] == 3
    else:
        target = torch.tensor([rewards] * 3)
        expected = sum(F.binary_cross_entropy_with_logits(logits, target) for logits in deciding) / len(deciding)
    assert stats["cross_entropy"] == pytest.approx(float(expected), rel=1e-5)
