"""attention=causal|right_to_left: the patched model equals stock eager BERT given the masks by hand.

The reference is transformers' own eager attention fed an additive [B, 1, T, T] mask built here from the
padding mask and the triangle, so nothing of bert_tasks' mask code is on both sides. A larger initial
weight range than BERT's 0.02 makes attention peaked, so a wrong triangle moves the outputs far more than
the tolerances.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertForSequenceClassification, BertForTokenClassification, BertModel

from bert_tasks import patch_bert
from bert_tasks.errors import BertTasksError
from bert_tasks.modeling.direction import last_tokens
from bert_tasks.modeling.patch import attention_direction, set_attention_direction, traceable
from tests.helpers import assert_same_training_step, at_real_tokens, tiny_bert_config

DIRECTED = ["causal", "right_to_left"]


def hand_mask(attention_mask: torch.Tensor, direction: str) -> torch.Tensor:
    """Additive [B, 1, T, T]: 0 where query i may read key j (a real key, j <= i or j >= i), else min."""
    seq_len = attention_mask.shape[1]
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool)
    allowed = allowed.tril() if direction == "causal" else allowed.triu()
    keep = attention_mask.bool()[:, None, None, :] & allowed  # [B, 1, T, T]
    return torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float).min)


def stock_and_directed(model_class, direction: str, **overrides):
    """Stock eager BERT (it honours a 4-D additive mask as given) and a patched copy attending so."""
    torch.manual_seed(0)
    settings = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.3}
    config = tiny_bert_config(**{**settings, **overrides})
    config._attn_implementation = "eager"
    stock = model_class(config).eval()
    patched = patch_bert(copy.deepcopy(stock))
    set_attention_direction(patched, direction)
    return stock, patched


def no_padding() -> dict[str, torch.Tensor]:
    input_ids = torch.randint(1000, 30000, (2, 9), generator=torch.Generator().manual_seed(1))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


@pytest.mark.parametrize("direction", DIRECTED)
@pytest.mark.parametrize("padded", [True, False])
def test_hidden_states_and_probabilities_match_hand_masked_eager(
    direction, padded, padded_batch, gathered_rows
):
    batch = padded_batch if padded else no_padding()
    mask = batch["attention_mask"]
    stock, patched = stock_and_directed(BertModel, direction)
    with torch.no_grad():
        expected = stock(batch["input_ids"], hand_mask(mask, direction), output_attentions=True)
        fused = patched(**batch).last_hidden_state  # unpadded where padded, SDPA otherwise
        math = patched(**batch, output_attentions=True)  # the padded path, eager-style math
    assert bool(gathered_rows) == padded
    for actual in (fused, math.last_hidden_state):
        torch.testing.assert_close(
            at_real_tokens(actual, mask),
            at_real_tokens(expected.last_hidden_state, mask),
            atol=1e-5,
            rtol=1e-5,
        )
    real_rows = mask.bool()[:, None, :, None]  # [B, 1, T, 1]: the rows of real queries
    for got, want in zip(math.attentions, expected.attentions, strict=True):
        torch.testing.assert_close(got * real_rows, want * real_rows, atol=1e-6, rtol=1e-5)
        upper = torch.ones(got.shape[-2:], dtype=torch.bool).triu(1)
        hidden = upper if direction == "causal" else upper.T  # the keys a query must not see
        assert (got * real_rows)[..., hidden].abs().max() == 0


@pytest.mark.parametrize("direction", DIRECTED)
def test_token_classification_training_step_matches(direction, padded_batch):
    """Loss and every gradient, through the unpadded path in train mode (CPU: the math path)."""
    # BERT's own initial range: with peaked attention, gradients that are 0 in exact arithmetic (a key bias
    # shifts every score of a row alike) come out as float noise above the helper's absolute tolerance.
    stock, patched = stock_and_directed(
        BertForTokenClassification, direction, num_labels=3, initializer_range=0.02
    )
    labels = torch.randint(0, 3, padded_batch["input_ids"].shape, generator=torch.Generator().manual_seed(2))
    labels[padded_batch["attention_mask"] == 0] = -100
    hand = {**padded_batch, "attention_mask": hand_mask(padded_batch["attention_mask"], direction)}
    assert_same_training_step(stock, patched, padded_batch, labels, stock_batch=hand)


def test_right_to_left_classifier_pools_cls_and_trains_the_same(padded_batch):
    """A right-to-left [CLS] sees every token: the head pools it, as stock does."""
    stock, patched = stock_and_directed(
        BertForSequenceClassification, "right_to_left", initializer_range=0.02
    )
    hand = {**padded_batch, "attention_mask": hand_mask(padded_batch["attention_mask"], "right_to_left")}
    assert_same_training_step(stock, patched, padded_batch, torch.tensor([0, 1, 1]), stock_batch=hand)


@pytest.mark.parametrize("padded", [True, False])
def test_causal_classifier_pools_the_last_real_token(padded, padded_batch):
    """A causal [CLS] sees only itself: the pooler reads each sequence's last real token ([SEP])."""
    batch = padded_batch if padded else no_padding()
    mask = batch["attention_mask"]
    stock, patched = stock_and_directed(BertForSequenceClassification, "causal")
    with torch.no_grad():
        hidden = stock.bert(batch["input_ids"], hand_mask(mask, "causal")).last_hidden_state  # [B, T, C]
        last = mask.sum(-1) - 1  # right padding
        pooled = stock.bert.pooler(hidden[torch.arange(len(last)), last][:, None])
        expected = stock.classifier(pooled)
        actual = patched(**batch).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    # The checkpoint stays a plain BertForSequenceClassification: same names, same tensors.
    assert patched.state_dict().keys() == stock.state_dict().keys()


