"""In-memory data for the library: `train(cfg, data=...)` and `evaluate_data` take records, DataFrames and
Datasets.

Trained on the tiny random BERT: the same rows in memory and in a file give the same weights at one seed,
and bad in-memory rows are the file readers' one-line errors, `where` naming the split and row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value
from safetensors.torch import load_file

from bert_tasks.config import load_recipe
from bert_tasks.data.in_memory import split_data
from bert_tasks.data.ner_files import read_conll
from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import evaluate_data
from bert_tasks.tasks import get_task
from bert_tasks.training import train
from tests.helpers import DATA, FAST, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")


def sentiment_rows(split: int) -> list[dict[str, Any]]:
    path = DATA["sentiment"][split]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def in_memory_config(task: str, model: Path, out: Path, **overrides: Any) -> Any:
    """A tiny run's config without data files: the data comes in memory."""
    return tiny_config(task, model, out, train_file="none", validation_file="none", **overrides)


def same_weights(a: Path, b: Path) -> bool:
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)


@pytest.fixture(scope="module")
def from_file(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("file") / "run"))


@pytest.mark.parametrize("form", ["records", "dataframe", "dataset"])
@pytest.mark.slow
def test_sentiment_in_memory_trains_the_weights_the_file_trains(
    form: str, from_file: Path, tiny_model: Path, tmp_path: Path
) -> None:
    train_rows, validation_rows = sentiment_rows(0), sentiment_rows(1)
    make = {"records": list, "dataframe": pd.DataFrame, "dataset": Dataset.from_list}[form]
    data = {"train": make(train_rows), "validation": make(validation_rows)}
    if form == "dataset":
        data = DatasetDict(data)
    run = train(in_memory_config("sentiment", tiny_model, tmp_path / "run"), data=data)
    assert same_weights(run, from_file)
    assert (
        json.loads((run / "metrics.json").read_text())["validation"]
        == json.loads((from_file / "metrics.json").read_text())["validation"]
    )
    card = (run / "README.md").read_text(encoding="utf-8")
    assert "| train | in memory (`train(cfg, data=...)`) | 40 |" in card
    assert "| validation | in memory (`train(cfg, data=...)`) | 12 |" in card
    recipe = (run / "recipe.yaml").read_text(encoding="utf-8")
    assert "# Data given in memory, not named here (train 40 rows, validation 12 rows)" in recipe
    assert yaml.safe_load(recipe)["train_file"] is None


@pytest.mark.slow
def test_one_split_is_the_training_data_and_the_demo_files_go_unused(
    tiny_model: Path, tmp_path: Path
) -> None:
    """`load_recipe` fills the demo files in; in-memory data is the user's, never mixed with the demo's."""
    overrides = [f"{key}={value}" for key, value in FAST.items()]
    cfg = load_recipe(
        None, [*overrides, f"model={tiny_model}", f"output_dir={tmp_path / 'run'}"], "sentiment"
    )
    assert cfg.train_file is not None and cfg.validation_file is not None  # the demo's
    run = train(cfg, data=pd.DataFrame(sentiment_rows(0)))
    assert "validation" not in json.loads((run / "metrics.json").read_text())  # the demo's was not read
    assert yaml.safe_load((run / "recipe.yaml").read_text())["validation_file"] is None


@pytest.mark.slow
def test_ner_in_memory_dataset_with_class_label_tags_trains_the_weights_the_file_trains(
    tiny_model: Path, tmp_path: Path
) -> None:
    names = ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    features = Features({"tokens": List(Value("string")), "ner_tags": List(ClassLabel(names=names))})

    def dataset(split: int) -> Dataset:
        sentences = read_conll(DATA["ner"][split])
        tags = [[names.index(tag) for tag in row] for row in sentences["tags"]]
        return Dataset.from_dict({"tokens": sentences["tokens"][:], "ner_tags": tags}, features=features)

    overrides = {"max_train_samples": "24", "max_eval_samples": "8"}
    by_file = train(tiny_config("ner", tiny_model, tmp_path / "file", **overrides))
    cfg = in_memory_config("ner", tiny_model, tmp_path / "memory", tag_column="ner_tags", **overrides)
    run = train(cfg, data={"train": dataset(0), "validation": dataset(1)})
    assert same_weights(run, by_file)


def test_evaluate_data_scores_records_as_evaluate_scores_the_file(sentiment_run: Path) -> None:
    from bert_tasks.inference.evaluate import read_labelled_file
    from bert_tasks.inference.predictor import Predictor

    expected = Predictor(sentiment_run).evaluate(
        read_labelled_file(sentiment_run, str(DATA["sentiment"][1]))[0]
    )
    assert evaluate_data(sentiment_run, pd.DataFrame(sentiment_rows(1))) == expected
    with pytest.raises(BertTasksError) as error:
        evaluate_data(sentiment_run, [{"text": "so so", "label": "meh"}])
    assert str(error.value) == (
        "test data (in memory): label 'meh' (first in example 1) is not one the model knows (negative, "
        "positive); evaluate on data with the model's labels, or train a model that has it"
    )


