"""`bert-tasks export --format onnx [--quantize int8]`: one ONNX graph, checked before it is kept.

The graph comes from `torch.onnx.export(dynamo=True)` on the patched model with its unpadding undone
(`modeling.patch.traceable`: the fused qkv projection and SDPA trace; picking the real tokens of a batch is
a data-dependent shape that does not), with the batch and token axes dynamic. INT8 is onnxruntime's
`quantize_dynamic` on the encoder's matmuls (the head, after the encoder's last LayerNorm, stays float, as
in the torch path): int8 weights stored in the file, activations quantized per batch, no calibration data.

Before anything is written the export is run through onnxruntime on the check texts and compared with the
torch model, window by window: logits within the tolerance below and the same label (argmax) on at least
`MIN_AGREEMENT` of the predictions (per text for sentence tasks, per sub-token for token tasks). A failed
check is one line and leaves no OUT dir behind.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bert_tasks.config import load_recipe
from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.onnx_backend import (
    GRAPH_INPUTS,
    GRAPH_OUTPUT,
    ONNX_FILE,
    OnnxBackend,
    open_session,
    require,
)
from bert_tasks.model_dir import (
    POLICY_KEY,
    check_export_source,
    check_method,
    load_finetuned,
    local_model_dir,
    read_policy,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from bert_tasks.model_dir import FinetunedModel

logger = logging.getLogger(__name__)

#: Largest |logit difference| allowed, as (absolute, relative to the torch logit), per method. fp32: the same
#: arithmetic in another order; int8: weights rounded to 1/127 of each output channel's range.
TOLERANCES = {None: (1e-4, 1e-4), "int8": (0.5, 0.1)}
#: Least share of predictions whose label (argmax) the export must keep.
MIN_AGREEMENT = 0.99


@dataclass(frozen=True)
class Parity:
    """How the export's logits compare with the torch model's on the check texts."""

    predictions: int
    #: Share of predictions whose label the export keeps; None for a task of values (regression), whose
    #: parity is the tolerance alone.
    agreement: float | None
    max_difference: float
    #: Every logit within the method's tolerance.
    close: bool
    method: str | None

    @classmethod
    def measure(
        cls,
        expected: list[np.ndarray],
        found: list[np.ndarray],
        method: str | None,
        labels_of: Callable[[np.ndarray], np.ndarray | None] = lambda logits: logits.argmax(-1),
    ) -> Parity:
        """Compare per-window logits ([L] or [T, L] each), every scored position counted once.

        `labels_of`: what a position predicts, [P] or [P, ...] from [P, L] (`Task.window_labels`: the
        class, a multi-label model's thresholded set); a position keeps its label when all of it is equal.
        """
        reference = np.concatenate([np.atleast_2d(x) for x in expected])  # [P, L]
        exported = np.concatenate([np.atleast_2d(x) for x in found])  # [P, L]
        kept, got = labels_of(reference), labels_of(exported)
        agreement = None
        if kept is not None and got is not None:
            agreement = float((kept == got).reshape(len(reference), -1).all(-1).mean())
        absolute, relative = TOLERANCES[method]
        difference = np.abs(exported - reference)  # [P, L]
        close = bool((difference <= absolute + relative * np.abs(reference)).all())
        return cls(len(reference), agreement, float(difference.max()), close, method)

    @property
    def passed(self) -> bool:
        return self.close and (self.agreement is None or self.agreement >= MIN_AGREEMENT)

    def __str__(self) -> str:
        absolute, relative = TOLERANCES[self.method]
        kept = (
            ""
            if self.agreement is None
            else f"{self.agreement:.2%} keep their label (at least {MIN_AGREEMENT:.0%} needed); "
        )
        return (
            f"checked against the torch model on {self.predictions} predictions: {kept}largest logit "
            f"difference {self.max_difference:.2g} (allowed: {absolute:g} + {relative:g} x |logit|)"
        )


def export_onnx(
    model_dir: str | Path, out_dir: str | Path, method: str | None = None, check_file: str | None = None
) -> Parity:
    """Write `out_dir`: model.onnx (fp32, or int8 with `method="int8"`), tokenizer, config.json, card.

    `check_file`: texts to check the export on, in any format the task reads (default: the task's demo
    validation file bundled with bert-tasks); their labels are not used, only the torch model's output.

    Raises:
        BertTasksError: the onnx extra is missing, an unknown method, a bad model dir or check file, an
            `out_dir` that exists and is not empty or cannot be written (before the model loads), an
            export that fails its parity check; a failed write removes what the export wrote.
    """
    from bert_tasks.inference.quantize import EXTRA_FILES  # deferred with torch
    from bert_tasks.model_card import MODEL_CARD, onnx_export_card
    from bert_tasks.output_paths import CommandOutput

    for module in ("onnx", "onnxruntime", "onnxscript"):
        require(module, "export --format onnx")
    check_method(method)
    check_export_source(model_dir, out_dir)
    out = Path(out_dir)
    with CommandOutput(out, f"export {out}", "choose a new directory you can write to", fresh=True) as target:
        raw = _check_texts(model_dir, check_file)
        loaded = load_finetuned(model_dir)
        with tempfile.TemporaryDirectory(prefix="bert-tasks-onnx-") as scratch:
            graph = Path(scratch) / ONNX_FILE
            parity = _export_checked(loaded, raw, graph, method)
            if not parity.passed:
                raise BertTasksError(
                    f"export {out}: the ONNX model does not match the torch model ({parity}); nothing "
                    "was written; export without --quantize, or report it with the model dir"
                )
            policy = replace(loaded.policy, quantize=method, backend="onnx")
            card = onnx_export_card(model_dir, loaded.directory, out, loaded.task, policy, f"Its {parity}.")
            config = loaded.model.config
            setattr(config, POLICY_KEY, policy.to_json())
            with target.writing():
                shutil.copyfile(graph, out / ONNX_FILE)
                config.save_pretrained(out)
                loaded.tokenizer.save_pretrained(out)
                for name in EXTRA_FILES:
                    if (loaded.directory / name).is_file():
                        shutil.copy2(loaded.directory / name, out / name)
                (out / MODEL_CARD).write_text(str(card), encoding="utf-8")
    logger.debug("%s: %s", out / ONNX_FILE, parity)  # the CLI prints it with the dir
    return parity


def _check_texts(model_dir: str | Path, check_file: str | None) -> Dataset:
    """The check texts as the task's raw rows, read with the task's own reader (before any model loads)."""
    policy = read_policy(local_model_dir(model_dir))
    task = policy.make_task()
    path = check_file or task.demo_validation_file
    if path is None:
        raise BertTasksError(
            f"export --format onnx: the {task.name} task has no bundled check data; pass --check FILE"
        )
    data_only = ["dataset=none", "train_file=none", "validation_file=none", "max_eval_samples=none"]
    cfg = load_recipe(None, [*data_only, f"test_file={path}"], policy.task)
    return read_splits(task, cfg)["test"]


def _export_checked(loaded: FinetunedModel, raw: Dataset, graph: Path, method: str | None) -> Parity:
    """Trace the model into `graph` (quantized in place with `method`) and compare it on `raw`."""
    from bert_tasks.data.padded_batches import Padding
    from bert_tasks.inference.torch_backend import TorchBackend
    from bert_tasks.modeling.patch import traceable

    task, tokenizer, policy = loaded.task, loaded.tokenizer, loaded.policy
    encoded = task.encode(raw, tokenizer, None, policy.max_length, policy.stride)
    padding = Padding.of(tokenizer, task.pad_to_multiple_of)
    reference = TorchBackend(loaded.model, None, "no", prepack=False).window_logits(encoded, padding, 64)
    model = traceable(loaded.model.cpu())
    if method is None:
        _trace(model, tokenizer, graph)
    else:
        fp32 = graph.with_name("fp32.onnx")
        _trace(model, tokenizer, fp32)
        _quantize_int8(fp32, graph)
        fp32.unlink()
    session = open_session(graph)
    found = OnnxBackend(session).window_logits(encoded, padding, 64, "check")
    return Parity.measure(reference, found, method, task.window_labels)


def _trace(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """torch.onnx's dynamo export, with dynamic batch and token axes, as one self-contained file.

    The graph takes the inputs of `GRAPH_INPUTS` that the model's forward takes (DistilBERT and ModernBERT
    take no `token_type_ids`); onnxruntime is fed the graph's own inputs (`OnnxBackend.run`).

    Raises:
        BertTasksError: torch.onnx cannot export this model (one line naming its class).
    """
    import inspect

    import torch

    names = [name for name in GRAPH_INPUTS if name in inspect.signature(model.forward).parameters]

    class Logits(torch.nn.Module):
        """The head's forward with the graph's named inputs, returning the logits tensor alone."""

        def __init__(self, head: PreTrainedModel) -> None:
            super().__init__()
            self.head = head

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor | None = None,
        ) -> torch.Tensor:
            types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.head(input_ids=input_ids, attention_mask=attention_mask, **types).logits

    # Two rows of different lengths, so no axis specialises to a size or to a mask without padding.
    sample = tokenizer(["A sample text.", "A longer sample text, in two parts; the graph traces it."])
    padded = tokenizer.pad(sample, return_tensors="pt")
    inputs = [padded[name] if name in padded else torch.zeros_like(padded["input_ids"]) for name in names]
    axes = {name: {0: "batch", 1: "tokens"} for name in names}
    chatter = io.StringIO()  # torch.onnx prints its steps; the log says what matters
    try:
        with _silenced(), contextlib.redirect_stdout(chatter), torch.inference_mode(False):
            torch.onnx.export(
                Logits(model.eval()),
                tuple(inputs),
                str(path),
                input_names=names,
                output_names=[GRAPH_OUTPUT],
                dynamic_shapes=axes,
                dynamo=True,
                external_data=False,
            )
    except Exception as error:  # torch.export and the ONNX translation raise many types of their own
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BertTasksError(
            f"export --format onnx: torch.onnx cannot export {type(model).__name__} ({first}); the model "
            "dir itself runs in predict, evaluate and serve"
        ) from error
    logger.debug("torch.onnx: %s", chatter.getvalue())


def _quantize_int8(fp32: Path, out: Path) -> None:
    """onnxruntime's dynamic int8 on the encoder's weight matmuls (one scale per output channel).

    Quantized: the matmuls of the encoder layers whose second operand is a stored weight (fused qkv,
    attention output, feed-forward), as the torch path does. Kept float: the attention's own
    activation-by-activation matmuls (scores, context: both sides would be rounded per batch), and the
    head (pooler and classifier, after the encoder's last LayerNormalization): it is tiny, and the logits
    are where rounding shows most.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(fp32)).graph
    weights = {tensor.name for tensor in graph.initializer}
    nodes = graph.node  # topologically sorted, as ONNX requires
    last_norm = max((i for i, node in enumerate(nodes) if node.op_type == "LayerNormalization"), default=0)
    chosen = [n.name for n in nodes[:last_norm] if n.op_type == "MatMul" and n.input[1] in weights]
    with _silenced(), contextlib.redirect_stdout(io.StringIO()):
        quantize_dynamic(
            str(fp32),
            str(out),
            weight_type=QuantType.QInt8,
            per_channel=True,
            nodes_to_quantize=chosen,
        )


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """The exporters' notes for their developers, not for users: warnings, torch.onnx's log records
    (operators of packages not installed), and onnxruntime's advice, logged on the root logger, to
    pre-process graphs (shape inference, which dynamic quantization of matmuls does not need). A handler
    the quantizer adds to the root logger (`logging.basicConfig`) is removed again: it would print every
    later log line a second time, in Python's default format."""
    exporter = logging.getLogger("torch.onnx")
    level = exporter.level
    root = logging.getLogger()

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or "onnxruntime" not in record.pathname

    handlers = list(root.handlers)
    exporter.setLevel(logging.ERROR)
    root.addFilter(keep)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeFilter(keep)
        exporter.setLevel(level)
        for added in [h for h in root.handlers if h not in handlers]:  # onnxruntime's logging.basicConfig
            root.removeHandler(added)
