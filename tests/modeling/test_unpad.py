"""Unpadding: patched models run their layers on the real tokens only, and fall back where they must."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from transformers import (
    AutoTokenizer,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
    pipeline,
)

from bert_tasks import patch_bert
from bert_tasks.modeling import unpad
from bert_tasks.modeling.load import bundled_model_dir
from bert_tasks.modeling.unpad import Unpadding, packed_rows, token_mask
from tests.helpers import assert_same_training_step, at_real_tokens, tiny_bert_config


def stock_and_patched(model_class=BertModel, **overrides):
    """A stock model (sdpa masks) and a patched deep copy, both in eval mode, no dropout."""
    torch.manual_seed(0)
    config = tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)
    config._attn_implementation = "sdpa"
    stock = model_class(config).eval()
    return stock, patch_bert(copy.deepcopy(stock))


def test_layers_run_on_real_tokens_only(padded_batch, gathered_rows):
    stock, patched = stock_and_patched()
    with torch.no_grad():
        expected = stock(**padded_batch).last_hidden_state
        actual = patched(**padded_batch).last_hidden_state  # [B, T, C]
    real = int(padded_batch["attention_mask"].sum())  # 11 + 7 + 3 = 21 of 33 positions
    # the embeddings, then each of the 2 layers' attention context: the 21 real tokens and, in CPU
    # inference, 3 zero rows after them (packed_rows: 24)
    assert gathered_rows == [packed_rows(real)] * 3 == [24] * 3
    mask = padded_batch["attention_mask"]
    torch.testing.assert_close(at_real_tokens(actual, mask), at_real_tokens(expected, mask))
    assert actual[mask == 0].abs().max() == 0  # padding positions: zeros, not stale values


def test_token_classification_gradients_match_through_unpadding(padded_batch, gathered_rows):
    stock, patched = stock_and_patched(BertForTokenClassification, num_labels=3)
    labels = torch.randint(0, 3, padded_batch["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    labels[padded_batch["attention_mask"] == 0] = -100
    assert_same_training_step(stock, patched, padded_batch, labels)
    assert gathered_rows


def test_gradient_checkpointing_through_unpadding(padded_batch, gathered_rows):
    _, plain = stock_and_patched(BertForTokenClassification, num_labels=3)
    checkpointed = copy.deepcopy(plain)
    checkpointed.gradient_checkpointing_enable()
    grads = []
    for model in (plain, checkpointed):
        model.train()
        model(**padded_batch).logits.sum().backward()
        grads.append(model.bert.embeddings.word_embeddings.weight.grad)
    assert gathered_rows
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
def test_captured_outputs_keep_the_padded_path(padded_batch, gathered_rows, flag):
    """Captured per-layer tensors keep transformers' [B, T, ...] shapes: stock's numbers everywhere."""
    stock, patched = stock_and_patched()
    with torch.no_grad():
        expected = stock(**padded_batch, **{flag: True})
        actual = patched(**padded_batch, **{flag: True})
    assert gathered_rows == []
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state)
    captured = actual[flag.removeprefix("output_")]
    assert [tensor.shape[0] for tensor in captured] == [3] * len(captured) and len(captured) >= 2


def test_no_padding_keeps_the_padded_path(gathered_rows):
    stock, patched = stock_and_patched()
    input_ids = torch.randint(1000, 30000, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(patched(input_ids).last_hidden_state, stock(input_ids).last_hidden_state)
    assert gathered_rows == []


def test_left_padding_keeps_the_padded_path(padded_batch, gathered_rows):
    """Heads read position 0: a batch padded on the left is left exactly as stock computes it."""
    stock, patched = stock_and_patched()
    flipped = {name: tensor.flip(1) for name, tensor in padded_batch.items()}
    with torch.no_grad():
        torch.testing.assert_close(patched(**flipped).last_hidden_state, stock(**flipped).last_hidden_state)
    assert gathered_rows == []


def test_decoder_keeps_the_padded_path(padded_batch, gathered_rows):
    stock, patched = stock_and_patched(BertLMHeadModel, is_decoder=True)
    with torch.no_grad():
        expected = stock(**padded_batch, use_cache=False).logits
        actual = patched(**padded_batch, use_cache=False).logits
    mask = padded_batch["attention_mask"]
    torch.testing.assert_close(at_real_tokens(actual, mask), at_real_tokens(expected, mask))
    assert gathered_rows == []


def _key_padding(keep: torch.Tensor) -> torch.Tensor:
    """transformers' sdpa mask form: bool [B, 1, T, T], an expanded view of the [B, T] padding mask."""
    batch, seq_len = keep.shape
    return keep[:, None, None, :].expand(batch, 1, seq_len, seq_len)


