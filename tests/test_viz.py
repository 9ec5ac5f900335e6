"""viz: the plots are written as real PNG files, and bad input fails in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bert_tasks.errors import BertTasksError
from bert_tasks.insight.plots import plot_confusion_matrix, plot_training_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_confusion_matrix_png(tmp_path: Path) -> None:
    path = plot_confusion_matrix([[5, 1], [2, 7]], ["negative", "positive"], tmp_path / "plots" / "cm.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_confusion_matrix_shape_must_match_labels(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError, match="there are 3 labels"):
        plot_confusion_matrix([[5, 1], [2, 7]], ["a", "b", "c"], tmp_path / "cm.png")


@pytest.mark.slow
def test_training_curves_png_with_interleaved_eval_rows(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 1 / s, "lr": 1e-4, "grad_norm": 0.5} for s in range(1, 21)]
    records += [
        {"step": 10, "eval_loss": 0.6, "eval_accuracy": 0.7, "eval_macro_f1": 0.65, "eval_per_class": {}},
        {"step": 20, "eval_loss": 0.5, "eval_accuracy": 0.8, "eval_macro_f1": 0.75},
    ]
    assert plot_training_curves(records, tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.slow
def test_training_curves_without_eval_rows(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 1 / s, "lr": 1e-4} for s in range(1, 5)]
    assert plot_training_curves(records, tmp_path / "curves.png").is_file()


def test_training_curves_need_records(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError, match="no training log records"):
        plot_training_curves([], tmp_path / "curves.png")
