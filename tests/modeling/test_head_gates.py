"""Head gates: ones change nothing, a zero gate is the pruned head, a per-sequence gate touches its sequence
only, in every layout the fused attention returns (padded, unpadded, first token only)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertForSequenceClassification, BertForTokenClassification

from bert_tasks.errors import BertTasksError
from bert_tasks.modeling.head_gates import gated_heads, self_attentions
from bert_tasks.modeling.patch import patch_bert
from tests.helpers import tiny_bert_config

HEADS = (BertForSequenceClassification, BertForTokenClassification)


def tiny(head: type) -> torch.nn.Module:
    torch.manual_seed(0)
    return patch_bert(head(tiny_bert_config(num_labels=3))).eval()


def gates(model: torch.nn.Module, *rows: int) -> list[torch.Tensor]:
    return [torch.ones(*rows, a.num_attention_heads) for a in self_attentions(model)]


@pytest.mark.parametrize("head", HEADS)
def test_gates_of_one_change_nothing_and_leave_no_hook(head: type, padded_batch) -> None:
    model = tiny(head)
    with torch.no_grad():
        plain = model(**padded_batch).logits
        with gated_heads(model, gates(model)):
            shared = model(**padded_batch).logits
        with gated_heads(model, gates(model, 3)):
            per_sequence = model(**padded_batch).logits
    torch.testing.assert_close(shared, plain, atol=0, rtol=0)
    torch.testing.assert_close(per_sequence, plain, atol=0, rtol=0)
    assert all(not a._forward_hooks for a in self_attentions(model))


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("padded", [True, False], ids=["unpadded path", "no padding"])
def test_a_zero_gate_is_the_pruned_head(head: type, padded: bool, padded_batch) -> None:
    """Pruning a head computes what the unpruned model computes with that head's gate at 0."""
    model = tiny(head)
    batch = padded_batch if padded else {"input_ids": padded_batch["input_ids"][:1, :3]}
    pruned = copy.deepcopy(model)
    pruned.prune_heads({0: [1], 1: [0, 3]})
    masked = gates(model)
    masked[0][1] = masked[1][0] = masked[1][3] = 0.0
    with torch.no_grad():
        with gated_heads(model, masked):
            want = model(**batch).logits
        found = pruned(**batch).logits
    real = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    if found.dim() == 3:
        want, found = want[real], found[real]
    torch.testing.assert_close(found, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("head", HEADS)
def test_a_gate_per_sequence_touches_its_own_sequence_only(head: type, padded_batch) -> None:
    """Row b of a [B, H] gate reaches sequence b alone: a summed loss's gradient in row b is b's own."""
    model = tiny(head)
    per_sequence = gates(model, 3)
    per_sequence[1][2, 0] = 0.0  # layer 1, sequence 2, head 0
    alone = gates(model)
    alone[1][0] = 0.0
    with torch.no_grad():
        plain = model(**padded_batch).logits
        with gated_heads(model, per_sequence):
            mixed = model(**padded_batch).logits
        with gated_heads(model, alone):
            all_masked = model(**padded_batch).logits
    torch.testing.assert_close(mixed[:2], plain[:2], atol=0, rtol=0)
    real = padded_batch["attention_mask"][2].bool()
    third = [logits[2] if logits.dim() == 2 else logits[2][real] for logits in (mixed, all_masked, plain)]
    torch.testing.assert_close(third[0], third[1], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(third[0], third[2]), "the gate changed nothing"


@pytest.mark.parametrize("head", HEADS)
def test_gates_per_sequence_fit_bucketed_rows(head: type, padded_batch) -> None:
    """bf16 inference packs zero rows after the real tokens (`unpad.packed_rows`): they take no gate."""
    model = tiny(head)
    masked = gates(model, 3)
    masked[1][2, 0] = 0.0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(**padded_batch).logits
        with gated_heads(model, masked):
            gated = model(**padded_batch).logits
    torch.testing.assert_close(gated[:2], plain[:2], atol=0, rtol=0)
    assert not torch.equal(gated[2], plain[2])


def test_gates_must_fit_the_heads() -> None:
    model = tiny(BertForSequenceClassification)
    model.prune_heads({0: [0]})
    wrong_size = gated_heads(model, [torch.ones(4), torch.ones(4)])
    with pytest.raises(BertTasksError, match=r"layer 0 has 3 heads, its gate is \[4\]"), wrong_size:
        pass
    with (
        pytest.raises(BertTasksError, match="1 gate tensors for 2 layers"),
        gated_heads(model, [torch.ones(3)]),
    ):
        pass
    assert all(not a._forward_hooks for a in self_attentions(model))
    with pytest.raises(BertTasksError, match="call patch_bert"):
        self_attentions(BertForSequenceClassification(tiny_bert_config()))
