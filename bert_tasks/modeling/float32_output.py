"""An output layer that computes in float32 whatever the autocast or the rest of the model's dtype.

A regression head writes numbers in the label's units: its saved last layer holds the target scaling
(`b' = std * b + mean`), so a value of 2,000 leaves a bf16 Linear rounded to a multiple of 8 (bf16 keeps
8 significant bits), and 1e9 as 998,244,352. One 1-output GEMM in float32 costs nothing next to the
encoder; bf16 stays everywhere else.
"""

from __future__ import annotations

import torch
from torch import nn


class Float32Linear(nn.Linear):
    """A Linear whose product, input and output are float32 under any autocast.

    Swapped in by class (`keep_in_float32`), so its parameters keep their names and a saved model is the
    plain Linear's checkpoint. bf16 inference (`linear_weights_in_bf16`), oneDNN prepacking and int8
    quantization leave it as it is.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., in] (any float dtype) -> [..., out] float32
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return nn.functional.linear(x.float(), self.weight.float(), bias)


def keep_in_float32(linear: nn.Linear) -> None:
    """Make `linear` compute in float32 from now on, in place (its weights become float32 too)."""
    linear.float()
    linear.__class__ = Float32Linear
