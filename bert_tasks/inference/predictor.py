"""Load a saved model dir and predict or evaluate: batch, window, decode -> plain Python values.

Prediction runs the very `encode` and `decode` the training used, with the windowing policy saved in the
model's config.json (`bert_tasks`), so a model never sees inputs cut differently from how it learned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from safetensors import SafetensorError, safe_open

from bert_tasks.allocator import reuse_freed_memory
from bert_tasks.data.batching import eval_loader
from bert_tasks.errors import BertTasksError
from bert_tasks.inference import collect_window_logits
from bert_tasks.modeling.load import load_config, load_model, load_tokenizer
from bert_tasks.precision import resolve_mixed_precision
from bert_tasks.quantize import SizeChange, check_method, quantize_model
from bert_tasks.tasks import make_task

_TASK_OF_ARCHITECTURE = {"BertForSequenceClassification": "sentiment", "BertForTokenClassification": "ner"}


class Predictor:
    """A fine-tuned model ready to predict: model, tokenizer, task and the policy it was trained with."""

    expected_task: str | None = None

    def __init__(
        self,
        model_dir: str | Path,
        batch_size: int = 64,
        mixed_precision: str = "auto",
        allow_pickle: bool = False,
        quantize: str | None = None,
    ) -> None:
        """`quantize="int8"`: dynamic INT8 Linear layers (CPU, fp32 activations); None quantizes only a
        dir written by `bert-tasks export --quantize`, whose config.json asks for it."""
        config = load_config(model_dir)
        policy = dict(getattr(config, "bert_tasks", None) or {})
        quantize = check_method(quantize or policy.get("quantize"))
        if quantize and mixed_precision == "bf16":
            raise BertTasksError(
                f"{quantize} quantization runs with fp32 activations; drop mixed_precision=bf16"
            )
        task_name = policy.get("task") or _TASK_OF_ARCHITECTURE.get((config.architectures or [""])[0])
        if task_name is None:
            raise BertTasksError(
                f"model dir {model_dir}: not a sentiment or NER model "
                f"(architectures {config.architectures}); pass a dir written by `bert-tasks finetune`"
            )
        if self.expected_task and task_name != self.expected_task:
            raise BertTasksError(
                f"model dir {model_dir} holds a {task_name} model, not a {self.expected_task} model; "
                f"use `bert-tasks predict {task_name}`"
            )
        self.task = make_task(
            task_name,
            label_all_subtokens=policy.get("label_all_subtokens", False),
            viterbi=policy.get("viterbi", True),
        )
        _check_labels(model_dir, list(config.id2label.values()))
        _check_weights_match_config(model_dir, config.num_labels)
        self.tokenizer = load_tokenizer(model_dir)
        self.model = load_model(model_dir, task_name, allow_pickle=allow_pickle).eval()
        #: Weight bytes before/after quantization; None for a float model.
        self.quantized: SizeChange | None = quantize_model(self.model, quantize) if quantize else None
        self.max_length = int(policy.get("max_length", min(self.tokenizer.model_max_length, 512)))
        self.stride = int(policy.get("stride", 32))
        self.batch_size = batch_size
        # Dynamically quantized Linear layers run on CPU only.
        self.device = torch.device("cuda" if torch.cuda.is_available() and not quantize else "cpu")
        self.model.to(self.device)
        if self.device.type == "cpu":
            reuse_freed_memory()  # every batch allocates activations of the same sizes again
        self.bf16 = not quantize and resolve_mixed_precision(mixed_precision) == "bf16"
        self.id2label = {int(k): v for k, v in self.model.config.id2label.items()}

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Predictor:
        return cls(model_dir, **kwargs)

    def predict(self, texts: Sequence[str]) -> list[Any]:
        """One prediction per text (a label dict for sentiment, a list of entities for NER)."""
        texts = list(texts)
        if not texts:
            return []
        for index, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise BertTasksError(f"text {index + 1} is empty; give at least one word to predict on")
        raw = self.task.texts_to_raw(list(texts))
        return self.task.decode(raw, *self._window_logits(raw), self.id2label)

    def evaluate(self, raw: Dataset) -> dict[str, Any]:
        """Score labelled raw data (as a task's reader returns it) with the task's metrics."""
        return self.task.metrics(raw, *self._window_logits(raw), self.id2label)

    def _window_logits(self, raw: Dataset) -> tuple[Dataset, list[Any]]:
        encoded = self.task.encode(raw, self.tokenizer, None, self.max_length, self.stride)
        loader = eval_loader(encoded, self.task.collator(self.tokenizer), self.batch_size)
        with torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext():
            logits = collect_window_logits(self.model, loader, len(encoded), device=self.device)
        return encoded, logits


class SentimentClassifier(Predictor):
    """`SentimentClassifier.from_pretrained(dir)(["text", ...]) -> [{"label", "score", "scores"}]`."""

    expected_task = "sentiment"

    def __call__(self, texts: str | Sequence[str]) -> list[dict[str, Any]]:
        return self.predict([texts] if isinstance(texts, str) else texts)


class EntityTagger(Predictor):
    """`EntityTagger.from_pretrained(dir)(text) -> [{"text", "label", "start", "end", "score"}]`.

    Given a list of texts it returns one such list per text.
    """

    expected_task = "ner"

    def __call__(self, texts: str | Sequence[str]) -> list[Any]:
        if isinstance(texts, str):
            return self.predict([texts])[0]
        return self.predict(texts)


def _check_labels(model_dir: str | Path, labels: list[str]) -> None:
    """Refuse transformers' placeholder names (LABEL_0, ...): predictions named so mean nothing to anyone."""
    if all(re.fullmatch(r"LABEL_\d+", label) for label in labels):
        raise BertTasksError(
            f"model dir {model_dir}: config.json has no label names (id2label is {', '.join(labels)}); "
            "add the real names to its id2label and label2id, or train the model with bert-tasks finetune"
        )


def _check_weights_match_config(model_dir: str | Path, num_labels: int) -> None:
    """Refuse a half-written model.safetensors or a config.json that lost its labels, in one line.

    Both would otherwise fail deep inside transformers (a safetensors header error, a size mismatch);
    reading the safetensors header costs a few kilobytes.
    """
    weights = Path(model_dir) / "model.safetensors"
    if not weights.is_file():
        return  # a hub id, sharded or pickle weights: load_model says what is wrong with those
    try:
        with safe_open(weights, "pt") as file:
            names = set(file.keys())
            head = file.get_slice("classifier.weight").get_shape() if "classifier.weight" in names else None
    except SafetensorError as error:
        raise BertTasksError(
            f"model dir {model_dir}: model.safetensors is damaged ({error}); the dir is half-written, "
            "copy or save it again"
        ) from None
    if head is not None and head[0] != num_labels:
        raise BertTasksError(
            f"model dir {model_dir}: config.json names {num_labels} labels but the classifier has {head[0]} "
            "outputs; put the label names (id2label) back into config.json or train the model again"
        )


#: The predictor class each CLI task uses.
PREDICTORS: dict[str, type[Predictor]] = {"sentiment": SentimentClassifier, "ner": EntityTagger}
