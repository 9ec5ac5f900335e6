"""The class-weighted loss: against hand computations, and against the heads' own loss at equal weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bert_tasks.modeling.load import load_model
from bert_tasks.modeling.patch import is_patched
from bert_tasks.training.objectives import TaskLoss, weighted_cross_entropy
from tests.helpers import LABELS


def test_sentence_labels_against_a_hand_computation() -> None:
    """Logits [0, ln 3] give p = [1/4, 3/4]: a negative costs ln 4, a positive ln 4/3."""
    logits = torch.tensor([[0.0, math.log(3)], [0.0, math.log(3)], [0.0, math.log(3)]])  # [B=3, C=2]
    labels = torch.tensor([0, 1, 1])
    weights = torch.tensor([3.0, 1.0])
    expected = (3 * math.log(4) + 2 * math.log(4 / 3)) / (3 + 1 + 1)
    assert weighted_cross_entropy(logits, labels, weights).item() == pytest.approx(expected, rel=1e-6)


def test_token_labels_against_a_hand_computation_skipping_ignored_positions() -> None:
    """Logits [0, ln 2, ln 5] give p = [1/8, 2/8, 5/8]; positions labelled -100 never count, however
    wrong their logits."""
    row = [0.0, math.log(2), math.log(5)]
    wild = [50.0, -50.0, 0.0]
    logits = torch.tensor([[row, row, wild], [row, wild, wild]])  # [B=2, T=3, C=3]
    labels = torch.tensor([[0, 2, -100], [1, -100, -100]])
    weights = torch.tensor([0.5, 2.0, 1.0])
    expected = (0.5 * math.log(8) + 1.0 * math.log(8 / 5) + 2.0 * math.log(4)) / (0.5 + 1.0 + 2.0)
    assert weighted_cross_entropy(logits, labels, weights).item() == pytest.approx(expected, rel=1e-6)


def test_low_precision_logits_are_scored_in_float32() -> None:
    logits = torch.tensor([[0.0, math.log(3)]], dtype=torch.bfloat16)
    loss = weighted_cross_entropy(logits, torch.tensor([0]), torch.tensor([2.0, 1.0]))
    assert loss.dtype == torch.float32


@pytest.mark.parametrize("task", ["sentiment", "ner"])
@pytest.mark.slow
def test_equal_weights_give_the_heads_own_loss_through_fused_attention_and_unpadding(
    task: str, tiny_model: Path, padded_batch: dict[str, torch.Tensor]
) -> None:
    """On a padded batch (so the unpadded encoder runs), for [B, C] and [B, T, C] logits alike, loss and
    gradients equal transformers' own; the weights then change the loss."""
    torch.manual_seed(0)
    model = load_model(tiny_model, task, LABELS[task]).eval()
    assert is_patched(model)
    classes = len(LABELS[task])
    generator = torch.Generator().manual_seed(1)
    if task == "sentiment":
        labels = torch.randint(0, classes, (3,), generator=generator)  # [B]
    else:
        labels = torch.randint(0, classes, (3, 11), generator=generator)  # [B, T]
        labels[padded_batch["attention_mask"] == 0] = -100
        labels[:, 0] = -100  # [CLS]
    batch = {**padded_batch, "labels": labels}

    def loss_and_grad(loss_fn: TaskLoss) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        return loss.detach(), model.classifier.weight.grad.clone()

    own, own_grad = loss_and_grad(TaskLoss())
    equal, equal_grad = loss_and_grad(TaskLoss(torch.full((classes,), 2.5)))
    torch.testing.assert_close(equal, own)
    torch.testing.assert_close(equal_grad, own_grad)
    skewed, _ = loss_and_grad(TaskLoss(torch.arange(1.0, classes + 1)))
    assert not torch.isclose(skewed, own)
