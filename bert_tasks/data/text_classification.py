"""Read labelled sentences (csv, tsv, jsonl, json, hub) into one shape: `text` and `label` strings.

Local files are parsed with the standard library rather than `datasets`' csv/json builders because every
bad row must be reported as `file:line` as the user sees it in an editor, and those builders neither
keep line numbers nor fail on a missing value (they write None and move on).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.files import json_records, read_utf8
from bert_tasks.data.hub import load_hub_split
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

FORMATS = (".csv", ".tsv", ".jsonl", ".json")


def read_text_classification(path: str | Path, text_column: str, label_column: str) -> Dataset:
    """Read a local file of labelled texts into a Dataset with string columns `text` and `label`.

    `.csv` uses standard CSV quoting; `.tsv` is GLUE style (header row, tab-separated, no quoting, so a
    `"` inside a sentence is just a character); `.jsonl` is one object per line; `.json` is either a JSON
    array of objects or JSON Lines (what `Dataset.to_json` writes). Integer labels become strings ("0").

    Raises:
        BertTasksError: Missing or empty file, bytes that are not UTF-8, a missing column, a row with
            empty text or no label, or malformed JSON, each naming `file:line`.
    """
    path = Path(path)
    content = read_utf8(path)
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        delimiter = "\t" if suffix == ".tsv" else ","
        rows = _delimited_rows(path, content, delimiter, required=(text_column, label_column))
    elif suffix in (".jsonl", ".json"):
        rows = json_records(path, content)
    else:
        raise BertTasksError(f"{path}: unsupported file type '{suffix}'; use one of {', '.join(FORMATS)}")

    texts, labels = [], []
    for where, row in rows:
        if text_column not in row or label_column not in row:
            raise BertTasksError(
                f"{where}: expected columns text_column='{text_column}' and label_column='{label_column}', "
                f"found {', '.join(map(str, row)) or 'none'}; set text_column/label_column to match the file"
            )
        texts.append(_text(row[text_column], where, text_column))
        labels.append(_label(row[label_column], where, label_column))
    if not texts:
        raise BertTasksError(f"{path}: no rows found; the file needs at least one labelled example")
    from datasets import Dataset  # deferred: every row is checked before the library loads

    return Dataset.from_dict({"text": texts, "label": labels})


def read_hub_text_classification(
    dataset_id: str, split: str, text_column: str, label_column: str
) -> Dataset | None:
    """Download one split of a hub dataset (`glue/sst2` = path `glue`, config `sst2`) as `text`/`label`.

    ClassLabel integers are mapped to their names, so labels read from the hub look like labels read
    from files and the saved model gets real names in its `id2label`. A split whose labels are all -1
    (GLUE's hidden test labels) has nothing to score: None, and the split counts as absent.
    """
    from datasets import ClassLabel, Dataset

    ds = load_hub_split(dataset_id, split, (text_column, label_column), "text_column/label_column")
    feature = ds.features[label_column]
    if isinstance(feature, ClassLabel) and max(ds[label_column], default=-1) < 0:
        return None
    if isinstance(feature, ClassLabel) and min(ds[label_column], default=0) < 0:
        raise BertTasksError(
            f"dataset={dataset_id} ({split}): some rows are unlabelled (label -1); drop them first"
        )

    labels = ds[label_column]
    names = feature.int2str(list(labels)) if isinstance(feature, ClassLabel) else labels
    # A new dataset, not `ds.map`: map would cast the named labels back to the split's ClassLabel ids.
    return Dataset.from_dict({"text": list(ds[text_column]), "label": [str(n) for n in names]})


def _delimited_rows(
    path: Path, content: str, delimiter: str, required: tuple[str, str]
) -> Iterator[tuple[str, dict[str, str]]]:
    """Yield (`file:line`, row) for each data row; the line is where the row starts in the file."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(content, newline=""), delimiter=delimiter, quoting=quoting)
    header = [name.strip() for name in next(reader)]
    if any(name not in header for name in required):
        raise BertTasksError(
            f"{path}:1: header has columns {', '.join(header)}, expected text_column='{required[0]}' and "
            f"label_column='{required[1]}'; set text_column/label_column to match the file"
        )
    kind = "tab" if delimiter == "\t" else "comma"
    line_end = reader.line_num
    try:
        for fields in reader:
            start, line_end = line_end + 1, reader.line_num
            if not fields:  # a blank line
                continue
            if len(fields) != len(header):
                raise BertTasksError(
                    f"{path}:{start}: expected {len(header)} {kind}-separated columns ({', '.join(header)}), "
                    f"found {len(fields)}; fix the row"
                )
            yield f"{path}:{start}", dict(zip(header, fields, strict=True))
    except csv.Error as e:
        raise BertTasksError(f"{path}:{reader.line_num}: {e}; fix the row") from e


def _text(value: Any, where: str, column: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BertTasksError(f"{where}: empty text in column '{column}'; fill it in or drop the row")
    return value


def _label(value: Any, where: str, column: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise BertTasksError(f"{where}: missing label in column '{column}'; give every row a label")
    return str(value).strip()
