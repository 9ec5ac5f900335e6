"""Prepacked bf16 Linear layers compute `F.linear`'s bits at any shape (fp32 ones its values to fp32's
rounding), and a model keeps plain layers wherever prepacking is unavailable."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bert_tasks.inference import prepacked_linear
from bert_tasks.inference.prepacked_linear import PrepackedLinear, linear_weights_in_bf16, prepack_linears

#: oneDNN has bf16 kernels only on a CPU with bf16 instructions (AVX512-BF16, AMX); elsewhere bf16 layers
#: stay plain (test_without_onednn_bf16_the_layers_stay_plain) and only the fp32 tests below apply.
needs_bf16_kernels = pytest.mark.skipif(
    not prepacked_linear._bf16_supported(), reason="this CPU has no bf16 instructions: no bf16 oneDNN kernels"
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 24), nn.GELU(), nn.Sequential(nn.Linear(24, 8, bias=False)))


@needs_bf16_kernels
@pytest.mark.parametrize("shape", [(1, 16), (5, 16), (2, 7, 16), (300, 16)])
def test_prepacked_layers_give_the_bits_of_plain_bf16_layers_under_autocast(shape: tuple[int, ...]) -> None:
    plain, packed = _model(), _model()
    linear_weights_in_bf16(plain)
    linear_weights_in_bf16(packed)
    assert prepack_linears(packed) == 2
    assert isinstance(packed[0], PrepackedLinear) and isinstance(packed[2][0], PrepackedLinear)
    assert packed[2][0].bias is None
    x = torch.randn(*shape)  # fp32, as the embeddings and LayerNorm hand a Linear its input
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        mine, theirs = packed(x), plain(x)
    assert mine.shape == (*shape[:-1], 8) and mine.dtype == torch.bfloat16
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize("shape", [(1, 16), (2, 7, 16), (300, 16)])
def test_prepacked_fp32_layers_agree_with_plain_ones_to_fp32_rounding(shape: tuple[int, ...]) -> None:
    plain, packed = _model(), _model()
    assert prepack_linears(packed) == 2
    x = torch.randn(*shape)
    with torch.inference_mode():
        mine, theirs = packed(x), plain(x)
    assert mine.dtype == torch.float32
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_without_onednn_bf16_the_layers_stay_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepacked_linear, "_bf16_supported", lambda: False)
    model = _model()
    linear_weights_in_bf16(model)
    assert prepack_linears(model) == 0
    assert model[0].weight.dtype == torch.bfloat16 and type(model[0]) is nn.Linear


@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=needs_bf16_kernels)])
def test_a_layer_whose_prepacked_product_differs_stays_plain(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda weight: reorder(weight * 2))
    model = _model()
    if dtype == "bf16":
        linear_weights_in_bf16(model)
    assert prepack_linears(model) == 0
    assert type(model[0]) is nn.Linear and type(model[2][0]) is nn.Linear


@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=needs_bf16_kernels)])
def test_a_prepacked_model_saves_the_state_dict_of_its_plain_self(dtype: str) -> None:
    plain, packed = _model(), _model()
    if dtype == "bf16":
        linear_weights_in_bf16(plain)
        linear_weights_in_bf16(packed)
    assert prepack_linears(packed) == 2
    mine, theirs = packed.state_dict(), plain.state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[key], theirs[key]) for key in theirs)
