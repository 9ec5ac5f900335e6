"""A BERT cut to some of its layers: distillation's student, initialised from its teacher (DistilBERT-style).

Fewer layers is a config change only (`num_hidden_layers`), so the saved student is a plain model dir
vanilla transformers loads; the kept layers are renumbered 0..k-1 in order, and their pruned heads (if
the teacher was head-pruned) move with them.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from transformers import PreTrainedModel


def keep_layers(model: PreTrainedModel, layers: Sequence[int]) -> PreTrainedModel:
    """Keep only the encoder layers `layers` (increasing indices) of `model`, in place; returns it.

    Embeddings, pooler and head stay as they are: the student starts from the teacher's, as DistilBERT's
    did. Works on patched and stock models alike (it moves whole layer modules).
    """
    encoder = model.base_model.encoder
    kept = [encoder.layer[i] for i in layers]
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):  # transformers' cache index, unused by encoders but kept true
                module.layer_idx = new_index
    encoder.layer = nn.ModuleList(kept)
    config = model.config
    config.num_hidden_layers = len(kept)
    pruned = {int(k): v for k, v in (getattr(config, "pruned_heads", None) or {}).items()}
    config.pruned_heads = {new: pruned[old] for new, old in enumerate(layers) if old in pruned}
    return model
