"""Read labelled sentences (csv, tsv, jsonl, json, hub) into one shape: `text` and `label` strings.

Local files are parsed with the standard library rather than `datasets`' csv/json builders because every
bad row must be reported as `file:line` as the user sees it in an editor, and those builders neither
keep line numbers nor fail on a missing value (they write None and move on).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.columns import (
    COLUMN_KEYS,
    DEFAULT_LABEL,
    DEFAULT_TEXT,
    check_distinct,
    choose_columns,
    column_indexes,
    positions,
)
from bert_tasks.data.files import (
    check_text,
    describe,
    is_blank,
    json_records,
    open_quote,
    opens_json,
    read_utf8,
    shown,
)
from bert_tasks.data.hub import load_hub_split
from bert_tasks.data.in_memory import Records
from bert_tasks.data.label_values import (
    INTEGER_LABEL,
    classes_of,
    is_set_form,
    read_label,
    set_items,
    settle_auto,
)
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

#: The file formats `format=` names for sentiment, and which one each extension means under `auto`.
FILE_FORMATS = ("auto", "csv", "tsv", "json")
SUFFIX_FORMATS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "json", ".json": "json"}
_DELIMITERS = {"csv": ",", "tsv": "\t"}

#: (`file:line`, text value, second text value or None, label value) of one row, as the file holds them.
Row = tuple[str, Any, Any, Any]
#: The column names one reading reports its values under: text, label, and the pair's second text or None.
Names = tuple[str, str, str | None]


def read_text_classification(
    path: str | Path,
    text_column: str = DEFAULT_TEXT,
    label_column: str = DEFAULT_LABEL,
    *,
    header: bool = True,
    file_format: str = "auto",
    pair_column: str | None = None,
    labels: str = "class",
) -> Dataset:
    """Read a local file of labelled texts into a Dataset with columns `text`, `label` (and `text_pair`).

    `csv` uses standard CSV quoting; `tsv` (`.tsv`, `.txt`) is GLUE style (tab-separated, no quoting, so
    a `"` inside a sentence is just a character); `json` (`.jsonl`, `.json`) is JSON Lines or a JSON array
    of objects. `format` other than `auto` reads any extension as that format; a name without an
    extension (a stream such as `<(...)`) is JSON when its first line opens an object or array, else TSV
    (a tab in the first line) or CSV. CSV/TSV files open with a header row unless `header=False`; then
    the columns are 0-based indexes (data/columns.py has the rule, and the guess of a column left at its
    default name). `pair_column` names the second text of a text pair (an aspect), checked as the text
    is. `labels` is the label shape (`data/label_values.py`): `class` strings, `set` lists of them,
    `number` floats, or `auto` (sets when the file writes any label as one, else classes). Class names
    spelled two ways that read as one (`1`/`1.0`, `True`/`true`) get one warning, and spellings that
    differ only by case or surrounding characters (`Positive`/`positive`) stay separate with another.

    Raises:
        BertTasksError: Unreadable, empty or non-UTF-8 file, a missing column, a column index out of range,
            a headerless file whose label column holds text, a row with empty (or invisible) text, a NUL or
            lone surrogate, a missing label or one its shape does not read, a CSV quote left open over
            following rows, or malformed JSON, each naming `file:line`.
    """
    path = Path(path)
    # Before reading: a pipe with no usable name, or a bad index, is not read for nothing.
    kind = _kind(path, file_format)
    wanted = (text_column, label_column, pair_column)
    indexes = column_indexes(*wanted) if not header and kind != "json" else None
    content = read_utf8(path)
    kind = kind or _kind_of_content(content)
    indexes = None if kind == "json" else indexes
    if kind == "json":
        names, rows = _record_rows(str(path), json_records(path, content), wanted)
    elif indexes is None:
        names, rows = _header_rows(path, content, _DELIMITERS[kind], wanted)
    else:
        shown_indexes = tuple(str(index) for index in indexes)
        names = (shown_indexes[0], shown_indexes[1], shown_indexes[2] if pair_column is not None else None)
        rows = _headerless_rows(path, content, _DELIMITERS[kind], indexes)
    texts, pairs, values = _checked(str(path), names, rows, labels)
    if not texts:
        raise BertTasksError(f"{path}: no rows found; the file needs at least one labelled example")
    if indexes is not None and labels == "class":
        _check_label_column(path, texts, values, indexes)
    return _dataset(str(path), texts, pairs, values)


def read_records(
    source: str,
    records: Records,
    text_column: str,
    label_column: str,
    pair_column: str | None = None,
    labels: str = "class",
) -> Dataset:
    """In-memory records (`data/in_memory.py`) as `text`/`label` (and `text_pair`), by a JSON file's checks
    and messages."""
    names, rows = _record_rows(source, records, (text_column, label_column, pair_column))
    return _dataset(source, *_checked(source, names, rows, labels))


def _dataset(source: str, texts: list[str], pairs: list[str] | None, labels: list[Any]) -> Dataset:
    """The rows as a Dataset of the reader's shape: `text`, (`text_pair`,) `label` as class strings, lists
    of them, or floats; near-duplicate class spellings warned about first."""
    from datasets import Dataset, Features, Sequence, Value  # deferred: every row is checked first

    _warn_near_duplicate_labels(source, [name for label in labels for name in classes_of(label)])
    columns: dict[str, list[Any]] = {"text": texts, **({"text_pair": pairs} if pairs is not None else {})}
    features = {column: Value("string") for column in columns}
    first = labels[0] if labels else ""
    label = Value("float64") if isinstance(first, float) else Value("string")
    label = Sequence(Value("string")) if isinstance(first, list) else label
    return Dataset.from_dict({**columns, "label": labels}, features=Features({**features, "label": label}))


def _checked(
    source: str, names: Names, rows: Iterator[Row], labels: str
) -> tuple[list[str], list[str] | None, list[Any]]:
    """Every row's texts and label checked and normalised, with one warning for class spellings merged."""
    text_name, label_name, pair_name = names
    texts: list[str] = []
    pairs: list[str] | None = [] if pair_name is not None else None
    values: list[Any] = []
    spellings: Counter[tuple[str, str]] = Counter()
    for where, text, pair, label in rows:
        texts.append(_text(text, where, text_name))
        if pairs is not None:
            pairs.append(_text(pair, where, pair_name))
        values.append(read_label(label, where, label_name, labels))
        for name, written in zip(classes_of(values[-1]), _written_classes(label, labels), strict=False):
            spellings[name, written] += 1
    _warn_merged_spellings(source, spellings)
    return texts, pairs, settle_auto(values) if labels == "auto" else values


