"""PNG plots of a run: the confusion matrix, per-label and NER per-type scores, training curves.

Figures are built with `matplotlib.figure.Figure` (rendered by the Agg canvas) instead of pyplot's
global figures, so plotting works on headless servers and leaves no open figures behind.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from sklearn.metrics import ConfusionMatrixDisplay

from bert_tasks.errors import BertTasksError
from bert_tasks.output_paths import GENERATOR

#: Scalars of a training log row that are bookkeeping, not curves.
_NOT_CURVES = {"step", "epoch", "loss", "lr", "grad_norm", "eval_loss"}
#: Classes the confusion-matrix PNG draws cell by cell; beyond, the most frequent ones and "other".
CONFUSION_PLOT_CLASSES = 30
#: Side of the confusion-matrix figure at most (inches): 30 classes + "other" at ~0.6 inch a cell.
_MAX_CONFUSION_INCHES = 20.0
#: Characters of a class name shown as a tick label.
_MAX_LABEL_CHARS = 24
#: Pixels of a saved figure's longer side at most: every PNG stays below ~100 MB of pixels to render.
MAX_SIDE_PIXELS = 4800
#: Resolution of saved figures while they fit in MAX_SIDE_PIXELS.
_DPI = 120


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], labels: Sequence[str], path: str | Path) -> Path:
    """Draw `matrix` (rows = gold, columns = predicted, as the classification metric returns it).

    Up to `CONFUSION_PLOT_CLASSES` classes every cell is drawn with its count. Beyond that the plot shows
    the most frequent classes (gold plus predicted occurrences) and sums the rest into an "other" row and
    column, and its title says so: a figure of every cell would grow with the square of the label count
    (1,000 classes: ~20 GB of pixels and a million text labels). The full matrix is in metrics.json.
    """
    counts = np.asarray(matrix, dtype=np.int64)  # (C, C)
    if counts.shape != (len(labels), len(labels)):
        raise BertTasksError(f"confusion matrix is {counts.shape} but there are {len(labels)} labels")
    names = [_short(label) for label in labels]
    title = "Confusion matrix"
    if len(labels) > CONFUSION_PLOT_CLASSES:
        counts, names = _most_frequent(counts, names, CONFUSION_PLOT_CLASSES)
        title = (
            f"Confusion matrix: the {CONFUSION_PLOT_CLASSES} most frequent of {len(labels)} classes\n"
            "(the others summed as 'other'; the full matrix is in metrics.json)"
        )
    size = min(_MAX_CONFUSION_INCHES, max(4.0, 0.6 * len(names) + 2))
    fig = Figure(figsize=(size, size), layout="constrained")
    ax = fig.add_subplot()
    rotation = "vertical" if len(names) > 6 else "horizontal"
    display = ConfusionMatrixDisplay(counts, display_labels=names)
    digits = len(str(int(counts.max(initial=0))))
    cell_points = 72 * (size - 2) / max(len(names), 1)
    fontsize = max(5.0, min(10.0, cell_points / (0.7 * digits)))
    display.plot(
        ax=ax,
        cmap="Blues",
        colorbar=False,
        xticks_rotation=rotation,
        values_format="d",
        text_kw={"fontsize": fontsize},
    )
    ax.set_title(title)
    ax.set_xlabel("Predicted")
    ax.set_ylabel("Gold")
    return _save(fig, path)


#: Entity types the NER scores PNG draws bars for; beyond, the most frequent ones (by gold support).
NER_PLOT_TYPES = 30


def plot_ner_scores(per_type: dict[str, dict[str, float]], errors: dict[str, Any], path: str | Path) -> Path:
    """Per-type precision, recall and F1 as grouped horizontal bars (support beside each type), and the
    counts of each kind of error, as the NER metric returns them.

    Beyond `NER_PLOT_TYPES` types the bars show the most frequent ones and the title says so (every type
    is in metrics.json), so the figure's height stays bounded.
    """
    names = sorted(per_type, key=lambda name: (-per_type[name]["support"], name))
    title = "Entity scores per type"
    if len(names) > NER_PLOT_TYPES:
        title = f"Entity scores: the {NER_PLOT_TYPES} most frequent of {len(names)} types (all: metrics.json)"
        names = names[:NER_PLOT_TYPES]
    kinds = [kind for kind in errors if kind != "examples"]
    fig = Figure(figsize=(12, max(3.0, 1.2 + 0.45 * len(names))), layout="constrained")
    scores, breakdown = fig.subplots(1, 2, width_ratios=[3, 2])
    _score_bars(scores, per_type, names, title, "gold entities")
    counts = [errors[kind] for kind in kinds]
    breakdown.barh(np.arange(len(kinds)), counts, color="#cb181d")
    breakdown.set_yticks(np.arange(len(kinds)), [kind.replace("_", " ") for kind in kinds])
    breakdown.invert_yaxis()
    for row, count in enumerate(counts):
        breakdown.annotate(f" {count}", (count, row), va="center", fontsize=9)
    breakdown.set_xlim(0, max(counts, default=0) * 1.15 + 1)
    breakdown.set_xlabel("entities")
    breakdown.set_title("Errors by kind")
    return _save(fig, path)


#: Labels the multi-label scores PNG draws bars for; beyond, the most frequent ones (by gold support).
LABEL_PLOT_LABELS = 30


def plot_label_scores(per_label: dict[str, dict[str, float]], path: str | Path, title: str) -> Path:
    """Per-label precision, recall and F1 as grouped horizontal bars with each label's support (multi-label
    evaluation); beyond `LABEL_PLOT_LABELS` labels the most frequent ones, and the title says so."""
    names = sorted(per_label, key=lambda name: (-per_label[name]["support"], name))
    if len(names) > LABEL_PLOT_LABELS:
        title = f"{title}: the {LABEL_PLOT_LABELS} most frequent of {len(names)} (all: metrics.json)"
        names = names[:LABEL_PLOT_LABELS]
    fig = Figure(figsize=(8, max(3.0, 1.2 + 0.45 * len(names))), layout="constrained")
    _score_bars(fig.add_subplot(), per_label, names, title, "gold texts")
    return _save(fig, path)


def _score_bars(
    ax: Any, scores: dict[str, dict[str, float]], names: list[str], title: str, unit: str
) -> None:
    """Precision, recall and F1 of each of `names` as three bars in a row, best-supported on top."""
    rows = np.arange(len(names))
    for offset, (metric, colour) in enumerate(
        zip(("precision", "recall", "f1"), ("#9ecae1", "#4292c6", "#08519c"), strict=True)
    ):
        values = [scores[name][metric] for name in names]
        ax.barh(rows + (offset - 1) * 0.27, values, height=0.27, color=colour, label=metric)
    ax.set_yticks(rows, [f"{_short(name)} ({scores[name]['support']})" for name in names])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"score (support: {unit})")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)


def _most_frequent(counts: np.ndarray, names: list[str], keep: int) -> tuple[np.ndarray, list[str]]:
    """(C, C) -> (keep + 1, keep + 1): the `keep` classes seen most often (gold + predicted), then "other".

    Row and column "other" sum every other class, so each row still adds up to its class's support and the
    whole grid to the number of examples.
    """
    frequency = counts.sum(axis=1) + counts.sum(axis=0)  # (C,)
    top = np.argsort(-frequency, kind="stable")[:keep]  # (keep,)
    grid = np.zeros((keep + 1, keep + 1), dtype=np.int64)
    grid[:keep, :keep] = counts[np.ix_(top, top)]
    grid[:keep, keep] = counts[top].sum(axis=1) - grid[:keep, :keep].sum(axis=1)
    grid[keep, :keep] = counts[:, top].sum(axis=0) - grid[:keep, :keep].sum(axis=0)
    grid[keep, keep] = counts.sum() - grid.sum()
    return grid, [names[i] for i in top] + [f"other ({len(names) - keep})"]


def _short(label: str) -> str:
    """A tick label of at most `_MAX_LABEL_CHARS` characters: a long class name must not push the grid off."""
    label = str(label)
    return label if len(label) <= _MAX_LABEL_CHARS else label[: _MAX_LABEL_CHARS - 1] + "…"


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
    """Write `fig` as a PNG, whole or not at all (through a temporary file beside it); a figure larger
    than MAX_SIDE_PIXELS at 120 dpi is saved at a lower dpi.

    Errors of the write (OSError) pass through: each command's output check says them in one line.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    inches = max(fig.get_figwidth(), fig.get_figheight())
    partial = path.with_name(f".{path.name}.tmp")
    try:
        dpi = min(_DPI, MAX_SIDE_PIXELS / inches)
        fig.savefig(partial, format="png", dpi=dpi, metadata={"Software": GENERATOR})  # see written_by_us
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def attention_figure_size(n_tokens: int, n_panels: int = 1, ncols: int = 1) -> tuple[float, float]:
    """Figure size in inches of an attention plot: one head, or `n_panels` small multiples in `ncols` columns.

    One head gets about a quarter inch per token (5 to 16 inches), room for the word-piece labels; small
    multiples get a fixed panel size so that a layers x heads overview of a 12 x 12 model stays printable.
    """
    if n_panels == 1:
        side = min(16.0, max(5.0, 2.0 + 0.28 * n_tokens))
        return side + 1.2, side  # + colour bar
    panel = 3.0 if n_panels <= 16 else 1.6
    nrows = math.ceil(n_panels / ncols)
    return ncols * panel + 1.0, nrows * panel + 1.6  # + colour bar, + title and word-piece labels


