"""Unpadding: BERT's linear layers run on the real tokens of a padded batch only.

In a padded batch every layer's projections, feed-forward and LayerNorms also process the padding
positions, whose outputs nobody reads (30% of the tokens in the benchmark's batches, more in a batch of
mixed-length sentences). `UnpaddedBertEncoder` gathers the real tokens of the embedding output into one
[N, C] matrix and runs every layer on it; only the attention, which needs the [B, T] layout to know which
token belongs to which sentence, scatters its fused q/k/v back into the padded layout, and gathers its
context again (`FusedBertSelfAttention`). The encoder's output is scattered back to [B, T, C] with zeros at
the padding positions, so heads, losses and callers see the usual shapes.

The attention direction (`direction.py`) applies on both paths: the attention's [B, T] layout gives each
sequence its own triangle.

In inference on CPU the attention runs in groups of sequences of similar length (`AttentionGroup`), each
padded to its own longest rather than the batch's: a server's micro-batch mixes short and long texts, and
CPU attention kernels at BERT's head size are slow enough that padding every sequence to the longest one
made a layer's attention over a random 64-text batch 1.7x as slow (BENCHMARKS.md, "Serving over HTTP").
A batch whose lengths are close (a length-sorted call, a training batch) is one group: the padded layout
as before.

In inference on CPU the packed matrix gets zero rows up to a bucketed size (`packed_rows`): memory grows
with the number of distinct matmul shapes (oneDNN's per-shape state in bf16; fp32 prediction, its Linear
layers prepacked for oneDNN, grew alike), and N takes a new value almost every call, so a long-lived
server grew without bound (BENCHMARKS.md, "Memory growth under bf16", and "A CPU without bf16
instructions" for fp32). The extra rows are row-wise independent of the
real ones (projections, feed-forward and LayerNorms act per row) and never reach the attention or the
output; training keeps N exact (its dropout draws, and no wasted rows).

The padded path runs unchanged whenever unpadding cannot apply or buys nothing: no padding, a mask that is
not a key-padding mask, a decoder (causal masks, caches, cross-attention), `output_attentions` /
`output_hidden_states` (their captured tensors keep transformers' [B, T, ...] shapes), or a feed-forward
chunked along the sequence (`chunk_size_feed_forward`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.models.bert.modeling_bert import BertLayer

from bert_tasks.modeling.direction import CAUSAL, DirectedBertEncoder, directed_mask

#: The keyword under which the encoder hands each layer's self-attention the token positions.
UNPADDING_KWARG = "unpadding"
#: The keyword a head that reads only each sequence's first token ([CLS]) passes down to the encoder.
FIRST_TOKEN_KWARG = "first_token_only"
#: A group of sequences attended together ends where a sequence is no longer than its longest / this: the
#: padded attention of a group costs at most ~2.3x its sequences' own. `bench/attention_groups.py` on
#: SST-2 length mixes: a self-attention layer over 64 random texts 29 -> 18 ms (5 groups), over 16 random
#: texts 6.1 -> 3.9 ms (4 groups); ratios 2 and 3 gained less, length-sorted batches stay one group.
_GROUP_LENGTH_RATIO = 1.5
#: Group widths are rounded up to this many positions: fewer distinct shapes for the kernels.
_GROUP_WIDTH_MULTIPLE = 8


@dataclass(frozen=True)
class AttentionGroup:
    """Sequences of a batch attended together, padded to their own longest (`Unpadding.in_groups`)."""

    sequences: torch.Tensor  # [G] the sequences' places in the batch
    rows: torch.Tensor  # [n] rows of the packed matrix holding their real tokens, in order
    positions: torch.Tensor  # [n] the same tokens' flat positions g * width + t in the group's [G, width]
    width: int
    #: The layers' attention mask cut to these sequences: [G, 1, width or 1, width] (None: no mask).
    mask: torch.Tensor | None

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """[rows, X] -> [G, width, X], zeros at the padding positions."""
        padded = packed.new_zeros(self.sequences.numel() * self.width, packed.shape[-1])  # [G * width, X]
        padded.index_copy_(0, self.positions, packed.index_select(0, self.rows))
        return padded.view(self.sequences.numel(), self.width, -1)

    def gather_into(self, packed: torch.Tensor, padded: torch.Tensor) -> None:
        """Write [G, width, X] back into the group's rows of `packed` [rows, X]."""
        flat = padded.reshape(-1, padded.shape[-1])  # [G * width, X]
        packed.index_copy_(0, self.rows, flat.index_select(0, self.positions))


