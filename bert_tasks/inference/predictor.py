"""Predict with a saved model dir: batch, window, decode -> plain Python values.

Prediction runs the very `encode` and `decode` the training used, with the policy saved in the model
dir (`bert_tasks.model_dir`), so a model never sees inputs cut differently from how it learned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bert_tasks.data.annotation_tools import label_studio_tasks
from bert_tasks.data.files import check_text_to_predict
from bert_tasks.data.table import Table
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import (
    ModelPolicy,
    check_method,
    check_saved_positions,
    local_model_dir,
    read_policy,
)

if TYPE_CHECKING:
    import numpy as np
    from datasets import Dataset
    from torch import nn

    from bert_tasks.data.padded_batches import Padding
    from bert_tasks.inference.quantize import SizeChange


#: What a Predictor predicts on: a text, a record of the fields its task reads (`Task.check_input`), or
#: for a pair model a (text, second text) pair (a tuple or a list), which becomes a record.
Input = str | Mapping[str, Any] | tuple[str, str] | list[str]


class Backend(Protocol):
    """What runs a model's forward pass: torch (`TorchBackend`) or onnxruntime (`OnnxBackend`)."""

    def window_logits(self, encoded: Dataset | Table, padding: Padding, batch_size: int) -> list[np.ndarray]:
        """Logits per encoded row (window), in row order, run in `PaddedBatches`."""
        ...


