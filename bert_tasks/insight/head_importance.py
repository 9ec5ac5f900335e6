"""How much each attention head matters to a task, as Michel et al. 2019 measure it.

"Are Sixteen Heads Really Better than One?" (section 4.1) gates each head's output with xi_h = 1 and scores
it by the expected sensitivity of the loss to its gate, I_h = E_x |dL(x)/dxi_h|, over labelled data, then
normalises the scores of each layer by their L2 norm (without it, heads of some layers score higher across
the board and pruning by a global ranking empties them first). The loss is the task's own on gold labels:
`Task.window_losses`, per window: cross-entropy (a NER window's is the mean over the sub-tokens it
labels), a multi-label head's BCE, a regression head's squared error. The
gates are one per window (`modeling.head_gates`), so a single backward pass gives every window's own
gradient; the absolute value is taken per window, as the expectation asks, not of a batch's summed
gradient (where heads whose gradients cancel between examples would look unimportant).

Scores come in the model's original numbering, [layers, heads of the unpruned config]: NaN at pruned heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bert_tasks.data.padded_batches import model_inputs
from bert_tasks.modeling.head_gates import gated_heads, self_attentions
from bert_tasks.training.objectives import window_cross_entropy

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def head_importance(
    model: PreTrainedModel,
    batches: Iterable[dict[str, torch.Tensor]],
    device: torch.device | None = None,
    losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = window_cross_entropy,
) -> np.ndarray:
    """E |dL/dxi_h| over every window of `batches` (labelled, as the task's collator pads them): [L, H].

    `losses`: each window's loss from (logits, labels), [B]: the task's own (`Task.window_losses`), since
    a multi-label or regression head's labels are no class ids.

    The model runs in eval mode (no dropout: the gradient of the model that predicts) and its weights get
    no gradients; each batch is a forward and one backward pass to the gates only.
    """
    attentions = self_attentions(model)
    model.eval()
    totals = [torch.zeros(a.num_attention_heads, dtype=torch.float64) for a in attentions]
    windows = 0
    for batch in batches:
        if device is not None:
            batch = {key: value.to(device) for key, value in batch.items()}
        labels = batch["labels"]  # [B], [B, T] or [B, C] (multi-hot)
        rows = labels.shape[0]
        where = next(model.parameters()).device
        # per layer [B, H_l]
        gates = [
            torch.ones(rows, a.num_attention_heads, device=where, requires_grad=True) for a in attentions
        ]
        with torch.enable_grad(), gated_heads(model, gates):
            logits = model(**model_inputs(batch, with_labels=False)).logits  # [B, C] or [B, T, C]
            loss = losses(logits, labels).sum()
            grads = torch.autograd.grad(loss, gates)
        for total, grad in zip(totals, grads, strict=True):
            total += grad.abs().sum(dim=0).double().cpu()
        windows += rows
    if windows == 0:
        raise ValueError("head_importance: no labelled windows to measure the heads on")
    return _in_original_numbering(model, [(total / windows).numpy() for total in totals])


def normalise_per_layer(importance: np.ndarray) -> np.ndarray:
    """Each layer's scores divided by their L2 norm (pruned heads, NaN, left out); a zero layer stays 0."""
    norms = np.sqrt(np.nansum(importance**2, axis=1, keepdims=True))  # [L, 1]
    return importance / np.where(norms > 0, norms, 1.0)


def pruned_heads(config: Any) -> dict[int, set[int]]:
    """config.pruned_heads with integer layers (a config read from JSON has string keys)."""
    return {int(layer): set(heads) for layer, heads in (getattr(config, "pruned_heads", None) or {}).items()}


def present_heads(config: Any) -> list[list[int]]:
    """Per layer, the original numbers of the heads the model still has, in order."""
    gone, heads = pruned_heads(config), range(config.num_attention_heads)
    return [[h for h in heads if h not in gone.get(layer, ())] for layer in range(config.num_hidden_layers)]


def _in_original_numbering(model: PreTrainedModel, per_layer: list[np.ndarray]) -> np.ndarray:
    """Scores of the heads present ([H_l] per layer) placed at their original numbers, NaN where pruned."""
    present = present_heads(model.config)
    table = np.full((len(present), model.config.num_attention_heads), np.nan)  # [L, H]
    for layer, (heads, scores) in enumerate(zip(present, per_layer, strict=True)):
        table[layer, heads] = scores
    return table
