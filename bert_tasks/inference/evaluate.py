"""`bert-tasks evaluate`: score a saved model on a labelled file and write the report next to it; for the
library, `evaluate_data` scores one in-memory split."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import Config, load_recipe
from bert_tasks.data.in_memory import in_memory_source
from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError, listed
from bert_tasks.model_dir import ModelPolicy, check_dir_positions, label_names, local_model_dir, read_policy
from bert_tasks.output_paths import CommandOutput, page_output, write_atomically
from bert_tasks.tasks import task_class

if TYPE_CHECKING:
    from datasets import Dataset

    from bert_tasks.tasks.base import Task

logger = logging.getLogger(__name__)


#: What `evaluate` takes as key=value: how the file is read. The saved policy's keys (windows, the task's
#: decoding options) are taken too, and then run instead of the saved values; training keys are refused.
READER_KEYS = (
    "text_column",
    "label_column",
    "header",
    "format",
    "tokens_column",
    "tag_column",
    "conll_tag_index",
    "label_names",
    "max_eval_samples",
)
_WINDOW_KEYS = ("max_length", "stride")


#: Overrides that leave only the data to evaluate: the training run's splits and caps are not read.
_DATA_ONLY = ("dataset=none", "train_file=none", "validation_file=none", "validation_split=none")
_DATA_ONLY += ("max_eval_samples=none",)

#: Written into every evaluate output dir: the metrics and plots there are evaluate's, and a later
#: evaluate into the same dir replaces them (a dir without it may hold a run's or the user's own).
EVALUATE_MARK = ".bert-tasks-evaluate"


def read_labelled_file(
    model_dir: str | Path, data_file: str, overrides: Sequence[str] = (), task: str | None = None
) -> tuple[Dataset, ModelPolicy]:
    """Read `data_file` with the reader settings of the recipe saved with the model, plus `overrides`;
    return it with the policy to evaluate under: the saved one, with the window/decoding keys the
    overrides name (each differing value is said in one INFO line).

    Needs only the model dir's JSON and YAML files: a bad file is answered before any model loads.

    Raises:
        BertTasksError: The model dir is not a fine-tuned model (of `task`, when given), an override names
            a training key, the file is unreadable, or holds a label the model cannot predict (it would
            only be scored as a miss, or break the metric).
    """
    return _read_labelled(model_dir, overrides, f"test_file={data_file}", task, None, data_file)


def read_labelled_data(
    model_dir: str | Path, data: Any, overrides: Sequence[str] = (), task: str | None = None
) -> tuple[Dataset, ModelPolicy]:
    """`read_labelled_file` for one in-memory split (records, a DataFrame or a Dataset: `data/in_memory.py`),
    checked as a file is, errors naming `test data (in memory), row N`."""
    return _read_labelled(model_dir, overrides, "test_file=none", task, data, in_memory_source("test"))


def _read_labelled(
    model_dir: str | Path, overrides: Sequence[str], test_file: str, task: str | None, data: Any, source: str
) -> tuple[Dataset, ModelPolicy]:
    directory = local_model_dir(model_dir)
    saved = read_policy(directory, task)
    saved_task = saved.make_task()
    policy_keys = _check_keys(overrides, saved_task.evaluate_options, saved_task.trained_options)
    recipe = directory / "recipe.yaml"
    cfg = load_recipe(recipe if recipe.is_file() else None, [*_DATA_ONLY, *overrides, test_file], saved.task)
    policy = _with_overrides(saved, cfg, policy_keys)
    model_task = policy.make_task()
    known = label_names(directory)
    model_task.check_options(known)
    check_dir_positions(policy.max_length, directory)
    raw = read_splits(model_task, cfg, None if data is None else {"test": data})["test"]
    named = {item.partition("=")[0].strip() for item in overrides}
    for key, why in model_task.unused_options(raw, cfg).items():
        if key in named:
            raise BertTasksError(f"{key}= on the command line changes nothing here: {source} {why}; drop it")
    check_known_labels(model_task, raw, cfg, known, source)
    _say_changes(saved, policy, policy_keys)  # only once they apply: a refusal stays the one line
    return raw, policy


def check_known_labels(
    task: Task, raw: Dataset, cfg: Config, known: list[str], source: str, command: str = "evaluate"
) -> None:
    """Refuse labelled data with a label the model cannot predict: it would only be scored as a miss, or
    break the metric (and, with its gold label encoded, have no id)."""
    data_cfg = dataclasses.replace(cfg, label_names=None)  # the labels the data itself uses, not the list
    unknown = sorted(set(task.label_names(raw, data_cfg)) - set(known))
    if unknown:
        example = _first_example_with(task, raw, data_cfg, unknown[0])
        raise BertTasksError(
            f"{source}: label {unknown[0]!r} (first in example {example}) is not one the model knows "
            f"({listed(known)}); {command} on data with the model's labels, or train a model that has it"
        )


def _first_example_with(task: Task, raw: Dataset, cfg: Config, label: str) -> int:
    """The 1-based number of the first example whose labels include `label`: a binary search over
    prefixes (whether a prefix holds the label only grows with it), so a large file costs log2(N) reads
    of the label column, on this error path alone."""
    low, high = 1, len(raw)  # the first prefix length whose labels hold `label`
    while low < high:
        middle = (low + high) // 2
        if label in task.label_names(raw.select(range(middle)), cfg):
            high = middle
        else:
            low = middle + 1
    return low


def _check_keys(overrides: Sequence[str], task_options: Sequence[str], trained: Sequence[str]) -> list[str]:
    """The policy keys among `overrides`; a key that is neither a reader nor a policy key is refused, and
    so is one the weights were trained for (sentiment's label shape: a regression model stays one)."""
    policy_keys = (*_WINDOW_KEYS, *task_options)
    named = [item.partition("=")[0].strip() for item in overrides]
    for key in named:
        if key in trained:
            raise BertTasksError(
                f"{key}= on the command line: the model was trained with its saved {key} (config.json's "
                f"bert_tasks.{key}), which evaluate cannot change; drop it"
            )
        if key not in READER_KEYS and key not in policy_keys:
            raise BertTasksError(
                f"{key}= on the command line is not an evaluate setting: evaluate takes how the file is read "
                f"({', '.join(READER_KEYS)}) and how the model reads it ({', '.join(policy_keys)})"
            )
    return [key for key in named if key in policy_keys]


def _say_changes(saved: ModelPolicy, policy: ModelPolicy, keys: Sequence[str]) -> None:
    """One INFO line per named window/decoding value that differs from the model's training."""
    before, after = _policy_values(saved), _policy_values(policy)
    for key in keys:
        if before.get(key) != after[key]:
            logger.info(
                "%s=%s differs from the model's training (%s): evaluating with it",
                key,
                after[key],
                before.get(key),
            )


def _policy_values(policy: ModelPolicy) -> dict[str, Any]:
    return {"max_length": policy.max_length, "stride": policy.stride, **policy.task_options}


def _with_overrides(policy: ModelPolicy, cfg: Config, keys: Sequence[str]) -> ModelPolicy:
    """The saved policy with the window/decoding values the user named."""
    chosen = {key: getattr(cfg, key) for key in keys}
    options = {key: chosen.get(key, value) for key, value in policy.task_options.items()}
    options |= {key: value for key, value in chosen.items() if key not in _WINDOW_KEYS}
    windows = {key: chosen[key] for key in _WINDOW_KEYS if key in chosen}
    return dataclasses.replace(policy, task_options=options, **windows)


def evaluate_data(
    model_dir: str | Path,
    data: Any,
    overrides: Sequence[str] = (),
    quantize: str | None = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Score a saved model on one labelled in-memory split and return the metrics (nothing is written).

    The library's in-memory counterpart of `evaluate_file`: `data` is read with the model's recipe settings
    (columns, label names) plus `overrides`, before any model loads.
    """
    raw, policy = read_labelled_data(model_dir, data, overrides)
    from bert_tasks.inference.predictor import Predictor  # torch and transformers: once the data is good

    return Predictor(model_dir, quantize=quantize, allow_pickle=allow_pickle, policy=policy).evaluate(raw)


def check_evaluate_dir(out_dir: Path) -> None:
    """Refuse an `--out` that holds a metrics.json or PNG that evaluate did not write (a training run's
    dir, a folder of the user's reports): evaluate would replace them."""
    if not out_dir.is_dir() or (out_dir / EVALUATE_MARK).exists():
        return
    theirs = sorted(path.name for path in [out_dir / "metrics.json", *out_dir.glob("*.png")] if path.exists())
    if theirs:
        raise BertTasksError(
            f"evaluate output {out_dir}: holds {listed(theirs)}, not written by evaluate, which would "
            "replace them; pass --out a new directory"
        )


def _earlier_report(out_dir: Path) -> list[str]:
    """The files the last evaluate into `out_dir` wrote, as its mark lists them; the mark is written first,
    so a dir whose report failed half-way (a full disk) is still evaluate's to replace."""
    mark = out_dir / EVALUATE_MARK
    try:
        names = json.loads(mark.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        names = None  # no mark yet, or an empty one (written before marks listed the report)
    mark.touch()
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def _mark_report(out_dir: Path, earlier: list[str], written: list[str]) -> None:
    """Drop what the last report wrote and this one did not (a single-label model's confusion matrix after
    a regression model's report), then list this report's files in the mark."""
    for name in sorted(set(earlier) - set(written)):
        stale = out_dir / Path(name).name  # a name only: the mark never points outside out_dir
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
    write_atomically(out_dir / EVALUATE_MARK, json.dumps(written) + "\n")


def evaluate_file(
    task: str,
    model_dir: str | Path,
    data_file: str,
    overrides: Sequence[str],
    out_dir: Path,
    quantize: str | None = None,
    allow_pickle: bool = False,
    html: str | Path | None = None,
) -> dict[str, Any]:
    """Read `data_file` the way the model's training recipe read its data, score it, write JSON + plots
    (and, with `html`, the task's evaluation page there).

    The recipe saved with the model supplies the reader settings (columns, label names, CoNLL tag
    column); `overrides` (key=value) can change them for a file laid out differently. `quantize="int8"`
    scores the dynamically quantized model, to see what quantization costs. `allow_pickle`: also load
    pickle-based weights. The report for people is `task.render_metrics(metrics)` (the CLI prints it).
    """
    read_policy(local_model_dir(model_dir), task)  # a wrong model dir before anything is created
    if html is not None:
        task_class(task).check_page("evaluate")
    check_evaluate_dir(out_dir)
    todo = "pass --out a directory you can write to"
    with (
        CommandOutput(out_dir, f"evaluate output {out_dir}", todo) as out,
        page_output(html, "evaluate") if html is not None else nullcontext() as page,
    ):  # the output paths before the data: reading them loads `datasets`; a bad file undoes the dirs
        raw, policy = read_labelled_file(model_dir, data_file, overrides, task)
        from bert_tasks.inference.predictor import Predictor  # torch and transformers: once the data is good

        predictor = Predictor(model_dir, quantize=quantize, allow_pickle=allow_pickle, policy=policy)
        encoded, logits = predictor.window_logits(raw)
        metrics = predictor.task.metrics(raw, encoded, logits, predictor.id2label)
        with out.writing():
            earlier = _earlier_report(out_dir)
            write_atomically(out_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
            plots = predictor.task.save_plots(metrics, out_dir)
            _mark_report(out_dir, earlier, ["metrics.json", *(path.name for path in plots)])
        if page is not None:
            text = predictor.task.evaluation_page(raw, encoded, logits, predictor.id2label, metrics)
            with page.writing():
                write_atomically(Path(html), text)
            plots.append(Path(html))
    written = ", ".join(str(path) for path in [out_dir / "metrics.json", *plots])
    logger.info("%d examples from %s; report in %s", len(raw), data_file, written)
    return metrics
