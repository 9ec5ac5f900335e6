"""A digest of an encoded split's rows, in order: what `--resume` compares to know that a run reads the
training rows its checkpoint was trained on.

A file's bytes would miss data given in memory or read from the hub, and a tokenizer that encodes the
same file otherwise; the encoded rows are what make the batches, so they are what is hashed: each
column's values and list lengths, read through Arrow's offsets (a selection or a split of a dataset
shares its parent's buffers, so hashing the buffers themselves would tell equal rows apart).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
from datasets import Dataset

#: Rows hashed at a time: bounds the memory a large corpus needs for its digest.
_ROWS_PER_PIECE = 10_000


def rows_digest(dataset: Dataset) -> str:
    """SHA-256 of the dataset's rows in order, its columns in name order."""
    digest = hashlib.sha256()
    table = dataset.with_format("arrow")
    for start in range(0, len(dataset), _ROWS_PER_PIECE):
        piece: pa.Table = table[start : start + _ROWS_PER_PIECE]
        for name in sorted(piece.column_names):
            digest.update(name.encode() + b"\0")
            _hash_values(digest, piece.column(name).combine_chunks())
    return digest.hexdigest()


def _hash_values(digest: Any, values: pa.Array) -> None:
    """Feed one array's type, nulls and values to `digest`; lists by their lengths, then their items."""
    digest.update(str(values.type).encode() + b"\0")
    if values.null_count:
        digest.update(values.is_null().to_numpy(zero_copy_only=False).tobytes())
    kind = values.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        digest.update(values.value_lengths().fill_null(-1).to_numpy(zero_copy_only=False).tobytes())
        _hash_values(digest, values.flatten())
    elif pa.types.is_struct(kind):
        for field in values.flatten():
            _hash_values(digest, field)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        for item in values.to_pylist():  # texts: a few per row at most, so Python's loop is cheap here
            digest.update(b"\1" if item is None else (item.encode() if isinstance(item, str) else item))
            digest.update(b"\0")
    else:
        digest.update(values.fill_null(0).to_numpy(zero_copy_only=False).tobytes())
