"""The saved-model contract: what a bert-tasks model dir promises, and the one loader every consumer uses.

A model dir is a plain Hugging Face checkpoint (config.json, model.safetensors, tokenizer files) whose
config.json also holds, under `bert_tasks`, the policy prediction must follow to see inputs exactly as
training did: the task, the window size and overlap, the task's own options (NER: sub-token labelling,
Viterbi), whether the weights are to be quantized on load, and which runtime runs the weights (torch, or
onnxruntime for a dir written by `bert-tasks export --format onnx`). `ModelPolicy` is that JSON object,
typed and validated; `load_finetuned(dir)` is how predict, evaluate and export open a dir.

Reading the policy needs only `json`, so a bad model dir is answered before torch loads. Dirs written by
older versions (the same keys, untyped) load unchanged; a dir fine-tuned elsewhere (no policy) gets the
task its architecture names and the defaults prediction always used.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import ATTENTION_DIRECTIONS, MAX_POSITIONS, Config
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks import task_class, task_names, task_of_architecture

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from bert_tasks.tasks.base import Task

#: The key in config.json under which the policy lives.
POLICY_KEY = "bert_tasks"
#: Quantization methods a policy (and `--quantize`) may name.
QUANTIZE_METHODS = ("int8",)
#: What runs a model dir's weights: transformers' BERT on torch (model.safetensors), or onnxruntime
#: (model.onnx, written by `bert-tasks export --format onnx`). The first is the default.
BACKENDS = ("torch", "onnx")
#: Where transformers' classification heads keep their output layer: `classifier` (BERT, DistilBERT,
#: DeBERTa, ModernBERT, every token head) or `classifier.out_proj` (RoBERTa-style sentence heads: RoBERTa,
#: XLM-R, ELECTRA).
_CLASSIFIER_OUTPUTS = ("classifier.weight", "classifier.out_proj.weight")
#: The overlap prediction used for dirs without a policy.
_DEFAULT_STRIDE = 32
_CONFIG_TYPES = typing.get_type_hints(Config)


def check_method(method: str | None) -> str | None:
    """None (no quantization) or a known method; anything else is a user error."""
    if method is not None and method not in QUANTIZE_METHODS:
        raise BertTasksError(f"quantize: unknown method {method!r}; choose {', '.join(QUANTIZE_METHODS)}")
    return method


@dataclass(frozen=True)
class ModelPolicy:
    """How a saved model windows and decodes its inputs, as written under `bert_tasks` in config.json."""

    task: str
    max_length: int
    stride: int
    #: The task's own options (`Task.options`), e.g. NER's `label_all_subtokens` and `viterbi`.
    task_options: dict[str, Any] = field(default_factory=dict)
    #: Quantize the weights on load (`bert-tasks export --quantize int8`); None: run them as saved. Under
    #: the onnx backend the graph's weights are already int8 on disk, and this records that they are.
    quantize: str | None = None
    #: What runs the weights (one of `BACKENDS`).
    backend: str = "torch"
    #: Which keys each token attends to (one of `ATTENTION_DIRECTIONS`): the model was trained so and
    #: must run so. Vanilla transformers knows nothing of it and runs every dir bidirectionally.
    attention: str = ATTENTION_DIRECTIONS[0]

    @classmethod
    def for_run(cls, cfg: Config, options: dict[str, Any] | None = None) -> ModelPolicy:
        """The policy of a model trained with `cfg`; `options`: the task's own, once the data settled them
        (sentiment's `multi_label` left unset) and validation tuned them (its thresholds)."""
        if options is None:
            options = {key: getattr(cfg, key) for key in task_class(cfg.task).options}
        return cls(
            task=cfg.task,
            max_length=cfg.max_length,
            stride=cfg.stride,
            task_options=dict(options),
            attention=cfg.attention,
        )

    def make_task(self) -> Task:
        """The task, built with the options this policy saved."""
        return task_class(self.task)(**self.task_options)

    def to_json(self) -> dict[str, Any]:
        """The flat JSON object older versions wrote too: task, max_length, stride, options, quantize; the
        backend and the attention only when they are not the defaults, so torch bidirectional dirs read in
        older versions unchanged (and an older version refuses a causal dir rather than run it wrongly)."""
        data = {"task": self.task, "max_length": self.max_length, "stride": self.stride, **self.task_options}
        if self.quantize is not None:
            data["quantize"] = self.quantize
        if self.backend != BACKENDS[0]:
            data["backend"] = self.backend
        return data if self.attention == ATTENTION_DIRECTIONS[0] else {**data, "attention": self.attention}

    @classmethod
    def from_json(cls, data: Any, where: str) -> ModelPolicy:
        """Validate a policy read from config.json; every problem is one line naming `where` and the key."""
        if not isinstance(data, dict):
            raise _bad(where, f"'{POLICY_KEY}' is {type(data).__name__}, not an object")
        name = data.get("task")
        if name not in task_names():
            raise _bad(where, f"'{POLICY_KEY}.task' is {name!r}, not one of {', '.join(task_names())}")
        task = task_class(name)
        max_length = _integer(data, "max_length", where, 8, MAX_POSITIONS)
        stride = _integer(data, "stride", where, 0, max_length // 2 - 1)
        options = {}
        for key in task.options:
            if key in data:
                options[key] = _typed(data, key, where)
        try:
            task(**options)  # the task's own checks of its option values (NER: the word splitter)
        except BertTasksError as error:
            raise _bad(where, f"'{POLICY_KEY}': {error}") from None
        quantize = data.get("quantize")
        if quantize is not None and quantize not in QUANTIZE_METHODS:
            raise _bad(
                where, f"'{POLICY_KEY}.quantize' is {quantize!r}, not one of {', '.join(QUANTIZE_METHODS)}"
            )
        backend = data.get("backend", BACKENDS[0])
        if backend not in BACKENDS:
            raise _bad(where, f"'{POLICY_KEY}.backend' is {backend!r}, not one of {', '.join(BACKENDS)}")
        known = {"task", "max_length", "stride", "quantize", "backend", *_CONFIG_TYPES}
        unknown = sorted(set(data) - known)
        if unknown:
            raise _bad(where, f"unknown key '{POLICY_KEY}.{unknown[0]}' (written by a newer bert-tasks?)")
        return cls(name, max_length, stride, options, quantize, backend, saved_attention(data, where))


def saved_attention(policy: Any, where: str) -> str:
    """The attention direction a config.json's policy (None: it has none) records; bidirectional for dirs
    without one (older dirs, base models, dirs fine-tuned elsewhere). Needs no torch."""
    if policy is None:
        return ATTENTION_DIRECTIONS[0]
    if not isinstance(policy, dict):
        raise _bad(where, f"'{POLICY_KEY}' is {type(policy).__name__}, not an object")
    direction = policy.get("attention", ATTENTION_DIRECTIONS[0])
    if direction not in ATTENTION_DIRECTIONS:
        raise _bad(
            where, f"'{POLICY_KEY}.attention' is {direction!r}, not one of {', '.join(ATTENTION_DIRECTIONS)}"
        )
    return direction


def read_policy(model_dir: str | Path, expected_task: str | None = None) -> ModelPolicy:
    """The policy of a local fine-tuned model dir, read from its JSON files alone (no torch needed).

    Raises:
        BertTasksError: no such dir, no config.json, a policy with wrong types or ranges, a dir that is no
            fine-tuned model of a registered task, or one of another task than `expected_task`, an id2label
            whose keys are no ids, that names one label twice, holds placeholder names (LABEL_0, ...) or
            names the task cannot read (NER: not BIO).
    """
    path = local_model_dir(model_dir)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise BertTasksError(f"model dir {path}: no config.json; pass a dir written by `bert-tasks finetune`")
    config = _json_object(config_file)
    if POLICY_KEY in config:
        policy = ModelPolicy.from_json(config[POLICY_KEY], str(config_file))
    else:
        policy = _policy_without_one(path, config)
    labels = _label_names(config_file, config)
    _check_labels(path, labels)
    problem = task_class(policy.task).label_problem(labels)
    if problem:
        raise _bad(str(config_file), f"'id2label' {problem}")
    if expected_task is not None and policy.task != expected_task:
        raise BertTasksError(
            f"model dir {path} holds a {policy.task} model, not a {expected_task} model; "
            f"use `bert-tasks predict {policy.task}`"
        )
    return policy


def refuse_export(directory: Path, policy: ModelPolicy, todo: str) -> None:
    """Refuse an export (ONNX, or int8 applied on load) as the source of a command that rewrites weights
    (prune, compress, export): it would drop the quantization or has no torch weights. `todo`: what to do."""
    if policy.backend != BACKENDS[0] or policy.quantize is not None:
        what = policy.backend if policy.backend != BACKENDS[0] else policy.quantize
        raise BertTasksError(f"model dir {directory} holds a {what} export; {todo}")


def check_export_source(model_dir: str | Path, out: str | Path) -> None:
    """`export`'s source, read from JSON alone: a fine-tuned fp32 dir, not an export of one (an ONNX
    export of an int8 dir would drop its int8 without a word), and `out` outside it."""
    from bert_tasks.output_paths import refuse_inside

    directory = local_model_dir(model_dir)
    refuse_export(directory, read_policy(directory), "export the fp32 model dir it was exported from")
    refuse_inside(out, directory, "export")


@dataclass
class FinetunedModel:
    """A loaded model dir: the model in eval mode (BERT patched), its tokenizer, task, policy and labels."""

    directory: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    policy: ModelPolicy
    id2label: dict[int, str]


def load_finetuned(
    model_dir: str | Path, expected_task: str | None = None, *, allow_pickle: bool = False
) -> FinetunedModel:
    """Open a fine-tuned model dir for prediction, evaluation or export: checked, loaded (BERT patched).

    The weights are loaded as saved (a policy's `quantize` is applied by the consumer that runs them).

    Raises:
        BertTasksError: everything `read_policy` refuses, an ONNX export (no torch weights), placeholder
            label names (LABEL_0, ...), weights that are half-written, disagree with the config's labels or
            layers or sizes, or do not load, and tokenizer files that do not load or do not fit the model.
    """
    from bert_tasks.modeling.load import check_tokenizer_fits, load_model, load_tokenizer

    path = local_model_dir(model_dir)
    policy = read_policy(path, expected_task)
    if policy.backend != BACKENDS[0]:
        raise _no_torch_weights(path, policy.backend)
    labels = label_names(path)  # checked by read_policy
    check_weights_match_labels(path, len(labels))
    task = policy.make_task()
    tokenizer = load_tokenizer(path, **task.tokenizer_options)
    # complete: every weight of the head must be in the file, so no part of it runs on random values.
    model = load_model(
        path, policy.task, allow_pickle=allow_pickle, complete=True, attention=policy.attention
    ).eval()
    task.prepare_model(model)
    check_tokenizer_fits(tokenizer, model, path)
    id2label = {int(k): v for k, v in model.config.id2label.items()}
    return FinetunedModel(path, model, tokenizer, task, policy, id2label)


def check_model_name(name: str | Path) -> None:
    """Refuse a model name that names no existing path but must have been meant as one.

    It starts with `.`, `/` or `~`, has more than one `/`, or lies under a local dir (`runs/nre` beside
    `runs/`): such a name is never sent to the hub, so a typo is reported as a missing directory, not as a
    failed download. Needs no model: `train` checks it before torch loads.
    """
    text = str(name)
    if Path(text).expanduser().exists() or not _mistyped_path(text):
        return
    raise BertTasksError(f"model {text}: no such directory; pass a saved model dir or a hub id")


def check_positions(
    max_length: int, positions: Any, name: str | Path, key: str = "max_length", where: str = ""
) -> None:
    """Refuse windows longer than the model's position embeddings: the first long batch would fail.
    `key` and `where` name the setting to lower (a saved policy's `bert_tasks.max_length`, in config.json)."""
    if isinstance(positions, int) and max_length > positions:
        raise BertTasksError(
            f"{key}={max_length}: model {name} has only {positions} position embeddings; "
            f"set {key}={positions} or less{where} (longer inputs are read in windows)"
        )


def check_dir_positions(max_length: int, model: str | Path, key: str = "max_length", where: str = "") -> None:
    """`check_positions` against a local model dir's config.json, before torch loads; a hub id, or a dir
    without a readable config.json, is left to the loader (and checked once the model is loaded)."""
    try:
        fields = json.loads((Path(model).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(fields, dict):
        check_positions(max_length, fields.get("max_position_embeddings"), model, key, where)


def check_saved_positions(policy: ModelPolicy, model: str | Path) -> None:
    """A saved policy's windows must fit the model: predict and serve run its max_length as saved, and a
    text longer than the position embeddings would fail mid-run (a traceback, a 500 in serve)."""
    check_dir_positions(policy.max_length, model, f"{POLICY_KEY}.max_length", " in its config.json")


def _mistyped_path(text: str) -> bool:
    parent_exists = text.count("/") == 1 and Path(text).expanduser().parent.is_dir()
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or parent_exists


def label_names(model_dir: Path) -> list[str]:
    """config.json's label names in id order, checked (ids are ids, no name given twice)."""
    config_file = model_dir / "config.json"
    return _label_names(config_file, _json_object(config_file))


def read_id2label(model_dir: Path) -> dict[int, str]:
    """config.json's labels by id, refusing placeholder names (for dirs no transformers config reads)."""
    labels = label_names(model_dir)
    _check_labels(model_dir, labels)
    return dict(enumerate(labels))


def local_model_dir(name: str | Path) -> Path:
    """A local model dir as given, or a hub id's files (downloaded once into the hub cache, online).

    A name that looks like a path (`./`, `/`, `~`, not exactly one `/`, or under a local dir such as
    `runs/`) is never sent to the hub: a typo in a path is reported as a missing directory, not as a
    failed download.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    text = str(name)
    if path.exists():
        raise BertTasksError(
            f"model dir {text}: is a file, not a directory; pass the dir written by `bert-tasks finetune` "
            "(the one that holds config.json)"
        )
    if "/" not in text or _mistyped_path(text) or not text.strip():
        raise BertTasksError(
            f"model dir {text}: no such directory; pass a dir written by `bert-tasks finetune`"
        )
    from huggingface_hub import snapshot_download  # deferred: only hub ids need it
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(text, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.yaml"]))
    except (OSError, ValueError, HFValidationError) as error:
        raise BertTasksError(
            f"model {text}: no such local directory, and not fetched from the hub ({_first_line(error)}); "
            "check the path, or the hub id while online"
        ) from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _policy_without_one(path: Path, config: dict[str, Any]) -> ModelPolicy:
    """A dir fine-tuned elsewhere: its head names the task; windows as long as its tokenizer and its
    position embeddings allow (a tokenizer's 512 over 128 positions would fail on the first long text)."""
    architectures = config.get("architectures") or [None]
    name = task_of_architecture(architectures[0])
    if name is None:
        raise BertTasksError(
            f"model dir {path}: not a fine-tuned model of a bert-tasks task (architectures "
            f"{config.get('architectures')}); pass a dir written by `bert-tasks finetune`"
        )
    tokenizer_file = path / "tokenizer_config.json"
    tokenizer_max = _json_object(tokenizer_file).get("model_max_length") if tokenizer_file.is_file() else None
    max_length = min(tokenizer_max, MAX_POSITIONS) if isinstance(tokenizer_max, int) else MAX_POSITIONS
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool):
        max_length = min(max_length, positions)
    return ModelPolicy(name, max(8, max_length), _DEFAULT_STRIDE)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BertTasksError(
            f"{path}: not readable JSON ({error}); copy or save the model dir again"
        ) from None
    if not isinstance(data, dict):
        raise BertTasksError(
            f"{path}: holds {type(data).__name__}, not a JSON object; save the model dir again"
        )
    return data


def _integer(data: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(where, f"'{POLICY_KEY}.{key}' is {value!r}, not an integer in [{low}, {high}]")
    return value


def _typed(data: dict[str, Any], key: str, where: str) -> Any:
    """A task option, checked against the type its config key has (None where the key is optional)."""
    value, expected = data[key], _CONFIG_TYPES[key]
    args = typing.get_args(expected) if isinstance(expected, types.UnionType) else (expected,)
    if value is None and type(None) in args:
        return value
    kinds = [kind for kind in args if kind is not type(None)]
    if not any(_is_a(value, kind) for kind in kinds):
        wanted = {bool: "true/false", int: "a number", float: "a number", str: "a string"}
        named = " or ".join(wanted.get(kind, "a list of numbers") for kind in kinds)
        raise _bad(where, f"'{POLICY_KEY}.{key}' is {value!r}, not {named}")
    return value


def _is_a(value: Any, kind: Any) -> bool:
    """Whether a JSON value is of a config type: a bool, number, string, or a list of numbers (the only
    list an option holds: sentiment's thresholds and round_to)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if typing.get_origin(kind) is list:
        return isinstance(value, list) and all(_is_a(item, float) for item in value)
    return True  # a kind no option has yet: the task's own check judges it


def _bad(where: str, what: str) -> BertTasksError:
    return BertTasksError(
        f"{where}: {what}; fix config.json or train the model again with bert-tasks finetune"
    )


def _label_names(config_file: Path, config: dict[str, Any]) -> list[str]:
    """config.json's label names in id order; one line for an id2label with keys that are no ids, or one
    that gives two ids the same name: predictions would name one label for two classes, and the scores
    (keyed by name) would lose one of them and contradict the label."""
    id2label = config.get("id2label") or {}
    try:
        pairs = sorted((int(key), str(name)) for key, name in dict(id2label).items())
    except (TypeError, ValueError):
        raise _bad(
            str(config_file), '\'id2label\' is not an object of ids ("0", "1", ...) to label names'
        ) from None
    first_id: dict[str, int] = {}
    for label_id, name in pairs:
        if name in first_id:
            raise _bad(
                str(config_file),
                f"'id2label' gives ids {first_id[name]} and {label_id} the same name {name!r}",
            )
        first_id[name] = label_id
    return [name for _, name in pairs]


def check_torch_weights(model: str | Path) -> None:
    """Refuse, before torch loads, a local dir whose weights torch cannot load: an ONNX export, or a
    half-written model.safetensors (transformers would blame them on pickle). `attention` and `memory`
    take any encoder, so a name that is no local dir with a config.json (a hub id) passes."""
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        return
    policy = _json_object(path / "config.json").get(POLICY_KEY)
    backend = policy.get("backend", BACKENDS[0]) if isinstance(policy, dict) else BACKENDS[0]
    if backend != BACKENDS[0]:
        raise _no_torch_weights(path, backend)
    _classifier_shape(path)


def _no_torch_weights(path: Path, backend: str) -> BertTasksError:
    return BertTasksError(
        f"model dir {path}: holds a {backend} export, which only predict and evaluate run; "
        "pass the model dir it was exported from"
    )


def _classifier_shape(model_dir: Path) -> list[int] | None:
    """The classifier output's shape from model.safetensors' header (None: no such file or head); a
    damaged file is one line."""
    from safetensors import SafetensorError, safe_open

    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        return None  # sharded or pickle weights: load_model says what is wrong with those
    try:
        with safe_open(weights, "numpy") as file:  # the header only; "numpy" imports no torch
            names = set(file.keys())
            output = next((name for name in _CLASSIFIER_OUTPUTS if name in names), None)
            return file.get_slice(output).get_shape() if output is not None else None
    except SafetensorError as error:
        raise BertTasksError(
            f"model dir {model_dir}: model.safetensors is damaged ({error}); the dir is half-written, "
            "copy or save it again"
        ) from None


def _check_labels(model_dir: Path, labels: list[str]) -> None:
    """Refuse transformers' placeholder names (LABEL_0, ...): predictions named so mean nothing to anyone."""
    if all(re.fullmatch(r"LABEL_\d+", label) for label in labels):
        raise BertTasksError(
            f"model dir {model_dir}: config.json has no label names "
            f"(id2label is {', '.join(labels) or 'missing'}); "
            "add the real names to its id2label and label2id, or train the model with bert-tasks finetune"
        )


def check_weights_match_labels(model_dir: Path, num_labels: int) -> None:
    """Refuse a half-written model.safetensors or a config.json that lost its labels, in one line.

    Both would otherwise fail deep inside transformers (a safetensors header error, a size mismatch);
    reading the safetensors header costs a few kilobytes.
    """
    head = _classifier_shape(model_dir)
    if head is not None and head[0] != num_labels:
        raise BertTasksError(
            f"model dir {model_dir}: config.json names {num_labels} labels but the classifier has {head[0]} "
            "outputs; put the label names (id2label) back into config.json or train the model again"
        )