def test_token_mask_reads_every_padding_mask_form():
    keep = torch.tensor([[True, True, True, False], [True, True, True, True]])
    additive = torch.zeros(2, 1, 4, 4).masked_fill(~_key_padding(keep), torch.finfo(torch.float).min)
    for mask in (_key_padding(keep), _key_padding(keep).contiguous(), additive):
        torch.testing.assert_close(token_mask(mask), keep)


def test_token_mask_refuses_masks_that_are_not_padding():
    keep = torch.tensor([[True, True, True, False], [True, True, True, True]])
    rows_differ = _key_padding(keep).clone()
    rows_differ[0, 0, 1, 0] = False
    biased = torch.zeros(2, 1, 4, 4)
    biased[0, 0, :, 3] = -1.0  # a soft bias, not masking: every token still counts
    for mask in (None, _key_padding(torch.ones(2, 4, dtype=torch.bool)), rows_differ, biased, keep):
        assert token_mask(mask) is None


def test_unpadding_round_trip():
    tokens = torch.tensor([[True, True, False], [True, False, False]])
    unpadding = Unpadding.from_token_mask(tokens)
    padded = torch.arange(18.0).view(2, 3, 3)  # [B, T, C]
    packed = unpadding.gather(padded)  # [N, C]
    assert packed.tolist() == [[0, 1, 2], [3, 4, 5], [9, 10, 11]]
    restored = unpadding.scatter(packed)
    torch.testing.assert_close(restored[tokens], padded[tokens])
    assert restored[~tokens].abs().max() == 0


def test_packed_rows_are_few_sizes_at_most_an_eighth_over():
    sizes = {real: packed_rows(real) for real in range(1, 8193)}
    assert all(real <= rows and rows % 8 == 0 for real, rows in sizes.items())
    assert all(rows - real < max(8, real / 8) for real, rows in sizes.items())
    assert len(set(sizes.values())) <= 16 + 8 * 6  # below 128 every 8th, then 8 an octave up to 8192
    assert packed_rows(21) == 24 and packed_rows(128) == 128 and packed_rows(129) == 144


