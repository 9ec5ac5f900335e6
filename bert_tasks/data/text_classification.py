"""Read labelled sentences (csv, tsv, jsonl, json, hub) into one shape: `text` and `label` strings.

Local files are parsed with the standard library rather than `datasets`' csv/json builders because every
bad row must be reported as `file:line` as the user sees it in an editor, and those builders neither
keep line numbers nor fail on a missing value (they write None and move on).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.files import check_text, describe, is_blank, json_records, opens_json, read_utf8, shown
from bert_tasks.data.hub import load_hub_split
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

FORMATS = (".csv", ".tsv", ".jsonl", ".json")


def read_text_classification(path: str | Path, text_column: str, label_column: str) -> Dataset:
    """Read a local file of labelled texts into a Dataset with string columns `text` and `label`.

    `.csv` uses standard CSV quoting; `.tsv` is GLUE style (header row, tab-separated, no quoting, so a
    `"` inside a sentence is just a character); `.jsonl` is one object per line; `.json` is either a JSON
    array of objects or JSON Lines (what `Dataset.to_json` writes); a name without an extension (a stream
    such as `<(...)`) is JSON when its first line opens an object or array, else TSV or CSV. Numeric
    labels become their integer spelling ("1", "1.0", "01" and the JSON number 1.0 are all "1"); other
    labels are stripped strings.
    Label spellings that differ only by case or surrounding characters (`Positive`/`positive`) stay
    separate classes, with one warning listing them.

    Raises:
        BertTasksError: Unreadable, empty or non-UTF-8 file, a missing column, a row with empty (or
            invisible) text, a NUL or lone surrogate, a missing, boolean or non-integer numeric label, a
            CSV quote left open over following rows, or malformed JSON, each naming `file:line`.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix and suffix not in FORMATS:  # before reading: a pipe with an unusable name is not read
        raise BertTasksError(f"{path}: unsupported file type '{suffix}'; use one of {', '.join(FORMATS)}")
    content = read_utf8(path)
    if not suffix:  # a stream (`<(...)`, /dev/stdin) or a file without an extension: its content says
        first = content.lstrip().partition("\n")[0]
        suffix = ".jsonl" if opens_json(content) else ".tsv" if "\t" in first else ".csv"
    if suffix in (".csv", ".tsv"):
        delimiter = "\t" if suffix == ".tsv" else ","
        rows = _delimited_rows(path, content, delimiter, required=(text_column, label_column))
    else:
        rows = json_records(path, content)

    texts, labels = [], []
    for where, row in rows:
        if text_column not in row or label_column not in row:
            raise BertTasksError(
                f"{where}: expected columns text_column='{text_column}' and label_column='{label_column}', "
                f"found {', '.join(map(shown, row)) or 'none'}; "
                "set text_column/label_column to match the file"
            )
        texts.append(_text(row[text_column], where, text_column))
        labels.append(_label(row[label_column], where, label_column))
    if not texts:
        raise BertTasksError(f"{path}: no rows found; the file needs at least one labelled example")
    _warn_near_duplicate_labels(path, labels)
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
            f"{path}:1: header has columns {', '.join(map(shown, header))}, expected "
            f"text_column='{required[0]}' and label_column='{required[1]}'; "
            "set text_column/label_column to match the file"
        )
    kind = "tab" if delimiter == "\t" else "comma"
    line_end = reader.line_num
    try:
        for fields in reader:
            start, line_end = line_end + 1, reader.line_num
            if not fields:  # a blank line
                continue
            _check_quotes_closed(path, start, fields, delimiter)
            if len(fields) != len(header):
                raise BertTasksError(
                    f"{path}:{start}: expected {len(header)} {kind}-separated columns ({', '.join(header)}), "
                    f"found {len(fields)}; fix the row"
                )
            yield f"{path}:{start}", dict(zip(header, fields, strict=True))
    except csv.Error as e:
        if "field larger than field limit" in str(e):  # a quote left open swallowed the rest of the file
            raise BertTasksError(_open_quote(f"{path}:{line_end + 1}")) from None
        raise BertTasksError(f"{path}:{reader.line_num}: {e}; fix the row") from e