def plot_attention_head(probs: np.ndarray, tokens: Sequence[str], title: str, path: str | Path) -> Path:
    """One head's attention probabilities [T, T]: query tokens as rows, key tokens as columns."""
    probs = np.asarray(probs)  # [T, T]
    _check_attention(probs[None], tokens)
    fig = Figure(figsize=attention_figure_size(len(tokens)), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(probs, cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
    _label_tokens(ax, tokens, rows=True, columns=True, fontsize=_token_fontsize(fig, len(tokens), 1))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="attention probability")
    return _save(fig, path)


def plot_attention_grid(
    probs: np.ndarray,
    tokens: Sequence[str],
    title: str,
    path: str | Path,
    ncols: int,
    panel_titles: Sequence[str],
    row_labels: Sequence[str] | None = None,
) -> Path:
    """Small multiples of attention maps [N, T, T] on one colour scale, `ncols` per row.

    Word-piece labels go on the outer panels only (first column, last row), and only while they fit.
    """
    probs = np.asarray(probs)  # [N, T, T]
    _check_attention(probs, tokens)
    n_panels = probs.shape[0]
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=attention_figure_size(len(tokens), n_panels, ncols), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)  # [rows, cols] of Axes
    fontsize = _token_fontsize(fig, len(tokens), ncols)
    vmax = float(probs.max())
    for index, ax in enumerate(axes.flat):
        if index >= n_panels:
            ax.set_axis_off()
            continue
        row, col = divmod(index, ncols)
        image = ax.imshow(
            probs[index], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest"
        )
        last_row = index + ncols >= n_panels
        _label_tokens(ax, tokens, rows=col == 0, columns=last_row, fontsize=fontsize)
        ax.set_title(panel_titles[index], fontsize=9)
        if row_labels is not None and col == 0:
            ax.set_ylabel(row_labels[row])
    fig.suptitle(title)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention probability")
    return _save(fig, path)


