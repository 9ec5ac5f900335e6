"""bert-tasks: fine-tune BERT on sentiment and NER with a fused-QKV SDPA attention, HF-format checkpoints.

The public names are imported on first use (PEP 562): `bert-tasks predict` then loads what prediction
needs and skips the training and plotting stack (matplotlib, scikit-learn), about 1 s of every start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bert_tasks.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from bert_tasks.config import DEFAULT_MODEL, Config, load_recipe
    from bert_tasks.errors import BertTasksError
    from bert_tasks.inference.evaluate import evaluate_data
    from bert_tasks.inference.predictor import EntityTagger, Predictor, SentimentClassifier
    from bert_tasks.model_dir import load_finetuned
    from bert_tasks.modeling import load_model, load_tokenizer, patch_bert
    from bert_tasks.tasks import Task, register_task
    from bert_tasks.training import train

#: Public name -> the module that defines it.
_EXPORTS = {
    "DEFAULT_MODEL": "bert_tasks.config",
    "BertTasksError": "bert_tasks.errors",
    "Config": "bert_tasks.config",
    "EntityTagger": "bert_tasks.inference.predictor",
    "evaluate_data": "bert_tasks.inference.evaluate",
    "Predictor": "bert_tasks.inference.predictor",
    "SentimentClassifier": "bert_tasks.inference.predictor",
    "Task": "bert_tasks.tasks",
    "load_finetuned": "bert_tasks.model_dir",
    "load_model": "bert_tasks.modeling",
    "load_recipe": "bert_tasks.config",
    "load_tokenizer": "bert_tasks.modeling",
    "patch_bert": "bert_tasks.modeling",
    "register_task": "bert_tasks.tasks",
    "train": "bert_tasks.training",
}
__all__ = [
    "DEFAULT_MODEL",
    "BertTasksError",
    "Config",
    "EntityTagger",
    "Predictor",
    "SentimentClassifier",
    "Task",
    "evaluate_data",
    "load_finetuned",
    "load_model",
    "load_recipe",
    "load_tokenizer",
    "patch_bert",
    "register_task",
    "train",
]
__version__ = "0.1.0"


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
