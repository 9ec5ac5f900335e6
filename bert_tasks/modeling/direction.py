"""Attention direction: which keys each token attends to (`attention=bidirectional|causal|right_to_left`).

BERT attends both ways. Under `causal` (a left-to-right model) token i reads the keys at positions <= i,
under `right_to_left` those >= i (the mirror), so an experiment can measure what each side of a word is
worth. Padding stays masked either way.

The mask is built once per forward, in the encoder (`DirectedBertEncoder`), and handed to every layer:
causal attention over a batch without padding needs none (each `FusedBertSelfAttention` then asks SDPA for
`is_causal`, whose kernels skip the upper triangle); every other case gets one boolean [B or 1, 1, T, T]
mask, the padding mask transformers built combined with the triangle. `UnpaddedBertEncoder` hands its
layers the same mask: its attention runs on the padded [B, T] layout, so each sequence has its own triangle
and no token ever sees another sequence's.

Pooling heads (`BertForSequenceClassification` and the other heads reading `pooler_output`) pool [CLS];
a causal [CLS] sees only itself, so a causal `BertModel` pools each sequence's last real token ([SEP]),
which sees the whole window (`pool_last_token`). A right_to_left [CLS] sees every token and stays.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.models.bert.modeling_bert import BertEncoder

from bert_tasks.config import ATTENTION_DIRECTIONS
from bert_tasks.errors import BertTasksError

BIDIRECTIONAL, CAUSAL, RIGHT_TO_LEFT = ATTENTION_DIRECTIONS


def directed_mask(
    attention_mask: torch.Tensor | None, direction: str, seq_len: int, device: torch.device
) -> torch.Tensor | None:
    """The mask every layer applies under `direction`, from the one transformers built for the batch.

    `attention_mask`: None (no padding), bool (True = attend) [B, 1, T, T] or [B, 1, 1, T], additive float
    (0 / dtype min) of those shapes, or a [B, T] padding mask (1 = token). Bidirectional: returned as is.
    Causal without padding: None (the attention modules run SDPA's `is_causal`).

    Each query keeps its own key in a boolean mask: a padding query of a right_to_left batch would else see
    no key at all, and SDPA (zeros) and the math path (uniform weights) would disagree on that row and its
    gradients; a real query sees its own key anyway. An additive mask keeps such rows finite (dtype min,
    never -inf), so both paths agree without it.
    """
    if direction == BIDIRECTIONAL or (direction == CAUSAL and attention_mask is None):
        return attention_mask
    if direction not in ATTENTION_DIRECTIONS:
        raise BertTasksError(f"attention={direction!r}: choose one of {', '.join(ATTENTION_DIRECTIONS)}")
    position = torch.arange(seq_len, device=device)
    query, key = position[:, None], position[None, :]  # [T, 1], [1, T]
    allowed = key <= query if direction == CAUSAL else key >= query  # [T, T]
    if attention_mask is None:
        return allowed[None, None]  # [1, 1, T, T]
    if attention_mask.dim() == 2:
        attention_mask = attention_mask[:, None, None, :].bool()  # [B, 1, 1, T]
    if attention_mask.dtype == torch.bool:
        return (attention_mask & allowed) | (key == query)  # [B, 1, T, T]
    return attention_mask.masked_fill(~allowed, torch.finfo(attention_mask.dtype).min)  # [B, 1, T, T]


class DirectedBertEncoder(BertEncoder):
    """transformers' `BertEncoder` whose layers attend in `attention_direction` (see the module doc).

    Adds no state but that one attribute, so `patch_bert` and `traceable` swap encoders to and from it in
    place; the default direction makes it a plain `BertEncoder`.
    """

    attention_direction: str = BIDIRECTIONAL

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        mask = directed_mask(
            attention_mask, self.attention_direction, hidden_states.shape[1], hidden_states.device
        )
        return super().forward(hidden_states, mask, *args, **kwargs)


def last_tokens(attention_mask: torch.Tensor | None, batch: int, seq_len: int) -> torch.Tensor:
    """[B] position of each sequence's last real token, from a [B, T] padding mask (None: no padding).

    Any padding side: the largest position holding a token.
    """
    if attention_mask is None:
        return torch.full((batch,), seq_len - 1, dtype=torch.long)
    if attention_mask.dim() != 2:
        raise BertTasksError(
            f"a causal BERT pools each sequence's last token, found from a [batch, tokens] padding mask; "
            f"got a mask of shape {list(attention_mask.shape)}: pass the tokenizer's attention_mask"
        )
    position = torch.arange(seq_len, device=attention_mask.device)
    return (attention_mask.bool() * position).amax(-1)  # [B]


def pool_last_token(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`BertModel.forward`, with `pooler_output` taken at each sequence's last real token.

    Set on a causal `BertModel` instance (`set_attention_direction`), so every head that reads
    `pooler_output` pools there while `last_hidden_state`, the weights and their names stay as they are:
    the dir saves as a plain checkpoint. transformers' own forward still pools [CLS] first (one C x C matmul
    per sequence, well under 0.1% of a forward), which keeps its forward untouched.
    """

    @wraps(forward)
    def last_token_forward(
        self: PreTrainedModel,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        output = forward(self, input_ids, attention_mask, *args, **kwargs)
        hidden = output[0]  # [B, T, C]
        batch, seq_len = hidden.shape[:2]
        last = last_tokens(attention_mask, batch, seq_len).to(hidden.device)  # [B]
        pooled = self.pooler(hidden[torch.arange(batch, device=hidden.device), last][:, None])  # [B, C]
        if isinstance(output, tuple):  # return_dict=False
            return (output[0], pooled, *output[2:])
        output.pooler_output = pooled
        return output

    return last_token_forward
