"""patch_bert: in place, idempotent, BERT only, cross-attention untouched, state carried over, pruning."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import BertForSequenceClassification, BertLMHeadModel, DistilBertConfig, DistilBertModel
from transformers.models.bert.modeling_bert import BertCrossAttention
from transformers.pytorch_utils import prune_linear_layer

from bert_tasks import BertTasksError, patch_bert
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.patch import is_patched
from tests.helpers import tiny_bert_config


def fused_modules(model: nn.Module) -> list[FusedBertSelfAttention]:
    return [m for m in model.modules() if isinstance(m, FusedBertSelfAttention)]


def test_patch_is_in_place_and_idempotent():
    model = BertForSequenceClassification(tiny_bert_config())
    assert not is_patched(model)
    assert patch_bert(model) is model
    first = fused_modules(model)
    assert len(first) == 2
    patch_bert(model)
    assert fused_modules(model) == first
    assert not any(hasattr(m, "query") for m in first)


def test_refuses_non_bert_models():
    distil = DistilBertModel(DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2, hidden_dim=37))
    with pytest.raises(BertTasksError, match="not a transformers BERT model"):
        patch_bert(distil)
    with pytest.raises(BertTasksError, match="not a transformers BERT model"):
        patch_bert(nn.Linear(2, 2))


def test_cross_attention_left_alone():
    model = BertLMHeadModel(tiny_bert_config(is_decoder=True, add_cross_attention=True))
    patch_bert(model)
    crosses = [m for m in model.modules() if isinstance(m, BertCrossAttention)]
    assert len(crosses) == 2
    assert all(hasattr(m, "query") for m in crosses)
    assert len(fused_modules(model)) == 2


def test_takes_mode_dtype_and_device_of_replaced_module():
    model = BertForSequenceClassification(tiny_bert_config()).to(torch.bfloat16).eval()
    patch_bert(model)
    for module in fused_modules(model):
        assert not module.training
        assert module.qkv.weight.dtype == torch.bfloat16
        assert module.qkv.weight.device.type == "cpu"


def test_frozen_projections_stay_frozen():
    model = BertForSequenceClassification(tiny_bert_config())
    for param in model.bert.parameters():
        param.requires_grad_(False)
    patch_bert(model)
    assert not any(m.qkv.weight.requires_grad for m in fused_modules(model))


def test_output_attentions_after_hooks_were_installed_on_stock_modules(padded_batch):
    """transformers installs capture hooks on first use; patching afterwards must keep them working."""
    model = BertForSequenceClassification(tiny_bert_config()).eval()
    model(**padded_batch, output_attentions=True)
    patch_bert(model)
    attentions = model(**padded_batch, output_attentions=True).attentions
    assert len(attentions) == 2
    assert attentions[0].shape == (3, 4, 11, 11)


def prune_stock(model: BertForSequenceClassification, heads_to_prune: dict[int, list[int]]) -> None:
    """The reference: drop the same heads from stock q/k/v rows and output columns by hand.

    transformers 5 removed `prune_heads`; its eager/sdpa attention infers the head count from the
    projection size, so pruning the Linear layers alone is the stock-HF equivalent.
    """
    for layer, heads in heads_to_prune.items():
        attention = model.bert.encoder.layer[layer].attention
        head_size = attention.self.attention_head_size
        keep = torch.ones(attention.self.num_attention_heads, head_size, dtype=torch.bool)
        keep[heads] = False
        index = keep.flatten().nonzero().squeeze(1)
        for name in ("query", "key", "value"):
            setattr(attention.self, name, prune_linear_layer(getattr(attention.self, name), index, dim=0))
        attention.output.dense = prune_linear_layer(attention.output.dense, index, dim=1)


def test_prune_heads_matches_stock_pruning(padded_batch):
    torch.manual_seed(0)
    stock = BertForSequenceClassification(tiny_bert_config()).eval()
    patched = patch_bert(copy.deepcopy(stock))
    patched.prune_heads({0: [1, 3], 1: [0]})
    patched.prune_heads({0: [3, 2]})  # a second call in original numbering: only head 2 is new
    prune_stock(stock, {0: [1, 2, 3], 1: [0]})
    assert patched.config.pruned_heads == {0: [1, 2, 3], 1: [0]}
    layer0 = patched.bert.encoder.layer[0].attention.self
    assert layer0.num_attention_heads == 1
    assert layer0.qkv.weight.shape == (3 * 8, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            patched(**padded_batch).logits, stock(**padded_batch).logits, atol=1e-5, rtol=1e-5
        )
        attentions = patched(**padded_batch, output_attentions=True).attentions
    assert [a.shape[1] for a in attentions] == [1, 3]


def test_prune_needs_patched_model():
    from bert_tasks.modeling.patch import prune_heads

    model = BertForSequenceClassification(tiny_bert_config())
    with pytest.raises(BertTasksError, match="patch_bert"):
        prune_heads(model, {0: [0]})
