"""rows_digest: equal rows give equal digests however the dataset was built; any change in a value, a
list's split, the order, a type or a null gives another."""

from __future__ import annotations

from datasets import Dataset, Value

from bert_tasks.data.fingerprint import rows_digest

ROWS = {
    "input_ids": [[101, 7, 8, 102], [101, 9, 102], [101, 102]],
    "labels": [0, 1, 1],
    "text": ["a b", "c", ""],
}


def test_equal_rows_give_equal_digests_however_they_were_built() -> None:
    built = Dataset.from_dict(ROWS)
    split = Dataset.from_dict({name: values * 2 for name, values in ROWS.items()}).select([3, 4, 5])
    reordered_columns = Dataset.from_dict(dict(reversed(ROWS.items())))
    assert rows_digest(built) == rows_digest(split) == rows_digest(reordered_columns)
    assert rows_digest(built) == rows_digest(Dataset.from_list(list(built)))


def test_any_change_gives_another_digest() -> None:
    digest = rows_digest(Dataset.from_dict(ROWS))
    changed = [
        ROWS | {"labels": [0, 1, 0]},
        ROWS | {"input_ids": [[101, 7, 8], [102, 101, 9, 102], [101, 102]]},  # the same ids, split elsewhere
        ROWS | {"text": ["a b", "c", " "]},
        ROWS | {"text": ["a", "b c", ""]},
        ROWS | {"text": ["a b", "c", None]},
    ]
    for rows in changed:
        assert rows_digest(Dataset.from_dict(rows)) != digest, rows
    assert rows_digest(Dataset.from_dict(ROWS).select([1, 0, 2])) != digest
    assert rows_digest(Dataset.from_dict(ROWS).cast_column("labels", Value("float32"))) != digest


def test_a_large_split_is_hashed_in_pieces_with_the_same_result() -> None:
    rows = {"input_ids": [[i, i + 1] for i in range(25_000)], "labels": [i % 3 for i in range(25_000)]}
    whole = Dataset.from_dict(rows)
    assert rows_digest(whole) == rows_digest(whole.select(range(25_000)))
    assert rows_digest(whole) != rows_digest(whole.select(range(24_999)))
