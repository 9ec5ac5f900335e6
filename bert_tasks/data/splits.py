"""The one rule for splits, shared by every task: each from its file if given, else from the hub, else absent.

So `dataset=glue/sst2 validation_file=dev.tsv` trains on the hub's train split and validates on the
user's file, for sentiment and NER alike. Row caps (`max_train_samples`, `max_eval_samples`) and the
task's cross-split checks (labels the training data never shows) apply to whatever was read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from bert_tasks.data.hub import hub_split_names
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

    from bert_tasks.config import Config
    from bert_tasks.tasks.base import Task

#: Split name -> the config key naming its local file.
SPLIT_FILES = {"train": "train_file", "validation": "validation_file", "test": "test_file"}


def read_splits(task: Task, cfg: Config) -> dict[str, Dataset]:
    """Read every split `cfg` names (by the rule above), capped and checked, in train/validation/test order.

    Raises:
        BertTasksError: No split at all, a bad file or hub split, or an evaluation label (entity type) that
            the training split never shows.
    """
    splits, sources = read_unchecked_splits(task, cfg)
    problems = split_problems(task, splits, sources, cfg)
    if problems:
        raise BertTasksError(problems[0])
    return splits


def read_unchecked_splits(task: Task, cfg: Config) -> tuple[dict[str, Dataset], dict[str, str]]:
    """Every split read and capped as `read_splits` reads it, with where each came from, but not
    cross-checked: `debug data` reports every problem of the whole data instead of stopping at the first.

    Raises:
        BertTasksError: No split at all, or a bad file or hub split.
    """
    hub_splits = hub_split_names(cfg.dataset) if cfg.dataset is not None else []
    splits: dict[str, Dataset] = {}
    sources: dict[str, str] = {}
    for split, key in SPLIT_FILES.items():
        path = getattr(cfg, key)
        if path is not None:
            data, source = task.read_file(path, cfg), path
        elif split in hub_splits:
            data, source = task.read_hub(cfg.dataset, split, cfg), f"dataset={cfg.dataset} ({split})"
        else:
            continue
        if data is not None:
            limit = cfg.max_train_samples if split == "train" else cfg.max_eval_samples
            splits[split], sources[split] = _capped(data, limit), source
    if not splits:
        raise BertTasksError(
            f"no data to read for {task.name}; set train_file (and validation_file, test_file) "
            "or dataset=<hub id>"
        )
    return splits, sources


def split_problems(task: Task, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> list[str]:
    """Why training would refuse these splits, one message per check (none without a training split).

    Each check stops at its first problem, as `read_splits` does: a one-label training split, then an
    evaluation label the training split lacks.
    """
    if "train" not in splits:
        return []
    problems = []
    for check in (
        lambda: _check_learnable(task, splits["train"], sources["train"], cfg),
        lambda: task.check_splits(splits, sources, cfg),
    ):
        try:
            check()
        except BertTasksError as error:
            problems.append(str(error))
    return problems


def _check_learnable(task: Task, train: Dataset, source: str, cfg: Config) -> None:
    """A training split with one label only (one sentiment class, or NER without any entity) trains to
    loss 0 and scores 1.0 while learning nothing: refuse it, for every task by the same rule."""
    found = task.label_names(train, replace(cfg, label_names=None))  # what the data shows, not the names
    if len(found) < 2:
        raise BertTasksError(
            f"{source}: the training data has one label only ({found[0]!r}), so a model would learn nothing; "
            "add examples of another label (for NER: tag some entities), or check label_column/tag_column"
        )


def _capped(data: Dataset, limit: int | None) -> Dataset:
    """The first `limit` rows, or all of them."""
    return data if limit is None or limit >= len(data) else data.select(range(limit))
