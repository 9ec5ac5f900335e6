"""patch_bert: the only code that touches transformers' BERT internals.

It swaps every `BertSelfAttention` of a model for `FusedBertSelfAttention` in place, carrying over the
weights, mode, dtype, device and any forward hooks transformers already installed (output capturing),
swaps every `nn.Dropout` for `FastDropout` (same p and mode, cheaper random numbers on CPU), makes the
encoder run its layers on the real tokens of padded batches only (`UnpaddedBertEncoder`) and, under a
head that reads [CLS] only, its last layer on that token only; and gives the model a `prune_heads` that
works on the fused projection. Cross-attention is left alone. `set_attention_direction` then makes it
attend causally or right to left (`direction.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from types import MethodType
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.models.bert.modeling_bert import (
    BertAttention,
    BertEncoder,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForSequenceClassification,
    BertSelfAttention,
)
from transformers.pytorch_utils import prune_linear_layer

from bert_tasks.config import ATTENTION_DIRECTIONS
from bert_tasks.errors import BertTasksError
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.direction import BIDIRECTIONAL, CAUSAL, DirectedBertEncoder, pool_last_token
from bert_tasks.modeling.dropout import FastDropout
from bert_tasks.modeling.unpad import FIRST_TOKEN_KWARG, UnpaddedBertEncoder


def patch_bert(model: nn.Module) -> nn.Module:
    """Replace the self-attention of a transformers BERT model (any `BertFor*` head) in place.

    Idempotent: patching a patched model changes nothing. Returns the model for chaining.

    Raises:
        BertTasksError: the model is not a transformers BERT model.
    """
    attentions = [m for m in model.modules() if isinstance(m, BertAttention) and not m.is_cross_attention]
    if not isinstance(model, PreTrainedModel) or not attentions:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise BertTasksError(
            f"patch_bert: {type(model).__name__} ({kind}) is not a transformers BERT model; "
            "bert-tasks patches BertModel and the BertFor* heads only"
        )
    for attention in attentions:
        if type(attention.self) is BertSelfAttention:
            attention.self = FusedBertSelfAttention.from_stock(attention.self)
    _swap_dropouts(model)
    for encoder in model.modules():
        if type(encoder) is BertEncoder:
            # No state of its own: swapping the class keeps names, weights, hooks and layers as they are.
            encoder.__class__ = UnpaddedBertEncoder
    if isinstance(model, _FIRST_TOKEN_HEADS) and "forward" not in vars(model):
        model.forward = MethodType(_first_token_forward(type(model).forward), model)
    model.prune_heads = MethodType(prune_heads, model)
    return model


#: Heads that read only each sequence's first token ([CLS], through the pooler).
_FIRST_TOKEN_HEADS = (BertForSequenceClassification, BertForMultipleChoice, BertForNextSentencePrediction)


def _first_token_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    """The head's own forward, telling the encoder that its last layer may compute the first token only.

    Set on the head instance, not on the encoder, so `model.bert(...)` called directly still returns every
    token's hidden state. `wraps` keeps the signature visible to `inspect` (Trainer and pipelines read it).
    """

    @wraps(forward)
    def first_token_forward(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
        return forward(self, *args, **{FIRST_TOKEN_KWARG: True, **kwargs})

    return first_token_forward


def _swap_dropouts(model: nn.Module) -> None:
    """Replace each plain `nn.Dropout` (embeddings, residual branches, the head) by `FastDropout`."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout.from_stock(child))


def set_attention_dropout(model: PreTrainedModel, p: float) -> None:
    """Set the dropout on attention probabilities of every layer, and in the config saved with the model.

    Without it (p = 0) CPU training of long inputs runs SDPA's flash kernel, which never holds the T x T
    probabilities: the memory lever for 512-token inputs (BENCHMARKS.md measures what it costs in accuracy).
    """
    model.config.attention_probs_dropout_prob = p
    for module in model.modules():
        if isinstance(module, FusedBertSelfAttention):
            module.dropout.p = p


