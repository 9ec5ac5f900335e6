"""Prediction's list path (`Predictor.predict`: the task's `encode_batch` and `decode` on plain lists,
`PaddedBatches`) gives exactly the records of the Dataset path (`datasets.map` over the same encoding),
and its batches are the tensors the task's own collator builds in training, window for window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bert_tasks.data.batching import eval_loader
from bert_tasks.data.padded_batches import PaddedBatches, Padding
from bert_tasks.inference.predictor import Predictor
from bert_tasks.model_dir import load_finetuned
from tests.helpers import LONG_NER_TEXT, LONG_REVIEW

pytestmark = pytest.mark.usefixtures("single_thread")

#: Short and long texts, in no length order: several batches of 4 windows, texts cut into windows.
TEXTS = {
    "sentiment": ["Great.", LONG_REVIEW, "The soup was cold and the waiter rude.", "Fine", LONG_REVIEW[:90]],
    "ner": ["Aspirin caused nausea.", LONG_NER_TEXT, "No findings .", LONG_NER_TEXT[:120], "Cisplatin"],
}


@pytest.mark.parametrize("task", ["sentiment", "ner"])
@pytest.mark.slow
def test_the_list_path_gives_the_records_of_the_dataset_path(
    task: str, request: pytest.FixtureRequest
) -> None:
    predictor = Predictor(request.getfixturevalue(f"{task}_run"), batch_size=4)
    texts = TEXTS[task]
    raw = predictor.task.texts_to_raw(texts)
    encoded, logits = predictor.window_logits(raw)  # through datasets.map
    assert len(encoded) > len(texts) and len(encoded) > 4  # texts cut into windows, several batches
    predictions = predictor.task.decode(raw, encoded, logits, predictor.id2label)
    through_dataset = [predictor.task.record(t, p) for t, p in zip(texts, predictions, strict=True)]
    assert predictor.records(texts) == through_dataset
    assert predictor.records(texts[::-1]) == through_dataset[::-1]  # each text's record, whatever its batch


@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_padded_batches_are_the_collators_batches(task: str, request: pytest.FixtureRequest) -> None:
    """Same windows per batch, same order, same padded tensors as training's eval loader + collator."""
    loaded = load_finetuned(request.getfixturevalue(f"{task}_run"))
    task_, tokenizer = loaded.task, loaded.tokenizer
    encoded = task_.encode(task_.texts_to_raw(TEXTS[task] * 3), tokenizer, None, 32, 8)
    expected = list(eval_loader(encoded, task_.collator(tokenizer), 5))
    padding = Padding.of(tokenizer, task_.pad_to_multiple_of)
    found = list(PaddedBatches(encoded, 5, padding, torch.from_numpy))
    assert len(found) == len(expected) == len(PaddedBatches(encoded, 5, padding)) > 3
    for mine, theirs in zip(found, expected, strict=True):
        assert mine.keys() == theirs.keys()
        for name in theirs:
            torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=0)
        assert mine["input_ids"].shape[1] % 8 == 0


def test_a_batch_is_padded_to_its_longest_window_rounded_up() -> None:
    table = {"input_ids": [[5, 6, 7], [5], [5, 6, 7, 8, 9]], "attention_mask": [[1, 1, 1], [1], [1] * 5]}

    class Columns(dict):
        column_names = property(lambda self: list(self))

        def __len__(self) -> int:
            return len(self["input_ids"])

    batches = list(PaddedBatches(Columns(table), 2, Padding(input_id=0, token_type=0, multiple=4)))
    assert [batch["row"].tolist() for batch in batches] == [[1, 0], [2]]
    np.testing.assert_array_equal(batches[0]["input_ids"], [[5, 0, 0, 0], [5, 6, 7, 0]])
    np.testing.assert_array_equal(batches[0]["attention_mask"], [[1, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(batches[1]["input_ids"], [[5, 6, 7, 8, 9, 0, 0, 0]])
    assert "token_type_ids" not in batches[0]


@pytest.mark.parametrize("task", ["sentiment", "ner"])
@pytest.mark.parametrize("prepack", [True, False], ids=["prepacked", "plain-bf16"])
def test_bf16_prediction_gives_autocast_s_very_logits_with_weights_cast_once(
    task: str, prepack: bool, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under bf16 on CPU each Linear is cast to bf16 once and prepacked for oneDNN (or, where it cannot
    be, kept as a bf16 Linear: on a CPU without bf16 instructions, which has no bf16 oneDNN kernels)
    instead of autocast casting its fp32 weight every call; the window logits are bit for bit those of
    autocast over the fp32 weights either way, and the other layers stay fp32."""
    from bert_tasks.inference import prepacked_linear, torch_backend

    run = request.getfixturevalue(f"{task}_run")
    if not prepack:
        monkeypatch.setattr(prepacked_linear, "_packed_weight", lambda linear: None)
    held = Predictor(run, mixed_precision="bf16", progress=False)
    monkeypatch.setattr(torch_backend, "linear_weights_in_bf16", lambda model: None)
    monkeypatch.setattr(torch_backend, "prepack_linears", lambda model: 0)
    cast = Predictor(run, mixed_precision="bf16", progress=False)
    untouched = [m for m in cast.model.modules() if isinstance(m, torch.nn.Linear)]
    assert untouched and all(m.weight.dtype == torch.float32 for m in untouched)
    linears = [m for m in held.model.modules() if isinstance(m, torch.nn.Linear)]
    packed = [m for m in held.model.modules() if isinstance(m, prepacked_linear.PrepackedLinear)]
    packs = prepack and prepacked_linear._bf16_supported()
    assert len(packed if packs else linears) == len(untouched)
    assert all(m.weight.dtype == m.bias.dtype == torch.bfloat16 for m in linears)
    assert all(m.bias.dtype == torch.bfloat16 for m in packed)
    assert held.model.get_input_embeddings().weight.dtype == torch.float32
    assert held.model.state_dict().keys() == cast.model.state_dict().keys()  # save_pretrained still works
    texts = TEXTS[task]
    raw = held.task.texts_to_raw(texts)
    for mine, theirs in zip(held.window_logits(raw)[1], cast.window_logits(raw)[1], strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_fp32_prediction_with_prepacked_weights_agrees_with_plain_fp32_to_its_rounding(
    task: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp32 on CPU prepacks every Linear too (oneDNN's GEMM instead of MKL's: another summation order), so
    its logits agree with plain fp32 to fp32's rounding, not bit for bit, and give the same records."""
    from bert_tasks.inference import prepacked_linear, torch_backend

    run = request.getfixturevalue(f"{task}_run")
    packed = Predictor(run, mixed_precision="no", progress=False)
    monkeypatch.setattr(torch_backend, "prepack_linears", lambda model: 0)
    plain = Predictor(run, mixed_precision="no", progress=False)
    layers = [m for m in packed.model.modules() if isinstance(m, prepacked_linear.PrepackedLinear)]
    assert layers and all(m.dtype == torch.float32 for m in layers)
    raw = packed.task.texts_to_raw(TEXTS[task])
    for mine, theirs in zip(packed.window_logits(raw)[1], plain.window_logits(raw)[1], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert _rounded(packed.records(TEXTS[task])) == _rounded(plain.records(TEXTS[task]))


def _rounded(value: object) -> object:
    """Records with their scores to 4 decimals: labels, spans and offsets compared exactly."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value
