"""FusedBertSelfAttention: BERT self-attention as one Linear(C, 3C) and one SDPA call.

Stock transformers runs three projections (query, key, value) and dispatches through its attention
registry. One fused projection is one matmul instead of three (bigger, better-shaped GEMMs on CPU and GPU),
and `torch.nn.functional.scaled_dot_product_attention` picks a flash / memory-efficient kernel where the
device has one, so the T x T attention matrix is never materialised.

On disk nothing changes: `state_dict()` splits the fused weight back into transformers' names
(`...attention.self.query.weight` etc.) and `load_state_dict()` fuses them again, so checkpoints stay
plain Hugging Face BERT checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertSelfAttention

from bert_tasks.modeling.dropout import FastDropout
from bert_tasks.modeling.unpad import FIRST_TOKEN_KWARG, UNPADDING_KWARG, Unpadding

_PROJECTIONS = ("query", "key", "value")
#: From this many keys on, CPU training without attention dropout uses SDPA's flash kernel; below it the
#: math path is faster (measured in BENCHMARKS.md: the flash backward dominates short sequences).
_CPU_FLASH_MIN_KEYS = 256


def _as_sdpa_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Normalise every mask form transformers hands a BERT self-attention into one SDPA accepts.

    transformers 5 passes None (no padding), a bool mask (True = attend) of shape [B, 1, T, T] or
    [B, 1, 1, T], or an additive float mask (0 / large negative) for the eager implementation. A 2-D
    [B, T] padding mask (1 = token) is accepted too, for callers that bypass BertModel's mask builder.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        attention_mask = attention_mask[:, None, None, :].bool()  # [B, 1, 1, T]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask.to(dtype)


class FusedBertSelfAttention(BertSelfAttention):
    """Drop-in replacement for transformers' `BertSelfAttention` (same forward signature and outputs).

    A subclass so that everything transformers finds by class keeps finding it: `output_attentions`
    capturing hooks are installed on `BertSelfAttention` instances.
    """

    def __init__(self, config: BertConfig, is_causal: bool = False, layer_idx: int | None = None) -> None:
        # Skip BertSelfAttention.__init__: it would build the three separate projections this class fuses.
        nn.Module.__init__(self)
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                f"{config.num_attention_heads}"
            )
        self.config = config
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.scaling = self.attention_head_size**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * self.all_head_size)
        # Kept as a module (not a float) so `model.eval()` / `.train()` and configs that tweak
        # `attention.self.dropout.p` behave exactly as with stock transformers.
        self.dropout = FastDropout(config.attention_probs_dropout_prob)
        self.is_decoder = config.is_decoder
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        #: False inside `fused_qkv_names`: state_dict() then keeps the in-memory `qkv` names.
        self.split_qkv_on_save = True
        self.register_state_dict_post_hook(_split_qkv_on_save)
        self.register_load_state_dict_pre_hook(_fuse_qkv_on_load)

    @classmethod
    def from_stock(cls, stock: BertSelfAttention) -> FusedBertSelfAttention:
        """Build the fused module from a stock one: same weights, mode, dtype, device and hooks."""
        fused = cls(stock.config, is_causal=stock.is_causal, layer_idx=stock.layer_idx)
        projections = (stock.query, stock.key, stock.value)
        with torch.no_grad():
            weight = torch.cat([p.weight for p in projections], dim=0)  # [3 * H * D, C]
            bias = torch.cat([p.bias for p in projections], dim=0)  # [3 * H * D]
        fused.qkv.weight = nn.Parameter(weight, requires_grad=stock.query.weight.requires_grad)
        fused.qkv.bias = nn.Parameter(bias, requires_grad=stock.query.bias.requires_grad)
        fused.dropout.p = stock.dropout.p
        # A freshly built module is in train mode: without this, dropout would switch on inside eval().
        fused.train(stock.training)
        # transformers installs its output-capturing hooks (output_attentions) lazily on module
        # instances; a model that already ran such a forward must keep capturing through the new module.
        fused._forward_hooks.update(stock._forward_hooks)
        fused._forward_pre_hooks.update(stock._forward_pre_hooks)
        return fused

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend; return (context [B, T, C'], attention probabilities [B, H, T, S] or None).

        Probabilities are computed only when transformers asks for them (`output_attentions=True`), through
        an exact math path that mirrors transformers' eager attention op for op, so heatmaps show the very
        numbers stock BERT would. Otherwise the fused SDPA kernel runs and no T x T matrix is returned.

        Under `UnpaddedBertEncoder` the hidden states are the real tokens only ([N, C], `unpadding` kwarg):
        the projection runs on them, attention on the padded layout, and the context comes back as [N, C'];
        with `first_token_only` too, only each sequence's first position queries and the context is [B, C'].
        """
        unpadding: Unpadding | None = kwargs.get(UNPADDING_KWARG)
        first_token_only = unpadding is not None and kwargs.get(FIRST_TOKEN_KWARG, False)
        qkv = self.qkv(hidden_states)  # [B, T, 3 * H * D], or [rows, 3 * H * D] unpadded
        if unpadding is not None and unpadding.groups:
            return self._attend_in_groups(qkv, unpadding, first_token_only, kwargs), None
        if unpadding is not None:
            qkv = unpadding.scatter(qkv)  # [B, T, 3 * H * D]
        context, probs = self._attend(qkv, attention_mask, cache, first_token_only, kwargs)  # [B, T', C']
        if first_token_only:
            return context[:, 0], probs  # [B, H * D]
        if unpadding is not None:
            context = unpadding.gather(context)  # [rows, H * D]
        return context, probs

    def _attend_in_groups(
        self, qkv: torch.Tensor, unpadding: Unpadding, first_token_only: bool, kwargs: dict[str, Any]
    ) -> torch.Tensor:
        """Attention group by group (`AttentionGroup`): [rows, 3 * H * D] in, [rows, H * D] out, or [B, H * D]
        for the first tokens only; each group in its own [G, width] layout, with its cut of the mask."""
        if first_token_only:
            context = qkv.new_empty(unpadding.batch, self.all_head_size)  # [B, H * D]
        else:
            context = qkv.new_zeros(unpadding.rows, self.all_head_size)  # [rows, H * D]
        for group in unpadding.groups:
            part, _ = self._attend(group.scatter(qkv), group.mask, None, first_token_only, kwargs)
            if first_token_only:
                context.index_copy_(0, group.sequences, part[:, 0])  # [G, H * D] into [B, H * D]
            else:
                group.gather_into(context, part)  # [G, width, H * D] into [rows, H * D]
        return context

    def _attend(
        self,
        qkv: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Any,
        first_token_only: bool,
        kwargs: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention on the padded layout: qkv [B, T, 3 * H * D] -> (context [B, T', H * D], probabilities
        [B, H, T', S] or None), T' = 1 for the first tokens only."""
        batch, seq_len, _ = qkv.shape
        qkv = qkv.view(batch, seq_len, 3, self.num_attention_heads, self.attention_head_size)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, D]
        if first_token_only:
            query = query[:, :, :1]  # [B, H, 1, D]
            if attention_mask is not None:
                attention_mask = attention_mask[:, :, :1]  # [B, 1, 1, T]

        if cache is not None:
            # Decoder use (BertLMHeadModel generation): extend keys/values with the cached ones.
            self_cache = getattr(cache, "self_attention_cache", cache)
            key, value = self_cache.update(key, value, self.layer_idx, kwargs=kwargs)  # [B, H, S, D]

        mask = _as_sdpa_mask(attention_mask, query.dtype)
        # Causal: a decoder, or `attention=causal` (direction.py). Where a mask came, it holds the triangle.
        is_causal = self.is_causal and mask is None and seq_len > 1
        dropout_p = self.dropout.p if self.training else 0.0

        # Asked for per call, or once in the config (`output_attentions=True` there): stock eager attention
        # hands its probabilities out either way, and transformers' capturing hooks record them.
        if kwargs.get("output_attentions", self.config.output_attentions):
            context, probs = self._attend_with_probs(query, key, value, mask, is_causal)
        elif self._math_is_faster(query, key.shape[-2]):
            context, _ = self._attend_with_probs(query, key, value, mask, is_causal)
            probs = None
        else:
            context = F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=self.scaling,
            )  # [B, H, T, D]
            probs = None
        return context.transpose(1, 2).reshape(batch, query.shape[2], -1), probs  # [B, T', H * D]

    def _math_is_faster(self, query: torch.Tensor, keys: int) -> bool:
        """CPU training: SDPA's CPU kernels have no dropout (it falls back to a math path drawing a
        Bernoulli sample per probability) and its flash backward is slow on short sequences; the math
        path below with `FastDropout` is faster there. Long inputs without dropout keep flash (memory)."""
        if not self.training or query.device.type != "cpu" or not torch.is_grad_enabled():
            return False
        return self.dropout.p > 0.0 or keys < _CPU_FLASH_MIN_KEYS

    def _attend_with_probs(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The math path: same ops, same order as transformers' `eager_attention_forward`; dropout on the
        probabilities in training (`FastDropout`), the returned probabilities are the undropped ones."""
        scores = torch.matmul(query, key.transpose(2, 3)) * self.scaling  # [B, H, T, S]
        if is_causal:
            seq_len, kv_len = scores.shape[-2:]
            mask = torch.ones(seq_len, kv_len, dtype=torch.bool, device=scores.device).tril(kv_len - seq_len)
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            else:
                scores = scores + mask
        probs = F.softmax(scores, dim=-1)  # [B, H, T, S]
        context = torch.matmul(self.dropout(probs), value)  # [B, H, T, D]
        return context, probs


@contextmanager
def fused_qkv_names(model: nn.Module) -> Iterator[None]:
    """Inside this block `state_dict()` keeps the fused `qkv` names: for training checkpoints.

    Accelerate saves and loads an FSDP2 model through torch's distributed state dict, which looks every
    key up as a module attribute, and transformers' query/key/value names are no attributes of the fused
    module. A training checkpoint is read back by bert-tasks alone (`--resume`), so it can keep the
    in-memory names under every launcher; model dirs (`best/`, the final model) keep transformers' names.
    Loading accepts both forms.
    """
    modules = [module for module in model.modules() if isinstance(module, FusedBertSelfAttention)]
    for module in modules:
        module.split_qkv_on_save = False
    try:
        yield
    finally:
        for module in modules:
            module.split_qkv_on_save = True


def _split_qkv_on_save(
    module: FusedBertSelfAttention, state_dict: dict[str, torch.Tensor], prefix: str, local_metadata: Any
) -> None:
    """Write the fused projection under transformers' query/key/value names (plain HF checkpoints)."""
    if not module.split_qkv_on_save:
        return
    for suffix in ("weight", "bias"):
        fused = state_dict.pop(f"{prefix}qkv.{suffix}")
        for name, part in zip(_PROJECTIONS, fused.chunk(3, dim=0), strict=True):
            # A copy, not a view: safetensors refuses tensors that share memory.
            state_dict[f"{prefix}{name}.{suffix}"] = part.detach().clone()


def _fuse_qkv_on_load(
    module: FusedBertSelfAttention,
    state_dict: dict[str, torch.Tensor],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Accept transformers' query/key/value tensors and fuse them into `qkv` (litgpt's pattern)."""
    for suffix in ("weight", "bias"):
        names = [f"{prefix}{name}.{suffix}" for name in _PROJECTIONS]
        if all(name in state_dict for name in names):
            state_dict[f"{prefix}qkv.{suffix}"] = torch.cat([state_dict.pop(name) for name in names], dim=0)
