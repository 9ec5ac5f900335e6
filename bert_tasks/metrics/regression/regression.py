"""Regression metrics as a local `evaluate` module: MAE, RMSE, Pearson, Spearman, and rounded accuracy.

Local for the reason classification.py is (training must work offline); the numbers come from numpy and
scipy. Load it with `evaluate.load(str(path_to_this_file))`.
"""

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr

_DESCRIPTION = "MAE, RMSE, Pearson and Spearman correlation; given rounded values, their accuracy."
_INPUTS = """
Args:
    predictions: predicted values.
    references: gold values.
    rounded: optional (predictions, references) each rounded to the nearest class (e.g. of 1..5 stars);
        the share that agree is `rounded_accuracy`.
Returns:
    mae, rmse, pearson, spearman (each correlation 0.0 where the predictions or the gold are constant:
    there is no correlation to measure, and NaN would pass for a best score), count, and given `rounded`
    rounded_accuracy.
"""


class Regression(evaluate.Metric):
    """Scores real-valued predictions; every number a plain Python value, ready for JSON."""

    def _info(self) -> evaluate.MetricInfo:
        value = datasets.Value("float64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": value, "references": value}),
        )

    def _compute(self, predictions, references, rounded=None) -> dict:
        predicted = np.asarray(predictions, dtype=np.float64)  # (N,)
        gold = np.asarray(references, dtype=np.float64)  # (N,)
        errors = predicted - gold
        varied = len(gold) > 1 and np.ptp(predicted) > 0 and np.ptp(gold) > 0
        scores = {
            "mae": float(np.abs(errors).mean()),
            "rmse": float(np.sqrt((errors**2).mean())),
            "pearson": float(pearsonr(predicted, gold)[0]) if varied else 0.0,
            "spearman": float(spearmanr(predicted, gold)[0]) if varied else 0.0,
            "count": len(gold),
        }
        if rounded is not None:
            scores["rounded_accuracy"] = float(np.mean(np.equal(*rounded)))
        return scores