def _written_classes(value: Any, labels: str) -> list[str]:
    """How the file spells each class of a label (`_spelling`), in the order `classes_of` gives them."""
    if isinstance(value, list):
        return [_spelling(item) for item in value]
    if labels in ("set", "auto") and isinstance(value, str) and is_set_form(value):
        return [_spelling(item) for item in set_items(value)]
    return [_spelling(value)]


def _kind(path: Path, file_format: str) -> str | None:
    """`csv`, `tsv` or `json`: `file_format` when given, else the extension's; None for a name without
    one (a stream such as `<(...)`, /dev/stdin), whose content decides (`_kind_of_content`)."""
    if file_format != "auto":
        if file_format not in FILE_FORMATS:
            raise BertTasksError(
                f"format={shown(file_format)} is not a sentiment format; use one of {', '.join(FILE_FORMATS)}"
            )
        return file_format
    suffix = path.suffix.lower()
    if not suffix:
        return None
    if suffix not in SUFFIX_FORMATS:
        found = f"'{suffix}'" if suffix else "(no extension)"
        raise BertTasksError(
            f"{path}: unsupported file type {found}; use one of {', '.join(SUFFIX_FORMATS)}, or name the "
            "format (format=csv, tsv or json)"
        )
    return SUFFIX_FORMATS[suffix]


def _kind_of_content(content: str) -> str:
    """JSON when the first line opens an object or array, else TSV (a tab in the first line) or CSV."""
    if opens_json(content):
        return "json"
    return "tsv" if "\t" in content.lstrip().partition("\n")[0] else "csv"


def read_hub_text_classification(
    dataset_id: str,
    split: str,
    text_column: str,
    label_column: str,
    pair_column: str | None = None,
    labels: str = "class",
) -> Dataset | None:
    """Download one split of a hub dataset (`glue/sst2` = path `glue`, config `sst2`) as `text`/`label`
    (and `text_pair` from `pair_column`).

    ClassLabel integers (and lists of them, as multi-label sets such as go_emotions' store) are mapped to
    their names, so labels read from the hub look like labels read from files and the saved model gets
    real names in its `id2label`; each label is then read by its shape (`labels`) with `row N` in errors.
    A split whose labels are all -1 (GLUE's hidden test labels) has nothing to score: None, and the split
    counts as absent.
    """
    from datasets import ClassLabel

    check_distinct(f"dataset={dataset_id} ({split})", (text_column, label_column, pair_column))
    columns = [column for column in (text_column, label_column, pair_column) if column is not None]
    ds = load_hub_split(dataset_id, split, columns, "text_column/label_column/text_pair_column")
    feature = ds.features[label_column]
    if isinstance(feature, ClassLabel) and max(ds[label_column], default=-1) < 0:
        return None
    if isinstance(feature, ClassLabel) and min(ds[label_column], default=0) < 0:
        raise BertTasksError(
            f"dataset={dataset_id} ({split}): some rows are unlabelled (label -1); drop them first"
        )
    inner = getattr(feature, "feature", None)
    values: list[Any] = list(ds[label_column])
    if isinstance(feature, ClassLabel):
        values = feature.int2str(values)
    elif isinstance(inner, ClassLabel):
        values = [inner.int2str(list(ids)) for ids in values]
    where = f"dataset={dataset_id} ({split})"
    read = [read_label(value, f"{where}, row {n}", label_column, labels) for n, value in enumerate(values)]
    pairs = list(ds[pair_column]) if pair_column is not None else None
    # A new dataset, not `ds.map`: map would cast the named labels back to the split's ClassLabel ids.
    return _dataset(where, list(ds[text_column]), pairs, settle_auto(read) if labels == "auto" else read)


