"""What training minimises: the task loss, plain or class-weighted, or distillation's soft targets.

Without class weights the loss is the head's own `.loss` (transformers' cross-entropy), so a run
without them is exactly the run it always was; with them it is the same cross-entropy over the head's
logits, each target weighted by its label's weight. A distill run minimises a `DistillLoss`: the
teacher's soft targets mixed with the gold loss, and optionally its hidden states and attention. The
loop calls the objective as `objective(model, batch)` and knows none of them.

Notation: B batch, T tokens, C labels, H heads, L layers; a target is one scored position (one per
window for sentiment, [B]; per token for NER, [B, T]), the positions whose label is not -100.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

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


def window_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The head's cross-entropy of each window: [B, C] / [B] -> [B]; [B, T, C] / [B, T] -> [B], the mean
    over the window's labelled positions (-100 ignored), in float32 as transformers' heads compute it.
    What head importance differentiates per window (`Task.window_losses`)."""
    losses = F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORED, reduction="none"
    ).view(labels.shape)  # [B] or [B, T]
    if losses.dim() == 1:
        return losses
    counted = (labels != IGNORED).sum(dim=1).clamp(min=1)  # [B]
    return losses.sum(dim=1) / counted


class TaskLoss:
    """The training loss of one batch: the head's own, or class-weighted when weights are given."""

    def __init__(self, weights: torch.Tensor | None = None) -> None:
        self.weights = weights  # [C] on the model's device, or None

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.weights is None:
            return model(**model_inputs(batch)).loss
        logits = model(**model_inputs(batch, with_labels=False)).logits
        return weighted_cross_entropy(logits, batch["labels"], self.weights)


def gold_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """The (class-weighted) mean cross-entropy over the targets whose label is not -100, and 0 when there is
    none (a batch of transfer rows only), without reading anything back from the device."""
    classes = logits.shape[-1]
    flat = labels.reshape(-1)  # [B * T]
    kept = flat != IGNORED
    total = F.cross_entropy(
        logits.reshape(-1, classes).float(),
        flat,
        weight=None if weights is None else weights.float(),
        ignore_index=IGNORED,
        reduction="sum",
    )
    count = kept.sum() if weights is None else (weights.float()[flat.clamp_min(0)] * kept).sum()
    return total / count.clamp_min(1)


def soft_target_loss(
    student: torch.Tensor, teacher: torch.Tensor, scored: torch.Tensor, temperature: float
) -> torch.Tensor:
    """T^2 * the mean over scored positions of KL(softmax(teacher / T) || softmax(student / T)).

    Hinton et al.'s soft-target loss; the T^2 keeps its gradients on the gold loss's scale as T changes.
    student, teacher: [B, C] or [B, T, C]; scored: [B] or [B, T], True where a position is trained.
    """
    log_student = F.log_softmax(student.float() / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher.float() / temperature, dim=-1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum(-1)  # [B] or [B, T]
    kl = torch.where(scored, kl, 0.0)  # what an ignored or padded position holds never counts, NaN neither
    return kl.sum() / scored.sum().clamp_min(1) * temperature**2


def hidden_transfer_loss(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    layers: Sequence[int],
    mask: torch.Tensor,
) -> torch.Tensor:
    """TinyBERT's hidden-state loss: the mean squared difference of student layer m's output and teacher
    layer layers[m]'s, over real tokens, averaged over the student's layers.

    student, teacher: hidden_states as transformers returns them (embeddings first, then each layer's
    output, [B, T, C] each); mask: [B, T] attention mask.
    """
    real = mask.bool()
    count = real.sum().clamp_min(1)
    losses = []
    for m, t in enumerate(layers):
        squared = (student[m + 1].float() - teacher[t + 1].float()).pow(2).mean(-1)  # [B, T]
        losses.append(torch.where(real, squared, 0.0).sum() / count)
    return torch.stack(losses).mean()


def attention_transfer_loss(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    layers: Sequence[int],
    mask: torch.Tensor,
) -> torch.Tensor:
    """MiniLM's attention-distribution loss: KL(teacher attention || student attention) of each head's
    distribution over keys, averaged over real queries, heads and the student's layers.

    student, teacher: attentions as transformers returns them ([B, H, T, T] per layer); mask: [B, T].
    Padded keys hold probability 0 in both and add nothing.
    """
    real = mask.bool()[:, None, :]  # [B, 1, T] over queries
    count = real.sum().clamp_min(1) * student[0].shape[1]  # real queries x heads
    losses = []
    for m, t in enumerate(layers):
        p, q = teacher[t].float(), student[m].float()  # [B, H, T, T]
        kl = torch.where(p > 0, p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-30).log()), 0.0).sum(-1)
        losses.append(torch.where(real, kl, 0.0).sum() / count)  # kl: [B, H, T]
    return torch.stack(losses).mean()


@dataclass(frozen=True)
class DistillSettings:
    """How a distill batch's loss is made (the config's `alpha`, `temperature`, `transfer`, ...)."""

    alpha: float
    temperature: float
    transfer: tuple[str, ...] = ()
    #: The teacher layer each student layer learns from under `transfer`.
    transfer_layers: tuple[int, ...] = ()
    transfer_weight: float = 1.0


class DistillLoss:
    """alpha * soft targets + (1 - alpha) * gold loss (+ transfer_weight * intermediate transfer).

    The teacher runs on the batch in no_grad, in eval mode, under the run's autocast (bf16 when the run
    is): its logits are recomputed each time, never stored, so a resumed run sees what it would have.
    `gold_rows[row]` says whether a training window has a gold label; transfer rows (False) are trained on
    the soft targets only, at the positions the task scores.
    """

    def __init__(
        self,
        teacher: torch.nn.Module,
        settings: DistillSettings,
        gold_rows: torch.Tensor,
        weights: torch.Tensor | None = None,
        autocast: Callable[[], AbstractContextManager] | None = None,
    ) -> None:
        self.teacher, self.settings, self.gold_rows, self.weights = (
            teacher.eval(),
            settings,
            gold_rows,
            weights,
        )
        self.autocast = autocast or nullcontext
        self.outputs = {
            "output_hidden_states": "hidden" in settings.transfer,
            "output_attentions": "attention" in settings.transfer,
        }

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = model_inputs(batch, with_labels=False)
        wanted = {key: True for key, on in self.outputs.items() if on}
        student = model(**inputs, **wanted)
        settings, labels = self.settings, batch["labels"]  # [B] or [B, T]
        gold = self.gold_rows[batch["row"]].view(-1, *([1] * (labels.dim() - 1)))  # [B] or [B, 1]
        loss = (1 - settings.alpha) * gold_loss(
            student.logits, labels.masked_fill(~gold, IGNORED), self.weights
        )
        if settings.alpha == 0 and not settings.transfer:
            return loss  # the gold loss alone (what distillation is measured against): no teacher needed
        with torch.no_grad(), self.autocast():
            teacher = self.teacher(**inputs, **wanted)
        loss = loss + settings.alpha * soft_target_loss(
            student.logits, teacher.logits, labels != IGNORED, settings.temperature
        )
        return loss + settings.transfer_weight * self._transfer(student, teacher, batch["attention_mask"])

    def _transfer(self, student: Any, teacher: Any, mask: torch.Tensor) -> torch.Tensor | float:
        layers, loss = self.settings.transfer_layers, 0.0
        if self.outputs["output_hidden_states"]:
            loss = loss + hidden_transfer_loss(student.hidden_states, teacher.hidden_states, layers, mask)
        if self.outputs["output_attentions"]:
            loss = loss + attention_transfer_loss(student.attentions, teacher.attentions, layers, mask)
        return loss
