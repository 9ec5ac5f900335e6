"""Run a model dir's weights with transformers' encoder on torch: the backend of every fine-tuned dir."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch

from bert_tasks.data.padded_batches import PaddedBatches, Padding
from bert_tasks.inference.prepacked_linear import linear_weights_in_bf16, prepack_linears
from bert_tasks.inference.quantize import SizeChange, quantize_model
from bert_tasks.inference.windows import collect_window_logits
from bert_tasks.runtime import resolve_mixed_precision

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel

    from bert_tasks.data.table import Table


class TorchBackend:
    """A loaded model on the best device: CUDA when there is one, CPU for int8 Linear layers."""

    def __init__(
        self,
        model: PreTrainedModel,
        quantize: str | None,
        mixed_precision: str,
        progress: bool = True,
        prepack: bool = True,
    ) -> None:
        """`prepack=False` keeps the model's Linear layers as they are (on CPU they are otherwise
        prepacked for oneDNN in place): the ONNX export's reference is the very model it traces."""
        self.model, self.progress = model, progress
        #: Weight bytes before/after quantization; None for a float model.
        self.quantized: SizeChange | None = quantize_model(model, quantize) if quantize else None
        # Dynamically quantized Linear layers run on CPU only.
        self.device = torch.device("cuda" if torch.cuda.is_available() and not quantize else "cpu")
        self.model.to(self.device)
        self.bf16 = not quantize and resolve_mixed_precision(mixed_precision) == "bf16"
        if self.bf16:
            linear_weights_in_bf16(self.model)
        if prepack and self.device.type == "cpu" and not quantize:
            prepack_linears(self.model)

    def window_logits(self, encoded: Dataset | Table, padding: Padding, batch_size: int) -> list[np.ndarray]:
        """Logits per encoded row, in row order (`collect_window_logits` over `PaddedBatches`)."""
        batches = PaddedBatches(encoded, batch_size, padding, torch.from_numpy)
        with torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext():
            return collect_window_logits(
                self.model, batches, len(encoded), device=self.device, progress=self.progress
            )
