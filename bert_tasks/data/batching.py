"""How batches are made: length-grouped training batches, length-sorted evaluation batches, dynamic padding.

Padding is the waste that dominates BERT fine-tuning on short sentences (SST-2 averages ~13 tokens):
grouping rows of similar length keeps batches nearly pad-free, and the collator pads each batch only to
its own longest row. Every batch also carries `row`, the index of each window in its encoded dataset, so
predictions made in any order (sorted, sharded over processes) are put back where they belong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from datasets import Dataset
from datasets.fingerprint import generate_random_fingerprint
from torch.utils.data import DataLoader
from transformers.trainer_pt_utils import LengthGroupedSampler

from bert_tasks.data.padded_batches import MODEL_INPUTS

Collate = Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]


class RowCollator:
    """The one collator path: the task's padding of the model inputs, plus the encoded row of each window.

    Bookkeeping columns (`example_id`, NER's `word_ids`) stay in the encoded dataset, where decoding
    reads them; only model inputs are padded, and `row` says where each window's logits belong.
    """

    def __init__(self, pad: Collate) -> None:
        self.pad = pad

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = torch.tensor([feature["row"] for feature in features])  # [B]
        batch = self.pad([{k: v for k, v in f.items() if k in MODEL_INPUTS} for f in features])
        batch["row"] = rows
        return batch


def with_rows(encoded: Dataset) -> Dataset:
    """Add the `row` column the collator reports back."""
    # A fresh fingerprint: hashing the column to derive one costs 0.35 s per 1,000 rows of prediction.
    return encoded.add_column("row", list(range(len(encoded))), new_fingerprint=generate_random_fingerprint())


class EpochLengthGroupedSampler(LengthGroupedSampler):
    """transformers' LengthGroupedSampler (as in group_by_length), shuffled by `seed + epoch`.

    Seeding each epoch from its number (Accelerate's dataloader calls `set_epoch`) makes the order of
    any epoch reproducible on its own, which is what lets a resumed run see the batches it would have.
    """

    def __init__(self, batch_size: int, lengths: list[int], seed: int) -> None:
        self.seed = seed
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed))

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)


def train_loader(
    encoded: Dataset, collate: Collate, batch_size: int, seed: int, processes: int = 1
) -> DataLoader:
    """Shuffled batches of similar-length rows: little padding, yet a different mix every epoch.

    Rows are grouped by the global batch (`batch_size` on each of `processes`; Accelerate hands each
    process its slice of it). transformers' sampler sizes its length groups from the batch size it is
    given, so grouping by the per-device batch would make the rows of an update depend on the number of
    processes; this way N processes train on what one process with N times the batch would.
    """
    lengths = [len(ids) for ids in encoded["input_ids"]]
    sampler = EpochLengthGroupedSampler(batch_size * processes, lengths, seed)
    return _loader(encoded, collate, batch_size, sampler)


def eval_loader(encoded: Dataset, collate: Collate, batch_size: int) -> DataLoader:
    """Batches in length order (least padding); the `row` column restores the original order."""
    lengths = [len(ids) for ids in encoded["input_ids"]]
    return _loader(encoded, collate, batch_size, sorted(range(len(encoded)), key=lengths.__getitem__))


def _loader(encoded: Dataset, collate: Collate, batch_size: int, sampler: Iterable[int]) -> DataLoader:
    # A DataLoader without a generator draws a seed from the global RNG each time it is iterated; its own
    # generator keeps the global stream (dropout) identical between a resumed and an uninterrupted run.
    return DataLoader(
        with_rows(encoded),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=RowCollator(collate),
        generator=torch.Generator().manual_seed(0),
    )
