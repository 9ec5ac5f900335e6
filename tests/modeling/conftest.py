"""Fixtures the modeling tests share."""

from __future__ import annotations

import pytest
import torch

from bert_tasks.modeling import unpad
from bert_tasks.modeling.unpad import Unpadding


@pytest.fixture
def gathered_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each `Unpadding.gather` call read: empty when the padded path ran."""
    rows: list[int] = []
    gather = Unpadding.gather

    def spy(self: Unpadding, padded: torch.Tensor) -> torch.Tensor:
        packed = gather(self, padded)
        rows.append(packed.shape[0])
        return packed

    monkeypatch.setattr(unpad.Unpadding, "gather", spy)
    return rows
