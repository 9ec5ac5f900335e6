"""In-memory data for the library (`train(cfg, data=...)`, `evaluate_data`): records, DataFrames, Datasets.

Each split is a list of records (dicts), a pandas DataFrame or a `datasets.Dataset`; `data` is one split
(the training data) or a mapping of split name -> split (a dict, or a `DatasetDict`). Every form becomes
the same stream of `(where, record)` pairs that JSON files give, so a task reads it with its file checks
and messages, `where` being e.g. `train data (in memory), row 12` (rows count from 0, as `data[12]`,
`df.iloc[12]`). Columns are named by the same config keys as files (text_column/label_column,
tokens_column/tag_column). pandas is never imported here: a DataFrame is recognised only when pandas is
already loaded (it must be, to have made one). Nothing is written to disk.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

#: `(where, record)` pairs, the shape `json_records` gives a file's records in.
Records = Iterator[tuple[str, dict[str, Any]]]
SPLITS = ("train", "validation", "test")
_FORMS = "a list of records (dicts), a pandas DataFrame or a datasets.Dataset"


def in_memory_source(split: str) -> str:
    """How messages and the model card name an in-memory split: `train data (in memory)`."""
    return f"{split} data (in memory)"


def split_data(data: Any) -> dict[str, Any]:
    """`data` as split name -> one split's data, each checked to be a supported form with rows.

    Raises:
        BertTasksError: An unknown split name, a form that is not one of the three, or a split without rows.
    """
    splits = dict(data) if isinstance(data, Mapping) else {"train": data}
    unknown = [name for name in splits if name not in SPLITS]
    if unknown:
        raise BertTasksError(
            f"data: unknown split {unknown[0]!r}; name the splits {', '.join(SPLITS)} (e.g. rename 'dev' "
            "to 'validation')"
        )
    for name, split in splits.items():
        if _form(split) is None:
            raise BertTasksError(
                f"{in_memory_source(name)}: a {type(split).__name__}, not {_FORMS}; pass one of those"
            )
        if len(split) == 0:
            raise BertTasksError(f"{in_memory_source(name)}: no rows; give at least one labelled example")
    return {name: splits[name] for name in SPLITS if name in splits}


def records(split: Any, source: str) -> Records:
    """Each row of one split as `(where, record)`, values as plain Python (a Dataset's ClassLabel ids as
    their names; a DataFrame's numpy values as Python ones, its missing values as None)."""
    form = _form(split)
    if form == "list":
        for row, record in enumerate(split):
            where = f"{source}, row {row}"
            if not isinstance(record, Mapping):
                raise BertTasksError(
                    f"{where}: a {type(record).__name__}, not a record (a dict of column -> value); "
                    "give every row as a dict"
                )
            yield where, dict(record)
    elif form == "dataframe":
        for row, record in enumerate(split.to_dict("records")):
            yield f"{source}, row {row}", {str(k): _plain(v) for k, v in record.items()}
    else:
        named = _class_names(split)
        for row, record in enumerate(split):
            yield f"{source}, row {row}", {k: named[k](v) if k in named else v for k, v in record.items()}


def _form(split: Any) -> str | None:
    """`list`, `dataframe`, `dataset`, or None for anything else."""
    if isinstance(split, (list, tuple)):
        return "list"
    pandas, datasets = sys.modules.get("pandas"), sys.modules.get("datasets")
    if pandas is not None and isinstance(split, pandas.DataFrame):
        return "dataframe"
    if datasets is not None and isinstance(split, datasets.Dataset):
        return "dataset"
    return None


def _plain(value: Any) -> Any:
    """A DataFrame cell as plain Python: numpy scalars and arrays unwrapped, NaN/None/NA/NaT as None."""
    import numpy as np  # numpy is loaded with pandas

    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (list, tuple, dict, str, bool, int)):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return None if sys.modules["pandas"].isna(value) else value


def _class_names(data: Dataset) -> dict[str, Callable[[Any], Any]]:
    """Per ClassLabel column (or list of ClassLabel), how an id becomes its name; -1 (no label) is None,
    and an id out of range stays a number for the reader to judge."""
    from datasets import ClassLabel

    def name_of(feature: ClassLabel) -> Callable[[Any], Any]:
        def name(i: Any) -> Any:
            if isinstance(i, int) and 0 <= i < feature.num_classes:
                return feature.int2str(i)
            return None if i == -1 else i

        return name

    named: dict[str, Callable[[Any], Any]] = {}
    for column, feature in data.features.items():
        inner = getattr(feature, "feature", None)
        if isinstance(feature, ClassLabel):
            named[column] = name_of(feature)
        elif isinstance(inner, ClassLabel):
            one = name_of(inner)
            named[column] = lambda ids, one=one: [one(i) for i in ids] if isinstance(ids, list) else ids
    return named