def set_attention_direction(model: PreTrainedModel, direction: str) -> None:
    """Make a patched model attend in `direction` (`ATTENTION_DIRECTIONS`), in place; any direction may
    follow any other. Under causal attention its pooler reads each sequence's last real token
    (`direction.py`).

    Raises:
        BertTasksError: an unknown direction, a model `patch_bert` did not patch, or a decoder (it attends
            causally by its config, with caches) asked for another direction.
    """
    if direction not in ATTENTION_DIRECTIONS:
        raise BertTasksError(f"attention={direction!r}: choose one of {', '.join(ATTENTION_DIRECTIONS)}")
    encoders = [module for module in model.modules() if isinstance(module, DirectedBertEncoder)]
    if not encoders:
        raise BertTasksError("set_attention_direction: call patch_bert(model) first")
    if model.config.is_decoder:
        if direction != BIDIRECTIONAL:
            raise BertTasksError(
                f"attention={direction}: {type(model).__name__} is a decoder (is_decoder=true), causal by "
                "its config; leave attention=bidirectional for it"
            )
        return  # "bidirectional" leaves a decoder as its config makes it
    for encoder in encoders:
        encoder.attention_direction = direction
    for module in model.modules():
        if isinstance(module, FusedBertSelfAttention):  # self-attention only: cross-attention stays stock
            module.is_causal = direction == CAUSAL  # SDPA's is_causal where a batch has no padding
    base = model.base_model
    vars(base).pop("forward", None)
    if direction == CAUSAL and getattr(base, "pooler", None) is not None:
        base.forward = MethodType(pool_last_token(type(base).forward), base)


def attention_direction(model: nn.Module) -> str:
    """The direction a patched model attends in (bidirectional for any other model)."""
    encoder = next((m for m in model.modules() if isinstance(m, DirectedBertEncoder)), None)
    return BIDIRECTIONAL if encoder is None else encoder.attention_direction


def traceable(model: PreTrainedModel) -> PreTrainedModel:
    """Undo the unpadding (encoder and first-token head) of a patched model, in place, for graph export.

    Unpadding picks the real tokens of each batch, a data-dependent shape that torch.export cannot trace;
    the fused attention and dropout stay (they trace, and keep one qkv matmul per layer in the graph), and
    so does the attention direction: its mask and last-token pooling are shape-static tensor ops.
    The model computes the same logits either way.
    """
    for encoder in model.modules():
        if type(encoder) is UnpaddedBertEncoder:
            encoder.__class__ = DirectedBertEncoder
    vars(model).pop("forward", None)  # `_first_token_forward`, set on the instance by patch_bert
    return model


def is_patched(model: nn.Module) -> bool:
    """True when the model runs bert-tasks' fused attention."""
    return any(isinstance(m, FusedBertSelfAttention) for m in model.modules())


def prune_heads(model: PreTrainedModel, heads_to_prune: dict[int, Iterable[int]]) -> None:
    """Remove attention heads, given per layer in the original numbering (transformers 4's API).

    Pruned heads are recorded in `config.pruned_heads`, so `load_model` rebuilds the same shapes.
    """
    layers = model.base_model.encoder.layer
    pruned: dict[int, list[int]] = {
        int(k): list(v) for k, v in (getattr(model.config, "pruned_heads", {}) or {}).items()
    }
    for layer_index, heads in heads_to_prune.items():
        attention = layers[int(layer_index)].attention
        already = set(pruned.get(int(layer_index), []))
        _prune_attention(attention, set(heads) - already, already)
        pruned[int(layer_index)] = sorted(already | set(heads))
    model.config.pruned_heads = pruned


def _prune_attention(attention: BertAttention, heads: set[int], already: set[int]) -> None:
    """Drop `heads` (original numbering) from one layer's fused qkv rows and output columns."""
    self_attention = attention.self
    if not isinstance(self_attention, FusedBertSelfAttention):
        raise BertTasksError("prune_heads: call patch_bert(model) before pruning heads")
    if not heads:
        return
    head_size = self_attention.attention_head_size
    # Position of each original head among the heads still present.
    current = {h: h - sum(p < h for p in already) for h in heads}
    keep = torch.ones(self_attention.num_attention_heads, head_size, dtype=torch.bool)  # [H, D]
    for head in heads:
        keep[current[head]] = False
    columns = keep.flatten().nonzero().squeeze(1)  # [H' * D]
    rows = torch.cat([columns + block * self_attention.all_head_size for block in range(3)])  # [3 * H' * D]
    self_attention.qkv = prune_linear_layer(self_attention.qkv, rows, dim=0)
    attention.output.dense = prune_linear_layer(attention.output.dense, columns, dim=1)
    self_attention.num_attention_heads -= len(heads)
    self_attention.all_head_size = self_attention.num_attention_heads * head_size