def _check_attention(probs: np.ndarray, tokens: Sequence[str]) -> None:
    if probs.ndim != 3 or probs.shape[1:] != (len(tokens), len(tokens)):
        raise BertTasksError(f"attention maps are {probs.shape} but there are {len(tokens)} tokens")


def _token_fontsize(fig: Figure, n_tokens: int, ncols: int) -> float:
    """Points per tick label: ~70% of a token's cell (the figure width is ~ncols panels), 0 if unreadable."""
    cell_points = 72 * fig.get_figwidth() / (ncols + 0.4) / max(n_tokens, 1)
    size = min(9.0, 0.7 * cell_points)
    return size if size >= 4.0 else 0.0


def _label_tokens(ax: Any, tokens: Sequence[str], rows: bool, columns: bool, fontsize: float) -> None:
    """Word pieces as tick labels on the chosen axes; no ticks where labels are off or would not fit."""
    positions = list(range(len(tokens)))
    if rows and fontsize:
        ax.set_yticks(positions, list(tokens), fontsize=fontsize)
    else:
        ax.set_yticks([])
    if columns and fontsize:
        ax.set_xticks(positions, list(tokens), fontsize=fontsize, rotation=90)
    else:
        ax.set_xticks([])


def plot_pruning(record: dict[str, Any], path: str | Path) -> Path:
    """`bert-tasks prune`'s record as two panels: the validation score against the heads kept, one point per
    pruning step (and the recovery's, when there was one); the layers x heads importance of the unpruned
    model (normalised per layer), each removed head marked with the step that removed it (a head pruned
    before this command has no score: "–").
    """
    steps, metric = record["steps"], record["metric"]
    importance = np.array(record["importance"][0], dtype=float)  # [L, H], NaN at heads pruned before
    layers, heads = importance.shape
    fig = Figure(figsize=(6 + max(4.0, 0.6 * heads), max(4.0, 1.0 + 0.5 * layers)), layout="constrained")
    curve, grid = fig.subplots(1, 2, width_ratios=[3, max(2.0, heads / 4)])
    kept = [step["heads_kept"] for step in steps]
    curve.plot(kept, [step["validation"][metric] for step in steps], marker="o", label="after each step")
    recovery = record.get("recovery")
    if recovery is not None and metric in recovery.get("validation", {}):
        score = recovery["validation"][metric]
        curve.plot([kept[-1]], [score], marker="*", markersize=14, linestyle="", label="after recovery")
    curve.invert_xaxis()  # pruning goes left to right
    curve.set_xlabel("heads kept")
    curve.set_ylabel(f"validation {metric}")
    removed, before = record["heads"]["removed"], record["heads"]["before"]
    curve.set_title(f"Score as heads are removed ({removed} of {before})")
    curve.grid(alpha=0.3)
    curve.legend(loc="lower left", fontsize=8)
    image = grid.imshow(np.nan_to_num(importance, nan=0.0), cmap="viridis", vmin=0.0, aspect="auto")
    removed_at = {
        (int(layer), head): number
        for number, step in enumerate(steps)
        for layer, gone in step["removed"].items()
        for head in gone
    }
    before = np.argwhere(np.isnan(importance))  # [P, 2] (layer, head) pruned before this command
    removed_at |= {(int(layer), int(head)): "–" for layer, head in before}
    for (layer, head), mark in removed_at.items():
        grid.annotate(f"{mark}", (head, layer), ha="center", va="center", color="white", fontsize=8)
    grid.set_xticks(range(heads))
    grid.set_yticks(range(layers))
    grid.set_xlabel("head")
    grid.set_ylabel("layer")
    grid.set_title("Head importance (number: the step that removed it; –: pruned before)", fontsize=9)
    fig.colorbar(image, ax=grid, shrink=0.8, label="|dL/dgate|, L2-normalised per layer")
    return _save(fig, path)