ROW = "train data (in memory), row 1"
BAD_SENTIMENT = [
    (
        [{"text": "fine", "label": "positive"}, {"review": "x", "label": "negative"}],
        f"{ROW}: expected columns text_column='text' and label_column='label', found review, label; "
        "set text_column/label_column to match the data",
    ),
    (
        [{"text": "fine", "label": "positive"}, {"text": "  ", "label": "negative"}],
        f"{ROW}: empty text in column 'text'; fill it in or drop the row",
    ),
    (
        pd.DataFrame({"text": ["fine", "bad"], "label": ["positive", None]}),
        f"{ROW}: missing label in column 'label'; give every row a label",
    ),
    (
        pd.DataFrame({"text": ["fine", "bad"], "label": [1.0, 2.5]}),
        f"{ROW}: label 2.5 (a float) in column 'label' is not a class; write labels as strings or integers "
        "(or set regression=true for numbers)",
    ),
    (
        [{"text": "fine", "label": "positive"}, "bad"],
        f"{ROW}: a str, not a record (a dict of column -> value); give every row as a dict",
    ),
    (
        {"train": [{"text": "a", "label": "x"}], "dev": [{"text": "b", "label": "y"}]},
        "data: unknown split 'dev'; name the splits train, validation, test (e.g. rename 'dev' to "
        "'validation')",
    ),
    (
        "train.jsonl",
        "train data (in memory): a str, not a list of records (dicts), a pandas DataFrame or a "
        "datasets.Dataset; pass one of those",
    ),
    ([], "train data (in memory): no rows; give at least one labelled example"),
    (
        Dataset.from_dict({"text": ["fine", "bad\x00"], "label": ["positive", "negative"]}),
        f"{ROW}: NUL character (\\x00) at character offset 3 of the text in column 'text'; remove it (NULs "
        "usually mean a binary or UTF-16 file: re-save it as UTF-8 text)",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_SENTIMENT, ids=range(len(BAD_SENTIMENT)))
def test_bad_sentiment_data_is_the_file_readers_one_line(data: Any, message: str, tmp_path: Path) -> None:
    cfg = in_memory_config("sentiment", Path("unused-model"), tmp_path / "run")
    with pytest.raises(BertTasksError) as error:
        train(cfg, data=data)
    assert str(error.value) == message
    assert not (tmp_path / "run").exists()  # refused before the output dir is made


BAD_NER = [
    (
        [{"tokens": ["a"], "tags": ["O"]}, {"tokens": ["fever"], "tags": ["Disease"]}],
        f"{ROW}: tag 'Disease' is not BIO (O, B-TYPE, I-TYPE; IOBES, BILOU and BMES prefixes are read as "
        "BIO); convert the file to BIO (IOB2) or point conll_tag_index at the tag column",
    ),
    (
        [{"tokens": ["a"], "tags": ["O"]}, {"tokens": ["high", "fever"], "tags": ["B-Disease"]}],
        f"{ROW}: 2 tokens but 1 tags; give one tag per token",
    ),
    (
        [{"words": ["a"]}],
        "train data (in memory), row 0: fields ['words']; NER data needs 'tokens' + 'tags', or 'text' + "
        "'spans'; set tokens_column/tag_column/text_column",
    ),
    (
        [{"text": "high fever", "spans": [{"start": 5, "end": 11, "label": "Disease"}]}],
        "train data (in memory), row 0: span {'start': 5, 'end': 11, 'label': 'Disease'} needs integer "
        "start < end within the text (length 10); fix the offsets",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_NER, ids=range(len(BAD_NER)))
def test_bad_ner_data_is_the_file_readers_one_line(data: Any, message: str, tmp_path: Path) -> None:
    cfg = in_memory_config("ner", Path("unused-model"), tmp_path / "run")
    with pytest.raises(BertTasksError) as error:
        train(cfg, data=data)
    assert str(error.value) == message


def test_a_split_given_in_memory_and_as_a_file_is_one_line(tiny_model: Path, tmp_path: Path) -> None:
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "run")
    with pytest.raises(BertTasksError) as error:
        train(cfg, data={"validation": sentiment_rows(1)})
    assert str(error.value) == (
        f"validation data (in memory) and validation_file={DATA['sentiment'][1]} both give the validation "
        "split; pick one (validation_file=none to use the in-memory data)"
    )


def test_in_memory_records_carve_a_validation_split() -> None:
    rows = [{"text": f"t {i}", "label": "a" if i % 4 else "b"} for i in range(20)]  # a 15, b 5
    cfg = load_recipe(None, ["train_file=none", "validation_file=none", "validation_split=0.2"], "sentiment")
    data = read_splits(get_task(cfg), cfg, rows)
    assert sorted(data["validation"]["label"][:]) == ["a"] * 3 + ["b"]  # 15 * 0.2 = 3, 5 * 0.2 = 1


def test_bad_records_are_refused_before_torch_loads(tmp_path: Path) -> None:
    probe = (
        "import sys\nfrom bert_tasks import load_recipe, train\n"
        "from bert_tasks.errors import BertTasksError\n"
        "try:\n    train(load_recipe(None, [sys.argv[1]], 'sentiment'), data=[{'text': 1}])\n"
        "except BertTasksError as e:\n    print(e)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))"
    )
    command = [sys.executable, "-c", probe, f"output_dir={tmp_path / 'run'}"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines() == [
        "train data (in memory), row 0: expected columns text_column='text' and label_column='label', found "
        "text; set text_column/label_column to match the data",
        "[]",
    ]


def test_split_data_keeps_split_order() -> None:
    assert list(split_data({"test": [{}], "train": [{}]})) == ["train", "test"]
