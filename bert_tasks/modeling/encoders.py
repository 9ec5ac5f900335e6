"""Which path a model takes: bert-tasks' fused BERT attention, or transformers' own for every other encoder.

A task names its head by transformers' Auto class (`AutoModelForSequenceClassification`); the concrete class
is the one that Auto class maps the checkpoint's config to (`BertFor...`, `RobertaFor...`,
`DebertaV2For...`). Where that class is one of transformers' BERT classes, the self-attention is BERT's and
`patch_bert` swaps in the fused one (with unpadding and the first-token shortcut); every other encoder runs
transformers' own modules and attention (SDPA where transformers offers it for the family, eager where not).
This module is the one place that decides, so the loader, the run, and the tools that need the fused path
(`memory`, head pruning, `attention_dropout`) all ask it instead of testing model types themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


def check_encoder(config: PretrainedConfig, name: str | Path) -> None:
    """Refuse a model that is no BERT-family encoder: a decoder (GPT-2, Llama), an encoder-decoder (T5).

    An encoder is what transformers gives a masked-language-model head and no decoder: every family the
    toolkit's windows, [CLS]-style sentence heads and word-level tagging were built for. Decoders also load
    as `...ForSequenceClassification` in transformers, but read the last token, not the first, and are
    out of scope here.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    encoder = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not (
        getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False)
    )
    if not encoder:
        raise BertTasksError(
            f"model {name}: model_type {config.model_type!r} is not a BERT-family encoder (transformers has "
            "no masked-LM encoder for it); bert-tasks fine-tunes encoders such as BERT, RoBERTa, DeBERTa, "
            "XLM-R, ELECTRA, DistilBERT and ModernBERT"
        )


def head_class(auto_name: str, config: PretrainedConfig, name: str | Path) -> type[PreTrainedModel]:
    """The concrete class that transformers' `auto_name` (e.g. AutoModelForTokenClassification) builds for
    `config`: the head for this model's family.

    Raises:
        BertTasksError: transformers has no such head for the family.
    """
    import transformers

    mapping = getattr(transformers, auto_name)._model_mapping  # config class -> model class, lazily imported
    try:
        return mapping[type(config)]
    except KeyError:
        raise BertTasksError(
            f"model {name}: transformers has no {auto_name.removeprefix('AutoModel') or 'base model'} head "
            f"for model_type {config.model_type!r}; choose another base model"
        ) from None


def takes_fused_path(head: type[PreTrainedModel]) -> bool:
    """Whether `head` is one of transformers' BERT classes: its self-attention is BERT's, and it is fused."""
    from transformers.models.bert.modeling_bert import BertPreTrainedModel

    return issubclass(head, BertPreTrainedModel)


def is_fused(model: PreTrainedModel) -> bool:
    """Whether a loaded model runs bert-tasks' fused attention (`patch_bert` has run on it)."""
    from bert_tasks.modeling.patch import is_patched

    return is_patched(model)


def attention_path(model: PreTrainedModel) -> str:
    """The path a loaded model runs, in words: `bert-tasks fused (BertModel)` or `transformers' own
    (RobertaModel, sdpa)`, with the encoder class and transformers' attention implementation."""
    encoder = type(model.base_model).__name__
    if is_fused(model):
        return f"bert-tasks fused ({encoder})"
    return f"transformers' own ({encoder}, {model.config._attn_implementation})"


def require_fused(config: PretrainedConfig, feature: str, name: str | Path, todo: str) -> None:
    """Refuse `feature`, which only the fused attention offers, in one line naming the model's path.

    Decided from the config alone, so the refusal can come before any weights load.
    """
    encoder = head_class("AutoModel", config, name)
    if not takes_fused_path(encoder):
        raise BertTasksError(
            f"{feature} needs bert-tasks' fused BERT attention, and model {name} ({encoder.__name__}) runs "
            f"transformers' own attention; {todo}"
        )
