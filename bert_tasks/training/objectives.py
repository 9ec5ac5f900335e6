"""What training minimises: the task loss, plain or class-weighted.

Without class weights the loss is the head's own `.loss` (transformers' cross-entropy), so a run
without them is exactly the run it always was; with them it is the same cross-entropy over the head's
logits, each target weighted by its label's weight. The loop calls a `TaskLoss` and knows neither.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bert_tasks.data.padded_batches import model_inputs
from bert_tasks.training.class_weights import IGNORED


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_i w[y_i] * -log softmax(logits_i)[y_i] / sum_i w[y_i], over the targets i whose label is not -100.

    logits: [B, C] (one label per window) or [B, T, C] (one per token); labels: [B] or [B, T]; weights:
    [C]. Computed in float32 whatever the autocast dtype, as transformers' heads do under autocast.
    """
    classes = logits.shape[-1]
    return F.cross_entropy(
        logits.reshape(-1, classes).float(),  # [B * T, C]
        labels.reshape(-1),  # [B * T]
        weight=weights.float(),
        ignore_index=IGNORED,
    )


class TaskLoss:
    """The training loss of one batch: the head's own, or class-weighted when weights are given."""

    def __init__(self, weights: torch.Tensor | None = None) -> None:
        self.weights = weights  # [C] on the model's device, or None

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.weights is None:
            return model(**model_inputs(batch)).loss
        logits = model(**model_inputs(batch, with_labels=False)).logits
        return weighted_cross_entropy(logits, batch["labels"], self.weights)