def test_a_bucketed_round_trip_drops_its_zero_rows():
    tokens = torch.tensor([[True, True, False], [True, False, False]])
    unpadding = Unpadding.from_token_mask(tokens, bucketed=True)
    padded = torch.arange(18.0).view(2, 3, 3)  # [B, T, C]
    packed = unpadding.gather(padded)  # [8, C]: 3 real rows, 5 zero rows
    assert unpadding.rows == 8 and packed.shape == (8, 3) and packed[3:].abs().max() == 0
    restored = unpadding.scatter(packed + 1.0)  # what a layer leaves in the extra rows never comes back
    torch.testing.assert_close(restored[tokens], padded[tokens] + 1.0)
    assert restored[~tokens].abs().max() == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "model_class", [BertModel, BertForSequenceClassification, BertForTokenClassification]
)
def test_cpu_inference_packs_bucketed_rows_and_computes_the_same(
    padded_batch, gathered_rows, model_class, precision
):
    """In inference on CPU, fp32 or under bf16 autocast, the packed matrix has `packed_rows(N)` rows; the
    outputs are stock BERT's (training packs N exactly: its dropout draws stay as they were)."""
    stock, patched = stock_and_patched(model_class, num_labels=3)
    real = int(padded_batch["attention_mask"].sum())  # 21
    bf16 = precision == "bf16"
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        expected = stock(**padded_batch)
        assert not gathered_rows  # stock BERT has no packed layout
        bucketed = patched(**padded_batch)
    assert set(gathered_rows) == {packed_rows(real)} == {24}
    mask = padded_batch["attention_mask"]
    want, got = (
        out.logits if hasattr(out, "logits") else out.last_hidden_state for out in (expected, bucketed)
    )
    if got.dim() == 3:
        want, got = at_real_tokens(want, mask), at_real_tokens(got, mask)
    tolerance = {"atol": 0.05, "rtol": 0.05} if bf16 else {}  # bf16: another summation order, 8 bits
    torch.testing.assert_close(got.float(), want.float(), **tolerance)
    gathered_rows.clear()
    patched.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        patched(**padded_batch)
    assert set(gathered_rows) == {real}


@pytest.fixture
def first_token_layers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch size of each last layer run for the first token only: empty when it ran in full."""
    batches: list[int] = []
    through = unpad._first_tokens_through

    def spy(*args: object) -> torch.Tensor:
        first = through(*args)
        batches.append(first.shape[0])
        return first

    monkeypatch.setattr(unpad, "_first_tokens_through", spy)
    return batches


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "no-padding"])
def test_classifier_last_layer_runs_first_tokens_only(padded_batch, first_token_layers, padded):
    """Exact for a [CLS] head: same logits, same loss, same gradient for every parameter."""
    stock, patched = stock_and_patched(BertForSequenceClassification)
    batch = padded_batch if padded else {"input_ids": padded_batch["input_ids"][:, :3]}
    assert_same_training_step(stock, patched, batch, labels=torch.tensor([0, 1, 1]))
    assert first_token_layers == [3]


def test_base_model_of_a_classifier_still_returns_every_token(padded_batch, first_token_layers):
    """Only the head's own forward asks for [CLS] only: `model.bert(...)` serves embeddings as usual."""
    stock, patched = stock_and_patched(BertForSequenceClassification)
    with torch.no_grad():
        expected = stock.bert(**padded_batch).last_hidden_state
        actual = patched.bert(**padded_batch).last_hidden_state
    mask = padded_batch["attention_mask"]
    torch.testing.assert_close(at_real_tokens(actual, mask), at_real_tokens(expected, mask))
    assert first_token_layers == []


def test_classifier_keeps_its_signature_and_copies():
    """Trainer and pipelines read `inspect.signature(model.forward)`; a deep copy calls its own weights."""
    _, patched = stock_and_patched(BertForSequenceClassification)
    assert list(inspect.signature(patched.forward).parameters)[:2] == ["input_ids", "attention_mask"]
    copied = copy.deepcopy(patched)
    assert copied.forward.__self__ is copied
    assert patch_bert(copied).forward.__func__ is copied.forward.__func__  # idempotent


def test_checkpointed_last_layer_runs_in_full(padded_batch, first_token_layers):
    _, patched = stock_and_patched(BertForSequenceClassification)
    expected = patched(**padded_batch).logits
    patched.gradient_checkpointing_enable()
    patched.train()
    actual = patched(**padded_batch).logits
    actual.sum().backward()
    assert first_token_layers == [3]  # the eval-mode call only
    torch.testing.assert_close(actual, expected)


