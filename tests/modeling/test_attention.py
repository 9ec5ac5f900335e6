"""Parity of the fused attention with stock transformers BERT (eager and sdpa), on padded batches."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
)
from transformers.models.bert.modeling_bert import BertSelfAttention, eager_attention_forward

from bert_tasks import patch_bert
from bert_tasks.modeling.attention import FusedBertSelfAttention
from tests.helpers import assert_same_training_step, at_real_tokens, tiny_bert_config


def stock_and_patched(model_class, attn_implementation: str = "eager", **overrides):
    """A stock model and a patched deep copy of it, both in eval mode."""
    torch.manual_seed(0)
    config = tiny_bert_config(**overrides)
    config._attn_implementation = attn_implementation
    stock = model_class(config).eval()
    return stock, patch_bert(copy.deepcopy(stock))


def first_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


@pytest.mark.parametrize(
    "model_class", [BertModel, BertForSequenceClassification, BertForTokenClassification, BertForMaskedLM]
)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_eval_outputs_match_stock(model_class, attn_implementation, padded_batch):
    """Equal at every real token; per-token outputs at padding positions are nobody's (see test_unpad)."""
    stock, patched = stock_and_patched(model_class, attn_implementation)
    with torch.no_grad():
        expected = first_output(stock(**padded_batch))
        actual = first_output(patched(**padded_batch))
    if model_class is not BertForSequenceClassification:
        mask = padded_batch["attention_mask"]
        actual, expected = at_real_tokens(actual, mask), at_real_tokens(expected, mask)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_attention_probabilities_match_eager(padded_batch):
    stock, patched = stock_and_patched(BertForSequenceClassification, "eager")
    with torch.no_grad():
        expected = stock(**padded_batch, output_attentions=True).attentions
        actual = patched(**padded_batch, output_attentions=True).attentions
    assert len(actual) == len(expected) == 2
    for got, want in zip(actual, expected, strict=True):
        assert got.shape == (3, 4, 11, 11)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.sum(-1), torch.ones(3, 4, 11))


