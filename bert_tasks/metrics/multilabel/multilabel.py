"""Multi-label metrics as a local `evaluate` module: micro/macro-F1, subset accuracy, per-label scores.

Local for the reason classification.py is (training must work offline); the numbers come from
scikit-learn on multi-hot rows. Load it with `evaluate.load(str(path_to_this_file))`.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

_DESCRIPTION = "Micro- and macro-F1, subset accuracy and per-label precision/recall/F1/support."
_INPUTS = """
Args:
    predictions: one multi-hot row per text (1 where the label is predicted), as lists of 0/1.
    references: the gold multi-hot rows, same width.
    labels: the label names, one per column.
Returns:
    micro_f1 (over every text-label decision), macro_f1 (the mean F1 of the labels that occur in the gold
    rows or the predictions, as classification.py averages, so a label missing from a small evaluation set
    does not count as F1 = 0), subset_accuracy (texts whose whole label set is right), per_label
    {label: {precision, recall, f1, support}}, labels.
"""


class MultiLabel(evaluate.Metric):
    """Scores multi-label classification; every number a plain Python value, ready for JSON."""

    def _info(self) -> evaluate.MetricInfo:
        row = datasets.Sequence(datasets.Value("int8"))
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": row, "references": row}),
        )

    def _compute(self, predictions, references, labels) -> dict:
        width = len(labels)
        predicted = np.asarray(predictions, dtype=np.int64).reshape(-1, width)  # (N, C)
        gold = np.asarray(references, dtype=np.int64).reshape(-1, width)  # (N, C)
        precision, recall, f1, support = precision_recall_fscore_support(
            gold, predicted, average=None, zero_division=0
        )
        seen = (gold.sum(axis=0) + predicted.sum(axis=0)) > 0  # (C,)
        per_label = {
            str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for label, p, r, f, s in zip(labels, precision, recall, f1, support, strict=True)
        }
        return {
            "micro_f1": float(f1_score(gold, predicted, average="micro", zero_division=0)),
            "macro_f1": float(f1[seen].mean()) if seen.any() else 0.0,
            "subset_accuracy": float(accuracy_score(gold, predicted)),
            "per_label": per_label,
            "labels": [str(label) for label in labels],
        }
