"""Rows held as plain lists by column name, read as tasks read a `datasets.Dataset`.

What prediction hands a task's `decode` for a batch of texts: building a Dataset (and mapping the
encoding over it) costs milliseconds a call, as much as predicting a few short texts; a server pays
it on every micro-batch. A task reads a Table as it reads a Dataset: `table["column"]` (a list),
`len(table)` (rows), `column_names`, `"column" in table`. Written here because pyarrow's and pandas'
tables hand back their own column types, not the lists the tasks' encoding and decoding take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Table:
    """Equal-length columns, as plain lists, by name."""

    def __init__(self, columns: Mapping[str, list[Any]]) -> None:
        lengths = {name: len(values) for name, values in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of unequal lengths: {lengths}")
        self.columns = dict(columns)
        self.rows = next(iter(lengths.values()), 0)

    def __getitem__(self, name: str) -> list[Any]:
        return self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __len__(self) -> int:
        return self.rows

    @property
    def column_names(self) -> list[str]:
        return list(self.columns)
