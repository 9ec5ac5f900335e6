"""The Task interface: everything that differs between sentiment and NER, behind one shape.

The training loop (training.py) and the predictor (predict.py) only ever talk to a Task, so a new task is
one new module in this package and nothing else changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np
    import torch
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from bert_tasks.config import Config


class Task(ABC):
    """One downstream task: how to read, encode, batch, score and decode it.

    Encoded datasets hold one row per *window* (long inputs are split, never truncated) with the columns
    `input_ids`, `attention_mask`, optionally `token_type_ids` and `labels`, plus `example_id` (the row of
    the raw dataset the window came from) and any task-specific bookkeeping (NER: `word_ids`).
    """

    name: ClassVar[str]
    #: The transformers head class that `load_model` builds for this task.
    model_class: ClassVar[type[PreTrainedModel]]
    #: The metric `metric_for_best` defaults to, and every scalar metric it may name (larger is better).
    default_metric: ClassVar[str]
    metric_names: ClassVar[tuple[str, ...]]

    @abstractmethod
    def read(self, cfg: Config) -> DatasetDict:
        """Read the splits named in `cfg` (train/validation/test) into raw datasets."""

    @abstractmethod
    def texts_to_raw(self, texts: list[str]) -> Dataset:
        """Unlabelled texts -> the raw rows `encode` and `decode` take (prediction input)."""

    @abstractmethod
    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """The label set, in id order, taken from the training data (and `cfg.label_names`)."""

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
        self, tokenizer: PreTrainedTokenizerBase
    ) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
        """A collate function that pads a list of encoded rows to the longest one (dynamic padding)."""

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

    @abstractmethod
    def render_predictions(self, texts: Sequence[str], predictions: Sequence[Any]) -> str:
        """Predictions as text for people (the CLI's default output)."""

    @abstractmethod
    def render_metrics(self, metrics: dict[str, Any]) -> str:
        """Evaluation results as text for people."""

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """Write the task's evaluation plots (none by default); return their paths."""
        return []


def score_table(rows: dict[str, dict[str, Any]], first_header: str) -> list[str]:
    """Per-class (sentiment) or per-type (NER) precision/recall/F1/support as aligned text lines."""
    width = max(len(first_header), *(len(name) for name in rows))
    lines = [f"{first_header:<{width}}  precision  recall  f1      support"]
    for name, row in rows.items():
        scores = f"{row['precision']:<9.4f}  {row['recall']:<6.4f}  {row['f1']:<6.4f}"
        lines.append(f"{name:<{width}}  {scores}  {row['support']}")
    return lines
