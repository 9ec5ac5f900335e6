"""Sentence classification (sentiment, or any text task): read, window, batch, score, decode.

One module for every shape of the task, as the issue that brought them asked: a text or a text pair
(`text_pair_column`: a review and its aspect, BERT's segments A and B), and a label that is one class, a
set of classes (`multi_label`) or a number (`regression`). What the inputs need lives here: the readers,
windows (`tasks/text_windows.py`: a pair is windowed over its longer side only), and the averaging of a
text's window logits back into one row, so no token is dropped and each text counts once. What the label
needs (the head's loss, the metrics, decoding, showing) is the shape's, chosen from the options as NER
chooses its decoder (`tasks/sentiment_shapes.py`). A sentence longer than `max_length` is split into
overlapping windows that all carry the sentence's label.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bert_tasks.data.files import check_text, describe, is_blank
from bert_tasks.data.splits import validation_share
from bert_tasks.data.text_classification import (
    FILE_FORMATS,
    read_hub_text_classification,
    read_records,
    read_text_classification,
)
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.base import SplitProfile, Task, TaskCard
from bert_tasks.tasks.sentiment_shapes import MultiLabel, shape_of
from bert_tasks.tasks.text_windows import pair_windows, text_windows

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from bert_tasks.config import Config
    from bert_tasks.data.in_memory import Records
    from bert_tasks.data.table import Table
    from bert_tasks.model_dir import ModelPolicy

logger = logging.getLogger(__name__)

_DEMO = Path(__file__).resolve().parent.parent / "resources" / "demo" / "sentiment"
#: What separates a pair's two texts where one string stands for both (`debug data`'s duplicates).
PAIR_JOINER = " [SEP] "
#: One input to predict: a text, or a (text, second text) pair for a pair model.
Input = str | tuple[str, str]


class SentimentTask(Task):
    """A text (or a text pair) and its label: one class, a set of classes, or a number."""

    name = "sentiment"
    head = "AutoModelForSequenceClassification"
    config_defaults: ClassVar[dict[str, Any]] = {
        "lr": 1e-4,
        "max_length": 128,
        "train_file": str(_DEMO / "train.jsonl"),
        "validation_file": str(_DEMO / "validation.jsonl"),
    }
    options = ("text_pair_column", "multi_label", "thresholds", "regression", "round_to", "ordinal")
    reader_keys = ("label_column", "header")
    trained_options = ("text_pair_column", "multi_label", "regression")
    # Every shape's metrics, for the config's check; an instance narrows them to its own shape's.
    default_metric = "accuracy"
    metric_names = ("accuracy", "macro_f1", "micro_f1", "subset_accuracy", "spearman", "pearson")
    metric_names += ("rounded_accuracy",)
    file_formats = FILE_FORMATS
    stratify_by = "label"
    pad_to_multiple_of = 8  # tensor cores

    def __init__(
        self,
        text_pair_column: str | None = None,
        multi_label: bool | None = None,
        thresholds: list[float] | None = None,
        regression: bool = False,
        round_to: list[float] | None = None,
        ordinal: bool = False,
    ) -> None:
        super().__init__(
            text_pair_column=text_pair_column,
            multi_label=multi_label,
            thresholds=thresholds,
            regression=regression,
            round_to=round_to,
            ordinal=ordinal,
        )
        self._choose_shape()

    def _choose_shape(self) -> None:
        self.shape = shape_of(self.option_values)
        self.default_metric, self.metric_names = self.shape.default_metric, self.shape.metric_names
        self.stratify_by = self.shape.stratify_by

    @property
    def problem_type(self) -> str | None:
        return self.shape.problem_type

    @property
    def demo_validation_file(self) -> str | None:
        """The bundled demo of this shape and input (pairs: with an `aspect` field); None for a pair model
        of another label shape, or whose pair field is not `aspect`."""
        shape = "regression" if self.option_values["regression"] else None
        shape = shape or ("multilabel" if self.option_values["multi_label"] else "sentiment")
        if self.pair_field is not None:
            shape = "pairs" if shape == "sentiment" and self.pair_field == "aspect" else None
        return None if shape is None else str(_DEMO.parent / shape / "validation.jsonl")

    @property
    def evaluate_options(self) -> tuple[str, ...]:
        """Multi-label: its thresholds; regression: its rounding; a single-label model has none."""
        return self.shape.evaluate_options

    @property
    def pair_field(self) -> str | None:
        return self.option_values["text_pair_column"]

    @property
    def _label_kind(self) -> str:
        """How the readers read labels: the shape's, or `auto` while `multi_label` is left unset."""
        unset = self.option_values["multi_label"] is None and not self.option_values["regression"]
        return "auto" if unset else self.shape.kind

    # Reading.

    def read_file(self, path: str, cfg: Config) -> Dataset:
        """A CSV/TSV/TXT/JSONL/JSON file of texts (pairs) and labels; integer labels named by label_names."""
        data = read_text_classification(
            path,
            cfg.text_column,
            cfg.label_column,
            header=cfg.header,
            file_format=cfg.format,
            pair_column=self.pair_field,
            labels=self._label_kind,
        )
        return self._named(data, cfg.label_names, path)

    def read_hub(self, dataset: str, split: str, cfg: Config) -> Dataset | None:
        """A hub split with ClassLabel ids turned into names; None for an unlabelled (GLUE test) split."""
        data = read_hub_text_classification(
            dataset, split, cfg.text_column, cfg.label_column, self.pair_field, self._label_kind
        )
        return data if data is None else self._named(data, cfg.label_names, f"dataset={dataset} ({split})")

    def read_memory(self, records: Records, source: str, cfg: Config) -> Dataset:
        """Records with the text (pair) and label columns, checked as JSON records are."""
        data = read_records(
            source, records, cfg.text_column, cfg.label_column, self.pair_field, self._label_kind
        )
        return self._named(data, cfg.label_names, source)

    def _named(self, data: Dataset, names: list[str] | None, source: str) -> Dataset:
        return data if names is None else _name_labels(data, names, source)

    def settle(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> dict[str, Dataset]:
        """`multi_label` left unset becomes true when any split writes a label as a set (a JSON list or
        `a|b`; the plain labels are then sets of one), else false; the shape then takes what it needs from
        the training split, and the settings that only now meet their shape are checked."""
        if self._label_kind == "auto":
            multi = any(_holds_sets(data) for data in splits.values())
            if multi:
                splits = {split: _as_sets(data) for split, data in splits.items()}
            self.option_values["multi_label"] = multi
            self._choose_shape()
            if cfg.thresholds is not None and not multi:
                raise BertTasksError(
                    f"thresholds: {sources.get('train', 'the data')} holds one label per text, not label "
                    "sets, and thresholds are multi-label's; drop thresholds, or write each label as a set "
                    "(a JSON list or a|b)"
                )
        train = splits.get("train")
        self.option_values |= self.shape.settle(train, cfg)
        self.metric_names = self.shape.metric_names  # regression's rounding, once `ordinal` knows its range
        multi = isinstance(self.shape, MultiLabel)
        if cfg.class_weights is not None and multi:
            raise BertTasksError(
                f"class_weights: {sources.get('train', 'the data')} holds label sets (multi-label), which "
                "have no class to weigh against the others; drop class_weights (each label's threshold is "
                "tuned on validation instead)"
            )
        if cfg.metric_for_best is not None and cfg.metric_for_best not in self.metric_names:
            raise BertTasksError(
                f"metric_for_best={cfg.metric_for_best} is not a score of a {self.shape.title} model; "
                f"choose one of {', '.join(self.metric_names)}"
            )
        if multi and train is not None:
            self.check_options(self.label_names(train, cfg))
            if self.calibrates and "validation" not in splits and validation_share(cfg, splits) is None:
                logger.warning(
                    "%s: multi-label without a validation split: every label's threshold stays 0.5 (give a "
                    "validation_file or validation_split to tune them, or thresholds=[...])",
                    sources["train"],
                )
        return splits

    def check_options(self, labels: list[str]) -> None:
        self.shape.check_options(labels)

    def check_learnable(self, train: Dataset, source: str, cfg: Config) -> None:
        """What the shape needs to learn anything: two classes, two label sets, or two values."""
        self.shape.check_learnable(train, source, self.label_names(train, replace(cfg, label_names=None)))

    def check_splits(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:
        """Every validation/test class must occur in the training data (or `cfg.label_names`)."""
        self.shape.check_unseen(splits, sources, cfg)

    def profile_split(self, raw: Dataset) -> SplitProfile:
        """Each example is its text (a pair: both, joined by [SEP]) with its label; the distribution counts
        examples per label (a multi-label text once for each of its labels)."""
        texts, labels = raw["text"][:], raw["label"][:]
        if self.pair_field is not None:
            texts = [f"{text}{PAIR_JOINER}{pair}" for text, pair in zip(texts, raw["text_pair"], strict=True)]
        golds = [self.shape.gold(label) for label in labels]
        return SplitProfile(keys=texts, golds=golds, labels=self.shape.distribution(labels), unit="examples")

    def prediction_columns(self, texts: list[str]) -> dict[str, list[Any]]:
        """Raw texts -> the one `text` column `encode_batch`/`decode` take (a pair model's texts come as
        records with their pair field: `input_columns`)."""
        if self.pair_field is not None:
            raise BertTasksError(f"the model reads (text, {self.pair_field}) pairs; give each text its pair")
        return {"text": list(texts)}

    def check_input(self, where: str, record: dict[str, Any]) -> dict[str, Any]:
        """A 'text', and for a pair model its second text in the record's pair field (a string of words)."""
        super().check_input(where, record)
        field = self.pair_field
        if field is None:
            return record
        if field not in record:
            raise BertTasksError(
                f"{where}: no '{field}' for the text; the model reads (text, {field}) pairs, so give every "
                f"record a '{field}' string field ((text, {field}) pairs in the library, predict --pair "
                "for texts without one)"
            )
        value = record[field]
        if not isinstance(value, str) or is_blank(value):
            found = "empty" if isinstance(value, str) else describe(value)
            raise BertTasksError(f"{where}: the '{field}' is {found}; give it as a string of some words")
        check_text(value, where, f"the {field}", nul=True)
        return record

    def input_columns(self, records: list[dict[str, Any]]) -> dict[str, list[Any]]:
        """Checked records -> the `text` column, and a pair model's `text_pair` from its pair field."""
        columns = {"text": [record["text"] for record in records]}
        if self.pair_field is not None:
            columns["text_pair"] = [record[self.pair_field] for record in records]
        return columns

    @property
    def input_fields(self) -> tuple[str, ...]:  # type: ignore[override]
        """The text, and a pair model's pair field: both come back in its prediction records."""
        return ("text",) if self.pair_field is None else ("text", self.pair_field)

    def shown_input(self, record: Mapping[str, Any]) -> Input:
        """The text, or a pair model's (text, second text)."""
        if self.pair_field is None:
            return record["text"]
        return record["text"], record[self.pair_field]

    def transfer_rows(self, records: list[dict[str, Any]], labels: Sequence[str]) -> Dataset:
        """The texts (with their pairs), each with the first label as its placeholder gold (one scored
        position per window)."""
        from datasets import Dataset

        raw = Dataset.from_dict(self.input_columns(records))
        return raw.add_column("label", [labels[0]] * len(records))

    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """`cfg.label_names` when given, else the sorted training classes (regression: its one output)."""
        return self.shape.label_names(train, cfg)

    # Encoding and batching.

    def encode(
        self,
        raw: Dataset,
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> Dataset:
        """Check the labels against the model's (all at once, so the first unknown label named is the first
        in sorted order, whatever batch holds it) and a pair model's second texts, then `encode_batch`."""
        if label2id is not None:
            if "label" not in raw.column_names:
                raise BertTasksError("cannot score texts without labels; give the data a label column")
            self.shape.check_known(raw, label2id)
        pair = self.pair_field
        if pair is not None and "text_pair" not in raw.column_names:
            raise BertTasksError(f"the model reads text pairs; give each text its {pair}")
        return super().encode(raw, tokenizer, label2id, max_length, stride)

    def encode_batch(
        self,
        batch: Mapping[str, list[Any]],
        indices: Sequence[int],
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> dict[str, list[Any]]:
        """Tokenize each text (pair) into windows, each with its text's label as the head's target."""
        pair = self.pair_field
        if pair is None:
            enc, rows = text_windows(tokenizer, batch["text"], max_length, stride)
        else:
            numbers = [index + 1 for index in indices]
            texts, pairs = batch["text"], batch["text_pair"]
            enc, rows = pair_windows(tokenizer, texts, pairs, max_length, stride, pair, numbers)
        enc["example_id"] = [indices[row] for row in rows]  # window -> row of the whole dataset
        if label2id is not None:
            enc["labels"] = [self.shape.target(batch["label"][row], label2id) for row in rows]
        return enc

    def collator(
        self, tokenizer: PreTrainedTokenizerBase, return_tensors: str = "pt"
    ) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor | np.ndarray]]:
        """Dynamic padding to the batch's longest window (a multiple of 8 for tensor cores)."""
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(
            tokenizer, pad_to_multiple_of=self.pad_to_multiple_of, return_tensors=return_tensors
        )

    # Scoring, decoding, and what a run learns besides the weights.

    def metrics(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> dict[str, Any]:
        """The shape's scores over whole texts (windows averaged): single-label accuracy, macro-F1,
        `per_class`, `confusion_matrix`, `labels`; multi-label micro/macro-F1, subset accuracy,
        `per_label`, `thresholds`; regression MAE, RMSE, Pearson, Spearman (and `rounded_accuracy`)."""
        logits = _example_logits(encoded, window_logits, len(raw))  # (N, C)
        return self.shape.metrics(logits, list(raw["label"]), _labels(id2label))

    def decode(
        self,
        raw: Dataset | Table,
        encoded: Dataset | Table,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> list[dict[str, Any]]:
        """One prediction per text, from its averaged window logits: `{"label", "score", "scores"}`,
        `{"labels": [{"label", "score"}], "scores"}` (multi-label) or `{"value"[, "rounded"]}`."""
        logits = _example_logits(encoded, window_logits, len(raw))  # (N, C)
        return self.shape.decode(logits, _labels(id2label))

    @property
    def calibrates(self) -> bool:
        return self.shape.calibrates and self.option_values["thresholds"] is None

    def calibrate(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> None:
        """Multi-label: each label's threshold, tuned on these (validation) logits, into the options."""
        logits = _example_logits(encoded, window_logits, len(raw))
        self.option_values |= self.shape.calibrate(logits, list(raw["label"]), _labels(id2label))

    def saved_weights(
        self, model: PreTrainedModel, weights: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        return self.shape.saved_weights(model, weights)

    def prepare_model(self, model: PreTrainedModel) -> None:
        self.shape.prepare_model(model)

    def window_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.shape.window_losses(logits, labels)

    def window_labels(self, logits: np.ndarray) -> np.ndarray | None:
        return self.shape.window_labels(logits)

    # Showing.

    def record(self, text: Input, prediction: dict[str, Any]) -> dict[str, Any]:
        """`{"text"[, <pair field>], ...the prediction}`."""
        if self.pair_field is None:
            return {"text": text, **prediction}
        return {"text": text[0], self.pair_field: text[1], **prediction}

    def label_studio_results(
        self, text: Input, prediction: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], float | None]:
        """The predicted class (classes) as a `choices` result, or the value as a `number` one."""
        return self.shape.label_studio(prediction)

    def render_predictions(self, texts: Sequence[Input], predictions: Sequence[dict[str, Any]]) -> str:
        """A table: the prediction's two cells (label and probability; labels and probabilities; value
        and rounded value), the pair's second text, then the text."""
        pair = self.pair_field
        header = [*self.shape.columns, *([pair] if pair is not None else []), "text"]
        rows = [
            [*self.shape.shown(p), *(text if pair is not None else [text])]
            for text, p in zip(texts, predictions, strict=True)
        ]
        if pair is not None:  # the text last: it is the long one
            rows = [[*row[:2], row[3], row[2]] for row in rows]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
        return "\n".join(
            "  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
            for row in [header, *rows]
        )

    def render_metrics(self, metrics: dict[str, Any]) -> str:
        """The shape's scores as text (single-label: with the confusion matrix up to 20 classes)."""
        return self.shape.render_metrics(metrics)

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """Single-label: the confusion matrix; multi-label: per-label scores; regression: none."""
        return self.shape.save_plots(metrics, out_dir)

    def card(self, labels: Sequence[str], policy: ModelPolicy) -> TaskCard:
        """The shape's summary and pipeline arguments; a vanilla pipeline truncates to one window, where
        bert-tasks averages."""
        pair = self.pair_field
        summary = self.shape.summary(labels)
        if pair is not None:
            summary += f" Each input is a text and its {pair}, read as BERT's two segments."
        long_inputs = (
            "in training every window carries its text's label; in prediction the windows' logits are "
            "averaged into one prediction per text, so no part of a text is dropped"
        )
        if pair is not None:
            long_inputs += f"; only the longer of a text and its {pair} is windowed, the other is whole"
        text = (
            "The battery is great but the screen is dim."
            if pair
            else "I loved this film, the cast was wonderful."
        )
        return TaskCard(
            summary=summary,
            long_inputs=long_inputs,
            pipeline_tag="text-classification",
            pipeline_options=self.shape.pipeline_options(),
            example=(text, "screen") if pair else text,
            limits=(
                "A vanilla `pipeline` reads only the first window of a long text (it truncates); bert-tasks "
                "averages over every window, so on long texts the two can disagree.",
                *self.shape.limits(),
            ),
        )


def _example_logits(
    encoded: Dataset | Table, window_logits: Sequence[np.ndarray], num_examples: int
) -> np.ndarray:
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


def _labels(id2label: dict[int, str]) -> list[str]:
    return [id2label[i] for i in sorted(id2label)]


def _holds_sets(data: Dataset) -> bool:
    """Whether a split's labels were read as sets (`data/label_values.py`: lists or `a|b`)."""
    return getattr(data.features["label"], "feature", None) is not None


def _as_sets(data: Dataset) -> Dataset:
    """A split of class labels as sets of one (a multi-label split's plain labels)."""
    if _holds_sets(data):
        return data
    from datasets import Sequence, Value

    sets = data.map(lambda batch: {"label": [[label] for label in batch["label"]]}, batched=True)
    return sets.cast_column("label", Sequence(Value("string")))


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

    sets = _holds_sets(ds)
    mapping = {
        label: name(label) for label in ({n for ls in ds["label"] for n in ls} if sets else set(ds["label"]))
    }

    def rename(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if sets:
            return {"label": [[mapping[n] for n in labels] for labels in batch["label"]]}
        return {"label": [mapping[label] for label in batch["label"]]}

    return ds.map(rename, batched=True)
