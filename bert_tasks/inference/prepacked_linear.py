"""Linear layers for CPU inference whose weights oneDNN lays out once, not on every call."""

from __future__ import annotations

import torch
from torch import nn

from bert_tasks.modeling.float32_output import Float32Linear


class PrepackedLinear(nn.Module):
    """A bf16 or fp32 Linear whose weight is held in oneDNN's blocked layout, reordered once at load time.

    A bf16 `F.linear` on CPU hands oneDNN a row-major weight, which it reorders into its blocked layout
    on every call; reordered once, the same matmul computes the same bits 1.07-1.3x faster at 128-8,192
    rows and 1.6-2.2x at 1-16 rows (AMD EPYC, BENCHMARKS.md "Inference at the GEMM roofline"). An fp32
    `F.linear` runs MKL's GEMM; oneDNN's on the prepacked weight was 1.1-1.25x faster on 2 EPYC cores
    (1.25-1.6x on one), in fp32 but another summation order (differences ~1e-6). The two ops are the
    ones inductor's freezing pass emits for CPU Linear layers (`torch.ops.mkldnn`); they are not public
    API, so `prepack_linears` checks each layer against `F.linear` and keeps the plain layer wherever
    they are missing or disagree.
    """

    def __init__(self, linear: nn.Linear, packed: torch.Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = packed  # [out, in] in oneDNN's opaque layout: no parameter; saved as `weight`
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)  # [out] in the weight's dtype, or None
        self.dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., in] -> [..., out] in the weight's dtype; autocast casts a bf16 Linear's input the same way
        return _product(x.to(self.dtype), self.packed, self.bias)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Save as the Linear it was (`weight`, `bias`): a prepacked model's state_dict, and so
        `save_pretrained` and the fused attention's save hook, read as the plain model's."""
        destination[prefix + "weight"] = self.packed.to_dense()  # [out, in], row-major again
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def extra_repr(self) -> str:
        with_bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={with_bias}"


def linear_weights_in_bf16(model: nn.Module) -> None:
    """Hold every Linear's weight and bias in bf16, as autocast would cast them for each forward.

    Autocast runs a Linear in bf16 by casting its fp32 weight and bias on every call: ~1,600 casts and
    3-4 ms of every prediction call on 2 CPU cores whatever its size, 5% of a server's 15-text batch
    (BENCHMARKS.md, "Serving over HTTP"). Cast once, the same bf16 values meet the same bf16 inputs, so
    the logits are bit for bit those of autocast; the other layers (embeddings, LayerNorm) stay fp32 and
    autocast still decides their precision. The model is the backend's own: prediction never trains it.
    A `Float32Linear` (a regression head's output) stays float32.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear) and not isinstance(module, Float32Linear):
            module.to(torch.bfloat16)


def prepack_linears(model: nn.Module) -> int:
    """Replace each bf16 or fp32 Linear of a CPU inference model by a `PrepackedLinear`; return how many.

    A layer stays the plain Linear where this torch cannot prepack it or the prepacked product differs
    from `F.linear`'s: in any bit in bf16, beyond fp32's rounding (1e-5) in fp32. A `Float32Linear`
    (a one-output regression layer) stays itself, so its float32 guarantee holds under any autocast.
    """
    if not torch.backends.mkldnn.is_available():
        return 0
    dtypes = {torch.float32, torch.bfloat16} if _bf16_supported() else {torch.float32}
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Float32Linear) or not isinstance(child, nn.Linear):
                continue
            if child.weight.dtype in dtypes:
                packed = _packed_weight(child)
                if packed is not None:
                    setattr(parent, name, PrepackedLinear(child, packed))
                    replaced += 1
    return replaced


def _bf16_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the op
        return False


def _packed_weight(linear: nn.Linear) -> torch.Tensor | None:
    """The layer's weight reordered by oneDNN, or None where that fails or changes the product."""
    dtype = linear.weight.dtype
    probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        with torch.inference_mode():
            mine = _product(probe, packed, linear.bias)
            theirs = nn.functional.linear(probe, linear.weight, linear.bias)
    except (AttributeError, RuntimeError):  # the op is missing or refuses this layer
        return None
    exact = dtype == torch.bfloat16
    agrees = torch.equal(mine, theirs) if exact else torch.allclose(mine, theirs, rtol=1e-5, atol=1e-5)
    return packed if agrees else None


def _product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T + b with W prepacked: no post-op fused ("none"), as inductor calls it for a plain Linear."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
