"""The one split rule, for every task: each split from its file if given, else from the hub, else absent.

The hub is replaced by in-memory datasets (no network in tests): `hub_split_names` and `load_hub_split`
are the only two functions that reach it, and they are swapped for ones serving local `Dataset`s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from bert_tasks.config import load_recipe
from bert_tasks.data import ner_files, text_classification
from bert_tasks.data import splits as split_rule
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks import get_task
from tests.helpers import write_conll, write_jsonl


def sentiment_hub() -> dict[str, Dataset]:
    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
    rows = {"sentence": ["hub good", "hub bad"], "label": [1, 0]}
    hidden = {"sentence": ["no label"], "label": [-1]}  # GLUE's test splits hide their labels
    return {
        "train": Dataset.from_dict(rows, features=features),
        "validation": Dataset.from_dict(rows, features=features),
        "test": Dataset.from_dict(hidden, features=features),
    }


def ner_hub() -> dict[str, Dataset]:
    tags = Sequence(ClassLabel(names=["O", "B-Disease", "I-Disease"]))
    features = Features({"tokens": Sequence(Value("string")), "ner_tags": tags})
    rows = {"tokens": [["hub", "fever"]], "ner_tags": [[0, 1]]}
    return {split: Dataset.from_dict(rows, features=features) for split in ("train", "validation", "test")}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Dataset]]:
    served = {"sst": sentiment_hub(), "ncbi": ner_hub()}
    monkeypatch.setattr(split_rule, "hub_split_names", lambda dataset: list(served[dataset]))

    def load(dataset: str, split: str, columns: tuple[str, ...], setting: str) -> Dataset:
        return served[dataset][split]

    monkeypatch.setattr(text_classification, "load_hub_split", load)
    monkeypatch.setattr(ner_files, "load_hub_split", load)
    return served


def read(task: str, overrides: list[str]) -> dict[str, Dataset]:
    cfg = load_recipe(None, overrides, task=task)
    return split_rule.read_splits(get_task(cfg), cfg)


@pytest.mark.usefixtures("hub")
def test_sentiment_takes_each_split_from_its_file_else_the_hub(tmp_path: Path) -> None:
    """The bug this rule fixed: with dataset= set, sentiment ignored validation_file and test_file."""
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"sentence": "file good", "label": "positive"}])
    test = write_jsonl(tmp_path / "test.jsonl", [{"sentence": "file bad", "label": "negative"}])
    both = read(
        "sentiment", ["dataset=sst", "text_column=sentence", f"validation_file={dev}", f"test_file={test}"]
    )
    assert list(both) == ["train", "validation", "test"]
    assert both["train"]["text"] == ["hub good", "hub bad"]
    assert both["validation"]["text"] == ["file good"]
    assert both["test"]["text"] == ["file bad"]


@pytest.mark.usefixtures("hub")
def test_a_hub_split_without_labels_is_absent() -> None:
    """GLUE's test split (labels -1) has nothing to score: the run reads train and validation only."""
    assert list(read("sentiment", ["dataset=sst", "text_column=sentence"])) == ["train", "validation"]


@pytest.mark.usefixtures("hub")
def test_ner_follows_the_same_rule(tmp_path: Path) -> None:
    dev = write_conll(tmp_path / "dev.conll", [[("file", "O"), ("cough", "B-Disease")]])
    data = read("ner", ["dataset=ncbi", "tag_column=ner_tags", f"validation_file={dev}"])
    assert list(data) == ["train", "validation", "test"]
    assert data["train"]["tokens"] == [["hub", "fever"]]
    assert data["validation"]["tokens"] == [["file", "cough"]]
    assert data["test"]["tags"] == [["O", "B-Disease"]]


@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_files_alone_and_caps_apply_to_every_split(task: str, tmp_path: Path) -> None:
    if task == "sentiment":
        rows = [{"text": f"text {i}", "label": "positive" if i % 2 else "negative"} for i in range(5)]
        train = write_jsonl(tmp_path / "train.jsonl", rows)
    else:
        train = write_conll(tmp_path / "train.conll", [[(f"w{i}", "B-Disease")] for i in range(5)])
    data = read(
        task, [f"train_file={train}", f"test_file={train}", "max_train_samples=3", "max_eval_samples=2"]
    )
    assert {split: len(rows) for split, rows in data.items()} == {"train": 3, "test": 2}


@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_a_training_set_with_one_label_only_is_refused(task: str, tmp_path: Path) -> None:
    """One sentiment class, or NER data without a single entity, would train to loss 0 and score 1.0."""
    if task == "sentiment":
        train = write_jsonl(tmp_path / "train.jsonl", [{"text": f"t {i}", "label": "pos"} for i in range(4)])
        label = "'pos'"
    else:
        train = write_conll(tmp_path / "train.conll", [[("no", "O"), ("entity", "O")]] * 3)
        label = "'O'"
    with pytest.raises(BertTasksError, match=f"^{train}: the training data has one label only \\({label}\\)"):
        read(task, [f"train_file={train}"])
