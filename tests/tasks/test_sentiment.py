"""SentimentTask: reading with label names and limits, windowed encoding, batching, metrics and decoding."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from bert_tasks.config import Config, load_recipe
from bert_tasks.data.batching import RowCollator, with_rows
from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.sentiment import SentimentTask
from bert_tasks.tasks.sentiment_shapes import METRICS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ID2LABEL = {0: "negative", 1: "positive"}
LABEL2ID = {"negative": 0, "positive": 1}
LONG_TEXT = (
    "The hotel looked lovely in the photos, but the room smelled of smoke, the shower ran cold for three "
    "days, and the staff at the front desk shrugged every time we asked for help; still, the breakfast "
    "was unexpectedly wonderful and the view over the harbour almost made up for everything else."
)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture
def task() -> SentimentTask:
    return SentimentTask()


def write_jsonl(path: Path, rows: list[tuple[str, str]]) -> str:
    path.write_text(
        "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows), encoding="utf-8"
    )
    return str(path)


def test_reads_packaged_demo_data(task: SentimentTask) -> None:
    cfg = load_recipe(None, task="sentiment")
    splits = read_splits(task, cfg)
    assert {name: len(ds) for name, ds in splits.items()} == {"train": 400, "validation": 100}
    assert task.label_names(splits["train"], cfg) == ["negative", "positive"]


def test_integer_labels_are_named_at_read_time(task: SentimentTask) -> None:
    cfg = Config(
        task="sentiment",
        train_file=str(FIXTURES / "sent_glue.tsv"),
        text_column="sentence",
        label_names=["neg", "pos"],
    )
    splits = read_splits(task, cfg)
    assert splits["train"]["label"] == ["pos", "neg", "pos"]
    assert task.label_names(splits["train"], cfg) == ["neg", "pos"]


def test_integer_label_outside_label_names(task: SentimentTask) -> None:
    cfg = Config(
        task="sentiment",
        train_file=str(FIXTURES / "sent_glue.tsv"),
        text_column="sentence",
        label_names=["neg"],
    )
    with pytest.raises(BertTasksError, match=r"sent_glue\.tsv: label '1' is neither in label_names \(neg\)"):
        read_splits(task, cfg)


def test_sample_limits_take_the_first_rows(task: SentimentTask) -> None:
    full = read_splits(task, load_recipe(None, task="sentiment"))
    limited = read_splits(
        task, load_recipe(None, ["max_train_samples=5", "max_eval_samples=3"], task="sentiment")
    )
    assert limited["train"]["text"] == full["train"]["text"][:5]
    assert limited["validation"]["text"] == full["validation"]["text"][:3]


def test_eval_label_unseen_in_train(task: SentimentTask, tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [("good", "pos"), ("bad", "neg")])
    dev = write_jsonl(tmp_path / "dev.jsonl", [("fine", "pos"), ("meh", "neutral")])
    cfg = Config(task="sentiment", train_file=train, validation_file=dev)
    with pytest.raises(BertTasksError, match=f"{dev}: label 'neutral' never occurs in the training data"):
        read_splits(task, cfg)


def test_no_data_configured(task: SentimentTask) -> None:
    with pytest.raises(BertTasksError, match="no data to read"):
        read_splits(task, Config(task="sentiment"))


def test_long_text_is_windowed_without_losing_a_token(
    task: SentimentTask, tokenizer: PreTrainedTokenizerBase
) -> None:
    raw = Dataset.from_dict({"text": [LONG_TEXT, "Short and sweet."], "label": ["negative", "positive"]})
    max_length, stride = 16, 4
    encoded = task.encode(raw, tokenizer, LABEL2ID, max_length=max_length, stride=stride)

    windows = [row for row in encoded if row["example_id"] == 0]
    assert len(windows) > 2
    assert all(len(w["input_ids"]) <= max_length for w in windows)
    assert all(w["labels"] == LABEL2ID["negative"] for w in windows)  # every window inherits the label
    inner = [w["input_ids"][1:-1] for w in windows]  # drop [CLS] and [SEP]
    rebuilt = inner[0] + [tok for window in inner[1:] for tok in window[stride:]]  # drop each overlap
    assert rebuilt == tokenizer(LONG_TEXT, add_special_tokens=False)["input_ids"]

    short = [row for row in encoded if row["example_id"] == 1]
    assert len(short) == 1 and short[0]["labels"] == LABEL2ID["positive"]
    assert set(encoded.column_names) >= {"input_ids", "attention_mask", "example_id", "labels"}


def test_encode_without_labels_for_prediction(
    task: SentimentTask, tokenizer: PreTrainedTokenizerBase
) -> None:
    encoded = task.encode(Dataset.from_dict({"text": ["no label here"]}), tokenizer, None, 16, 4)
    assert "labels" not in encoded.column_names
    assert encoded["example_id"] == [0]


def test_encode_rejects_label_the_model_lacks(
    task: SentimentTask, tokenizer: PreTrainedTokenizerBase
) -> None:
    raw = Dataset.from_dict({"text": ["so so"], "label": ["neutral"]})
    with pytest.raises(BertTasksError, match="label 'neutral' is not one the model knows"):
        task.encode(raw, tokenizer, LABEL2ID, 16, 4)


def test_the_known_labels_stay_one_short_line_with_a_thousand_classes(
    task: SentimentTask, tokenizer: PreTrainedTokenizerBase
) -> None:
    raw = Dataset.from_dict({"text": ["so so"], "label": ["neutral"]})
    many = {f"class-{i}": i for i in range(1000)}
    with pytest.raises(BertTasksError) as refused:
        task.encode(raw, tokenizer, many, 16, 4)
    assert "class-9, ... (1000 in all)" in str(refused.value) and len(str(refused.value)) < 250


def test_batches_pad_to_multiple_of_8_and_carry_rows_not_bookkeeping(
    task: SentimentTask, tokenizer: PreTrainedTokenizerBase
) -> None:
    """The one collator path (data/batching.RowCollator over the task's padding): model inputs and the
    encoded row of each window; `example_id` stays in the encoded dataset, where decoding reads it."""
    raw = Dataset.from_dict(
        {"text": ["Great.", "A much longer review of the place."], "label": ["positive"] * 2}
    )
    encoded = with_rows(task.encode(raw, tokenizer, LABEL2ID, 32, 8))
    batch = RowCollator(task.collator(tokenizer))([encoded[1], encoded[0]])
    assert batch["input_ids"].shape[1] % 8 == 0
    assert batch["attention_mask"][0].sum() > batch["attention_mask"][1].sum()
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "row"}
    assert torch.equal(batch["row"], torch.tensor([1, 0]))
    assert torch.equal(batch["labels"], torch.tensor([1, 1]))


# Three texts; the second is split into two windows whose *averaged* logits favour "negative".
RAW = Dataset.from_dict({"text": ["a", "b", "c"], "label": ["negative", "positive", "positive"]})
ENCODED = Dataset.from_dict({"example_id": [0, 1, 1, 2]})
WINDOW_LOGITS = [np.array([2.0, 0.0]), np.array([0.0, 1.0]), np.array([3.0, 0.0]), np.array([0.0, 5.0])]


def test_metrics_average_windows_per_text(task: SentimentTask) -> None:
    scores = task.metrics(RAW, ENCODED, WINDOW_LOGITS, ID2LABEL)
    assert scores["accuracy"] == pytest.approx(2 / 3)
    assert scores["confusion_matrix"] == [[1, 0], [1, 1]]  # gold rows, predicted columns
    assert scores["labels"] == ["negative", "positive"]
    assert scores["per_class"]["positive"] == {
        "precision": 1.0,
        "recall": 0.5,
        "f1": pytest.approx(2 / 3),
        "support": 2,
    }
    assert scores["macro_f1"] == pytest.approx((2 / 3 + 2 / 3) / 2)


def test_decode_gives_softmax_of_averaged_logits(task: SentimentTask) -> None:
    batches = [np.stack(WINDOW_LOGITS[:3]), np.stack(WINDOW_LOGITS[3:])]  # per-batch (B, C) arrays work too
    predictions = task.decode(RAW, ENCODED, batches, ID2LABEL)
    assert [p["label"] for p in predictions] == ["negative", "negative", "positive"]
    expected = np.exp([1.5, 0.5]) / np.exp([1.5, 0.5]).sum()  # mean of [0, 1] and [3, 0]
    assert predictions[1]["scores"] == {
        "negative": pytest.approx(expected[0]),
        "positive": pytest.approx(expected[1]),
    }
    assert predictions[1]["score"] == pytest.approx(expected[0])
    assert all(sum(p["scores"].values()) == pytest.approx(1.0) for p in predictions)


def test_metric_module_loads_offline() -> None:
    import evaluate

    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_EVALUATE_OFFLINE"] == "1"
    metric = evaluate.load(str(METRICS / "classification" / "classification.py"), keep_in_memory=True)
    scores = metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])
    assert scores["accuracy"] == pytest.approx(2 / 3)
    assert scores["confusion_matrix"] == [[1, 1], [0, 1]]
