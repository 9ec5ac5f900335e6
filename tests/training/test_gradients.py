"""The word embeddings' touched-rows gradient and the clipping of gradients.py against torch's own path:
the same gradients, the same norm, the same AdamW updates, step after step."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import BertForMaskedLM, BertForSequenceClassification

from bert_tasks.modeling.patch import patch_bert
from bert_tasks.training import train
from bert_tasks.training.gradients import GradientBook, TouchedRowsEmbedding
from tests.helpers import read_log, tiny_bert_config, tiny_config

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # deterministic
    model = patch_bert(BertForSequenceClassification(config))
    return model.train()


def _batches(count: int) -> list[Batch]:
    """Right-padded batches whose ids repeat within a batch (rows summed twice) and include padding (0)."""
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        ids = torch.randint(1000, 1040, (4, 9), generator=generator)  # 40 ids: many repeats
        mask = torch.ones_like(ids)
        mask[1, 5:] = mask[3, 2:] = 0
        ids[mask == 0] = 0
        batches.append((ids, mask, torch.randint(0, 2, (4,), generator=generator)))
    return batches


def _torch_steps(model: nn.Module, batches: list[Batch], max_norm: float, accumulate: int) -> list[float]:
    """torch's path: dense embedding gradient, clip_grad_norm_, fused AdamW; the norm of each update."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, fused=True)
    norms = []
    for index, (ids, mask, labels) in enumerate(batches, start=1):
        (model(input_ids=ids, attention_mask=mask, labels=labels).loss / accumulate).backward()
        if index % accumulate == 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or float("inf"))))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return norms


def _book_steps(model: nn.Module, batches: list[Batch], max_norm: float, accumulate: int) -> list[float]:
    """The run's path: GradientBook with touched rows, the same optimizer."""
    book = GradientBook(model, touched_rows=True)
    assert book.describe == "touched rows"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, fused=True)
    norms = []
    for index, (ids, mask, labels) in enumerate(batches, start=1):
        (model(input_ids=ids, attention_mask=mask, labels=labels).loss / accumulate).backward()
        if index % accumulate == 0:
            norms.append(float(book.clip(max_norm)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            book.cleared()
            assert torch.count_nonzero(model.get_input_embeddings().weight.grad) == 0
    book.release()
    return norms


@pytest.mark.parametrize(
    ("max_norm", "accumulate", "tolerance"),
    [(1e-3, 1, 1e-6), (1e6, 1, 0.0), (0.0, 1, 0.0), (1e-3, 2, 1e-6)],
    ids=["clipping", "never-clipping", "no-clipping", "accumulating"],
)
def test_touched_rows_train_as_torch_does(max_norm: float, accumulate: int, tolerance: float) -> None:
    """Bit for bit where nothing is clipped; clipped, the norm read from the non-zero rows only may differ
    in its last bit (another summation order), and so may the scaled weights."""
    batches = _batches(6)
    dense, touched = _model(), _model()
    want = _torch_steps(dense, batches, max_norm, accumulate)
    got = _book_steps(touched, batches, max_norm, accumulate)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    looked_up = torch.unique(torch.cat([ids.flatten() for ids, _, _ in batches]))
    for (name, want_param), got_param in zip(dense.named_parameters(), touched.parameters(), strict=True):
        torch.testing.assert_close(got_param, want_param, rtol=0, atol=tolerance, msg=name)
    # Rows no batch looked up still moved: AdamW's weight decay steps on the whole dense buffer.
    start = _model().get_input_embeddings().weight
    untouched = torch.ones(start.shape[0], dtype=torch.bool)
    untouched[looked_up] = False
    weights = touched.get_input_embeddings().weight
    assert not torch.equal(weights[untouched], start[untouched])
    torch.testing.assert_close(
        weights[untouched], dense.get_input_embeddings().weight[untouched], rtol=0, atol=0
    )


def test_the_padding_row_gets_no_gradient() -> None:
    model = _model()
    book = GradientBook(model, touched_rows=True)
    ids, mask, labels = _batches(1)[0]
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    grad = model.get_input_embeddings().weight.grad
    assert torch.count_nonzero(grad[0]) == 0
    assert torch.count_nonzero(grad[1000:1040].abs().sum(dim=1)) > 0
    book.release()


def test_release_gives_the_plain_embedding_back() -> None:
    model = _model()
    embedding = model.get_input_embeddings()
    book = GradientBook(model, touched_rows=True)
    assert type(embedding) is TouchedRowsEmbedding
    book.release()
    assert type(embedding) is nn.Embedding and embedding.weight.grad is None
    assert not hasattr(embedding, "touched_rows")
    assert set(model.state_dict()) == set(_model().state_dict())


def test_a_tied_or_frozen_embedding_keeps_the_dense_gradient() -> None:
    tied = BertForMaskedLM(tiny_bert_config())  # the output layer shares the input embeddings' weight
    assert GradientBook(tied, touched_rows=True).describe == "dense"
    frozen = _model()
    frozen.get_input_embeddings().weight.requires_grad_(False)
    assert GradientBook(frozen, touched_rows=True).describe == "dense"
    assert GradientBook(_model(), touched_rows=False).describe == "dense"


def test_clip_without_gradients_is_a_zero_norm() -> None:
    assert float(GradientBook(copy.deepcopy(_model()), touched_rows=True).clip(1.0)) == 0.0


def test_max_grad_norm_zero_trains_unclipped(tiny_model: Path, tmp_path: Path) -> None:
    """0 = no clipping: the run measures the norm and still learns (a bound of 0 would zero every update)."""
    cfg = tiny_config(
        "sentiment", tiny_model, tmp_path / "run", max_grad_norm=0.0, logging_steps=1, max_steps=2
    )
    logged = [record for record in read_log(train(cfg)) if "grad_norm" in record]
    assert logged and all(record["grad_norm"] > 0 for record in logged)
    first = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=2).bert.pooler.dense.weight
    trained = BertForSequenceClassification.from_pretrained(tmp_path / "run").bert.pooler.dense.weight
    assert not torch.equal(first, trained)


def test_frozen_embeddings_stay_as_the_base_model_has_them(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "run", freeze_embeddings=True, lr=1e-2)
    with caplog.at_level("INFO", logger="bert_tasks"):
        trained = BertForSequenceClassification.from_pretrained(train(cfg))
    base = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    assert torch.equal(
        trained.bert.embeddings.word_embeddings.weight, base.bert.embeddings.word_embeddings.weight
    )
    assert not torch.equal(trained.bert.pooler.dense.weight, base.bert.pooler.dense.weight)
    assert "word-embedding gradient: none (frozen)" in caplog.text
