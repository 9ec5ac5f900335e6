"""A task the package does not ship, defined in this module alone: registered, trained, evaluated, predicted.

It proves "a new task is one new module": `QuestionTask` (is a sentence a question or a statement?) reads
its own headerless `label<TAB>text` files and is wired in by `register_task` only. No package file names
it, yet config, `train`, the saved model-dir policy, `evaluate_file` and `Predictor` all work with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from datasets import Dataset
from huggingface_hub import ModelCard
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from bert_tasks import tasks
from bert_tasks.config import load_recipe
from bert_tasks.data.table import Table
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import evaluate_file
from bert_tasks.inference.predictor import Predictor
from bert_tasks.model_dir import read_policy
from bert_tasks.tasks import Task, register_task
from bert_tasks.training import train
from tests.helpers import FAST

LABELS = ["question", "statement"]
#: What `decode` reads: a Dataset (evaluation) or a Table of plain lists (prediction).
Rows = Dataset | Table


class QuestionTask(Task):
    """One label per sentence from a headerless `label<TAB>text` file; windows averaged per sentence."""

    name = "question"
    head = "AutoModelForSequenceClassification"
    config_defaults: ClassVar[dict[str, Any]] = {"max_length": 32, "stride": 8}
    default_metric = "accuracy"
    metric_names = ("accuracy",)

    def read_file(self, path: str, cfg: Any) -> Dataset:
        rows = [line.split("\t", 1) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
        return Dataset.from_dict({"label": [r[0] for r in rows], "text": [r[1] for r in rows]})

    def read_hub(self, dataset: str, split: str, cfg: Any) -> Dataset | None:
        raise BertTasksError("the question task reads local files only")

    def label_names(self, train: Dataset, cfg: Any) -> list[str]:
        return sorted(set(train["label"]))

    def prediction_columns(self, texts: list[str]) -> dict[str, list[Any]]:
        return {"text": texts}

    def encode_batch(
        self,
        batch: Mapping[str, list[Any]],
        indices: Sequence[int],
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> dict[str, list[Any]]:
        enc = tokenizer(
            batch["text"],
            truncation=True,
            max_length=max_length,
            stride=stride,
            return_overflowing_tokens=True,
        )
        rows = enc.pop("overflow_to_sample_mapping")
        enc["example_id"] = [indices[row] for row in rows]
        if label2id is not None:
            enc["labels"] = [label2id[batch["label"][row]] for row in rows]
        return dict(enc)

    def collator(
        self, tokenizer: PreTrainedTokenizerBase, return_tensors: str = "pt"
    ) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor | np.ndarray]]:
        return DataCollatorWithPadding(tokenizer, return_tensors=return_tensors)

    def _predicted(self, raw: Rows, encoded: Rows, window_logits: Sequence[np.ndarray]) -> np.ndarray:
        sums = np.zeros((len(raw), len(window_logits[0])))  # [N, C]
        np.add.at(sums, np.asarray(encoded["example_id"]), np.stack(window_logits))
        return sums.argmax(axis=1)  # [N]

    def metrics(
        self, raw: Dataset, encoded: Dataset, window_logits: Sequence[np.ndarray], id2label: dict[int, str]
    ) -> dict[str, Any]:
        predicted = [id2label[int(i)] for i in self._predicted(raw, encoded, window_logits)]
        return {"accuracy": float(np.mean([p == g for p, g in zip(predicted, raw["label"], strict=True)]))}

    def decode(
        self, raw: Rows, encoded: Rows, window_logits: Sequence[np.ndarray], id2label: dict[int, str]
    ) -> list[str]:
        return [id2label[int(i)] for i in self._predicted(raw, encoded, window_logits)]

    def record(self, text: str, prediction: str) -> dict[str, Any]:
        return {"text": text, "kind": prediction}

    def render_predictions(self, texts: Sequence[str], predictions: Sequence[str]) -> str:
        return "\n".join(f"{p}\t{t}" for t, p in zip(texts, predictions, strict=True))

    def render_metrics(self, metrics: dict[str, Any]) -> str:
        return f"accuracy {metrics['accuracy']:.4f}"


@pytest.fixture
def question_task() -> Iterator[type[Task]]:
    register_task(QuestionTask)
    yield QuestionTask
    tasks._TASKS.pop(QuestionTask.name)  # the other tests see the built-in tasks only


def write_questions(path: Path, count: int) -> Path:
    """Questions end with '?' and open with a question word; statements do neither."""
    subjects = ["the train", "your sister", "the new library", "this soup", "the meeting", "our garden"]
    lines = []
    for i in range(count):
        subject = subjects[i % len(subjects)]
        if i % 2:
            lines.append(f"question\tWhen does {subject} open again?")
        else:
            lines.append(f"statement\t{subject.capitalize()} opens again on Monday.")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_task_registered_outside_the_package_trains_evaluates_and_predicts(
    question_task: type[Task], tiny_model: Path, tmp_path: Path
) -> None:
    train_file = write_questions(tmp_path / "train.tsv", 48)
    dev_file = write_questions(tmp_path / "dev.tsv", 12)
    overrides = {**FAST, "epochs": "6", "lr": "5e-3", "max_length": "24"}
    cfg = load_recipe(
        None,
        [f"{k}={v}" for k, v in overrides.items()]
        + [f"model={tiny_model}", f"train_file={train_file}", f"validation_file={dev_file}"]
        + [f"output_dir={tmp_path / 'run'}"],
        task="question",
    )
    assert cfg.stride == 8  # the task's own config default
    model_dir = train(cfg)

    policy = read_policy(model_dir)
    assert (policy.task, policy.max_length, policy.stride) == ("question", 24, 8)
    card = ModelCard.load(model_dir / "README.md")  # Task.card's default: the labels, no pipeline
    assert card.data.pipeline_tag is None and "question, statement" in card.text
    assert [r.metric_value for r in card.data.eval_results] == [1.0]
    metrics = evaluate_file("question", model_dir, str(dev_file), [], tmp_path / "eval")
    assert metrics["accuracy"] == 1.0  # a tiny BERT learns the '?' in six epochs
    predictor = Predictor(model_dir)
    assert isinstance(predictor.task, QuestionTask)
    texts = ["When does the station open again?", "The station opens again on Monday."]
    assert predictor.records(texts) == [
        {"text": texts[0], "kind": "question"},
        {"text": texts[1], "kind": "statement"},
    ]
