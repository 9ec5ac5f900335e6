"""`class_weights`: one loss weight per label, given as a list or computed from the training labels.

Counting is task-blind: every task encodes its labels as ids with -100 where nothing is trained
(`Task.encode`), one id per window for sentiment and one per sub-token for NER, so the counts are those
of what the loss sees (NER: every trained tag position, `O` included). Nothing here imports torch: a
list of the wrong length is refused in `train()` before the model loads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bert_tasks.config import AUTO
from bert_tasks.errors import BertTasksError

#: The label id of a position the loss skips (transformers' and torch's ignore_index).
IGNORED = -100


@dataclass(frozen=True)
class ClassWeights:
    """The resolved weights of a run, in label order, with the training counts they came from."""

    labels: list[str]
    weights: list[float]
    counts: list[int]
    setting: str  # "auto" or "given"

    def describe(self) -> str:
        """One line naming each label's weight and count: logged, and noted in recipe.yaml."""
        how = "inverse square root of the counts" if self.setting == AUTO else "as given"
        each = ", ".join(
            f"{label} {weight:.4g} ({count:,})"
            for label, weight, count in zip(self.labels, self.weights, self.counts, strict=True)
        )
        return f"class weights ({how}; label weight (trained positions)): {each}"


def check_class_weights(setting: list[float] | str | None, labels: Sequence[str]) -> None:
    """Refuse a weight list whose length is not the label count, naming the labels in their order."""
    if isinstance(setting, list) and len(setting) != len(labels):
        raise BertTasksError(
            f"class_weights has {len(setting)} weight(s) but the training data has {len(labels)} labels "
            f"({', '.join(labels)}); give one weight per label in this order, or class_weights=auto"
        )


def resolve_class_weights(
    setting: list[float] | str | None, labels: Sequence[str], encoded_labels: Iterable[int | Sequence[int]]
) -> ClassWeights | None:
    """The run's weights (None: no class weights, the head's own loss); `encoded_labels`: train's labels."""
    if setting is None:
        return None
    check_class_weights(setting, labels)
    counts = label_counts(encoded_labels, len(labels))
    weights = inverse_sqrt_weights(counts) if setting == AUTO else [float(w) for w in setting]
    return ClassWeights(list(labels), weights, counts, AUTO if setting == AUTO else "given")


def label_counts(encoded_labels: Iterable[int | Sequence[int]], num_labels: int) -> list[int]:
    """How often each label id is a target: an id (sentiment) or a list (NER) per row, -100 skipped."""
    rows = (row if isinstance(row, Sequence) else (row,) for row in encoded_labels)
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64)
    return np.bincount(ids[ids != IGNORED], minlength=num_labels).tolist()


def inverse_sqrt_weights(counts: Sequence[int]) -> list[float]:
    """w_c = k / sqrt(n_c), with k such that the count-weighted mean weight sum_c n_c w_c / N is 1.

    Why the square root: plain inverse frequency (sklearn's "balanced") gives BC5CDR's rarest tag,
    I-Chemical (1,900 of 118,170 training words), 55 times the weight of `O`, so its few positions weigh
    as much in the loss as all of `O`'s; the square root halves the imbalance on a log scale (7.4 times
    there; 1:9 labels get weights 3:1), so rare types count more without outweighing the rest.

    Why the normalisation: a weight of 1 is an average trained position's, so weights read against 1 and
    a batch's weight sum stays near its count (torch's weighted mean divides by that sum, so the loss
    keeps its scale). A label never trained on is counted once: its weight stays finite (it is never a
    target, so it never enters the loss).
    """
    seen = [max(int(n), 1) for n in counts]
    scale = sum(seen) / sum(math.sqrt(n) for n in seen)
    return [scale / math.sqrt(n) for n in seen]
