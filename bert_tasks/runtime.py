"""Choose the mixed-precision mode `auto` means on this machine."""

from __future__ import annotations

import torch


def resolve_mixed_precision(requested: str) -> str:
    """`auto` -> bf16 where the hardware runs it natively (CUDA Ampere+, CPUs with AVX512-BF16/AMX), else no.

    bf16 needs no loss scaling and, on such CPUs, runs matmuls several times faster than fp32; fp16 is
    only taken when asked for, since it needs a grad scaler and can overflow.
    """
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no"