def test_causal_classifier_trains_through_the_last_token(padded_batch):
    """Gradients reach the pooler from the last token's row: the loss moves when only [SEP]'s input does."""
    _, patched = stock_and_directed(BertForSequenceClassification, "causal")
    patched.train()
    loss = patched(**padded_batch, labels=torch.tensor([0, 1, 1])).loss
    loss.backward()
    assert patched.bert.pooler.dense.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("direction", DIRECTED)
def test_bf16_within_bf16_tolerance(direction, padded_batch):
    mask = padded_batch["attention_mask"]
    stock, patched = stock_and_directed(BertModel, direction, initializer_range=0.1)
    stock.config._attn_implementation = patched.config._attn_implementation = "sdpa"
    with torch.no_grad():
        expected = stock(padded_batch["input_ids"], hand_mask(mask, direction)).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            actual = patched(**padded_batch).last_hidden_state.float()
            probs = patched(**padded_batch, output_attentions=True).attentions
    torch.testing.assert_close(
        at_real_tokens(actual, mask), at_real_tokens(expected, mask), atol=5e-2, rtol=5e-2
    )
    upper = torch.ones(11, 11, dtype=torch.bool).triu(1)
    assert probs[-1][..., upper if direction == "causal" else upper.T].abs().max() == 0


@pytest.mark.parametrize("direction", DIRECTED)
@pytest.mark.parametrize("padded", [True, False])
def test_a_token_never_sees_the_other_side(direction, padded, padded_batch):
    """Causal: token i's output is the same whatever follows it; right_to_left: whatever precedes it."""
    batch = padded_batch if padded else no_padding()
    _, patched = stock_and_directed(BertForTokenClassification, direction)
    i = 2  # real in every sequence of both batches
    changed = batch["input_ids"].clone()
    other_side = slice(i + 1, None) if direction == "causal" else slice(0, i)
    changed[:, other_side] = torch.randint(1000, 30000, changed[:, other_side].shape)
    changed[batch["attention_mask"] == 0] = 0
    with torch.no_grad():
        before = patched(**batch).logits
        after = patched(input_ids=changed, attention_mask=batch["attention_mask"]).logits
    seen = slice(0, i + 1) if direction == "causal" else slice(i, None)
    real = batch["attention_mask"].bool()[:, seen]
    torch.testing.assert_close(after[:, seen][real], before[:, seen][real], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(after[:, other_side], before[:, other_side])  # the other side did change


def test_sequences_of_one_batch_never_see_each_other(padded_batch):
    """Per-sequence triangles on the unpadded path: a sequence's outputs do not depend on its batch."""
    _, patched = stock_and_directed(BertForTokenClassification, "causal")
    with torch.no_grad():
        together = patched(**padded_batch).logits
        alone = patched(**{k: v[2:, :3] for k, v in padded_batch.items()}).logits
    torch.testing.assert_close(alone[0], together[2, :3], atol=1e-5, rtol=1e-5)


def test_directions_switch_back_and_forth(padded_batch):
    stock, patched = stock_and_directed(BertForSequenceClassification, "causal")
    assert attention_direction(patched) == "causal"
    set_attention_direction(patched, "bidirectional")
    assert attention_direction(patched) == "bidirectional"
    assert "forward" not in vars(patched.bert)
    with torch.no_grad():
        torch.testing.assert_close(patched(**padded_batch).logits, stock(**padded_batch).logits)


def test_traceable_keeps_the_direction(padded_batch):
    """Graph export undoes unpadding, not the direction (the ONNX export traces this model)."""
    _, patched = stock_and_directed(BertForSequenceClassification, "causal")
    with torch.no_grad():
        expected = patched(**padded_batch).logits
        traced = traceable(patched)(**padded_batch).logits
    assert attention_direction(patched) == "causal"
    torch.testing.assert_close(traced, expected, atol=1e-5, rtol=1e-5)


def test_last_tokens_on_either_padding_side():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0]])
    assert last_tokens(mask, 3, 4).tolist() == [2, 3, 0]
    assert last_tokens(None, 2, 5).tolist() == [4, 4]
    with pytest.raises(BertTasksError, match="padding mask"):
        last_tokens(mask[:, None, None, :], 3, 4)


def test_bad_direction_and_decoders_are_refused():
    _, patched = stock_and_directed(BertModel, "causal")
    with pytest.raises(BertTasksError, match="attention='sideways': choose one of bidirectional, causal"):
        set_attention_direction(patched, "sideways")
    decoder = patch_bert(BertModel(tiny_bert_config(is_decoder=True)))
    with pytest.raises(BertTasksError, match="is a decoder"):
        set_attention_direction(decoder, "right_to_left")
    with pytest.raises(BertTasksError, match="patch_bert"):
        set_attention_direction(BertModel(tiny_bert_config()), "causal")
