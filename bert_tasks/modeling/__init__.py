"""How BERT computes in bert-tasks: the fused attention, the patch, and the loader (which builds any
BERT-family encoder: `encoders.py` decides which path a model takes).

The public names are imported on first use (PEP 562), so `bert_tasks.modeling.load.load_tokenizer` loads
without transformers' BERT modelling code (about 2 s of CPU on 2 cores): `debug data` needs a tokenizer only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bert_tasks.lazy_exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