def test_attention_probabilities_under_sdpa_config(padded_batch):
    """With the sdpa mask form (bool) the math path still returns eager's exact probabilities."""
    stock, _ = stock_and_patched(BertForSequenceClassification, "eager")
    _, patched = stock_and_patched(BertForSequenceClassification, "sdpa")
    with torch.no_grad():
        expected = stock(**padded_batch, output_attentions=True)
        actual = patched(**padded_batch, output_attentions=True)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=1e-5)
    for got, want in zip(actual.attentions, expected.attentions, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_train_mode_loss_and_gradients_match(attn_implementation, padded_batch):
    stock, patched = stock_and_patched(
        BertForSequenceClassification,
        attn_implementation,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    assert_same_training_step(stock, patched, padded_batch, labels=torch.tensor([0, 1, 1]))


def test_bf16_autocast_within_bf16_tolerance(padded_batch):
    stock, patched = stock_and_patched(BertForSequenceClassification, "sdpa")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = stock(**padded_batch).logits.float()
        actual = patched(**padded_batch).logits.float()
    with torch.no_grad():
        exact = stock(**padded_batch).logits
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(actual, exact, atol=5e-2, rtol=5e-2)


def test_dropout_only_in_training(padded_batch):
    _, patched = stock_and_patched(BertForSequenceClassification, attention_probs_dropout_prob=0.5)
    with torch.no_grad():
        first = patched(**padded_batch).logits
        second = patched(**padded_batch).logits
        torch.testing.assert_close(first, second, atol=0, rtol=0)
        patched.train()
        torch.manual_seed(1)
        noisy = patched(**padded_batch).logits
    assert not torch.allclose(noisy, first)


def test_dropout_on_probabilities_in_math_path():
    torch.manual_seed(0)
    module = FusedBertSelfAttention(tiny_bert_config(attention_probs_dropout_prob=0.5)).train()
    hidden = torch.randn(2, 6, 32)
    context_eval = module.eval()(hidden, output_attentions=True)[0]
    context_train = module.train()(hidden, output_attentions=True)[0]
    assert not torch.allclose(context_eval, context_train)


def _mask_forms(batch: int, seq_len: int):
    keep = torch.ones(batch, seq_len, dtype=torch.bool)
    keep[1, 4:] = False
    square = keep[:, None, None, :].expand(batch, 1, seq_len, seq_len)
    additive = torch.zeros(batch, 1, 1, seq_len).masked_fill(
        ~keep[:, None, None, :], torch.finfo(torch.float).min
    )
    return {
        "none": (None, None),
        "bool_square": (square, square),
        "bool_row": (keep[:, None, None, :], keep[:, None, None, :]),
        "additive": (additive, additive),
        "padding_2d": (keep.long(), keep[:, None, None, :]),
    }


@pytest.mark.parametrize("form", ["none", "bool_square", "bool_row", "additive", "padding_2d"])
def test_every_mask_form_matches_eager(form):
    torch.manual_seed(0)
    config = tiny_bert_config()
    stock = BertSelfAttention(config).eval()
    fused = FusedBertSelfAttention.from_stock(stock)
    hidden = torch.randn(2, 7, 32)
    mask, eager_mask = _mask_forms(2, 7)[form]
    if eager_mask is not None and eager_mask.dtype == torch.bool:
        eager_mask = torch.zeros(eager_mask.shape).masked_fill(~eager_mask, torch.finfo(torch.float).min)
    shape = (2, 7, 4, 8)
    query = stock.query(hidden).view(shape).transpose(1, 2)
    key = stock.key(hidden).view(shape).transpose(1, 2)
    value = stock.value(hidden).view(shape).transpose(1, 2)
    want_context, want_probs = eager_attention_forward(
        stock, query, key, value, eager_mask, scaling=stock.scaling
    )
    with torch.no_grad():
        sdpa_context, no_probs = fused(hidden, attention_mask=mask)
        math_context, probs = fused(hidden, attention_mask=mask, output_attentions=True)
    assert no_probs is None
    torch.testing.assert_close(sdpa_context, want_context.reshape(2, 7, 32), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(math_context, want_context.reshape(2, 7, 32), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs, want_probs, atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_matches(padded_batch):
    _, patched = stock_and_patched(
        BertForSequenceClassification, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    checkpointed = copy.deepcopy(patched)
    checkpointed.activation_checkpointing_enable()
    labels = torch.tensor([0, 1, 0])
    for model in (patched, checkpointed):
        model.train()
        model(**padded_batch, labels=labels).loss.backward()
    for (name, plain), (_, ckpt) in zip(
        patched.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        torch.testing.assert_close(ckpt.grad, plain.grad, atol=1e-7, rtol=1e-5, msg=name)


@pytest.mark.slow  # torch.compile
def test_torch_compile_runs_and_matches(padded_batch):
    _, patched = stock_and_patched(BertForSequenceClassification, "sdpa")
    compiled = torch.compile(patched, dynamic=False)
    with torch.no_grad():
        expected = patched(**padded_batch).logits
        actual = compiled(**padded_batch).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_decoder_self_attention_is_causal_and_matches():
    stock, patched = stock_and_patched(BertLMHeadModel, "sdpa", is_decoder=True)
    input_ids = torch.randint(1000, 30000, (2, 6))
    with torch.no_grad():
        expected = stock(input_ids=input_ids, use_cache=False).logits
        actual = patched(input_ids=input_ids, use_cache=False).logits
        cached = patched(input_ids=input_ids, use_cache=True).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached, expected, atol=1e-5, rtol=1e-5)


def test_output_attentions_set_in_the_config_is_honoured(padded_batch):
    """`config.output_attentions=True` (not passed per call): stock eager returns the probabilities, and so
    must the patched model (it returned none, silently)."""
    stock, patched = stock_and_patched(BertModel, "eager", output_attentions=True)
    expected = stock(**padded_batch).attentions
    actual = patched(**padded_batch).attentions
    assert len(actual) == len(expected) == 2
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
