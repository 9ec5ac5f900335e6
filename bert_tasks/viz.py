"""PNG plots of a run: the confusion matrix and the training curves.

Figures are built with `matplotlib.figure.Figure` (rendered by the Agg canvas) instead of pyplot's
global figures, so plotting works on headless servers and leaves no open figures behind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from sklearn.metrics import ConfusionMatrixDisplay

from bert_tasks.errors import BertTasksError

#: Scalars of a training log row that are bookkeeping, not curves.
_NOT_CURVES = {"step", "epoch", "loss", "lr", "grad_norm", "eval_loss"}


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], labels: Sequence[str], path: str | Path) -> Path:
    """Draw `matrix` (rows = gold, columns = predicted, as the classification metric returns it)."""
    counts = np.asarray(matrix)  # (C, C)
    if counts.shape != (len(labels), len(labels)):
        raise BertTasksError(f"confusion matrix is {counts.shape} but there are {len(labels)} labels")
    size = max(4.0, 0.6 * len(labels) + 2)
    fig = Figure(figsize=(size, size), layout="constrained")
    ax = fig.add_subplot()
    rotation = "vertical" if len(labels) > 6 else "horizontal"
    display = ConfusionMatrixDisplay(counts, display_labels=list(labels))
    display.plot(ax=ax, cmap="Blues", colorbar=False, xticks_rotation=rotation)
    ax.set_title("Confusion matrix")
    ax.set_xlabel("Predicted")
    ax.set_ylabel("Gold")
    return _save(fig, path)


def plot_training_curves(log_records: list[dict[str, Any]], path: str | Path) -> Path:
    """Plot training loss (and eval loss), learning rate and every numeric `eval_*` metric against step.

    `log_records` are the rows of the run's JSONL log; each panel uses only the rows that carry its key,
    so training rows and evaluation rows can be interleaved.
    """
    if not log_records:
        raise BertTasksError("no training log records to plot; was the run logged?")
    numeric = {key for record in log_records for key, value in record.items() if _is_number(value)}
    metrics = sorted(key for key in numeric - _NOT_CURVES if key.startswith("eval_"))
    panels = [("loss", ["loss", "eval_loss"]), ("learning rate", ["lr"])]
    if metrics:
        panels.append(("eval metrics", metrics))
    fig = Figure(figsize=(5 * len(panels), 4), layout="constrained")
    for ax, (title, keys) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in log_records if "step" in r and _is_number(r.get(key))]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if key.startswith("eval_") else None, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend()
    return _save(fig, path)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