def _open_quote(where: str) -> str:
    return (
        f"{where}: a quote opened here is not closed before the following rows, so they were read as one "
        'field; close the quote, or write a quote inside a field as ""'
    )


def _check_quotes_closed(path: Path, line: int, fields: list[str], delimiter: str) -> None:
    """Refuse a quoted field that swallowed the rows after it (its quote was never closed, or closed late).

    The sign: the field spans lines, and a line after its first holds the delimiter, i.e. looks like a
    row of its own. A multi-line field without delimiters on its later lines is legitimate CSV.
    """
    for field in fields:
        later_lines = _LINE_BREAK.split(field)[1:]
        if any(delimiter in part for part in later_lines):
            raise BertTasksError(_open_quote(f"{path}:{line}"))
        line += len(later_lines)


def _text(value: Any, where: str, column: str) -> str:
    if isinstance(value, (bool, int, float, list, dict)):
        found = describe(value)
        raise BertTasksError(
            f"{where}: text is {found}, not a string, in column '{column}'; write the text as a JSON string"
        )
    if not isinstance(value, str) or is_blank(value):
        raise BertTasksError(f"{where}: empty text in column '{column}'; fill it in or drop the row")
    return check_text(value, where, f"the text in column '{column}'")


#: Line ends as the csv module counts them (its `line_num`).
_LINE_BREAK = re.compile("\r\n|\r|\n")
#: A label spelled as an integer: `1`, `01`, `+1`, `-2`, `1.0`, `1.`.
_INTEGER_LABEL = re.compile(r"[+-]?[0-9]+(?:\.0*)?", re.ASCII)


def _label(value: Any, where: str, column: str) -> str:
    """The label as a class name: strings stripped, integer spellings normalised ("01", "1.0", 1.0 -> "1")."""
    if isinstance(value, bool):
        raise BertTasksError(
            f"{where}: label {json.dumps(value)} (a boolean) in column '{column}' is not a class name; "
            "write labels as strings or integers"
        )
    if isinstance(value, float):
        if not value.is_integer():
            raise BertTasksError(
                f"{where}: label {json.dumps(value)} (a float) in column '{column}' is not a class; "
                "write labels as strings or integers"
            )
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, dict)):
        raise BertTasksError(
            f"{where}: label is {describe(value)} in column '{column}', not a class name; "
            "write labels as strings or integers"
        )
    if not isinstance(value, str) or is_blank(value):
        raise BertTasksError(f"{where}: missing label in column '{column}'; give every row a label")
    label = check_text(value.strip(), where, f"the label in column '{column}'")
    return str(int(label.split(".")[0])) if _INTEGER_LABEL.fullmatch(label) else label


def _warn_near_duplicate_labels(path: Path, labels: list[str]) -> None:
    """One warning when label spellings differ only by case or surrounding characters (kept apart)."""
    counts = Counter(labels)
    groups: dict[str, list[str]] = {}
    for label in counts:
        groups.setdefault(_label_key(label), []).append(label)
    clashes = [sorted(group) for group in groups.values() if len(group) > 1]
    if clashes:
        listed = "; ".join(" / ".join(f"{label!r} ({counts[label]})" for label in g) for g in clashes)
        logger.warning(
            "%s: label spellings that differ only by case or surrounding characters are separate classes: "
            "%s; if they mean one class, spell them the same in the file",
            path,
            listed,
        )


def _label_key(label: str) -> str:
    """What is left of a label without case and without the non-alphanumeric characters around it."""
    if _INTEGER_LABEL.fullmatch(label):
        return label  # -1 and 1 are different numbers, not two spellings of one
    core = label.casefold()
    start, end = 0, len(core)
    while start < end and not core[start].isalnum():
        start += 1
    while end > start and not core[end - 1].isalnum():
        end -= 1
    return core[start:end] or core
