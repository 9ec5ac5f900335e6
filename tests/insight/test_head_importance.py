"""Head importance (Michel et al. 2019): an irrelevant head scores 0 and is pruned first, the expectation is
over windows (not batches), a pruned model's scores are the masked model's, and the per-layer L2 norm."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import BertForSequenceClassification, BertForTokenClassification

from bert_tasks.insight.head_importance import head_importance, normalise_per_layer
from bert_tasks.modeling.head_gates import gated_heads
from bert_tasks.modeling.patch import patch_bert
from bert_tasks.pruning.plan import choose_heads
from bert_tasks.tasks.sentiment import SentimentTask
from bert_tasks.training.objectives import window_cross_entropy
from tests.helpers import tiny_bert_config

HEADS = (BertForSequenceClassification, BertForTokenClassification)


def tiny(head: type) -> torch.nn.Module:
    torch.manual_seed(0)
    return patch_bert(head(tiny_bert_config(num_labels=3)))


def labelled(head: type, padded_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The padded batch with gold labels: one per sequence, or one per real token (-100 at padding)."""
    generator = torch.Generator().manual_seed(1)
    mask = padded_batch["attention_mask"]
    if head is BertForSequenceClassification:
        labels = torch.randint(0, 3, (mask.shape[0],), generator=generator)
    else:
        labels = torch.randint(0, 3, mask.shape, generator=generator).masked_fill(mask == 0, -100)
    return {**padded_batch, "labels": labels}


def silence(model: torch.nn.Module, layer: int, head: int) -> None:
    """Zero one head's value slice of the fused qkv: its context, hence its output, is 0 for every input."""
    attention = model.base_model.encoder.layer[layer].attention.self
    size, width = attention.attention_head_size, attention.all_head_size
    rows = slice(2 * width + head * size, 2 * width + (head + 1) * size)
    with torch.no_grad():
        attention.qkv.weight[rows] = 0.0
        attention.qkv.bias[rows] = 0.0


@pytest.mark.parametrize("head", HEADS)
def test_an_irrelevant_head_scores_zero_and_is_pruned_first(head: type, padded_batch) -> None:
    model = tiny(head)
    silence(model, 1, 2)
    importance = head_importance(model, [labelled(head, padded_batch)])  # [L, H]
    assert importance.shape == (2, 4)
    assert importance[1, 2] == 0.0
    others = np.delete(importance.flatten(), 1 * 4 + 2)
    assert (others > 0).all(), importance
    assert choose_heads(normalise_per_layer(importance), 1) == {1: [2]}
    assert all(p.grad is None for p in model.parameters()), "the weights get no gradients"


@pytest.mark.parametrize("head", HEADS)
def test_the_expectation_is_over_windows_whatever_the_batches(head: type, padded_batch) -> None:
    """|dL/dgate| per window, averaged: one batch of three and three batches of one agree."""
    model = tiny(head)
    batch = labelled(head, padded_batch)
    whole = head_importance(model, [batch])
    singles = [{key: value[i : i + 1] for key, value in batch.items()} for i in range(3)]
    for single in singles:  # each alone, trimmed to its own tokens, as a length-sorted loader batches it
        length = int(single["attention_mask"].sum())
        for key in ("input_ids", "attention_mask", *(["labels"] if single["labels"].dim() == 2 else [])):
            single[key] = single[key][:, :length]
    np.testing.assert_allclose(head_importance(model, singles), whole, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("head", HEADS)
def test_a_pruned_models_scores_are_the_masked_models(head: type, padded_batch) -> None:
    """Original numbering, NaN where pruned; the rest is the unpruned model's with those heads gated to 0."""
    model = tiny(head)
    batch = labelled(head, padded_batch)
    pruned = copy.deepcopy(model)
    pruned.prune_heads({0: [1, 3]})
    found = head_importance(pruned, [batch])
    mask = [torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.ones(4)]
    with gated_heads(model, mask):
        want = head_importance(model, [batch])
    assert np.isnan(found[0, [1, 3]]).all()
    assert (want[0, [1, 3]] == 0).all()
    want[0, [1, 3]] = np.nan
    np.testing.assert_allclose(found, want, rtol=1e-4, atol=1e-7)


def test_window_losses_are_the_heads_own_loss(padded_batch) -> None:
    for head in HEADS:
        model = tiny(head).eval()
        batch = labelled(head, padded_batch)
        with torch.no_grad():
            output = model(**batch)
        losses = window_cross_entropy(output.logits, batch["labels"])  # [B]
        if head is BertForSequenceClassification:
            torch.testing.assert_close(losses.mean(), output.loss)
        else:  # the head averages over every labelled token of the batch; one window alone is its loss
            one = {key: value[:1] for key, value in batch.items()}
            with torch.no_grad():
                alone = model(**one)
            torch.testing.assert_close(window_cross_entropy(alone.logits, one["labels"])[0], alone.loss)
            torch.testing.assert_close(losses[0], alone.loss, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("options", "problem", "labels"),
    [
        ({"multi_label": True}, "multi_label_classification", 3),
        ({"regression": True}, "regression", 1),
    ],
)
def test_each_shapes_window_losses_are_its_heads_own_loss(
    options: dict[str, bool], problem: str, labels: int, padded_batch
) -> None:
    """Multi-label (BCE on multi-hot rows) and regression (MSE on values): their labels are no class ids."""
    torch.manual_seed(0)
    model = patch_bert(
        BertForSequenceClassification(tiny_bert_config(num_labels=labels, problem_type=problem))
    ).eval()
    rows = padded_batch["input_ids"].shape[0]
    generator = torch.Generator().manual_seed(1)
    multi_hot = torch.randint(0, 2, (rows, labels), generator=generator).float()  # [B, C]
    gold = multi_hot if labels > 1 else torch.randn(rows, generator=generator)  # [B, C] or [B]
    batch = {**padded_batch, "labels": gold}
    with torch.no_grad():
        output = model(**batch)
    losses = SentimentTask(**options).window_losses(output.logits, gold)  # [B]
    assert losses.shape == (rows,)
    torch.testing.assert_close(losses.mean(), output.loss)
    assert np.isfinite(head_importance(model, [batch], losses=SentimentTask(**options).window_losses)).all()


def test_normalisation_is_the_l2_norm_of_each_layer_without_pruned_heads() -> None:
    scores = np.array([[3.0, 4.0, np.nan], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    normalised = normalise_per_layer(scores)
    np.testing.assert_allclose(normalised[0, :2], [0.6, 0.8])
    assert np.isnan(normalised[0, 2])
    np.testing.assert_array_equal(normalised[1], 0.0)
    np.testing.assert_allclose(normalised[2], 1 / np.sqrt(3))
    np.testing.assert_allclose(np.sqrt(np.nansum(normalised[[0, 2]] ** 2, axis=1)), 1.0)
