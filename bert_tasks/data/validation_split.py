"""`validation_split=F`: carve a seeded validation set out of train, stratified where the task says so.

So a recipe whose only labelled evaluation set is the one it reports (SST-2's dev) can select its
checkpoint on rows of train and report dev as held out, and a run given only a training file still picks
its best checkpoint and stops early (`validation_split=auto`, the default: `AUTO_SHARE` of train).

The rule, simple enough to check by hand: with `stratify_by` (a raw column, e.g. sentiment's `label`),
each value with `c` rows gives `round(c * F)` of them (halves up) to validation, but never all `c`, so every
label keeps a training example; a value whose share rounds to 0 stays wholly in train (one INFO line names
them). Without it, `round(n * F)` of the `n` rows go. Which rows go is a permutation drawn from `seed`
alone: the same seed, the same split. Both parts keep the rows in their original order.

Hand-written rather than `datasets`' `train_test_split(stratify_by_column=...)`: that needs a ClassLabel
column, refuses a label with a single row instead of keeping it in train, and lets its random tie-breaks
(scikit-learn's "approximate mode") decide how many rows of each label go, so per-label sizes follow no
rule a user can check.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)


#: The `validation_split` value that carves `AUTO_SHARE` when no validation set is given (config.AUTO,
#: spelled here too: config imports the tasks, which import this module, so it cannot import config).
AUTO = "auto"
#: `validation_split=auto`: the share carved when no validation set is given. A tenth is what a model
#: selection needs on a few thousand rows (hundreds of sentences to score) and costs a tenth of the data.
AUTO_SHARE = 0.1
#: Below this many training rows auto carves nothing: ten or fewer rows to select on would pick a
#: checkpoint by noise, and a small set needs every row to learn from.
AUTO_MIN_ROWS = 100


def auto_share(train_rows: int) -> float | None:
    """The share `validation_split=auto` carves from `train_rows` rows with no validation set given."""
    return AUTO_SHARE if train_rows >= AUTO_MIN_ROWS else None


def carve_validation(
    train: Dataset, share: float, seed: int, stratify_by: str | None, source: str
) -> tuple[Dataset, Dataset]:
    """(train without the validation rows, the validation rows), by the rule above; `source` names train.

    Raises:
        BertTasksError: No row would go to validation (too few rows, or every label too rare for `share`).
    """
    order = np.random.default_rng(seed).permutation(len(train))  # the rows in the seed's order
    groups = _groups(train, order, stratify_by)
    chosen, too_rare = [], {}
    for value, rows in groups.items():
        take = min(_rounded(len(rows) * share), len(rows) - 1)
        chosen += rows[:take]
        if take == 0 and stratify_by is not None:
            too_rare[value] = len(rows)
    if not chosen:
        per = f" of each {stratify_by}" if stratify_by is not None else ""
        raise BertTasksError(
            f"{source}: validation_split={share:g} of {len(train)} training row(s){per} rounds to no "
            "validation example; raise validation_split, add rows, or give a validation_file"
        )
    if too_rare:
        logger.info(
            "validation_split=%g: %s value(s) too rare to split (%s) stay in train, unscored by validation",
            share,
            stratify_by,
            ", ".join(f"{value!r}: {count} row(s)" for value, count in sorted(too_rare.items())),
        )
    held = np.zeros(len(train), dtype=bool)
    held[chosen] = True
    return train.select(np.flatnonzero(~held)), train.select(np.flatnonzero(held))


def _groups(train: Dataset, order: np.ndarray, stratify_by: str | None) -> dict[str, list[int]]:
    """Row indexes in permutation order, per value of `stratify_by` (one group of all rows without it)."""
    if stratify_by is None:
        return {"": order.tolist()}
    values = train[stratify_by][:]
    groups: dict[str, list[int]] = {}
    for row in order.tolist():
        groups.setdefault(str(values[row]), []).append(row)
    return groups


def _rounded(x: float) -> int:
    """`x` rounded half up (Python's `round` rounds halves to even: 2.5 -> 2), as a person counts."""
    return math.floor(x + 0.5)