@dataclass(frozen=True)
class Unpadding:
    """Where the real tokens of a padded [B, T] batch sit: the map between [B, T, C] and [N, C]."""

    indices: torch.Tensor  # [N] flat positions b * T + t of the real tokens, in order
    batch: int
    seq_len: int
    #: Rows of the packed matrix: N, or more (zero rows after the real ones, `packed_rows`).
    rows: int
    #: Attention in groups of similar length (`in_groups`); empty: the whole batch in the [B, T] layout.
    groups: tuple[AttentionGroup, ...] = ()

    @classmethod
    def from_token_mask(cls, tokens: torch.Tensor, bucketed: bool = False) -> Unpadding:
        """`tokens`: bool [B, T], True at real tokens; `bucketed`: pack into `packed_rows(N)` rows."""
        batch, seq_len = tokens.shape
        indices = tokens.flatten().nonzero().squeeze(1)  # [N]
        real = indices.numel()
        return cls(indices, batch, seq_len, packed_rows(real) if bucketed else real)

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, T, C] -> [rows, C]: the real tokens, then zero rows up to `rows`."""
        packed = padded.reshape(self.batch * self.seq_len, -1).index_select(0, self.indices)  # [N, C]
        extra = self.rows - self.indices.numel()
        return packed if extra == 0 else torch.cat([packed, packed.new_zeros(extra, packed.shape[-1])])

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """[rows, C] -> [B, T, C], zeros at the padding positions (the rows past N are dropped)."""
        real = packed[: self.indices.numel()]  # [N, C]
        padded = packed.new_zeros(self.batch * self.seq_len, packed.shape[-1])  # [B * T, C]
        return padded.index_copy(0, self.indices, real).view(self.batch, self.seq_len, -1)

    def in_groups(self, attention_mask: torch.Tensor | None) -> Unpadding:
        """This unpadding with its sequences split into attention groups of similar length, each with its
        cut of the layers' `attention_mask` ([B, 1, T or 1, T], as `directed_mask` gives it); itself when
        the lengths are close enough for one group."""
        sequence = self.indices // self.seq_len  # [N] which sequence each real token belongs to
        position = self.indices % self.seq_len  # [N] its place in that sequence
        extent = torch.zeros(self.batch, dtype=torch.long, device=self.indices.device)
        extent.scatter_reduce_(0, sequence, position + 1, "amax")  # [B] one past each last real token
        extents = extent.tolist()
        members = _length_groups(extents)
        if len(members) == 1:
            return self
        groups = []
        for listed in members:
            sequences = torch.tensor(listed, device=self.indices.device)  # [G]
            longest = extents[listed[0]]  # each group lists its longest first
            width = min(self.seq_len, -(-longest // _GROUP_WIDTH_MULTIPLE) * _GROUP_WIDTH_MULTIPLE)
            place = torch.full((self.batch,), -1, dtype=torch.long, device=self.indices.device)
            place[sequences] = torch.arange(len(listed), device=self.indices.device)  # [B]
            rows = (place[sequence] >= 0).nonzero().squeeze(1)  # [n]
            positions = place[sequence[rows]] * width + position[rows]  # [n]
            mask = None
            if attention_mask is not None:
                cut = attention_mask.index_select(0, sequences)  # [G, 1, T or 1, T]
                mask = cut[:, :, :width, :width] if cut.shape[2] > 1 else cut[..., :width]
            groups.append(AttentionGroup(sequences, rows, positions, width, mask))
        return replace(self, groups=tuple(groups))

    def first_tokens(self) -> torch.Tensor:
        """[B] rows of [N, C] that hold each sequence's first token (every sequence starts with one)."""
        return (self.indices % self.seq_len == 0).nonzero().squeeze(1)


def _length_groups(extents: list[int]) -> list[list[int]]:
    """Sequence places by length, longest first, in groups whose lengths stay within
    `_GROUP_LENGTH_RATIO` of their longest."""
    groups: list[list[int]] = []
    longest = 0
    for place in sorted(range(len(extents)), key=lambda b: -extents[b]):
        if not groups or extents[place] * _GROUP_LENGTH_RATIO <= longest:
            groups.append([])
            longest = extents[place]
        groups[-1].append(place)
    return groups


def cpu_inference(hidden_states: torch.Tensor) -> bool:
    """Inference on CPU: where the encoder attends mixed lengths in groups (measured to pay) and packs
    `packed_rows(N)` rows (memory grows per matmul shape, in bf16 and in fp32: 594 -> 1464 MiB over 300
    fp32 calls with N exact, level at ~860 bucketed). Training keeps one layout and N rows: its dropout
    draws, no wasted rows, and its length-grouped batches are one group anyway."""
    return hidden_states.device.type == "cpu" and not torch.is_grad_enabled()