def _header_rows(path: Path, content: str, delimiter: str, wanted: Names) -> tuple[Names, Iterator[Row]]:
    """The (text, label, pair) column names, and each data row's values, of a file with a header row."""
    text_column, label_column, pair_column = wanted
    lines = _delimited_lines(path, content, delimiter)
    line, header = next(lines, (1, []))
    header = [name.strip() for name in header]
    names = choose_columns(f"{path}", header, text_column, label_column)
    check_distinct(f"{path}:{line}", (*(names or (text_column, label_column)), pair_column))
    if names is None or (pair_column is not None and pair_column not in header):
        expected = f"text_column='{text_column}' and label_column='{label_column}'"
        expected += f" and text_pair_column='{pair_column}'" if pair_column is not None else ""
        raise BertTasksError(
            f"{path}:{line}: header has columns {', '.join(map(shown, header))}, expected {expected}; "
            f"set {_settings(pair_column)} to match the file (or header=false if it has no header row)"
        )
    read = [name for name in (*names, pair_column) if name is not None]
    twice = next((name for name in read if header.count(name) > 1), None)
    if twice is not None:  # which of them to read would be a guess
        raise BertTasksError(
            f"{path}:{line}: the header names column {twice!r} {header.count(twice)} times; rename all "
            "but one of them, or set text_column/label_column to another column"
        )
    at = [header.index(name) for name in read]

    def rows() -> Iterator[Row]:
        for start, fields in lines:
            _check_width(path, start, fields, len(header), delimiter, f" ({', '.join(header)})")
            yield _row(f"{path}:{start}", fields, at)

    return (names[0], names[1], pair_column), rows()


def _headerless_rows(path: Path, content: str, delimiter: str, indexes: tuple[int, ...]) -> Iterator[Row]:
    """Each row's values at the column indexes; every row has as many columns as the first."""
    width = 0
    for start, fields in _delimited_lines(path, content, delimiter):
        if not width:
            width = len(fields)
            at = positions(indexes, width, f"{path}:{start}", _KIND[delimiter])
        _check_width(path, start, fields, width, delimiter, " (as on the first row; header=false)")
        yield _row(f"{path}:{start}", fields, at)


def _settings(pair_column: str | None) -> str:
    """The config keys that name the columns, as an error message names them."""
    return "text_column/label_column" + ("/text_pair_column" if pair_column is not None else "")


def _row(where: str, fields: Sequence[Any], at: Sequence[int]) -> Row:
    """(where, text, pair or None, label) from a row's fields at (text, label[, pair]) positions."""
    return where, fields[at[0]], fields[at[2]] if len(at) > 2 else None, fields[at[1]]


_KIND = {"\t": "tab", ",": "comma"}


def _check_width(path: Path, line: int, fields: list[str], width: int, delimiter: str, which: str) -> None:
    if len(fields) != width:
        raise BertTasksError(
            f"{path}:{line}: expected {width} {_KIND[delimiter]}-separated columns{which}, "
            f"found {len(fields)}; fix the row"
        )


