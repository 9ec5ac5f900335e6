"""FastDropout: torch's dropout semantics from cheaper random numbers, and where patch_bert puts it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertForTokenClassification

from bert_tasks import patch_bert
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.dropout import FastDropout, fast_dropout, keep_mask
from tests.helpers import tiny_bert_config


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_one_minus_p(p):
    torch.manual_seed(0)
    keep = keep_mask((1000, 1001), p, torch.device("cpu"))  # an odd count: the last draw is cut
    assert keep.shape == (1000, 1001) and keep.dtype == torch.bool
    assert keep.float().mean().item() == pytest.approx(1 - p, abs=2e-3)


def test_keep_mask_lanes_are_independent():
    """Neighbouring elements come from one 64-bit draw: they must still be uncorrelated."""
    torch.manual_seed(0)
    keep = keep_mask((1 << 20,), 0.5, torch.device("cpu")).float().view(-1, 4)  # [draws, lanes]
    lane_means = keep.mean(0)
    torch.testing.assert_close(lane_means, torch.full((4,), 0.5), atol=4e-3, rtol=0)
    both_kept = (keep[:, 0] * keep[:, 1]).mean().item()
    assert both_kept == pytest.approx(0.25, abs=4e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_zeroes_or_scales_and_backward_follows_the_same_mask(dtype):
    torch.manual_seed(0)
    x = (torch.rand(64, 128) + 1.0).to(dtype).requires_grad_()  # no zeros of its own
    out = fast_dropout(x, 0.25)
    dropped = out == 0
    assert 0.2 < dropped.float().mean().item() < 0.3
    torch.testing.assert_close(out[~dropped], (x[~dropped] / 0.75).to(dtype))
    out.sum().backward()
    assert torch.all(x.grad[dropped] == 0)
    torch.testing.assert_close(x.grad[~dropped], torch.full_like(x.grad[~dropped], 1 / 0.75))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_dtype_computes_x_times_mask_times_scale(dtype: torch.dtype) -> None:
    """Half precision selects with `where` instead of multiplying by the mask: the same numbers."""
    torch.manual_seed(1)
    x = torch.randn(33, 70).to(dtype)
    torch.manual_seed(2)
    got = fast_dropout(x, 0.1)
    torch.manual_seed(2)  # the same draws
    keep = keep_mask(x.shape, 0.1, x.device)
    assert torch.equal(got, x * keep * (1.0 / 0.9))


def test_same_seed_same_mask_and_eval_is_identity():
    x = torch.randn(8, 16)
    torch.manual_seed(3)
    first = fast_dropout(x, 0.5)
    torch.manual_seed(3)
    torch.testing.assert_close(fast_dropout(x, 0.5), first, atol=0, rtol=0)
    assert fast_dropout(x, 0.5, training=False) is x
    assert fast_dropout(x, 0.0) is x


def test_patch_bert_swaps_every_dropout_keeping_p_and_mode():
    config = tiny_bert_config(
        hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3, classifier_dropout=0.4
    )
    model = patch_bert(BertForTokenClassification(config).eval())
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is FastDropout for m in dropouts)
    assert {m.p for m in dropouts} == {0.2, 0.3, 0.4}
    assert not any(m.training for m in dropouts)


def test_cpu_training_math_path_equals_sdpa_without_dropout():
    """Training on CPU takes the math path (no dropout here): it must compute what SDPA computes."""
    torch.manual_seed(0)
    module = FusedBertSelfAttention(tiny_bert_config(attention_probs_dropout_prob=0.0))
    hidden = torch.randn(3, 9, 32)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 5:] = False
    trained = module.train()(hidden, attention_mask=mask)[0]
    evaluated = module.eval()(hidden, attention_mask=mask)[0]
    torch.testing.assert_close(trained, evaluated, atol=1e-5, rtol=1e-5)


def test_compiled_dropout_is_one_graph() -> None:
    """Under torch.compile FastDropout hands over to torch's dropout, which inductor fuses; its own
    `random_` on a view would split every compiled layer at each dropout."""
    dropout = FastDropout(0.1).train()
    explanation = torch._dynamo.explain(lambda x: dropout(x) + 1.0)(torch.randn(4, 8))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
