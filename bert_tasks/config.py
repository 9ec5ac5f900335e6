"""One typed config for every command, and the one function that builds it.

Values come from four layers, later ones winning: the dataclass defaults < `TASK_DEFAULTS[task]` < a YAML
recipe < `key=value` overrides from the command line. Every layer goes through the same checks: unknown
keys are rejected with a suggestion, values are typed from the dataclass annotations (so `lr=3e-5` is a
float, not a string), and ranges are validated, so a typo fails in one line before any model loads.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bert_tasks.errors import BertTasksError

TASKS = ("sentiment", "ner")
MIXED_PRECISION = ("auto", "bf16", "fp16", "no")
#: BERT's learned position embeddings stop at 512.
MAX_POSITIONS = 512
#: Fields holding paths to local data files: `~` is expanded and relative paths are made absolute.
FILE_FIELDS = ("train_file", "validation_file", "test_file")

_DEMO_DIR = Path(__file__).resolve().parent / "resources" / "demo"


@dataclasses.dataclass
class Config:
    """Everything a run needs; one flat namespace so `key=value` overrides need no nesting syntax."""

    task: str
    model: str = "all-MiniLM-L6-v2"
    dataset: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    tokens_column: str = "tokens"
    tag_column: str = "tags"
    conll_tag_index: int = -1
    label_names: list[str] | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_length: int = 128
    stride: int = 32
    label_all_subtokens: bool = False
    viterbi: bool = True
    batch_size: int = 32
    eval_batch_size: int = 64
    lr: float = 5e-5
    epochs: float = 3.0
    max_steps: int = 0
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    mixed_precision: str = "auto"
    gradient_checkpointing: bool = False
    attention_dropout: float | None = None
    allow_pickle: bool = False
    seed: int = 42
    eval_every: int = 0
    save_every: int = 0
    save_each_epoch: bool = False
    keep_checkpoints: int = 2
    logging_steps: int = 20
    early_stopping_patience: int = 0
    metric_for_best: str | None = None
    output_dir: str | None = None
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python values only, so the dict dumps to YAML/JSON as is."""
        return dataclasses.asdict(self)


#: Per-task defaults layered over the dataclass defaults. `train_file`/`validation_file` point at the
#: packaged demo data and only apply when the user names neither `dataset` nor `train_file`, so
#: `bert-tasks finetune sentiment` runs out of the box.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "sentiment": {
        "lr": 1e-4,
        "epochs": 3.0,
        "max_length": 128,
        "train_file": str(_DEMO_DIR / "sentiment" / "train.jsonl"),
        "validation_file": str(_DEMO_DIR / "sentiment" / "validation.jsonl"),
    },
    "ner": {
        "lr": 1e-4,
        "max_length": 256,
        "batch_size": 16,
        "train_file": str(_DEMO_DIR / "ner" / "train.conll"),
        "validation_file": str(_DEMO_DIR / "ner" / "validation.conll"),
    },
}
_DEMO_KEYS = ("train_file", "validation_file")

_FIELDS = tuple(f.name for f in dataclasses.fields(Config))
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


class _RecipeLoader(yaml.SafeLoader):
    """YAML 1.1's `yes`/`no`/`on`/`off` booleans removed, so `mixed_precision: no` stays the string "no".

    Strings like "yes" still become booleans for bool fields, through `_coerce`.
    """


_RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


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
        BertTasksError: Unreadable recipe, unknown key, badly typed value, conflicting task, or a value
            out of range.
    """
    recipe = _read_recipe(Path(path).expanduser()) if path is not None else {}
    from_recipe = _typed(recipe, f"in recipe {path}")
    from_cli = _typed(_parse_overrides(overrides), "on the command line")
    task = _resolve_task(task, from_recipe.get("task"), from_cli.get("task"), path)

    user = {**from_recipe, **from_cli}
    task_defaults = dict(TASK_DEFAULTS[task])
    if user.get("dataset") is not None or user.get("train_file") is not None:
        for key in _DEMO_KEYS:
            task_defaults.pop(key)
    values = {**task_defaults, **user, "task": task}
    for key in FILE_FIELDS:
        if values.get(key) is not None:
            values[key] = str(Path(values[key]).expanduser().resolve())
    if values.get("output_dir") is not None:
        values["output_dir"] = str(Path(values["output_dir"]).expanduser())
    return Config(**values)


def save_config(cfg: Config, path: str | Path) -> Path:
    """Write the resolved config as a YAML recipe that `load_recipe(path)` reads back to an equal Config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Resolved bert-tasks config; reload with bert_tasks.load_recipe(path).\n"
    path.write_text(header + yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    return path


def _read_recipe(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BertTasksError(f"{path}: recipe not found; check the path (relative to the current directory)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_RecipeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise BertTasksError(f"{path}: not valid YAML ({' '.join(str(e).split())}); fix the recipe") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BertTasksError(f"{path}: a recipe must be a mapping of config keys, not {type(data).__name__}")
    return data


def _parse_overrides(overrides: Sequence[str]) -> dict[str, str]:
    parsed = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BertTasksError(f"override '{item}' on the command line is not key=value; e.g. lr=3e-5")
        parsed[key.strip()] = value.strip()
    return parsed


def _typed(raw: Mapping[Any, Any], source: str) -> dict[str, Any]:
    """Reject unknown keys and convert each value to its field's annotated type."""
    typed = {}
    for key, value in raw.items():
        if key not in _FIELDS:
            close = [_HF_NAMES[key]] if key in _HF_NAMES else difflib.get_close_matches(str(key), _FIELDS, 1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(_FIELDS)}"
            raise BertTasksError(f"unknown config key '{key}' {source}; {hint}")
        typed[key] = _coerce(key, value, _TYPES[key], source)
    return typed


def _coerce(key: str, value: Any, annotation: Any, source: str) -> Any:
    """Convert a YAML value or a command-line string to `annotation` (a scalar, list[str], or X | None)."""
    args = typing.get_args(annotation)
    optional = isinstance(annotation, types.UnionType) and type(None) in args
    target = next(a for a in args if a is not type(None)) if optional else annotation
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise BertTasksError(f"{key}=None {source}: expected {_type_name(target)}; this key needs a value")
    converted = _convert(value, target)
    if converted is None:
        expected = _type_name(annotation)
        raise BertTasksError(f"{key}={value!r} {source}: expected {expected}; fix the value")
    return converted


def _convert(value: Any, target: Any) -> Any:
    """The converted value, or None when `value` does not fit `target`."""
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
        number = _to_float(value)
        return int(number) if number is not None and number.is_integer() else None
    if target is float:
        return None if isinstance(value, bool) else _to_float(value)
    if target is str:
        return value if isinstance(value, str) else None
    if typing.get_origin(target) is list:
        if isinstance(value, str):
            value = [part.strip().strip("'\"") for part in value.strip().strip("[]").split(",")]
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) and v != "" for v in value):
            return None
        return [str(v) for v in value]
    raise TypeError(f"config field type {target} has no converter")


def _to_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _type_name(annotation: Any) -> str:
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType):
        return " or ".join("none" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(annotation) is list:
        return "a list like [a,b]"
    return names[annotation]


def _resolve_task(command: str | None, recipe: str | None, cli: str | None, path: str | Path | None) -> str:
    named = [(command, "the command"), (cli, "task= on the command line"), (recipe, f"recipe {path}")]
    given = [(value, where) for value, where in named if value is not None]
    if not given:
        raise BertTasksError(f"no task given; pass one of {', '.join(TASKS)} (or set task: in the recipe)")
    task, where = given[0]
    for other, other_where in given[1:]:
        if other != task:
            raise BertTasksError(
                f"task conflict: {where} says '{task}' but {other_where} says '{other}'; make them agree"
            )
    if task not in TASKS:
        raise BertTasksError(f"unknown task '{task}' from {where}; choose one of {', '.join(TASKS)}")
    return task


def _validate(cfg: Config) -> None:
    """Range checks, one line each, so a bad value fails before any data or model loads."""
    checks = [
        ("task", cfg.task in TASKS, f"one of {', '.join(TASKS)}"),
        ("batch_size", cfg.batch_size >= 1, ">= 1"),
        ("eval_batch_size", cfg.eval_batch_size >= 1, ">= 1"),
        ("lr", cfg.lr > 0, "> 0"),
        ("grad_accum", cfg.grad_accum >= 1, ">= 1"),
        ("warmup_ratio", 0 <= cfg.warmup_ratio < 1, "in [0, 1)"),
        ("max_steps", cfg.max_steps >= 0, ">= 0 (0 = train for `epochs`)"),
        ("epochs", cfg.epochs > 0 or cfg.max_steps > 0, "> 0 unless max_steps > 0"),
        ("max_length", 8 <= cfg.max_length <= MAX_POSITIONS, f"in [8, {MAX_POSITIONS}] (BERT's positions)"),
        ("stride", 0 <= cfg.stride < cfg.max_length / 2, f">= 0 and < max_length/2 ({cfg.max_length / 2:g})"),
        ("mixed_precision", cfg.mixed_precision in MIXED_PRECISION, f"one of {', '.join(MIXED_PRECISION)}"),
        ("weight_decay", cfg.weight_decay >= 0, ">= 0"),
        ("max_grad_norm", cfg.max_grad_norm >= 0, ">= 0 (0 = no clipping)"),
        ("logging_steps", cfg.logging_steps >= 1, ">= 1"),
        (
            "attention_dropout",
            cfg.attention_dropout is None or 0.0 <= cfg.attention_dropout < 1.0,
            "in [0, 1) or none (keep the model's)",
        ),
        ("eval_every", cfg.eval_every >= 0, ">= 0 (0 = end of each epoch)"),
        ("save_every", cfg.save_every >= 0, ">= 0 (0 = off)"),
        ("keep_checkpoints", cfg.keep_checkpoints >= 1, ">= 1 (the newest checkpoints kept)"),
        ("early_stopping_patience", cfg.early_stopping_patience >= 0, ">= 0 (0 = off)"),
        ("max_train_samples", cfg.max_train_samples is None or cfg.max_train_samples >= 1, ">= 1 or none"),
        ("max_eval_samples", cfg.max_eval_samples is None or cfg.max_eval_samples >= 1, ">= 1 or none"),
        ("label_names", cfg.label_names is None or _distinct(cfg.label_names), "non-empty and distinct"),
        ("dataset", cfg.dataset is None or cfg.train_file is None, "none when train_file is set"),
    ]
    for key, ok, rule in checks:
        if not ok:
            raise BertTasksError(f"bad config: {key}={getattr(cfg, key)!r}, must be {rule}")


def _distinct(names: list[str]) -> bool:
    return bool(names) and len(set(names)) == len(names)
