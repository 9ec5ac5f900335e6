"""The Task interface: everything that differs between tasks, behind one shape.

The config (defaults), the split reader, the training run, the model-dir loader, prediction and the CLI
only ever talk to a Task, so a new task is one new module that subclasses `Task` and calls
`bert_tasks.tasks.register_task` — no package file changes (tests/tasks/test_third_task.py does it).

Task modules import nothing heavy at import time (torch, transformers, datasets load inside methods),
because the CLI imports the registry to parse and validate a command before any model is needed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from bert_tasks.data.files import check_text_record
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from bert_tasks.config import Config
    from bert_tasks.data.in_memory import Records
    from bert_tasks.data.table import Table
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
    #: An input to show the snippets on: a text, or a (text, second text) pair for a pair model.
    example: str | tuple[str, str] = "An example sentence."
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
    #: The transformers Auto class of the head, by name (importing a task imports no transformers):
    #: `load_model` builds the class it maps the model's config to (BertFor..., RobertaFor..., ...), and a
    #: saved model's `architectures` maps back to its task through it (`saves_as`).
    head: ClassVar[str]
    #: Keyword arguments for the tokenizer this task encodes with (NER: words are given pre-split).
    tokenizer_options: ClassVar[dict[str, Any]] = {}
    #: Config values this task starts from (over the dataclass defaults, under recipe and overrides).
    config_defaults: ClassVar[dict[str, Any]] = {}
    #: Config keys that change how this task encodes or decodes; saved with the model (policy) so
    #: prediction and evaluation rebuild the task exactly as it was trained.
    options: ClassVar[tuple[str, ...]] = ()
    #: Config keys only this task's readers take (sentiment's label_column, NER's tag_column): with
    #: `options`, the keys a run of another task refuses when set, instead of saving and ignoring them.
    reader_keys: ClassVar[tuple[str, ...]] = ()
    #: The metric `metric_for_best` defaults to, and every scalar metric it may name (larger is better).
    default_metric: ClassVar[str]
    metric_names: ClassVar[tuple[str, ...]]
    #: What `format=` may name for this task's data files; "auto" (first) decides by extension and content.
    file_formats: ClassVar[tuple[str, ...]] = ("auto",)
    #: The fields of a prediction input record the task reads (`check_input`); its prediction records
    #: carry them back, so an input record holding them is no clash (`predictor.with_prediction`). An
    #: instance may add those its options read (a pair model's pair field).
    input_fields: ClassVar[tuple[str, ...]] = ("text",)
    #: The raw column whose values `validation_split` keeps in proportion (a class label); None: the
    #: carved rows are a plain seeded sample (NER, where a sentence has many labels).
    stratify_by: ClassVar[str | None] = None
    #: Options the weights were trained for (sentiment's label shape): `evaluate` cannot change them, as it
    #: runs the others (windows, NER's Viterbi) instead of the saved values.
    trained_options: ClassVar[tuple[str, ...]] = ()
    # An instance may narrow `default_metric`, `metric_names` and `stratify_by` to its options (sentiment's
    # label shape); the class keeps every name, for the config's checks before any task is built.
    #: Batches are padded to a multiple of this many tokens (None: to the longest window), by the
    #: collator in training and by `data/padded_batches.py` in prediction: one rule for both.
    pad_to_multiple_of: ClassVar[int | None] = None

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
    def saves_as(cls, architecture: str | None) -> bool:
        """Whether a saved model's `architectures[0]` is this task's head, in any family.

        transformers names every head after its Auto class: `AutoModelForTokenClassification` builds
        `BertForTokenClassification`, `RobertaForTokenClassification`, ... (read without importing it).
        """
        return architecture is not None and architecture.endswith(cls.head.removeprefix("AutoModel"))

    @property
    def problem_type(self) -> str | None:
        """transformers' `problem_type` for the head's config (its loss, and how a vanilla `pipeline`
        reads its outputs); None lets transformers infer it."""
        return None

    @property
    def demo_validation_file(self) -> str | None:
        """A bundled labelled file this task's models read (`export --format onnx` checks on it by default);
        None: the task ships none."""
        return self.config_defaults.get("validation_file")

    @property
    def evaluate_options(self) -> tuple[str, ...]:
        """The options `evaluate` may run instead of the saved values (NER's Viterbi): every option but the
        trained ones, unless an instance narrows them to those that mean something for it."""
        return tuple(key for key in self.options if key not in self.trained_options)

    @property
    def pair_field(self) -> str | None:
        """The field of a text pair's second text (segment B) in prediction records; None: one text."""
        return None

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

    def settle(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> dict[str, Dataset]:
        """Settle the options the data decides, once every split is read (before `validation_split` carves):
        sentiment's `multi_label` left unset is decided by how the labels are written. Returns the splits in
        the settled form (nothing changes by default)."""
        return splits

    def check_learnable(self, train: Dataset, source: str, cfg: Config) -> None:
        """Refuse a training split a model learns nothing from: by default one with a single label, which
        trains to loss 0 and scores 1.0 while learning nothing."""
        from dataclasses import replace

        found = self.label_names(train, replace(cfg, label_names=None))  # the data's labels, not the names
        if len(found) < 2:
            raise BertTasksError(
                f"{source}: the training data has one label only ({found[0]!r}), so a model would learn "
                "nothing; add examples of another label (for NER: tag some entities), or check "
                "label_column/tag_column"
            )

    def check_splits(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:  # noqa: B027
        """Refuse evaluation splits whose labels the training split never shows (nothing by default)."""

    def check_options(self, labels: list[str]) -> None:  # noqa: B027
        """Refuse option values the model's labels cannot take (nothing by default); `evaluate` asks before
        the model loads, since its key=value may replace a saved value."""

    @classmethod
    def label_problem(cls, labels: Sequence[str]) -> str | None:
        """What makes a model dir's label names unusable by this task, or None (nothing by default): asked
        before the model loads, so predictions never come out silently wrong."""
        return None

    def unused_options(self, raw: Dataset, cfg: Config) -> dict[str, str]:
        """The options and reader keys that change nothing on labelled data `raw`, read with `cfg`, each
        with why (`evaluate` refuses them when given); none by default."""
        return {}

    def profile_split(self, raw: Dataset) -> SplitProfile:
        """The task's view of one raw split for `debug data` (a task that gives none cannot be debugged)."""
        raise BertTasksError(
            f"debug data: the {self.name} task does not profile its data; implement Task.profile_split"
        )

    def infer_options(self, train: Dataset, cfg: Config) -> dict[str, Any]:
        """Option values the training data decides, for options the user left unset (NER: the word
        splitter its tokens follow); `train` then runs with them and saves them. None by default."""
        return {}

    @abstractmethod
    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """The label set, in id order, taken from the training data (and `cfg.label_names`)."""

    @abstractmethod
    def prediction_columns(self, texts: list[str]) -> dict[str, list[Any]]:
        """Unlabelled texts -> the raw columns (plain lists) that `encode_batch` and `decode` take."""

    def texts_to_raw(self, texts: list[str]) -> Dataset:
        """The raw prediction rows of `texts` as a Dataset, for the Dataset path (`encode`)."""
        from datasets import Dataset

        return Dataset.from_dict(self.prediction_columns(texts))

    def check_input(self, where: str, record: dict[str, Any]) -> dict[str, Any]:
        """One prediction input record (a file's line, a server's record, the library's), checked before
        any model loads (by the task its policy makes); a mistake is one line naming `where`. By default
        it needs a 'text' string."""
        return check_text_record(where, record)

    def input_columns(self, records: list[dict[str, Any]]) -> dict[str, list[Any]]:
        """Checked input records -> raw columns, as `prediction_columns` for their texts (NER also takes
        the user's own tokens)."""
        return self.prediction_columns([record["text"] for record in records])

    def warn_unread(self, wheres: Sequence[str], columns: Mapping[str, list[Any]]) -> None:  # noqa: B027
        """Warn of inputs (named by `wheres`) of which the model reads nothing, as `input_columns` gave
        them: their predictions would be empty without a word of why (nothing to warn of by default)."""

    def shown_input(self, record: Mapping[str, Any]) -> Any:
        """What `record`, `render_predictions`, Label Studio and pages show as one checked input record's
        input: its text (None for NER's tokens alone; a pair model: the (text, second text) pair)."""
        return record.get("text")

    def transfer_rows(self, records: list[dict[str, Any]], labels: Sequence[str]) -> Dataset:
        """Unlabelled input records (checked by `check_input`) as training rows for distillation
        (`transfer_file`): `input_columns`' rows with a placeholder gold label out of `labels`, so `encode`
        marks the positions the task scores exactly as on labelled rows. The run masks their gold loss:
        only the teacher's soft targets train on them. Not abstract: a task without it takes no
        transfer_file (one line, before torch loads)."""
        raise BertTasksError(
            f"transfer_file: the {self.name} task takes no unlabelled text; drop transfer_file"
        )

    # Encoding and batching.

    @abstractmethod
    def encode_batch(
        self,
        batch: Mapping[str, list[Any]],
        indices: Sequence[int],
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> dict[str, list[Any]]:
        """Tokenize raw rows (columns of plain lists) into windows of at most `max_length` tokens
        overlapping by `stride`; `indices[i]` is row i's index in its dataset (its windows' `example_id`).

        The one encoding of the task: `encode` maps it over a Dataset, and prediction calls it on a
        batch of texts directly (no Dataset to build), so both cut the same windows. `label2id=None`
        encodes without labels (prediction).
        """

    def encode(
        self,
        raw: Dataset,
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> Dataset:
        """`encode_batch` mapped over a Dataset: one row per window (see the class docstring)."""
        from datasets.fingerprint import generate_random_fingerprint

        def windows(batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
            return self.encode_batch(batch, indices, tokenizer, label2id, max_length, stride)

        # A fresh fingerprint: datasets would otherwise pickle `windows`, tokenizer and all, to hash it
        # (about 1 s a call).
        return raw.map(
            windows,
            batched=True,
            with_indices=True,
            remove_columns=raw.column_names,
            desc=f"Tokenizing {self.name}",
            new_fingerprint=generate_random_fingerprint(),
        )

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
        raw: Dataset | Table,
        encoded: Dataset | Table,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> list[Any]:
        """Merge per-window logits into one plain-Python prediction per raw example.

        Prediction hands it `Table`s (plain lists, read like a Dataset: `raw["column"]`, `len(raw)`,
        `column_names`), evaluation Datasets."""

    # What a run learns besides the weights.

    @property
    def calibrates(self) -> bool:
        """Whether `calibrate` wants the best weights' validation logits at the end of a run."""
        return False

    def calibrate(  # noqa: B027
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> None:
        """Set the options that are tuned on the validation split's predictions (multi-label thresholds),
        before the held-out splits are scored and the policy is saved; nothing by default."""

    def saved_weights(
        self, model: PreTrainedModel, weights: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The weights as the final model dir holds them (`weights`: the whole state dict, `{}` on processes
        that do not save); regression folds its target scaling into the head here."""
        return weights

    def prepare_model(self, model: PreTrainedModel) -> None:  # noqa: B027
        """Adjust a loaded model before it trains or predicts; nothing by default (regression keeps its
        output layer in float32)."""

    def window_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each window's loss on its gold labels, [B]: what head importance differentiates per window
        (`insight.head_importance`). Cross-entropy by default, a NER window's averaged over its labelled
        sub-tokens."""
        from bert_tasks.training.objectives import window_cross_entropy

        return window_cross_entropy(logits, labels)

    def window_labels(self, logits: np.ndarray) -> np.ndarray | None:
        """What each scored position predicts, [P] or [P, ...], from its logits [P, C]: the class (argmax).
        An ONNX export's parity check requires the export to keep it; None: the task predicts values, and
        only the logits' tolerance is checked."""
        return logits.argmax(-1)

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
