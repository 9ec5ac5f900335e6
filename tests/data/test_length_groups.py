"""Training batches: transformers' length groups, in an order that follows no length trend."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from transformers.trainer_pt_utils import get_length_grouped_indices

from bert_tasks.data.batching import EpochLengthGroupedSampler


def _lengths(count: int) -> list[int]:
    generator = random.Random(0)
    return [generator.randint(3, 120) for _ in range(count)]


def _mean_lengths(groups: list[list[int]], lengths: list[int]) -> list[float]:
    return [sum(lengths[row] for row in group) / len(group) for group in groups]


def _groups(order: list[int], size: int) -> list[list[int]]:
    return [order[start : start + size] for start in range(0, len(order), size)]


@pytest.mark.parametrize("rows", [2000, 2017, 33, 7])
def test_the_groups_are_transformers_own_in_another_order(rows: int) -> None:
    lengths, size = _lengths(rows), 32
    sampler = EpochLengthGroupedSampler(size, lengths, seed=5)
    sampler.set_epoch(1)
    got = _groups(list(sampler), size)
    generator = torch.Generator().manual_seed(6)  # seed + epoch: what the sampler draws from
    want = _groups(get_length_grouped_indices(lengths, size, generator=generator), size)
    assert sorted(map(sorted, got)) == sorted(map(sorted, want))  # the same rows together: the same padding
    assert got[0] == want[0], "the group with the longest row comes first"
    assert max(lengths[row] for row in got[0]) == max(lengths)
    assert all(len(group) == size for group in got[:-1]), "a short group only at the end, or batches shift"


def test_group_lengths_follow_no_trend_over_the_epoch() -> None:
    """transformers orders each mega-batch's groups from longest to shortest; here the order is shuffled."""
    lengths, size = _lengths(2000), 32
    sampler = EpochLengthGroupedSampler(size, lengths, seed=0)
    means = _mean_lengths(_groups(list(sampler), size)[1:-1], lengths)
    falls = sum(later < earlier for earlier, later in itertools.pairwise(means))
    assert 0.3 < falls / (len(means) - 1) < 0.7  # transformers' own order: nearly every step falls
    raw = get_length_grouped_indices(lengths, size, generator=torch.Generator().manual_seed(0))
    raw_means = _mean_lengths(_groups(raw, size)[1:-1], lengths)
    raw_falls = sum(later <= earlier for earlier, later in itertools.pairwise(raw_means))
    assert raw_falls / (len(raw_means) - 1) > 0.9


def test_an_epoch_order_is_a_function_of_seed_and_epoch() -> None:
    lengths = _lengths(500)
    first, again = EpochLengthGroupedSampler(16, lengths, 3), EpochLengthGroupedSampler(16, lengths, 3)
    first.set_epoch(2)
    list(first)  # drawing an order does not move the next one (a resumed run re-creates its sampler)
    first.set_epoch(2)
    again.set_epoch(2)
    assert list(first) == list(again)
    again.set_epoch(3)
    assert list(again) != list(first) and sorted(again) == list(range(500))
