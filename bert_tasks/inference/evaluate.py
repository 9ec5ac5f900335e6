"""`bert-tasks evaluate`: score a saved model on a labelled file and write the report next to it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from datasets import Dataset

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.predict import PREDICTORS, Predictor


def read_labelled_file(
    predictor: Predictor, model_dir: str | Path, data_file: str, overrides: Sequence[str] = ()
) -> Dataset:
    """Read `data_file` with the reader settings of the recipe saved with the model, plus `overrides`.

    Raises:
        BertTasksError: The file is unreadable, or holds a label the model cannot predict (it would
            only be scored as a miss, or break the metric).
    """
    recipe = Path(model_dir) / "recipe.yaml"
    data_only = ["dataset=none", "train_file=none", "validation_file=none", "max_eval_samples=none"]
    cfg = load_recipe(
        recipe if recipe.is_file() else None,
        [*data_only, *overrides, f"test_file={data_file}"],
        predictor.task.name,
    )
    raw = predictor.task.read(cfg)["test"]
    known = list(predictor.id2label.values())
    # label_names without the recipe's list: the labels the data itself uses.
    unknown = sorted(set(predictor.task.label_names(raw, replace(cfg, label_names=None))) - set(known))
    if unknown:
        raise BertTasksError(
            f"{data_file}: label {unknown[0]!r} is not one the model knows ({', '.join(known)}); "
            "evaluate on data with the model's labels, or train a model that has it"
        )
    return raw


def evaluate_file(
    task: str,
    model_dir: str | Path,
    data_file: str,
    overrides: Sequence[str],
    out_dir: Path,
    quiet: bool = False,
    quantize: str | None = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Read `data_file` the way the model's training recipe read its data, score it, write JSON + plots.

    The recipe saved with the model supplies the reader settings (columns, label names, CoNLL tag
    column); `overrides` (key=value) can change them for a file laid out differently. `quiet` skips the
    report for people (the CLI's --json prints JSON only). `quantize="int8"` scores the dynamically
    quantized model, to see what quantization costs. `allow_pickle`: also load pickle-based weights.
    """
    predictor = PREDICTORS[task](model_dir, quantize=quantize, allow_pickle=allow_pickle)
    raw = read_labelled_file(predictor, model_dir, data_file, overrides)
    metrics = predictor.evaluate(raw)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    plots = predictor.task.save_plots(metrics, out_dir)
    if not quiet:
        print(predictor.task.render_metrics(metrics))
        print(
            f"\n{len(raw)} examples from {data_file}; report in {out_dir / 'metrics.json'}", *plots, sep="\n"
        )
    return metrics
