"""The shapes of a sentiment label, one class each: what a label is, what the head learns, how it is scored
and shown.

`SentimentTask` (tasks/sentiment.py) owns what every shape shares: reading files, the hub and memory,
windowing a text or a text pair, and averaging each text's window logits into one row. Its shape, chosen
from the config as NER chooses its decoder, owns the rest:

- `SingleLabel`: one class per text. Softmax + cross-entropy (the head's own loss); accuracy, macro-F1,
  per-class scores and the confusion matrix.
- `MultiLabel`: any set of classes per text (emotions, phenotypes). Sigmoid + BCE-with-logits (transformers'
  `multi_label_classification`, so vanilla transformers reads the head the same way); a label is
  predicted when its probability reaches its threshold, one per label, tuned on validation (the best F1 of
  that label, ties broken toward 0.5); micro/macro-F1, per-label scores, subset accuracy.
- `Regression`: a number per text (stars, intensity). One output and MSE (transformers' `regression`) on
  standardised targets: the head starts near zero whatever the label's units, so the loss, learning rate
  and gradient clipping behave alike for 1-5 stars and for a 0-1000 price. The scaling is undone inside the
  head when the model is saved (`saved_weights`), so the saved model, in bert-tasks and in vanilla
  transformers, outputs the label's own units. MAE, RMSE, Pearson, Spearman, and with `round_to` (or
  `ordinal`) the accuracy of rounding to the nearest class.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bert_tasks.data.annotation_tools import TEXT_OBJECT
from bert_tasks.errors import BertTasksError, listed
from bert_tasks.tasks.base import score_table

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from evaluate import EvaluationModule
    from transformers import PreTrainedModel

    from bert_tasks.config import Config

METRICS = Path(__file__).resolve().parent.parent / "metrics"
#: Classes up to which `render_metrics` prints the confusion matrix (each row is ~11 characters a class).
PRINTED_MATRIX_CLASSES = 20
#: Where a multi-label threshold starts, and where tuning breaks its ties toward.
DEFAULT_THRESHOLD = 0.5
#: The Label Studio control that `predict --format label-studio` fills for classes:
#: `<Choices name="sentiment" toName="text">` (multi-label: with `choice="multiple"`).
CHOICES_CONTROL = "sentiment"
#: ... and for numbers: `<Number name="value" toName="text">`.
NUMBER_CONTROL = "value"
#: The name of a regression model's one output (its id2label), and the key of its predicted number.
VALUE = "value"


class LabelShape(ABC):
    """What differs between the label shapes: the defaults every shape shares, then `SingleLabel`'s
    classification methods, which `MultiLabel` and `Regression` replace with their own."""

    #: What messages call a model of this shape.
    title: ClassVar[str] = "single-label"
    #: How the readers read a label (`data/label_values.py`).
    kind: ClassVar[str] = "class"
    #: transformers' problem_type of the head (None: inferred from the labels, cross-entropy).
    problem_type: ClassVar[str | None] = None
    default_metric: ClassVar[str] = "accuracy"
    metric_names: ClassVar[tuple[str, ...]] = ("accuracy", "macro_f1")
    #: The raw column `validation_split` stratifies by (None: a plain seeded sample).
    stratify_by: ClassVar[str | None] = "label"
    #: The options `evaluate` may change (key=value) for a model of this shape.
    evaluate_options: ClassVar[tuple[str, ...]] = ()
    #: The headers of the two cells a prediction shows as in `predict`'s table.
    columns: ClassVar[tuple[str, str]] = ("label", "score")

    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """`cfg.label_names` when given (their order is the id order), else the sorted training labels."""
        return list(cfg.label_names) if cfg.label_names is not None else sorted(self.classes(train))

    def classes(self, data: Dataset) -> set[str]:
        """Every class a split's labels name."""
        return set(data["label"])

    def settle(self, train: Dataset | None, cfg: Config) -> dict[str, Any]:
        """Take from the training split what the shape needs before encoding; return the options that
        this settles (nothing here)."""
        return {}

    def check_learnable(self, train: Dataset, source: str, labels: list[str]) -> None:
        """One class only trains to loss 0 and scores 1.0 while learning nothing."""
        if len(labels) < 2:
            raise BertTasksError(
                f"{source}: the training data has one label only ({labels[0]!r}), so a model would learn "
                "nothing; add examples of another label (for NER: tag some entities), or check "
                "label_column/tag_column"
            )

    def check_options(self, labels: list[str]) -> None:  # noqa: B027
        """The shape's options against the model's labels (nothing to check here)."""

    def check_unseen(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:
        """Every validation/test class must occur in the training data (or `cfg.label_names`)."""
        known = set(cfg.label_names) if cfg.label_names is not None else self.classes(splits["train"])
        for split, ds in splits.items():
            unseen = sorted(self.classes(ds) - known)
            if unseen:
                hint = "; max_train_samples may have cut it" if cfg.max_train_samples is not None else ""
                raise BertTasksError(
                    f"{sources[split]}: label '{unseen[0]}' never occurs in the training data "
                    f"({sources['train']}){hint}; add training examples of it or fix the label"
                )

    def check_known(self, raw: Dataset, label2id: dict[str, int]) -> None:
        """Refuse scoring labels the model cannot predict."""
        unknown = sorted(self.classes(raw) - set(label2id))
        if unknown:
            raise BertTasksError(
                f"label '{unknown[0]}' is not one the model knows ({listed(list(label2id))}); "
                "fix the data or train a model that has it"
            )

    def target(self, label: Any, label2id: dict[str, int]) -> Any:
        """What the head is trained to output for one text's label: its class id."""
        return label2id[label]

    def gold(self, label: Any) -> Hashable:
        """One example's whole gold annotation, as `debug data` compares copies of a text."""
        return label

    def distribution(self, labels: Sequence[Any]) -> dict[str, int]:
        """Examples per class (`debug data`)."""
        return dict(Counter(labels))

    # What the shape's predictions and scores are, and how they are shown.

    @abstractmethod
    def metrics(self, logits: np.ndarray, gold: list[Any], labels: list[str]) -> dict[str, Any]:
        """The scores of (N, C) averaged window logits against the gold labels."""

    @abstractmethod
    def decode(self, logits: np.ndarray, labels: list[str]) -> list[dict[str, Any]]:
        """One plain-Python prediction per text of (N, C) averaged window logits."""

    @abstractmethod
    def shown(self, prediction: dict[str, Any]) -> tuple[str, str]:
        """A prediction as the two cells `render_predictions` shows under `columns`."""

    @abstractmethod
    def label_studio(self, prediction: dict[str, Any]) -> tuple[list[dict[str, Any]], float | None]:
        """A prediction as Label Studio result items, and the task's score (None: none)."""

    @abstractmethod
    def render_metrics(self, metrics: dict[str, Any]) -> str:
        """The scores as text for people."""

    @abstractmethod
    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """The evaluation's PNGs, written to `out_dir`."""

    @abstractmethod
    def summary(self, labels: Sequence[str]) -> str:
        """What the model does, for its card."""

    def pipeline_options(self) -> dict[str, Any]:
        """The vanilla `pipeline("text-classification")` arguments that read the head as bert-tasks does."""
        return {"truncation": True}

    def limits(self) -> tuple[str, ...]:
        """What a vanilla pipeline does differently with this shape, for the card."""
        return ()

    # What a run learns besides the weights.

    calibrates: ClassVar[bool] = False

    def calibrate(self, logits: np.ndarray, gold: list[Any], labels: list[str]) -> dict[str, Any]:
        """The options tuned on validation logits (none here)."""
        return {}

    def saved_weights(self, model: PreTrainedModel, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The weights as the saved dir holds them (unchanged here)."""
        return weights

    def prepare_model(self, model: PreTrainedModel) -> None:  # noqa: B027
        """Adjust a loaded model before it trains or predicts (nothing here)."""

    def window_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each window's cross-entropy on its class id: [B, C] / [B] -> [B] (`Task.window_losses`)."""
        from bert_tasks.training.objectives import window_cross_entropy

        return window_cross_entropy(logits, labels)

    def window_labels(self, logits: np.ndarray) -> np.ndarray | None:
        """Each window's class: [P, C] -> [P] (`Task.window_labels`)."""
        return logits.argmax(-1)


class SingleLabel(LabelShape):
    """One class per text, the head's softmax over them."""

    def metrics(self, logits: np.ndarray, gold: list[Any], labels: list[str]) -> dict[str, Any]:
        """Accuracy, macro-F1, per-class scores and confusion matrix of (N, C) averaged logits."""
        predictions = [labels[i] for i in logits.argmax(axis=-1)]
        return _metric("classification").compute(predictions=predictions, references=gold, labels=labels)

    def decode(self, logits: np.ndarray, labels: list[str]) -> list[dict[str, Any]]:
        """One `{"label", "score", "scores": {label: prob}}` per text, from the softmax of averaged logits."""
        from scipy.special import softmax

        return [
            {
                "label": labels[int(row.argmax())],
                "score": float(row.max()),
                "scores": {label: float(p) for label, p in zip(labels, row, strict=True)},
            }
            for row in softmax(logits, axis=-1)
        ]

    def shown(self, prediction: dict[str, Any]) -> tuple[str, str]:
        """A prediction as the (label, score) cells of `render_predictions`."""
        return prediction["label"], f"{prediction['score']:.3f}"

    def label_studio(self, prediction: dict[str, Any]) -> tuple[list[dict[str, Any]], float | None]:
        """The predicted class as a `choices` result; the task's score is the class's probability."""
        return [_choices([prediction["label"]], prediction["score"])], prediction["score"]

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

        path = out_dir / "confusion_matrix.png"
        return [plot_confusion_matrix(metrics["confusion_matrix"], metrics["labels"], path)]

    def summary(self, labels: Sequence[str]) -> str:
        """What the model does, for its card."""
        return f"Text classification: one label per text, out of {', '.join(labels)}."


class MultiLabel(LabelShape):
    """A set of classes per text; a threshold per label decides which are predicted."""

    title = "multi-label"
    kind = "set"
    problem_type = "multi_label_classification"
    default_metric = "macro_f1"
    metric_names = ("macro_f1", "micro_f1", "subset_accuracy")
    stratify_by = None  # a set has no one class to keep in proportion: a plain seeded sample
    columns = ("labels", "scores")
    evaluate_options = ("thresholds",)
    calibrates = True

    def __init__(self, thresholds: list[float] | None = None) -> None:
        #: One threshold per label in id order, one for all, or None: 0.5 until tuned on validation.
        self.thresholds = thresholds

    def classes(self, data: Dataset) -> set[str]:
        return {name for names in data["label"] for name in names}

    def check_learnable(self, train: Dataset, source: str, labels: list[str]) -> None:
        """A set that is the same on every training text (or no label at all) leaves nothing to learn."""
        sets = {tuple(sorted(names)) for names in train["label"]}
        if not labels or len(sets) < 2:
            only = ", ".join(next(iter(sets))) or "no label"
            raise BertTasksError(
                f"{source}: every training text has the same labels ({only}), so a model would learn "
                "nothing; add texts with other label sets, or check label_column"
            )

    def check_options(self, labels: list[str]) -> None:
        """A threshold per label, or one for all."""
        if self.thresholds is not None and len(self.thresholds) not in (1, len(labels)):
            raise BertTasksError(
                f"thresholds has {len(self.thresholds)} value(s) but the model has {len(labels)} labels "
                f"({', '.join(labels)}); give one per label in this order, one for all, or none to tune them"
            )

    def target(self, label: Any, label2id: dict[str, int]) -> list[float]:
        """The multi-hot row BCE is computed against."""
        row = [0.0] * len(label2id)
        for name in label:
            row[label2id[name]] = 1.0
        return row

    def gold(self, label: Any) -> Hashable:
        return tuple(sorted(label))

    def distribution(self, labels: Sequence[Any]) -> dict[str, int]:
        """Texts per label (a text counts once for each of its labels)."""
        return dict(Counter(name for names in labels for name in names))

    def cutoffs(self, count: int) -> np.ndarray:
        """The (C,) thresholds in use: the given or tuned ones, or 0.5 each."""
        given = self.thresholds or [DEFAULT_THRESHOLD]
        return np.asarray(given * count if len(given) == 1 else given, dtype=np.float64)

    def metrics(self, logits: np.ndarray, gold: list[Any], labels: list[str]) -> dict[str, Any]:
        """Micro/macro-F1, subset accuracy and per-label scores at the thresholds in use (and those)."""
        thresholds = self.cutoffs(len(labels))
        predicted = (_sigmoid(logits) >= thresholds).astype(np.int8)  # (N, C)
        scores = _metric("multilabel").compute(
            predictions=predicted.tolist(), references=_multi_hot(gold, labels).tolist(), labels=labels
        )
        return scores | {"thresholds": dict(zip(labels, thresholds.tolist(), strict=True))}

    def decode(self, logits: np.ndarray, labels: list[str]) -> list[dict[str, Any]]:
        """`{"labels": [{"label", "score"}, ...], "scores": {label: prob}}` per text: every label whose
        probability reaches its threshold, most probable first; none when none does (no forced top label:
        "no label" is an answer of its own, and the thresholds were tuned with it)."""
        thresholds = self.cutoffs(len(labels))
        found = []
        for row in _sigmoid(logits):
            passing = sorted(np.flatnonzero(row >= thresholds), key=lambda i: -row[i])
            found.append(
                {
                    "labels": [{"label": labels[i], "score": float(row[i])} for i in passing],
                    "scores": {label: float(p) for label, p in zip(labels, row, strict=True)},
                }
            )
        return found

    def shown(self, prediction: dict[str, Any]) -> tuple[str, str]:
        names = [item["label"] for item in prediction["labels"]]
        scores = [f"{item['score']:.3f}" for item in prediction["labels"]]
        return "|".join(names) or "(none)", "|".join(scores) or "-"

    def label_studio(self, prediction: dict[str, Any]) -> tuple[list[dict[str, Any]], float | None]:
        """Every predicted label in one `choices` result; the task's score is their mean probability."""
        items = prediction["labels"]
        if not items:
            return [], None
        score = float(np.mean([item["score"] for item in items]))
        return [_choices([item["label"] for item in items], score)], score

    def render_metrics(self, metrics: dict[str, Any]) -> str:
        lines = [
            f"micro-F1 {metrics['micro_f1']:.4f} | macro-F1 {metrics['macro_f1']:.4f} | subset accuracy "
            f"{metrics['subset_accuracy']:.4f}",
            "",
            *score_table(metrics["per_label"], "label"),
            "",
            "thresholds: "
            + ", ".join(f"{label} {value:.3f}" for label, value in metrics["thresholds"].items()),
        ]
        return "\n".join(lines)

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """Per-label precision, recall and F1 as bars (`label_scores.png`)."""
        from bert_tasks.insight.plots import plot_label_scores

        return [plot_label_scores(metrics["per_label"], out_dir / "label_scores.png", "Scores per label")]

    def summary(self, labels: Sequence[str]) -> str:
        return (
            f"Multi-label text classification: any of the labels {', '.join(labels)} per text, each "
            "predicted when its probability reaches its own threshold."
        )

    def pipeline_options(self) -> dict[str, Any]:
        return {"truncation": True, "top_k": None}

    def limits(self) -> tuple[str, ...]:
        return (
            "A vanilla `pipeline(..., top_k=None)` gives every label's sigmoid probability but applies no "
            "threshold: compare each with its threshold, `bert_tasks.thresholds` in config.json (in label "
            "order), as bert-tasks does.",
        )

    def calibrate(self, logits: np.ndarray, gold: list[Any], labels: list[str]) -> dict[str, Any]:
        """Each label's threshold tuned on the validation split, unless thresholds were given."""
        if self.thresholds is not None:
            return {}
        self.thresholds = tune_thresholds(_sigmoid(logits), _multi_hot(gold, labels))
        return {"thresholds": self.thresholds}

    def window_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each window's BCE-with-logits against its multi-hot row, the mean over labels as transformers'
        head takes it: [B, C] / [B, C] -> [B]."""
        import torch.nn.functional as F

        per_label = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
        return per_label.mean(dim=-1)  # [B]

    def window_labels(self, logits: np.ndarray) -> np.ndarray | None:
        """Each window's label set at the thresholds in use: [P, C] -> [P, C] booleans."""
        return _sigmoid(logits) >= self.cutoffs(logits.shape[-1])


#: The most integers `ordinal=true` rounds to: a rating scale, not every integer of a wide range.
MAX_ORDINAL_CLASSES = 1000


class Regression(LabelShape):
    """A number per text: one output, trained on standardised targets, saved in the label's units."""

    title = "regression"
    kind = "number"
    problem_type = "regression"
    stratify_by = None  # a plain seeded sample
    columns = ("value", "rounded")
    evaluate_options = ("round_to",)

    def __init__(self, round_to: list[float] | None = None, ordinal: bool = False) -> None:
        #: The classes a value is rounded to for `rounded` and `rounded_accuracy` (None: no rounding).
        self.round_to = sorted(round_to) if round_to is not None else None
        self.ordinal = ordinal
        #: (mean, standard deviation) of the training targets while a run trains; None: the head outputs
        #: the label's units (a saved model, whose head holds the scaling).
        self.scale: tuple[float, float] | None = None

    @property
    def metric_names(self) -> tuple[str, ...]:  # type: ignore[override]
        """Larger is better for each: the correlations, and rounding's accuracy when there is rounding."""
        return ("spearman", "pearson", *(("rounded_accuracy",) if self.round_to is not None else ()))

    default_metric = "spearman"

    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """The one output, `value` (what transformers' pipeline calls its label; whatever the column)."""
        return [VALUE]

    def classes(self, data: Dataset) -> set[str]:
        return set()

    def settle(self, train: Dataset | None, cfg: Config) -> dict[str, Any]:
        """The training targets' mean and spread (and, with `ordinal`, `round_to`: every integer of their
        range, saved with the model)."""
        if train is None:
            return {}
        values = np.asarray(train["label"], dtype=np.float64)
        self.scale = (float(values.mean()), float(values.std()) or 1.0)
        if self.ordinal:
            low, high = math.ceil(values.min()), math.floor(values.max())
            if high - low < 1:
                raise BertTasksError(
                    f"ordinal=true rounds to the integers of the training labels' range, "
                    f"{values.min():g}..{values.max():g}, which holds fewer than two; give round_to=[...]"
                )
            if high - low + 1 > MAX_ORDINAL_CLASSES:
                raise BertTasksError(
                    f"ordinal=true rounds to every integer of the training labels' range, {low}..{high}, "
                    f"which holds {high - low + 1:,} (more than {MAX_ORDINAL_CLASSES:,}, no rating scale); "
                    "give round_to=[...] with the classes, or drop ordinal"
                )
            self.round_to = [float(n) for n in range(low, high + 1)]
            return {"round_to": self.round_to}
        return {}

    def check_learnable(self, train: Dataset, source: str, labels: list[str]) -> None:
        """Targets that are all one number leave nothing to learn (and no spread to standardise by)."""
        values = train["label"]
        if min(values) == max(values):
            raise BertTasksError(
                f"{source}: every training label is {values[0]:g}, so a model would learn nothing; add "
                "texts with other values, or check label_column"
            )

    def check_unseen(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:
        """Any number is a label a regression model can score."""

    def check_known(self, raw: Dataset, label2id: dict[str, int]) -> None:
        """Any number is scored."""

    def target(self, label: Any, label2id: dict[str, int]) -> float:
        """The standardised target: (y - mean) / std of the training targets."""
        mean, std = self.scale or (0.0, 1.0)
        return (float(label) - mean) / std

    def distribution(self, labels: Sequence[Any]) -> dict[str, int]:
        """Examples per value (`debug data`: a rating's 1..5 are each a row)."""
        return dict(Counter(f"{value:g}" for value in labels))

    def values(self, logits: np.ndarray) -> np.ndarray:
        """(N, 1) averaged outputs -> (N,) values in the label's units."""
        mean, std = self.scale or (0.0, 1.0)
        return logits[:, 0] * std + mean

    def rounded(self, values: np.ndarray) -> np.ndarray:
        """Each value as the nearest of `round_to` (a tie goes to the lower class)."""
        classes = np.asarray(self.round_to, dtype=np.float64)
        return classes[np.abs(values[:, None] - classes[None, :]).argmin(axis=1)]

    def metrics(self, logits: np.ndarray, gold: list[Any], labels: list[str]) -> dict[str, Any]:
        """MAE, RMSE, Pearson, Spearman (and rounding's accuracy) of the values against the gold ones."""
        values, references = self.values(logits), np.asarray(gold, dtype=np.float64)
        rounded = None
        if self.round_to is not None:
            rounded = (self.rounded(values).tolist(), self.rounded(references).tolist())
        scores = _metric("regression").compute(predictions=values, references=references, rounded=rounded)
        return scores | ({"round_to": self.round_to} if self.round_to is not None else {})

    def decode(self, logits: np.ndarray, labels: list[str]) -> list[dict[str, Any]]:
        """`{"value"}` per text, with `"rounded"` (the nearest of `round_to`) when there is rounding."""
        values = self.values(logits)
        found = [{"value": float(value)} for value in values]
        if self.round_to is not None:
            for record, rounded in zip(found, self.rounded(values).tolist(), strict=True):
                record["rounded"] = int(rounded) if float(rounded).is_integer() else rounded
        return found

    def shown(self, prediction: dict[str, Any]) -> tuple[str, str]:
        rounded = prediction.get("rounded")
        return f"{prediction['value']:.3f}", "-" if rounded is None else f"{rounded:g}"

    def label_studio(self, prediction: dict[str, Any]) -> tuple[list[dict[str, Any]], float | None]:
        """The value as a `number` result (`<Number name="value" toName="text">`); no confidence."""
        result = {
            "from_name": NUMBER_CONTROL,
            "to_name": TEXT_OBJECT,
            "type": "number",
            "value": {"number": prediction["value"]},
        }
        return [result], None

    def render_metrics(self, metrics: dict[str, Any]) -> str:
        line = (
            f"MAE {metrics['mae']:.4f} | RMSE {metrics['rmse']:.4f} | Pearson {metrics['pearson']:.4f} | "
            f"Spearman {metrics['spearman']:.4f} | {metrics['count']} texts"
        )
        if "rounded_accuracy" in metrics:
            classes = ", ".join(f"{value:g}" for value in metrics["round_to"])
            line += f"\nrounded to the nearest of {classes}: accuracy {metrics['rounded_accuracy']:.4f}"
        return line

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """None: the scores are four numbers (every value is in `predict`'s output)."""
        return []

    def summary(self, labels: Sequence[str]) -> str:
        return "Text regression: one number per text, in the training labels' units."

    def limits(self) -> tuple[str, ...]:
        return (
            "Values are not bounded to the training labels' range: a text unlike the training data can "
            "score beyond it.",
        )

    def prepare_model(self, model: PreTrainedModel) -> None:
        """The output layer computes in float32: the saved one writes the label's units, which bf16
        rounds to 8 significant bits (2,005 as 2,008)."""
        from bert_tasks.modeling.float32_output import keep_in_float32

        keep_in_float32(model.get_submodule(_output_layer(model)))

    def window_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each window's squared error, as transformers' MSE head: [B, 1] / [B] -> [B]."""
        return (logits.float().squeeze(-1) - labels.float()).pow(2)

    def window_labels(self, logits: np.ndarray) -> np.ndarray | None:
        """None: a value has no label to keep; an export's parity is its values' tolerance."""
        return None

    def saved_weights(self, model: PreTrainedModel, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The head's last layer with the target scaling folded in: w' = std * w, b' = std * b + mean, so
        the saved model outputs the label's units (its policy holds no scaling: it needs none)."""
        if self.scale is None:
            return weights
        name = _output_layer(model)
        mean, std = self.scale
        folded = dict(weights)
        if f"{name}.weight" in weights:  # processes that do not save hold no weights
            folded[f"{name}.weight"] = weights[f"{name}.weight"] * std
            folded[f"{name}.bias"] = weights[f"{name}.bias"] * std + mean
        return folded


def tune_thresholds(probabilities: np.ndarray, gold: np.ndarray) -> list[float]:
    """Per label, the threshold of the best F1 on these (N, C) probabilities and multi-hot gold rows.

    A label is predicted when its probability reaches the threshold. Of the thresholds that keep the same
    predictions (between two neighbouring probabilities) the midpoint is taken, and 0.5 itself is a
    candidate; of those with the best F1, the one nearest 0.5 wins (so a label whose F1 is 0 whatever the
    threshold, e.g. one without gold examples, keeps 0.5). O(N log N) per label: the texts are sorted by
    probability once, and predicting the top j of them gives F1 = 2 TP_j / (j + P).
    """
    chosen = []
    for probs, positives in zip(probabilities.T, gold.T, strict=True):
        order = np.argsort(-probs, kind="stable")
        ranked, hits = probs[order], positives[order].astype(np.int64)
        true_positives = np.concatenate([[0], np.cumsum(hits)])  # TP when predicting the top j, j = 0..N
        bounds = np.concatenate([[1.0], ranked, [0.0]])  # the top j are above the midpoint of j and j + 1
        cuts = [j for j in range(len(ranked) + 1) if bounds[j] > bounds[j + 1] or j in (0, len(ranked))]
        candidates = [((bounds[j] + bounds[j + 1]) / 2, j) for j in cuts]
        candidates.append((DEFAULT_THRESHOLD, int((probs >= DEFAULT_THRESHOLD).sum())))
        total = int(hits.sum())

        def f1(j: int, total: int = total, true_positives: np.ndarray = true_positives) -> float:
            return 2 * int(true_positives[j]) / (j + total) if j + total else 0.0

        best = max(f1(j) for _, j in candidates)
        chosen.append(min((abs(t - 0.5), t) for t, j in candidates if f1(j) == best)[1])
    return [float(t) for t in chosen]


def _output_layer(model: PreTrainedModel) -> str:
    """The name of the head's last Linear layer: the one that writes the model's single output."""
    from torch import nn

    layers = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    outputs = [name for name in layers if model.get_submodule(name).out_features == 1]
    if not outputs:
        raise RuntimeError("a regression head without a one-output Linear layer")
    return outputs[-1]


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(logits)


def _multi_hot(gold: list[Any], labels: list[str]) -> np.ndarray:
    """(N, C) 0/1 rows of the gold label sets."""
    index = {label: i for i, label in enumerate(labels)}
    rows = np.zeros((len(gold), len(labels)), dtype=np.int8)
    for row, names in enumerate(gold):
        rows[row, [index[name] for name in names]] = 1
    return rows


def _choices(names: list[str], score: float) -> dict[str, Any]:
    return {
        "from_name": CHOICES_CONTROL,
        "to_name": TEXT_OBJECT,
        "type": "choices",
        "value": {"choices": names},
        "score": score,
    }


@functools.cache
def _metric(name: str) -> EvaluationModule:
    """Load a local metric once; `evaluate` is imported here because it is slow to import."""
    import evaluate

    return evaluate.load(str(METRICS / name / f"{name}.py"), keep_in_memory=True)


def shape_of(options: dict[str, Any]) -> LabelShape:
    """The shape the task's options choose (multi-label also when left unset: `SentimentTask.settle`)."""
    if options.get("regression"):
        return Regression(options.get("round_to"), bool(options.get("ordinal")))
    if options.get("multi_label"):
        return MultiLabel(options.get("thresholds"))
    return SingleLabel()
