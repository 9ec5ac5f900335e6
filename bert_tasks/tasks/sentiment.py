"""Sentence classification (sentiment, or any single-label text task): read, window, batch, score, decode.

A sentence longer than `max_length` is split into overlapping windows that all carry the sentence's
label; at evaluation and prediction time the windows' logits are averaged back into one score per
sentence, so no token is dropped and each sentence counts once.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bert_tasks.data.annotation_tools import TEXT_OBJECT
from bert_tasks.data.text_classification import (
    FILE_FORMATS,
    read_hub_text_classification,
    read_records,
    read_text_classification,
)
from bert_tasks.errors import BertTasksError, listed
from bert_tasks.tasks.base import SplitProfile, Task, TaskCard, score_table

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from evaluate import EvaluationModule
    from transformers import PreTrainedTokenizerBase

    from bert_tasks.config import Config
    from bert_tasks.data.in_memory import Records
    from bert_tasks.model_dir import ModelPolicy

METRIC_PATH = Path(__file__).resolve().parent.parent / "metrics" / "classification" / "classification.py"
_DEMO = Path(__file__).resolve().parent.parent / "resources" / "demo" / "sentiment"
#: Classes up to which `render_metrics` prints the confusion matrix (each row is ~11 characters a class).
PRINTED_MATRIX_CLASSES = 20


class SentimentTask(Task):
    """One label per text; the label set is the training file's labels (or `cfg.label_names`)."""

    name = "sentiment"
    head = "BertForSequenceClassification"
    config_defaults: ClassVar[dict[str, Any]] = {
        "lr": 1e-4,
        "max_length": 128,
        "train_file": str(_DEMO / "train.jsonl"),
        "validation_file": str(_DEMO / "validation.jsonl"),
    }
    default_metric = "accuracy"
    metric_names = ("accuracy", "macro_f1")
    file_formats = FILE_FORMATS
    stratify_by = "label"
    #: The Label Studio control that `predict --format label-studio` fills:
    #: `<Choices name="sentiment" toName="text">`, as in Label Studio's text classification template.
    label_studio_control = "sentiment"

    def read_file(self, path: str, cfg: Config) -> Dataset:
        """A CSV/TSV/TXT/JSONL/JSON file of texts and labels, integer labels named by `cfg.label_names`."""
        data = read_text_classification(
            path, cfg.text_column, cfg.label_column, header=cfg.header, file_format=cfg.format
        )
        return data if cfg.label_names is None else _name_labels(data, cfg.label_names, path)

    def read_hub(self, dataset: str, split: str, cfg: Config) -> Dataset | None:
        """A hub split with ClassLabel ids turned into names; None for an unlabelled (GLUE test) split."""
        data = read_hub_text_classification(dataset, split, cfg.text_column, cfg.label_column)
        if data is None or cfg.label_names is None:
            return data
        return _name_labels(data, cfg.label_names, f"dataset={dataset} ({split})")

    def read_memory(self, records: Records, source: str, cfg: Config) -> Dataset:
        """Records with the text and label columns, checked as JSON records are (labels named likewise)."""
        data = read_records(source, records, cfg.text_column, cfg.label_column)
        return data if cfg.label_names is None else _name_labels(data, cfg.label_names, source)

    def check_splits(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:
        """Every validation/test label must occur in the training data (or `cfg.label_names`)."""
        known = set(cfg.label_names) if cfg.label_names is not None else set(splits["train"]["label"])
        for split, ds in splits.items():
            unseen = sorted(set(ds["label"]) - known)
            if unseen:
                hint = "; max_train_samples may have cut it" if cfg.max_train_samples is not None else ""
                raise BertTasksError(
                    f"{sources[split]}: label '{unseen[0]}' never occurs in the training data "
                    f"({sources['train']}){hint}; add training examples of it or fix the label"
                )

    def profile_split(self, raw: Dataset) -> SplitProfile:
        """Each example is its text with one label; the distribution counts examples per label."""
        texts, labels = raw["text"][:], raw["label"][:]
        return SplitProfile(keys=texts, golds=labels, labels=dict(Counter(labels)), unit="examples")

    def texts_to_raw(self, texts: list[str]) -> Dataset:
        """Raw texts -> the one-column dataset `encode`/`decode` take for prediction."""
        from datasets import Dataset

        return Dataset.from_dict({"text": texts})

    def transfer_rows(self, texts: list[str], labels: Sequence[str]) -> Dataset:
        """The texts, each with the first label as its placeholder gold (one scored position per window)."""
        return self.texts_to_raw(texts).add_column("label", [labels[0]] * len(texts))

    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """`cfg.label_names` when given (their order is the id order), else the sorted training labels."""
        return list(cfg.label_names) if cfg.label_names is not None else sorted(set(train["label"]))

    def encode(
        self,
        raw: Dataset,
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> Dataset:
        """Tokenize each text into windows (the fast tokenizer's own overflow), each with the text's label."""
        if label2id is not None:
            if "label" not in raw.column_names:
                raise BertTasksError("cannot score texts without labels; give the data a label column")
            unknown = sorted(set(raw["label"]) - set(label2id))
            if unknown:
                raise BertTasksError(
                    f"label '{unknown[0]}' is not one the model knows ({listed(list(label2id))}); "
                    "fix the data or train a model that has it"
                )

        def windows(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
            enc = tokenizer(
                batch["text"],
                truncation=True,
                max_length=max_length,
                stride=stride,
                return_overflowing_tokens=True,
            )
            source_rows = enc.pop("overflow_to_sample_mapping")  # window -> row within this batch
            enc["example_id"] = [indices[row] for row in source_rows]
            if label2id is not None:
                enc["labels"] = [label2id[batch["label"][row]] for row in source_rows]
            return dict(enc)

        from datasets.fingerprint import generate_random_fingerprint

        # A fresh fingerprint: datasets would otherwise pickle `windows`, tokenizer and all, to hash it
        # (about 1 s a call, the cost of predicting on hundreds of texts).
        return raw.map(
            windows,
            batched=True,
            with_indices=True,
            remove_columns=raw.column_names,
            new_fingerprint=generate_random_fingerprint(),
        )

    def collator(
        self, tokenizer: PreTrainedTokenizerBase, return_tensors: str = "pt"
    ) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor | np.ndarray]]:
        """Dynamic padding to the batch's longest window (a multiple of 8 for tensor cores)."""
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8, return_tensors=return_tensors)

    def metrics(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> dict[str, Any]:
        """Accuracy, macro-F1, per-class scores and confusion matrix over whole texts (windows averaged).

        Returns the classification metric's dict: scalar `accuracy` and `macro_f1`, plus `per_class`
        ({label: {precision, recall, f1, support}}), `confusion_matrix` (gold rows) and `labels`.
        """
        logits = _example_logits(encoded, window_logits, len(raw))  # (N, C)
        labels = [id2label[i] for i in sorted(id2label)]
        predictions = [labels[i] for i in logits.argmax(axis=-1)]
        return _classification_metric().compute(
            predictions=predictions, references=list(raw["label"]), labels=labels
        )

    def decode(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> list[dict[str, Any]]:
        """One `{"label", "score", "scores": {label: prob}}` per text, from the softmax of averaged logits."""
        from scipy.special import softmax

        probs = softmax(_example_logits(encoded, window_logits, len(raw)), axis=-1)  # (N, C)
        labels = [id2label[i] for i in sorted(id2label)]
        return [
            {
                "label": labels[int(row.argmax())],
                "score": float(row.max()),
                "scores": {label: float(p) for label, p in zip(labels, row, strict=True)},
            }
            for row in probs
        ]

    def record(self, text: str, prediction: dict[str, Any]) -> dict[str, Any]:
        """`{"text", "label", "score", "scores"}`."""
        return {"text": text, **prediction}

    def label_studio_results(
        self, text: str, prediction: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], float]:
        """The predicted class as a `choices` result; the task's score is the class's probability."""
        result = {
            "from_name": self.label_studio_control,
            "to_name": TEXT_OBJECT,
            "type": "choices",
            "value": {"choices": [prediction["label"]]},
            "score": prediction["score"],
        }
        return [result], prediction["score"]

    def render_predictions(self, texts: Sequence[str], predictions: Sequence[dict[str, Any]]) -> str:
        """A table: label, probability, text."""
        width = max(5, *(len(p["label"]) for p in predictions))
        lines = [f"{'label':<{width}}  score  text"]
        lines += [
            f"{p['label']:<{width}}  {p['score']:.3f}  {t}" for t, p in zip(texts, predictions, strict=True)
        ]
        return "\n".join(lines)

    def render_metrics(self, metrics: dict[str, Any]) -> str:
        """Accuracy, macro-F1, the per-class table and, up to `PRINTED_MATRIX_CLASSES` classes, the confusion
        matrix (beyond, a line says where it is: its rows alone would be thousands of characters wide)."""
        labels = metrics["labels"]
        lines = [f"accuracy {metrics['accuracy']:.4f} | macro-F1 {metrics['macro_f1']:.4f}", ""]
        lines += score_table(metrics["per_class"], "class")
        if len(labels) > PRINTED_MATRIX_CLASSES:
            lines += [
                "",
                f"confusion matrix: {len(labels)} classes, too many to print (more than "
                f"{PRINTED_MATRIX_CLASSES}); the full matrix (rows: gold, columns: predicted) is "
                "'confusion_matrix' in the metrics.json evaluate wrote (or print it with --json), and "
                "confusion_matrix.png beside it shows the most frequent classes",
            ]
            return "\n".join(lines)
        width = max(9, *(len(label) for label in labels))
        lines += ["", "confusion matrix (rows: gold, columns: predicted)"]
        lines.append(" " * width + "  " + "  ".join(f"{label:>{width}}" for label in labels))
        for label, row in zip(labels, metrics["confusion_matrix"], strict=True):
            lines.append(f"{label:<{width}}  " + "  ".join(f"{count:>{width}}" for count in row))
        return "\n".join(lines)

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """The confusion matrix as a PNG (beyond 30 classes: the most frequent ones, the rest as "other")."""
        from bert_tasks.insight.plots import plot_confusion_matrix  # matplotlib: only evaluation needs it

        return [
            plot_confusion_matrix(
                metrics["confusion_matrix"], metrics["labels"], out_dir / "confusion_matrix.png"
            )
        ]

    def card(self, labels: Sequence[str], policy: ModelPolicy) -> TaskCard:
        """Text classification; a vanilla pipeline truncates to one window, where bert-tasks averages."""
        return TaskCard(
            summary=f"Text classification: one label per text, out of {', '.join(labels)}.",
            long_inputs="in training every window carries its text's label; in prediction the windows' "
            "logits are averaged into one label per text, so no part of a text is dropped",
            pipeline_tag="text-classification",
            pipeline_options={"truncation": True},
            example="I loved this film, the cast was wonderful.",
            limits=(
                "A vanilla `pipeline` reads only the first window of a long text (it truncates); bert-tasks "
                "averages over every window, so on long texts the two can disagree.",
            ),
        )


def _example_logits(encoded: Dataset, window_logits: Sequence[np.ndarray], num_examples: int) -> np.ndarray:
    """Average window logits per raw example: (W, C) -> (N, C).

    Accepts one (C,) array per window or per-batch (B, C) arrays, in the order of `encoded`'s rows.
    """
    logits = np.concatenate([np.atleast_2d(np.asarray(x, dtype=np.float64)) for x in window_logits])  # (W, C)
    example_id = np.asarray(encoded["example_id"])  # (W,)
    if len(logits) != len(example_id):
        raise ValueError(
            f"got logits for {len(logits)} windows but the encoded dataset has {len(example_id)}"
        )
    sums = np.zeros((num_examples, logits.shape[1]))  # (N, C)
    np.add.at(sums, example_id, logits)
    counts = np.bincount(example_id, minlength=num_examples)  # (N,)
    if (counts == 0).any():
        raise ValueError(f"raw example {int(np.argmin(counts))} has no window; encode the same raw dataset")
    return sums / counts[:, None]


@functools.cache
def _classification_metric() -> EvaluationModule:
    """Load the local metric once; `evaluate` is imported here because it is slow to import."""
    import evaluate

    return evaluate.load(str(METRIC_PATH), keep_in_memory=True)


def _name_labels(ds: Dataset, names: list[str], source: str) -> Dataset:
    """Map integer labels ("0", "1") to `names`, so raw datasets carry the names the model will save."""

    def name(label: str) -> str:
        if label in names:
            return label
        if label.isdigit() and int(label) < len(names):
            return names[int(label)]
        raise BertTasksError(
            f"{source}: label '{label}' is neither in label_names ({', '.join(names)}) nor an index "
            f"0..{len(names) - 1}; fix label_names"
        )

    mapping = {label: name(label) for label in set(ds["label"])}
    return ds.map(lambda batch: {"label": [mapping[label] for label in batch["label"]]}, batched=True)
