"""Run an exported model dir (`model.onnx`) through onnxruntime: prediction without torch.

The dir holds the ONNX graph, the tokenizer and config.json (labels and the policy, `backend: onnx`).
Prediction and evaluation run the task's own `encode`, padding and `decode` on it, exactly as on a torch
dir; only the forward pass differs. Nothing here imports torch or transformers' model code (the tokenizer
is transformers' tokenizers-backed one, the batches numpy arrays), which is what makes a one-text predict
start in a fraction of the time (BENCHMARKS.md, "CLI start-up").
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from bert_tasks.data.padded_batches import PaddedBatches, Padding
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import ModelPolicy, read_id2label
from bert_tasks.runtime import progress_bars_wanted

if TYPE_CHECKING:
    from datasets import Dataset
    from onnxruntime import InferenceSession
    from transformers import PreTrainedTokenizerBase

    from bert_tasks.data.table import Table
    from bert_tasks.tasks.base import Task

#: The graph file of an exported dir.
ONNX_FILE = "model.onnx"
#: The graph's inputs, in the order the export traced them, and its one output.
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
GRAPH_OUTPUT = "logits"
#: How to get the optional dependencies (pyproject's `onnx` extra).
INSTALL_EXTRA = "pip install 'bert-tasks[onnx]'"


def require(module: str, what: str) -> ModuleType:
    """Import one of the `onnx` extra's packages, or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BertTasksError(
            f"{what} needs the optional package {module}, which is not installed; install the "
            f"onnx extra: {INSTALL_EXTRA}"
        ) from None


def open_session(path: Path, threads: int | None = None) -> InferenceSession:
    """An onnxruntime CPU session on `path`; a missing or damaged file is one line.

    `threads`: intra-op threads (None: onnxruntime's default, one per physical core).
    """
    ort = require("onnxruntime", f"running {path}")
    if not path.is_file():
        raise BertTasksError(
            f"{path}: no such file; export the model again (bert-tasks export --format onnx)"
        )
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings are about graph internals, not about inputs
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's own classes (InvalidProtobuf, Fail, ...) share no base
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BertTasksError(
            f"{path}: not a loadable ONNX model ({reason}); the file is damaged or half-written, export "
            "the model again (bert-tasks export --format onnx)"
        ) from None


class OnnxBackend:
    """The forward pass of an exported graph, batch by batch in length order (the least padding)."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.inputs = [node.name for node in session.get_inputs()]

    def window_logits(
        self, encoded: Dataset | Table, padding: Padding, batch_size: int, description: str = "predict"
    ) -> list[np.ndarray]:
        """Logits per encoded row, in row order: [num_labels] per sentence, [tokens, num_labels] per token."""
        found: list[np.ndarray] = [np.empty(0)] * len(encoded)
        show = progress_bars_wanted()
        batches = PaddedBatches(encoded, batch_size, padding)
        for batch in tqdm(batches, desc=description, disable=not show, leave=False, delay=2):
            logits = self.run(batch)  # [B, L] or [B, T, L]
            lengths = batch["attention_mask"].sum(axis=1)  # [B]
            for row, length, row_logits in zip(batch["row"].tolist(), lengths.tolist(), logits, strict=True):
                found[row] = row_logits[:length] if row_logits.ndim == 2 else row_logits
        return found

    def run(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The graph on one padded batch; a tokenizer without token types gets the zeros BERT assumes."""
        ids = batch["input_ids"]
        feed = {
            name: np.asarray(batch[name], dtype=np.int64) if name in batch else np.zeros_like(ids, np.int64)
            for name in self.inputs
        }
        return self.session.run([GRAPH_OUTPUT], feed)[0]


@dataclass
class ExportedModel:
    """An opened export dir: what a Predictor needs besides the policy it was opened by."""

    directory: Path
    tokenizer: PreTrainedTokenizerBase
    task: Task
    id2label: dict[int, str]
    backend: OnnxBackend


def open_exported(directory: Path, policy: ModelPolicy, threads: int | None = None) -> ExportedModel:
    """Open a dir `bert-tasks export --format onnx` wrote (the policy is read and checked already).

    Raises:
        BertTasksError: the onnx extra is missing, placeholder label names, tokenizer files that do not load,
            a missing or damaged model.onnx, or a graph whose outputs are not one per label.
    """
    id2label = read_id2label(directory)
    session = open_session(directory / ONNX_FILE, threads)
    _check_outputs(directory, session.get_outputs()[0].shape, len(id2label))
    tokenizer = load_tokenizer(directory)
    task = policy.make_task()
    return ExportedModel(directory, tokenizer, task, id2label, OnnxBackend(session))


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The export's tokenizer.json through transformers' tokenizers-backed class.

    Not `AutoTokenizer`, which imports transformers' config machinery and with it torch (~2 s); the export
    wrote a tokenizer.json, which holds the whole tokenizer (normalizer, pieces, special-token template).
    """
    from transformers import PreTrainedTokenizerFast

    if not (directory / "tokenizer.json").is_file():
        raise BertTasksError(f"model dir {directory}: no tokenizer.json; export the model again")
    try:
        return PreTrainedTokenizerFast.from_pretrained(directory)
    except Exception as error:  # the tokenizers library raises plain Exceptions, JSON errors, KeyErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BertTasksError(
            f"model dir {directory}: could not load tokenizer.json ({reason}); export the model again"
        ) from None


def _check_outputs(directory: Path, shape: Sequence[Any], num_labels: int) -> None:
    if not shape or shape[-1] != num_labels:
        raise BertTasksError(
            f"model dir {directory}: config.json names {num_labels} labels but {ONNX_FILE} gives "
            f"{shape[-1] if shape else 'no'} outputs per prediction; export the model again"
        )
