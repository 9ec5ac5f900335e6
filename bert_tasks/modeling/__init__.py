"""How BERT computes in bert-tasks: the fused attention, the patch, and the loader.

The public names are imported on first use (PEP 562), so `bert_tasks.modeling.load.load_tokenizer` loads
without transformers' BERT modelling code (about 2 s of CPU on 2 cores): `debug data` needs a tokenizer only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bert_tasks.modeling.attention import FusedBertSelfAttention
    from bert_tasks.modeling.load import DEFAULT_MODEL, load_model, load_tokenizer
    from bert_tasks.modeling.patch import is_patched, patch_bert

#: Public name -> the module that defines it.
_EXPORTS = {
    "DEFAULT_MODEL": "bert_tasks.modeling.load",
    "FusedBertSelfAttention": "bert_tasks.modeling.attention",
    "is_patched": "bert_tasks.modeling.patch",
    "load_model": "bert_tasks.modeling.load",
    "load_tokenizer": "bert_tasks.modeling.load",
    "patch_bert": "bert_tasks.modeling.patch",
}
__all__ = [
    "DEFAULT_MODEL",
    "FusedBertSelfAttention",
    "is_patched",
    "load_model",
    "load_tokenizer",
    "patch_bert",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bert_tasks.modeling' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
