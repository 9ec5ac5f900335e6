"""The one rule for splits, shared by every task: each from its file (or the library's in-memory data) if
given, else from the hub, else absent; with `validation_split`, validation is carved from train instead
(by default, `auto`, when no validation split is given).

So `dataset=glue/sst2 validation_file=dev.tsv` trains on the hub's train split and validates on the
user's file, for sentiment and NER alike. Row caps (`max_train_samples`, `max_eval_samples`) and the
task's cross-split checks (labels the training data never shows) apply to whatever was read; the
validation set is carved from the capped train (so train and it add up to the cap).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bert_tasks.data.hub import hub_split_names
from bert_tasks.data.in_memory import in_memory_source, records, split_data
from bert_tasks.data.validation_split import AUTO, auto_share, carve_validation
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

    from bert_tasks.config import Config
    from bert_tasks.tasks.base import Task

#: Split name -> the config key naming its local file.
SPLIT_FILES = {"train": "train_file", "validation": "validation_file", "test": "test_file"}


def read_splits(task: Task, cfg: Config, data: Any = None) -> dict[str, Dataset]:
    """Read every split `cfg` (and in-memory `data`, see `data/in_memory.py`) names, by the rule above,
    capped and checked, in train/validation/test order.

    Raises:
        BertTasksError: No split at all, a bad file, hub split or in-memory split, a split given twice, or an
            evaluation label (entity type) that the training split never shows.
    """
    return read_training_splits(task, cfg, data)[0]


def read_training_splits(task: Task, cfg: Config, data: Any = None) -> tuple[dict[str, Dataset], Config]:
    """`read_splits`, and `cfg` with the share `validation_split=auto` carved, when it carved one: the saved
    recipe and the model card name the share (an auto that carved nothing stays auto here; recipe.yaml
    records it as none, `Run._recorded_validation_split`).

    Raises:
        BertTasksError: As `read_splits`.
    """
    splits, sources, share = _read(task, cfg, data)
    problems = split_problems(task, splits, sources, cfg)
    if problems:
        raise BertTasksError(problems[0])
    return splits, (replace(cfg, validation_split=share) if share is not None else cfg)


def read_unchecked_splits(
    task: Task, cfg: Config, data: Any = None
) -> tuple[dict[str, Dataset], dict[str, str]]:
    """Every split read and capped as `read_splits` reads it, with where each came from, but not
    cross-checked: `debug data` reports every problem of the whole data instead of stopping at the first.

    Raises:
        BertTasksError: No split at all, a bad file, hub split or in-memory split, or a split given twice.
    """
    splits, sources, _ = _read(task, cfg, data)
    return splits, sources


def _read(task: Task, cfg: Config, data: Any) -> tuple[dict[str, Dataset], dict[str, str], float | None]:
    """The splits, their sources and the share of train carved as validation (None: nothing carved)."""
    memory = split_data(data) if data is not None else {}
    hub_splits = hub_split_names(cfg.dataset) if cfg.dataset is not None else []
    splits: dict[str, Dataset] = {}
    sources: dict[str, str] = {}
    for split, key in SPLIT_FILES.items():
        path = getattr(cfg, key)
        if split in memory:
            source = in_memory_source(split)
            if path is not None:
                raise BertTasksError(
                    f"{source} and {key}={path} both give the {split} split; pick one ({key}=none to use "
                    "the in-memory data)"
                )
            data_read = task.read_memory(records(memory[split], source), source, cfg)
        elif path is not None:
            data_read, source = task.read_file(path, cfg), path
        elif split in hub_splits:
            data_read, source = task.read_hub(cfg.dataset, split, cfg), f"dataset={cfg.dataset} ({split})"
        else:
            continue
        if data_read is not None:
            limit = cfg.max_train_samples if split == "train" else cfg.max_eval_samples
            splits[split], sources[split] = _capped(data_read, limit), source
    if not splits:
        raise BertTasksError(
            f"no data to read for {task.name}; set train_file (and validation_file, test_file) "
            "or dataset=<hub id>"
        )
    splits = task.settle(splits, sources, cfg)
    share = validation_share(cfg, splits)
    if share is not None:
        _carve(task, cfg, share, splits, sources)
    return splits, sources, share


def validation_share(cfg: Config, splits: dict[str, Dataset]) -> float | None:
    """The share of train `cfg.validation_split` carves from these splits as read (before carving):
    the number given, `auto`'s when no validation split was read (data/validation_split.py), or None."""
    if cfg.validation_split != AUTO:
        return cfg.validation_split
    if "validation" in splits or "train" not in splits:
        return None
    return auto_share(len(splits["train"]))


def without_demo_files(task: Task, cfg: Config) -> Config:
    """`cfg` without the task's demo files (its config defaults): in-memory data is the user's own and
    never mixes with the demo's, as `load_recipe` drops them when a train_file or dataset is named."""
    demo = {
        key: None
        for key in SPLIT_FILES.values()
        if getattr(cfg, key) is not None and getattr(cfg, key) == task.config_defaults.get(key)
    }
    return replace(cfg, **demo) if demo else cfg


def _carve(
    task: Task, cfg: Config, share: float, splits: dict[str, Dataset], sources: dict[str, str]
) -> None:
    """Carve `share` of train as the validation split (`data/validation_split.py`), in place, before any
    test split."""
    if "validation" in splits:
        raise BertTasksError(
            f"validation_split={share:g} carves a validation set from train, but {sources['validation']} "
            "gives one too; pick one (validation_split=none, or leave that validation split out)"
        )
    if "train" not in splits:
        raise BertTasksError(
            f"validation_split={share:g} carves validation from train, but no training split was given; "
            "set train_file (or dataset=, or data=)"
        )
    train, validation = carve_validation(splits["train"], share, cfg.seed, task.stratify_by, sources["train"])
    test, test_source = splits.pop("test", None), sources.pop("test", None)
    splits["train"], splits["validation"] = train, validation  # its size is the share, not max_eval_samples
    sources["validation"] = f"{sources['train']} (validation_split={share:g})"
    if test is not None:
        splits["test"], sources["test"] = test, test_source


def split_problems(task: Task, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> list[str]:
    """Why training would refuse these splits, one message per check (none without a training split).

    Each check stops at its first problem, as `read_splits` does: a one-label training split, then an
    evaluation label the training split lacks.
    """
    if "train" not in splits:
        return []
    problems = []
    for check in (
        lambda: task.check_learnable(splits["train"], sources["train"], cfg),
        lambda: task.check_splits(splits, sources, cfg),
    ):
        try:
            check()
        except BertTasksError as error:
            problems.append(str(error))
    return problems


def _capped(data: Dataset, limit: int | None) -> Dataset:
    """The first `limit` rows, or all of them."""
    return data if limit is None or limit >= len(data) else data.select(range(limit))