def test_wrapped_last_layer_runs_in_full(padded_batch, first_token_layers):
    """FSDP2 swaps each layer's class for a wrapper subclass that gathers its weights around forward."""
    stock, patched = stock_and_patched(BertForSequenceClassification)
    last = patched.bert.encoder.layer[-1]
    last.__class__ = type("FSDPBertLayer", (type(last),), {})
    with torch.no_grad():
        torch.testing.assert_close(patched(**padded_batch).logits, stock(**padded_batch).logits)
    assert first_token_layers == []


def test_token_pipeline_over_padded_batches_matches_stock(gathered_rows):
    """transformers' token-classification pipeline pads batches and marks padding as special tokens, so
    the zeros a patched model leaves there never reach its entities."""
    stock, patched = stock_and_patched(BertForTokenClassification, num_labels=5)
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    texts = [
        "Aspirin eased the headache.",
        "Fever.",
        "The patient developed acute renal failure after cisplatin.",
    ]
    found = [
        pipeline("token-classification", model=model, tokenizer=tokenizer, batch_size=3)(texts)
        for model in (stock, patched)
    ]
    assert gathered_rows  # the batch was padded, and unpadded inside the model
    for stock_entities, patched_entities in zip(*found, strict=True):
        assert [e["word"] for e in patched_entities] == [e["word"] for e in stock_entities]
        assert [e["entity"] for e in patched_entities] == [e["entity"] for e in stock_entities]
        assert [e["score"] for e in patched_entities] == pytest.approx([e["score"] for e in stock_entities])


def test_length_groups_keep_lengths_within_the_ratio_of_their_longest():
    assert unpad._length_groups([11, 7, 3]) == [[0], [1], [2]]
    # 13 * 1.5 <= 20 opens a second group; 9 * 1.5 > 13 stays in it
    assert unpad._length_groups([15, 20, 9, 18, 13]) == [[1, 3, 0], [4, 2]]
    assert unpad._length_groups([8, 8, 6]) == [[0, 1, 2]]  # close lengths: one group, one layout


@pytest.fixture
def attention_groups(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The sequences of each attention group of each forward (empty lists: one [B, T] layout)."""
    made: list[list[int]] = []
    in_groups = Unpadding.in_groups

    def spy(self: Unpadding, attention_mask: torch.Tensor | None) -> Unpadding:
        grouped = in_groups(self, attention_mask)
        made.append([len(group.sequences) for group in grouped.groups])
        return grouped

    monkeypatch.setattr(Unpadding, "in_groups", spy)
    return made


@pytest.mark.parametrize("direction", ["bidirectional", "causal", "right_to_left"])
@pytest.mark.parametrize("model_class", [BertForSequenceClassification, BertForTokenClassification])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_in_length_groups_equals_one_layout(
    padded_batch, attention_groups, monkeypatch, direction, model_class, dtype
):
    """CPU inference attends a mixed-length batch group by group (lengths 11, 7, 3: three groups); the
    logits are those of the whole batch in one [B, T] layout at every real token, for every direction and
    for a head that reads the first token only."""
    from bert_tasks.modeling.patch import set_attention_direction

    _, patched = stock_and_patched(model_class, num_labels=3)
    set_attention_direction(patched, direction)
    mask = padded_batch["attention_mask"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        grouped = patched(**padded_batch).logits.float()
        monkeypatch.setattr(unpad, "_GROUP_LENGTH_RATIO", float("inf"))  # every batch one group
        whole = patched(**padded_batch).logits.float()
    assert attention_groups == [[1, 1, 1], []]
    if grouped.dim() == 3:
        grouped, whole = at_real_tokens(grouped, mask), at_real_tokens(whole, mask)
    tolerance = {"atol": 0.05, "rtol": 0.05} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(grouped, whole, **tolerance)


def test_training_keeps_one_layout(padded_batch, attention_groups):
    """Training (gradients on) never groups: its dropout draws and gradients stay as they were."""
    _, patched = stock_and_patched(BertForTokenClassification, num_labels=3)
    patched.train()
    patched(**padded_batch).logits.sum().backward()
    assert attention_groups == []
