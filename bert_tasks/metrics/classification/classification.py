"""Classification metrics as a local `evaluate` module: accuracy, macro-F1, per-class, confusion matrix.

Local because `evaluate.load("accuracy")` fetches its script from the Hub, and training must work offline;
load it with `evaluate.load(str(path_to_this_file))`. The numbers come from scikit-learn.
"""

import datasets
import evaluate
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

_DESCRIPTION = "Accuracy, macro-F1, per-class precision/recall/F1/support and the confusion matrix."
_INPUTS = """
Args:
    predictions: predicted labels (strings or ints).
    references: gold labels, same type as predictions.
    labels: the label set in display order (rows/columns of the confusion matrix, keys of `per_class`);
        defaults to the sorted union of predictions and references. Macro-F1 averages over the labels
        that occur in predictions or references (as scikit-learn does without `labels`), so a class
        missing from a small eval set does not count as F1 = 0.
Returns:
    accuracy, macro_f1, per_class {label: {precision, recall, f1, support}}, confusion_matrix
    (rows = gold, columns = predicted, nested lists), labels.
"""


def _features(dtype: str) -> datasets.Features:
    return datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)})


class Classification(evaluate.Metric):
    """Scores single-label classification; every number a plain Python value, ready for JSON."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=[_features("string"), _features("int64")],
        )

    def _compute(self, predictions, references, labels=None) -> dict:
        seen = set(predictions) | set(references)
        labels = list(labels) if labels is not None else sorted(seen)
        precision, recall, f1, support = precision_recall_fscore_support(
            references, predictions, labels=labels, average=None, zero_division=0
        )
        per_class = {
            str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for label, p, r, f, s in zip(labels, precision, recall, f1, support, strict=True)
        }
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "macro_f1": float(f1[[label in seen for label in labels]].mean()),
            "per_class": per_class,
            "confusion_matrix": confusion_matrix(references, predictions, labels=labels).tolist(),
            "labels": [str(label) for label in labels],
        }
