"""Predict with a saved model dir: batch, window, decode -> plain Python values.

Prediction runs the very `encode` and `decode` the training used, with the policy saved in the model
dir (`bert_tasks.model_dir`), so a model never sees inputs cut differently from how it learned.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bert_tasks.data.annotation_tools import label_studio_tasks
from bert_tasks.data.batching import eval_loader
from bert_tasks.data.files import check_texts
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.quantize import SizeChange, check_method, quantize_model
from bert_tasks.inference.windows import collect_window_logits
from bert_tasks.model_dir import load_finetuned
from bert_tasks.runtime import resolve_mixed_precision

if TYPE_CHECKING:
    from datasets import Dataset


class Predictor:
    """A fine-tuned model ready to predict: model, tokenizer, task and the policy it was trained with.

    Any registered task's model dir works; `SentimentClassifier` and `EntityTagger` also check the task
    and shape their results for one text.
    """

    expected_task: str | None = None

    def __init__(
        self,
        model_dir: str | Path,
        batch_size: int = 64,
        mixed_precision: str = "auto",
        allow_pickle: bool = False,
        quantize: str | None = None,
        progress: bool = True,
    ) -> None:
        """`quantize="int8"`: dynamic INT8 Linear layers (CPU, fp32 activations); None quantizes only a
        dir written by `bert-tasks export --quantize`, whose policy asks for it. `progress=False`: no
        progress bar per call (a server, or a caller with a bar of its own)."""
        check_method(quantize)
        if quantize and mixed_precision == "bf16":
            raise BertTasksError(
                f"{quantize} quantization runs with fp32 activations; drop mixed_precision=bf16"
            )
        loaded = load_finetuned(model_dir, self.expected_task, allow_pickle=allow_pickle)
        #: What Label Studio shows as the predictions' model version: the model dir's name.
        self.model_version = Path(model_dir).resolve().name
        self.model, self.tokenizer, self.task = loaded.model, loaded.tokenizer, loaded.task
        self.policy, self.id2label = loaded.policy, loaded.id2label
        quantize = quantize or self.policy.quantize
        #: Weight bytes before/after quantization; None for a float model.
        self.quantized: SizeChange | None = quantize_model(self.model, quantize) if quantize else None
        self.batch_size, self.progress = batch_size, progress
        # Dynamically quantized Linear layers run on CPU only.
        self.device = torch.device("cuda" if torch.cuda.is_available() and not quantize else "cpu")
        self.model.to(self.device)
        self.bf16 = not quantize and resolve_mixed_precision(mixed_precision) == "bf16"

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Predictor:
        return cls(model_dir, **kwargs)

    def predict(self, texts: Sequence[str]) -> list[Any]:
        """One prediction per text (a label dict for sentiment, a list of entities for NER)."""
        texts = list(texts)
        if not texts:
            return []
        check_texts(texts)
        raw = self.task.texts_to_raw(texts)
        return self.task.decode(raw, *self._window_logits(raw), self.id2label)

    def records(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One JSON-ready record per text, as `bert-tasks predict --json` prints them."""
        texts = list(texts)
        return [self.task.record(t, p) for t, p in zip(texts, self.predict(texts), strict=True)]

    def annotate(self, records: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Each (`where`, record with a "text") as the record with this model's prediction added.

        Every input field passes through (`id` and others); the prediction's keys follow them. A record
        that already holds one of those keys is refused, naming `where`: its value would be lost.
        """
        predicted = self.records([fields["text"] for _, fields in records])
        return [with_prediction(w, fields, rec) for (w, fields), rec in zip(records, predicted, strict=True)]

    def label_studio_tasks(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """The texts as Label Studio tasks pre-annotated with this model's predictions (one JSON array,
        as `bert-tasks predict --format label-studio` prints it, imports into a Label Studio project)."""
        texts = list(texts)
        return label_studio_tasks(self.task, texts, self.predict(texts), self.model_version)

    def evaluate(self, raw: Dataset) -> dict[str, Any]:
        """Score labelled raw data (as a task's reader returns it) with the task's metrics."""
        return self.task.metrics(raw, *self._window_logits(raw), self.id2label)

    def _window_logits(self, raw: Dataset) -> tuple[Dataset, list[Any]]:
        encoded = self.task.encode(raw, self.tokenizer, None, self.policy.max_length, self.policy.stride)
        loader = eval_loader(encoded, self.task.collator(self.tokenizer), self.batch_size)
        with torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext():
            logits = collect_window_logits(
                self.model, loader, len(encoded), device=self.device, progress=self.progress
            )
        return encoded, logits


def with_prediction(where: str, fields: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """An input record's fields followed by its prediction `record` (as `Predictor.records` gives it)."""
    clash = next((key for key in record if key != "text" and key in fields), None)
    if clash is not None:
        raise BertTasksError(
            f"{where}: the record has a field '{clash}', which the prediction writes; rename that field "
            f"(e.g. to 'gold_{clash}') or drop it, so that neither value is lost"
        )
    return {**fields, **record}


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