class Predictor:
    """A fine-tuned model ready to predict: backend, tokenizer, task and the policy it was trained with.

    Any registered task's model dir works; `SentimentClassifier` and `EntityTagger` also check the task
    and shape their results for one text. The policy picks the backend: a dir written by `bert-tasks export
    --format onnx` runs through onnxruntime without importing torch, every other dir through torch.
    """

    expected_task: str | None = None

    def __init__(
        self,
        model_dir: str | Path,
        batch_size: int = 64,
        mixed_precision: str = "auto",
        allow_pickle: bool = False,
        quantize: str | None = None,
        policy: ModelPolicy | None = None,
        progress: bool = True,
    ) -> None:
        """`quantize="int8"`: dynamic INT8 Linear layers (CPU, fp32 activations); None quantizes only a
        dir written by `bert-tasks export --quantize`, whose policy asks for it. `policy`: windows and
        decoding options to run instead of the saved ones (`evaluate ... viterbi=false`), same task.
        `progress=False`: no progress bar per call (a server, or a caller with a bar of its own)."""
        check_method(quantize)
        if quantize and mixed_precision == "bf16":
            raise BertTasksError(
                f"{quantize} quantization runs with fp32 activations; drop mixed_precision=bf16"
            )
        directory = local_model_dir(model_dir)
        self.policy = read_policy(directory, self.expected_task)
        check_saved_positions(policy or self.policy, directory)
        #: What Label Studio shows as the predictions' model version: the model dir's name.
        self.model_version = Path(model_dir).resolve().name
        self.batch_size, self.progress = batch_size, progress
        #: The torch model (None under onnxruntime) and its weight bytes before/after quantization.
        self.model: nn.Module | None = None
        self.quantized: SizeChange | None = None
        self.backend: Backend
        if self.policy.backend == "onnx":
            self._open_onnx(directory, quantize, mixed_precision)
        else:
            self._open_torch(directory, quantize or self.policy.quantize, mixed_precision, allow_pickle)
        if policy is not None and policy != self.policy:
            if policy.task != self.policy.task:
                raise ValueError(f"a {policy.task} policy for a {self.policy.task} model")
            self.policy, self.task = policy, policy.make_task()

    def _open_onnx(self, directory: Path, quantize: str | None, mixed_precision: str) -> None:
        if quantize or mixed_precision == "bf16":
            asked = f"quantize={quantize}" if quantize else "mixed_precision=bf16"
            raise BertTasksError(
                f"model dir {directory}: an ONNX export runs as exported, not with {asked}; export from "
                "the torch model dir with the setting you want (bert-tasks export --format onnx)"
            )
        from bert_tasks.inference.onnx_backend import open_exported

        exported = open_exported(directory, self.policy)
        self.tokenizer, self.task, self.id2label = exported.tokenizer, exported.task, exported.id2label
        self.backend = exported.backend

    def _open_torch(
        self, directory: Path, quantize: str | None, mixed_precision: str, allow_pickle: bool
    ) -> None:
        from bert_tasks.inference.torch_backend import TorchBackend
        from bert_tasks.model_dir import load_finetuned

        loaded = load_finetuned(directory, self.expected_task, allow_pickle=allow_pickle)
        self.tokenizer, self.task, self.id2label = loaded.tokenizer, loaded.task, loaded.id2label
        backend = TorchBackend(loaded.model, quantize, mixed_precision, self.progress)
        self.model, self.quantized, self.backend = backend.model, backend.quantized, backend

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Predictor:
        return cls(model_dir, **kwargs)

    def predict(self, inputs: Sequence[Input]) -> list[Any]:
        """One prediction per input: a text (sentiment: a label dict; NER: a list of entities), or a record
        the task reads (`Task.check_input`; NER: `{"tokens": [...]}`, with or without its "text", gives
        `{["text",] "tokens", "tags", "entities"}`, one tag per token). Texts are named `text N` in
        errors, records `record N`."""
        return self.predict_inputs(self.checked_inputs(inputs))

    def predict_inputs(self, inputs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Any]:
        """One prediction per (`where`, record), the records checked already: as `text_records` and
        `stream.prediction_inputs` yield them (a file's records by the task's `check_input`, texts by the
        command line's rule), or as `predict` checks them.

        The records go through the task's `encode_batch` and `decode` on plain lists (`Table`), never a
        Dataset: a server's micro-batch of a few texts would pay more to build one than to predict them.
        """
        records = [dict(record) for _, record in inputs]
        if not records:
            return []
        columns = self.task.input_columns(records)
        self.task.warn_unread([where for where, _ in inputs], columns)
        windows = self.task.encode_batch(
            columns, range(len(records)), self.tokenizer, None, self.policy.max_length, self.policy.stride
        )
        raw, encoded = Table(columns), Table(windows)
        logits = self.backend.window_logits(encoded, self.padding, self.batch_size)
        return self.task.decode(raw, encoded, logits, self.id2label)

    def records(self, inputs: Sequence[Input]) -> list[dict[str, Any]]:
        """One JSON-ready record per input, as `bert-tasks predict --json` prints them."""
        return self.located_records(self.checked_inputs(inputs))

    def located_records(self, located: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """`records` of inputs checked already (`checked_inputs`): what the server's batcher runs, so a
        request is checked once, when it arrives."""
        predicted = self.predict_inputs(located)
        shown = self.task.shown_input
        return [self.task.record(shown(r), p) for (_, r), p in zip(located, predicted, strict=True)]

    def annotate(self, records: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Each (`where`, input record) as the record with this model's prediction added.

        The records are checked already (`predict_inputs`). Every input field passes through (`id` and
        others); the prediction's keys follow them. A record that already holds one of those keys (other
        than the inputs the prediction carries back, such as its "text") is refused, naming `where`: its
        value would be lost.
        """
        predicted = self.predict_inputs(records)
        echoed, shown = self.task.input_fields, self.task.shown_input
        return [
            with_prediction(where, fields, self.task.record(shown(fields), prediction), echoed)
            for (where, fields), prediction in zip(records, predicted, strict=True)
        ]

    def checked_inputs(self, inputs: Sequence[Input]) -> list[tuple[str, Mapping[str, Any]]]:
        """Inputs as checked (`where`, record) pairs, each checked by the task's `check_input`: a record
        named `record N`; a text as `{"text"}` and a pair model's (text, second text) as `{"text", <pair
        field>}`, named `text N`, the text held to the command line's rule for texts first (anything that
        is no record or pair is judged as a text)."""
        located: list[tuple[str, Mapping[str, Any]]] = []
        for number, item in enumerate(inputs, start=1):
            if isinstance(item, Mapping):
                located.append((f"record {number}", self.task.check_input(f"record {number}", dict(item))))
                continue
            where = f"text {number}"
            record = self._pair_record(where, item) if isinstance(item, tuple | list) else {"text": item}
            check_text_to_predict(record["text"], where)
            located.append((where, self.task.check_input(where, record)))
        return located

    def _pair_record(self, where: str, pair: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
        """A (text, second text) pair as the record a pair model reads; refused by a one-text model."""
        field = self.task.pair_field
        if field is None:
            raise BertTasksError(f"{where} is a pair, but the model reads one text per input; give the text")
        if len(pair) != 2:
            raise BertTasksError(
                f"{where} has {len(pair)} parts; the model reads (text, {field}) pairs: give two strings"
            )
        return {"text": pair[0], field: pair[1]}

    def label_studio_tasks(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """The texts as Label Studio tasks pre-annotated with this model's predictions (one JSON array,
        as `bert-tasks predict --format label-studio` prints it, imports into a Label Studio project)."""
        texts = list(texts)
        return label_studio_tasks(self.task, texts, self.predict(texts), self.model_version)

    def evaluate(self, raw: Dataset) -> dict[str, Any]:
        """Score labelled raw data (as a task's reader returns it) with the task's metrics."""
        return self.task.metrics(raw, *self.window_logits(raw), self.id2label)

    def window_logits(self, raw: Dataset) -> tuple[Dataset, list[Any]]:
        """Encode raw rows into the saved policy's windows and run the model: (windows, logits per window),
        what a task's `metrics`, `decode` and pages read."""
        encoded = self.task.encode(raw, self.tokenizer, None, self.policy.max_length, self.policy.stride)
        return encoded, self.backend.window_logits(encoded, self.padding, self.batch_size)

    @property
    def padding(self) -> Padding:
        """How the task pads a batch, with this model's tokenizer."""
        from bert_tasks.data.padded_batches import Padding

        return Padding.of(self.tokenizer, self.task.pad_to_multiple_of)


def with_prediction(
    where: str, fields: dict[str, Any], record: dict[str, Any], echoed: Sequence[str] = ("text",)
) -> dict[str, Any]:
    """An input record's fields followed by its prediction `record` (as `Predictor.records` gives it);
    `echoed`: the input fields the prediction carries back (`Task.input_fields`), which are no clash."""
    clash = next((key for key in record if key not in echoed and key in fields), None)
    if clash is not None:
        raise BertTasksError(
            f"{where}: the record has a field '{clash}', which the prediction writes; rename that field "
            f"(e.g. to 'gold_{clash}') or drop it, so that neither value is lost"
        )
    return {**fields, **record}


class SentimentClassifier(Predictor):
    """`SentimentClassifier.from_pretrained(dir)(["text", ...]) -> [{"label", "score", "scores"}]`.

    A pair model takes `[(text, aspect), ...]` (one tuple alone is one pair); a multi-label model gives
    `{"labels": [...], "scores"}` per text, a regression model `{"value"[, "rounded"]}`.
    """

    expected_task = "sentiment"

    def __call__(self, texts: str | tuple[str, str] | Sequence[Any]) -> list[dict[str, Any]]:
        one_pair = isinstance(texts, tuple) and self.task.pair_field is not None and len(texts) == 2
        return self.predict([texts] if isinstance(texts, str) or one_pair else texts)


class EntityTagger(Predictor):
    """`EntityTagger.from_pretrained(dir)(text) -> [{"text", "label", "start", "end", "score"}]`.

    On the user's own words, `tagger({"tokens": [...]})` (a "text" may come with them, for character
    offsets) -> `{"tokens", "tags", "entities": [{"label", "token_start", "token_end", "score"}]}`.
    Given a list of texts or records it returns one result per item.
    """

    expected_task = "ner"

    def __call__(self, inputs: Input | Sequence[Input]) -> Any:
        if isinstance(inputs, str | Mapping):
            return self.predict([inputs])[0]
        return self.predict(inputs)
