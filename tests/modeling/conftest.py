"""Fixtures the modeling tests share."""

from __future__ import annotations

import pytest
import torch

from bert_tasks.modeling import unpad
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.unpad import Unpadding


@pytest.fixture
def gathered_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each gather back to the packed layout wrote: the embeddings' (`Unpadding.gather`), then
    each layer's attention context, in one [B, T] layout or in length groups (`_attend_in_groups`); empty
    when the padded path ran. A last layer run for the first tokens only adds none."""
    rows: list[int] = []
    gather, in_groups = Unpadding.gather, FusedBertSelfAttention._attend_in_groups

    def spy(self: Unpadding, padded: torch.Tensor) -> torch.Tensor:
        packed = gather(self, padded)
        rows.append(packed.shape[0])
        return packed

    def groups_spy(self: FusedBertSelfAttention, qkv, unpadding, first_token_only, kwargs) -> torch.Tensor:
        context = in_groups(self, qkv, unpadding, first_token_only, kwargs)
        if not first_token_only:
            rows.append(context.shape[0])
        return context

    monkeypatch.setattr(unpad.Unpadding, "gather", spy)
    monkeypatch.setattr(FusedBertSelfAttention, "_attend_in_groups", groups_spy)
    return rows