def _delimited_lines(path: Path, content: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """Yield (line, fields) for each non-blank row, header included; the line is where the row starts."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(content, newline=""), delimiter=delimiter, quoting=quoting)
    line_end = reader.line_num
    try:
        for fields in reader:
            start, line_end = line_end + 1, reader.line_num
            if not fields:  # a blank line
                continue
            _check_quotes_closed(path, start, fields, delimiter)
            yield start, fields
    except csv.Error as e:
        if "field larger than field limit" in str(e):  # a quote left open swallowed the rest of the file
            raise BertTasksError(open_quote(f"{path}:{line_end + 1}")) from None
        raise BertTasksError(f"{path}:{reader.line_num}: {e}; fix the row") from e


def _record_rows(source: str, records: Records, wanted: Names) -> tuple[Names, Iterator[Row]]:
    """The (text, label, pair) keys, chosen from the first record's, and each record's values under them."""
    text_column, label_column, pair_column = wanted
    first = next(records, None)
    if first is None:
        return wanted, iter(())
    names = choose_columns(source, list(first[1]), text_column, label_column) or (text_column, label_column)
    check_distinct(first[0], (*names, pair_column))
    keys = [key for key in (*names, pair_column) if key is not None]

    def rows() -> Iterator[Row]:
        for where, record in itertools.chain([first], records):
            if any(key not in record for key in keys):
                expected = " and ".join(
                    f"{setting}='{key}'" for setting, key in zip(COLUMN_KEYS, keys, strict=False)
                )
                raise BertTasksError(
                    f"{where}: expected columns {expected}, found {', '.join(map(shown, record)) or 'none'}; "
                    f"set {_settings(pair_column)} to match the data"
                )
            yield _row(where, [record[key] for key in keys], [0, 1, 2][: len(keys)])

    return (names[0], names[1], pair_column), rows()


def _check_quotes_closed(path: Path, line: int, fields: list[str], delimiter: str) -> None:
    """Refuse a quoted field that swallowed the rows after it (its quote was never closed, or closed late).

    The sign: the field spans lines, and a whole line inside it (neither its first nor its last, which a
    quote opens or closes) holds the delimiter, i.e. looks like a row of its own. A multi-line field
    without delimiters on such lines is legitimate CSV ("I love it\nreally, truly" has its comma on the
    last line, where the quote closes).
    """
    for field in fields:
        later_lines = _LINE_BREAK.split(field)[1:]
        if any(delimiter in part for part in later_lines[:-1]):
            raise BertTasksError(open_quote(f"{path}:{line}"))
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


def _spelling(value: Any) -> str:
    """How the file spells a label: a string as written (stripped), a JSON number or boolean as JSON does."""
    return value.strip() if isinstance(value, str) else json.dumps(value)


def _warn_merged_spellings(source: str, spellings: Counter[tuple[str, str]]) -> None:
    """One warning when a label is spelled two ways that `_label` reads as one (`1` and `1.0`)."""
    ways: dict[str, list[str]] = {}
    for label, spelling in spellings:
        ways.setdefault(label, []).append(spelling)
    merged = {label: sorted(found) for label, found in ways.items() if len(found) > 1}
    if merged:
        listed = "; ".join(
            " and ".join(f"{shown(s)} ({spellings[label, s]})" for s in found) + f" as {label!r}"
            for label, found in sorted(merged.items())
        )
        logger.warning(
            "%s: label spellings read as one label: %s; if they are different classes, name them apart",
            source,
            listed,
        )


#: A headerless label column holds text when most of its values are several words and most differ.
_TEXT_LIKE_SHARE = 0.5


def _check_label_column(path: Path, texts: list[str], labels: list[str], indexes: tuple[int, int]) -> None:
    """Refuse a headerless file read with its columns the wrong way round (e.g. `label<TAB>text`).

    The signs, neither of which a real label column shows: most labels are several words and most are
    different, or every text is a number while the labels are not.
    """
    worded = [label for label in labels if len(label.split()) > 1]
    distinct = len(set(labels))
    text_like = len(worded) > len(labels) * _TEXT_LIKE_SHARE and distinct > len(labels) * _TEXT_LIKE_SHARE
    numbers = all(INTEGER_LABEL.fullmatch(text.strip()) for text in texts)
    if not text_like and not (numbers and not all(INTEGER_LABEL.fullmatch(label) for label in labels)):
        return
    text_at, label_at = indexes
    why = (
        f"{len(worded)} of {len(labels)} labels are several words, {distinct} different"
        if text_like
        else f"every text in column {text_at} is a number"
    )
    example = repr((worded or labels)[0][:40])
    raise BertTasksError(
        f"{path}: label column {label_at} holds text, not labels ({why}, e.g. {example}); if the columns "
        f"are the other way round, set text_column={label_at} label_column={text_at}"
    )


def _warn_near_duplicate_labels(source: str, labels: list[str]) -> None:
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
            "%s; if they mean one class, spell them the same in the data",
            source,
            listed,
        )


def _label_key(label: str) -> str:
    """What is left of a label without case and without the non-alphanumeric characters around it."""
    if INTEGER_LABEL.fullmatch(label):
        return label  # -1 and 1 are different numbers, not two spellings of one
    core = label.casefold()
    start, end = 0, len(core)
    while start < end and not core[start].isalnum():
        start += 1
    while end > start and not core[end - 1].isalnum():
        end -= 1
    return core[start:end] or core
