"""FastDropout: dropout whose random numbers cost a quarter of torch's on CPU.

torch's CPU dropout draws one Bernoulli sample per element (`aten::bernoulli_`, a 32-bit draw each):
in a bf16 BERT training step on this CPU that is 11-15% of the time, and in SDPA's math fallback (the
only CPU path that implements attention dropout) the draws over the B x H x T x T probabilities cost as
much as the attention matmuls. Here each 64-bit draw of torch's own generator is split into four 16-bit
lanes, each compared with p * 2^16: the same keep probability to 1/65536, from the same seeded stream
(`set_seed` and checkpointed RNG states still make runs reproducible). The random numbers cost a quarter;
forward + backward of a whole dropout about half (1.7-1.9x, `bench/levers.py`). On accelerators torch's
fused dropout kernel is already cheap and is used unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_LANES = 4  # int16 lanes per int64 draw
_LANE_VALUES = 1 << 16


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device) -> torch.Tensor:
    """A bool tensor of `shape`, each element True with probability 1 - p (to 1/65536)."""
    count = math.prod(shape)
    draws = torch.empty((count + _LANES - 1) // _LANES, dtype=torch.int64, device=device)
    draws.random_(-(2**63), None)  # the full 64-bit range: every lane is uniform over int16
    lanes = draws.view(torch.int16)[:count].view(shape)
    return lanes >= round(p * _LANE_VALUES) - _LANE_VALUES // 2


class _ScaleByMask(torch.autograd.Function):
    """x * keep * scale, saving only the 1-byte mask for the backward pass (as torch's dropout does)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return _kept(x, keep, scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return _kept(grad, keep, ctx.scale), None, None


def _kept(x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """x * keep * scale. In bf16/fp16 `mul` first casts the bool mask to x's dtype, a slow conversion on
    CPU (half the time of the whole op at 1203 x 384); `where` reads the mask as it is. In fp32 `mul` is
    the faster one."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return torch.where(keep, x, 0.0).mul_(scale)
    return x.mul(keep).mul_(scale)


def fast_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout` with cheaper random numbers on CPU; identical semantics (inverted dropout)."""
    if not training or p == 0.0:
        return x
    # Compiled, torch's dropout fuses into its neighbours' kernels; `random_` on a view would break the graph.
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    return _ScaleByMask.apply(x, keep_mask(x.shape, p, x.device), 1.0 / (1.0 - p))


class FastDropout(nn.Dropout):
    """Drop-in `nn.Dropout` (same `p`, same train/eval switch) running `fast_dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_dropout(x, self.p, self.training)

    @classmethod
    def from_stock(cls, stock: nn.Dropout) -> FastDropout:
        """The same dropout, in the same mode."""
        fast = cls(stock.p, stock.inplace)
        fast.train(stock.training)
        return fast
