"""Head gates: one multiplier per attention head on the context it hands the attention's output projection.

Michel et al. 2019 ("Are Sixteen Heads Really Better than One?") write multi-head attention as
sum_h xi_h * Att_h(x) with gates xi_h = 1, and score a head by |dL/dxi_h|; a gate of 0 masks the head. The
gates are forward hooks on `FusedBertSelfAttention`, registered only inside `gated_heads(...)`: a model
outside that block runs exactly as before, with no extra work.

A gate per layer is [H_l] (one value for the whole batch) or [B, H_l] (one per sequence: the gradient of a
summed loss with respect to row b is then sequence b's own gradient, which is what an expectation of
|dL/dxi| over examples needs, in one backward pass). The hook reads every layout the fused attention
returns: padded [B, T, H*D], unpadded [N, H*D] (real tokens of all sequences, `Unpadding` says whose) and
the first-token shortcut [B, H*D].
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from bert_tasks.errors import BertTasksError
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.unpad import FIRST_TOKEN_KWARG, UNPADDING_KWARG, Unpadding


def self_attentions(model: nn.Module) -> list[FusedBertSelfAttention]:
    """The fused self-attention of each encoder layer, in layer order (cross-attention is not gated)."""
    found = [module for module in model.modules() if isinstance(module, FusedBertSelfAttention)]
    if not found:
        raise BertTasksError("head gates: call patch_bert(model) first; the model runs no fused attention")
    return found


@contextmanager
def gated_heads(model: nn.Module, gates: Sequence[torch.Tensor]) -> Iterator[None]:
    """Inside this block each layer's head contexts are multiplied by `gates[layer]` ([H_l] or [B, H_l]).

    Raises:
        BertTasksError: the model is not patched, or the gates do not give one value per head of each layer.
    """
    attentions = self_attentions(model)
    if len(gates) != len(attentions):
        raise BertTasksError(f"head gates: {len(gates)} gate tensors for {len(attentions)} layers")
    handles = []
    try:
        for layer, (attention, gate) in enumerate(zip(attentions, gates, strict=True)):
            if gate.shape[-1] != attention.num_attention_heads or gate.dim() not in (1, 2):
                raise BertTasksError(
                    f"head gates: layer {layer} has {attention.num_attention_heads} heads, its gate is "
                    f"{list(gate.shape)}; give [heads] or [batch, heads]"
                )
            handles.append(attention.register_forward_hook(_GateHook(gate), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


class _GateHook:
    """Multiply one layer's context, head by head, by its gate."""

    def __init__(self, gate: torch.Tensor) -> None:
        self.gate = gate  # [H] or [B, H]

    def __call__(
        self,
        module: FusedBertSelfAttention,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: tuple[torch.Tensor, torch.Tensor | None],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, probs = output  # [B, T, H * D], [rows, H * D] or [B, H * D]
        heads, size = module.num_attention_heads, module.attention_head_size
        gate = self.gate.to(context.dtype)
        unpadding: Unpadding | None = kwargs.get(UNPADDING_KWARG)
        if gate.dim() == 2 and unpadding is not None and not kwargs.get(FIRST_TOKEN_KWARG, False):
            gate = gate.index_select(0, unpadding.indices // unpadding.seq_len)  # [N, H]: each token's row
            extra = unpadding.rows - gate.shape[0]  # bucketed zero rows (unpad.packed_rows) take no gate
            gate = torch.cat([gate, gate.new_zeros(extra, heads)]) if extra else gate  # [rows, H]
        elif gate.dim() == 2 and context.dim() == 3:
            gate = gate[:, None]  # [B, 1, H]
        split = context.unflatten(-1, (heads, size))  # [..., H, D]
        return (split * gate[..., None]).flatten(-2), probs
