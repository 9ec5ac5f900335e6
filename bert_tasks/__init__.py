"""bert-tasks: fine-tune BERT on sentiment and NER with a fused-QKV SDPA attention, HF-format checkpoints."""

from bert_tasks.errors import BertTasksError
from bert_tasks.modeling import DEFAULT_MODEL, load_model, load_tokenizer, patch_bert

__all__ = ["DEFAULT_MODEL", "BertTasksError", "load_model", "load_tokenizer", "patch_bert"]
__version__ = "0.1.0"
