"""bert-tasks: fine-tune BERT on sentiment and NER with a fused-QKV SDPA attention, HF-format checkpoints."""

from bert_tasks.config import Config, load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.modeling import DEFAULT_MODEL, load_model, load_tokenizer, patch_bert
from bert_tasks.predict import EntityTagger, Predictor, SentimentClassifier
from bert_tasks.training import train

__all__ = [
    "DEFAULT_MODEL",
    "BertTasksError",
    "Config",
    "EntityTagger",
    "Predictor",
    "SentimentClassifier",
    "load_model",
    "load_recipe",
    "load_tokenizer",
    "patch_bert",
    "train",
]
__version__ = "0.1.0"
