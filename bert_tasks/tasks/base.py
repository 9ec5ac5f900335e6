"""The Task interface: everything that differs between tasks, behind one shape.

The config (defaults), the split reader, the training run, the model-dir loader, prediction and the CLI
only ever talk to a Task, so a new task is one new module that subclasses `Task` and calls
`bert_tasks.tasks.register_task` — no package file changes (tests/tasks/test_third_task.py does it).

Task modules import nothing heavy at import time (torch, transformers, datasets load inside methods),
because the CLI imports the registry to parse and validate a command before any model is needed.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from bert_tasks.config import Config
    from bert_tasks.data.in_memory import Records
    from bert_tasks.model_dir import ModelPolicy


@dataclass(frozen=True)
class TaskCard:
    """What a model card says that differs between tasks (`bert_tasks/model_card.py` writes the rest)."""

    #: What the model does, in a sentence naming its labels.
    summary: str
    #: How a text longer than one window becomes one prediction.
    long_inputs: str
    #: The Hugging Face pipeline the saved dir runs in (card metadata, and the vanilla snippet); None: none.
    pipeline_tag: str | None = None
    #: Keyword arguments of that pipeline that make it read the model as bert-tasks does.
    pipeline_options: dict[str, Any] = field(default_factory=dict)
    #: A text to show the snippets on.
    example: str = "An example sentence."
    #: Limits particular to the task, beyond those of the base model and the data.
    limits: tuple[str, ...] = ()


@dataclass
class SplitProfile:
    """What `debug data` needs to know of one split that only its task knows; the report does the rest.

    `keys` and `golds` have one entry per example: the example's text (what exact overlap, duplicates and
    empty rows are judged on) and its whole gold annotation (two copies of a text conflict when theirs
    differ). `labels` is the distribution that rare and unseen labels are judged on, counted in `unit`
    ("examples", "entities"). `counts` holds further task numbers to show (a count, or a name -> count
    table), `warnings` the task's own one-line warnings about the split.
    """

    keys: list[str]
    golds: list[Hashable]
    labels: dict[str, int]
    unit: str
    counts: dict[str, int | dict[str, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class Task(ABC):
    """One downstream task: how to read, encode, batch, score, decode and show it.

    Encoded datasets hold one row per *window* (long inputs are split, never truncated) with the columns
    `input_ids`, `attention_mask`, optionally `token_type_ids` and `labels`, plus `example_id` (the row of
    the raw dataset the window came from) and any task-specific bookkeeping (NER: `word_ids`). Only the
    model inputs reach a batch (`data/batching.py`).
    """

    name: ClassVar[str]
    #: The transformers head class (by name, so importing a task imports no transformers) that
    #: `load_model` builds; a saved model's `architectures` maps back to its task through it.
    head: ClassVar[str]
    #: Config values this task starts from (over the dataclass defaults, under recipe and overrides).
    config_defaults: ClassVar[dict[str, Any]] = {}
    #: Config keys that change how this task encodes or decodes; saved with the model (policy) so
    #: prediction and evaluation rebuild the task exactly as it was trained.
    options: ClassVar[tuple[str, ...]] = ()
    #: The metric `metric_for_best` defaults to, and every scalar metric it may name (larger is better).
    default_metric: ClassVar[str]
    metric_names: ClassVar[tuple[str, ...]]
    #: What `format=` may name for this task's data files; "auto" (first) decides by extension and content.
    file_formats: ClassVar[tuple[str, ...]] = ("auto",)
    #: The raw column whose values `validation_split` keeps in proportion (a class label); None: the
    #: carved rows are a plain seeded sample (NER, where a sentence has many labels).
    stratify_by: ClassVar[str | None] = None

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no option {unknown[0]!r}")
        self.option_values: dict[str, Any] = dict(options)

    @classmethod
    def from_config(cls, cfg: Config) -> Task:
        """The task with its options taken from the run's config."""
        return cls(**{key: getattr(cfg, key) for key in cls.options})

    @classmethod
    def head_class(cls) -> type[PreTrainedModel]:
        """The transformers head this task trains, imported on first use."""
        return getattr(importlib.import_module("transformers"), cls.head)

    # Reading: one split at a time; `data/splits.py` decides which split comes from where.

    @abstractmethod
    def read_file(self, path: str, cfg: Config) -> Dataset:
        """One labelled local file as raw rows (label names applied), errors as `file:line`."""

    @abstractmethod
    def read_hub(self, dataset: str, split: str, cfg: Config) -> Dataset | None:
        """One split of a hub dataset as raw rows, or None when the split has no labels (GLUE test)."""

    def read_memory(self, records: Records, source: str, cfg: Config) -> Dataset:
        """In-memory rows (`train(cfg, data=...)`) as raw rows, through the checks files pass, errors as
        `source, row N`; a task without it says so in one line."""
        raise BertTasksError(
            f"{source}: the {self.name} task reads no in-memory data; give files, or implement "
            "Task.read_memory"
        )

    def check_splits(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:  # noqa: B027
        """Refuse evaluation splits whose labels the training split never shows (nothing by default)."""

    def profile_split(self, raw: Dataset) -> SplitProfile:
        """The task's view of one raw split for `debug data` (a task that gives none cannot be debugged)."""
        raise BertTasksError(
            f"debug data: the {self.name} task does not profile its data; implement Task.profile_split"
        )

    @abstractmethod
    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """The label set, in id order, taken from the training data (and `cfg.label_names`)."""

    @abstractmethod
    def texts_to_raw(self, texts: list[str]) -> Dataset:
        """Unlabelled texts -> the raw rows `encode` and `decode` take (prediction input)."""

    def transfer_rows(self, texts: list[str], labels: Sequence[str]) -> Dataset:
        """Unlabelled texts as training rows for distillation (`transfer_file`): `texts_to_raw`'s rows with
        a placeholder gold label out of `labels`, so `encode` marks the positions the task scores exactly
        as on labelled rows. The run masks their gold loss: only the teacher's soft targets train on them.
        Not abstract: a task without it takes no transfer_file (one line, before torch loads)."""
        raise BertTasksError(
            f"transfer_file: the {self.name} task takes no unlabelled text; drop transfer_file"
        )

    # Encoding and batching.

    @abstractmethod
    def encode(
        self,
        raw: Dataset,
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> Dataset:
        """Tokenize into windows of at most `max_length` tokens overlapping by `stride`.

        `label2id=None` encodes without labels (prediction).
        """

    @abstractmethod
    def collator(
        self, tokenizer: PreTrainedTokenizerBase, return_tensors: str = "pt"
    ) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor | np.ndarray]]:
        """Pad a list of model-input rows to the longest one (dynamic padding), labels included.

        `return_tensors`: "pt" (torch tensors) for the torch models, "np" (numpy arrays) for onnxruntime.
        """

    # Scoring and decoding.

    @abstractmethod
    def metrics(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> dict[str, Any]:
        """Merge per-window logits back to whole examples and score them against the raw gold labels."""

    @abstractmethod
    def decode(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> list[Any]:
        """Merge per-window logits into one plain-Python prediction per raw example."""

    # Showing: to programs (records) and to people (text, plots).

    @abstractmethod
    def record(self, text: str, prediction: Any) -> dict[str, Any]:
        """One prediction as the JSON object `predict --json` prints for `text`."""

    def label_studio_results(self, text: str, prediction: Any) -> tuple[list[dict[str, Any]], float | None]:
        """One prediction as Label Studio result items and the task's score (`predict --format label-studio`).

        Not abstract: a task without a Label Studio form says so in one line.
        """
        raise BertTasksError(f"{self.name} predictions have no Label Studio form; use --json")

    @abstractmethod
    def render_predictions(self, texts: Sequence[str], predictions: Sequence[Any]) -> str:
        """Predictions as text for people (the CLI's default output)."""

    @abstractmethod
    def render_metrics(self, metrics: dict[str, Any]) -> str:
        """Evaluation results as text for people."""

    def predictions_page(self, texts: Sequence[str], predictions: Sequence[Any]) -> str:
        """Predictions as one self-contained HTML page (`predict --html`); a task without one says so."""
        raise BertTasksError(self._no_page("predict"))

    def evaluation_page(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
        metrics: dict[str, Any],
    ) -> str:
        """An evaluation as one self-contained HTML page (`evaluate --html`), from the same window logits
        its `metrics` were scored on; a task without one says so."""
        raise BertTasksError(self._no_page("evaluate"))

    @classmethod
    def check_page(cls, command: str) -> None:
        """Refuse `<command> --html` before any model loads when the task draws no such page (it does
        when it overrides `predictions_page` / `evaluation_page`)."""
        method = {"predict": "predictions_page", "evaluate": "evaluation_page"}[command]
        if getattr(cls, method) is getattr(Task, method):
            raise BertTasksError(cls._no_page(command))

    @classmethod
    def _no_page(cls, command: str) -> str:
        return f"{command} --html: the {cls.name} task draws no HTML page for {command}; drop --html"

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """Write the task's evaluation plots (none by default); return their paths."""
        return []

    def card(self, labels: Sequence[str], policy: ModelPolicy) -> TaskCard:
        """The task's part of the model card; the default names the labels and no pipeline."""
        return TaskCard(
            summary=f"{self.name}: predicts one of the labels {', '.join(labels)}.",
            long_inputs="a text longer than one window is split into overlapping windows, merged back by "
            "the task's decoding",
        )


def score_table(rows: dict[str, dict[str, Any]], first_header: str) -> list[str]:
    """Per-class (sentiment) or per-type (NER) precision/recall/F1/support as aligned text lines."""
    width = max(len(first_header), *(len(name) for name in rows))
    lines = [f"{first_header:<{width}}  precision  recall  f1      support"]
    for name, row in rows.items():
        scores = f"{row['precision']:<9.4f}  {row['recall']:<6.4f}  {row['f1']:<6.4f}"
        lines.append(f"{name:<{width}}  {scores}  {row['support']}")
    return lines
