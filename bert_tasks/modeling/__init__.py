"""How BERT computes in bert-tasks: the fused attention, the patch, and the loader."""

from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.load import DEFAULT_MODEL, load_model, load_tokenizer
from bert_tasks.modeling.patch import is_patched, patch_bert

__all__ = [
    "DEFAULT_MODEL",
    "FusedBertSelfAttention",
    "is_patched",
    "load_model",
    "load_tokenizer",
    "patch_bert",
]