def packed_rows(real: int) -> int:
    """`real` rounded up to one of 8 sizes an octave (a multiple of 8 below 128): at most 12.5% extra
    rows, and a few dozen sizes for any batch instead of one per token count."""
    step = max(8, 1 << max(real.bit_length() - 4, 0))
    return -(-real // step) * step


def token_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The bool [B, T] real-token mask behind a pure key-padding attention mask, else None.

    transformers 5 expands the [B, T] padding mask into [B, 1, T, T] (bool, True = attend, for SDPA; or
    additive 0 / dtype-min floats for eager) with every query row equal. Any other mask (a custom 3-D or
    4-D mask with differing rows, biases other than 0 / -inf) is not padding and is left to the padded
    path; so is a batch without padding (None, or nothing masked), where unpadding buys nothing.
    """
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        return None
    if attention_mask.dtype == torch.bool:
        keep = attention_mask[:, 0]  # [B, T, T]
    else:
        keep = attention_mask[:, 0] == 0  # [B, T, T]
        masked = attention_mask[:, 0] <= torch.finfo(attention_mask.dtype).min / 2
        if not bool((keep | masked).all()):
            return None
    # transformers' masks are expanded views (query stride 0): their rows are equal by construction.
    if attention_mask.stride(2) != 0 and not bool((keep == keep[:, :1]).all()):
        return None
    tokens = keep[:, 0]  # [B, T]
    if bool(tokens.all()) or not bool(tokens[:, 0].all()):
        # Nothing to drop; or a sentence whose first position is padding (left padding): the heads read
        # position 0 ([CLS]), so leave such batches to the padded path.
        return None
    return tokens


class UnpaddedBertEncoder(DirectedBertEncoder):
    """transformers' `BertEncoder` that runs its layers on the real tokens only (see the module doc), in
    the attention direction of `DirectedBertEncoder` (the padded path is that class's forward).

    `patch_bert` swaps the class of an existing encoder to this one: it adds no state, so names, weights,
    hooks and the layers themselves stay as they are.
    """

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        # A causal head pools the last token, not the first (`direction.pool_last_token`).
        first_token_only = bool(kwargs.pop(FIRST_TOKEN_KWARG, False)) and self.attention_direction != CAUSAL
        tokens = None
        if self._can_unpad(encoder_hidden_states, cache, kwargs):
            tokens = token_mask(attention_mask)
            if tokens is not None and tokens.shape != hidden_states.shape[:2]:
                tokens = None  # keys other than the queries' own tokens: not a padding mask of this batch
            if tokens is None and first_token_only and attention_mask is None:
                # No padding, but the last layer can still skip every token the head does not read.
                tokens = hidden_states.new_ones(hidden_states.shape[:2], dtype=torch.bool)  # [B, T]
        if tokens is None:
            return super().forward(
                hidden_states,
                attention_mask,
                encoder_hidden_states,
                encoder_attention_mask,
                cache=cache,
                use_cache=use_cache,
                **kwargs,
            )
        inference_on_cpu = cpu_inference(hidden_states)
        unpadding = Unpadding.from_token_mask(tokens, bucketed=inference_on_cpu)
        attention_mask = directed_mask(
            attention_mask, self.attention_direction, unpadding.seq_len, hidden_states.device
        )
        if inference_on_cpu:
            unpadding = unpadding.in_groups(attention_mask)
        kwargs[UNPADDING_KWARG] = unpadding
        layers = list(self.layer)
        shortcut = first_token_only and bool(layers) and not self._runs_in_full(layers[-1])
        last = layers.pop() if shortcut else None
        packed = unpadding.gather(hidden_states)  # [rows, C]: N real tokens (+ zero rows, bucketed)
        for layer_module in layers:
            packed = layer_module(packed, attention_mask, None, **kwargs)
        if last is None:
            return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=unpadding.scatter(packed))
        first = _first_tokens_through(last, packed, attention_mask, unpadding, kwargs)  # [B, C]
        rest = first.new_zeros(unpadding.batch, unpadding.seq_len - 1, first.shape[-1])  # [B, T - 1, C]
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=torch.cat([first[:, None], rest], dim=1)  # [B, T, C]
        )

    def _runs_in_full(self, layer: BertLayer) -> bool:
        """The first-token shortcut calls the layer's parts, not the layer: where the layer's own forward or
        call does work (gradient checkpointing; FSDP, whose wrapper class gathers the layer's weights
        around its forward), the last layer runs in full."""
        wrapped = type(layer) is not BertLayer
        return wrapped or (layer.gradient_checkpointing and layer.training and torch.is_grad_enabled())

    def _can_unpad(
        self, encoder_hidden_states: torch.Tensor | None, cache: Any, kwargs: dict[str, Any]
    ) -> bool:
        """Encoder-only BERT, nothing captured per layer, feed-forward not chunked along the sequence."""
        config = self.config
        captured = any(
            kwargs.get(flag, getattr(config, flag, False))
            for flag in ("output_attentions", "output_hidden_states")
        )
        return not (
            config.is_decoder
            or encoder_hidden_states is not None
            or cache is not None
            or captured
            or config.chunk_size_feed_forward
        )


def _first_tokens_through(
    layer: BertLayer,
    packed: torch.Tensor,
    attention_mask: torch.Tensor | None,
    unpadding: Unpadding,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """The last layer for each sequence's first token only: [N, C] in, [B, C] out.

    The fused q/k/v projection still runs on every token (keys and values need them all); the
    attention queries, the output projection, the feed-forward and the LayerNorms run on B rows instead
    of N. That is exact for a head that reads the first token only (the pooler of
    `BertFor{SequenceClassification,MultipleChoice,...}`): those rows are computed as in the full layer,
    and no other row reaches the loss.
    """
    first = unpadding.first_tokens()  # [B]
    context, _ = layer.attention.self(
        packed, attention_mask, **kwargs, **{FIRST_TOKEN_KWARG: True}
    )  # [B, C']
    attended = layer.attention.output(context, packed.index_select(0, first))  # [B, C]
    return layer.feed_forward_chunk(attended)  # [B, C]
