"""Which column of a sentiment file holds the text and which the label: by name, by index, or by guess.

- With a header (CSV/TSV header row, JSON keys) the columns are the configured names. When a name is
  left at its default (`text`, `label`) and the file lacks it, the one column whose name is a common
  spelling of it (`sentence`, `review`, ... / `sentiment`, `polarity`, ...) is taken, with one INFO line;
  none or several such columns stay an error, so nothing is guessed between two candidates.
- Without one (`header=false`) the columns are 0-based indexes, negative from the end; the default names
  stand for text 0 and label 1, the `text<TAB>label` layout most headerless public sets ship in.
- A text pair's second text (`text_pair_column`, e.g. the aspect) is never guessed: its header name or
  JSON key is taken as given, and a headerless file names its index (`text_pair_column=2`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from bert_tasks.errors import BertTasksError

logger = logging.getLogger(__name__)

#: The config defaults of `text_column` and `label_column` (config.py takes them from here).
DEFAULT_TEXT, DEFAULT_LABEL = "text", "label"
#: Column names (lowercase, without `_`, `-`, `.` and spaces) that say "the text" or "the label".
TEXT_NAMES = frozenset(
    (
        "text",
        "sentence",
        "sentences",
        "review",
        "reviewtext",
        "content",
        "document",
        "tweet",
        "comment",
        "body",
    )
)
LABEL_NAMES = frozenset(("label", "labels", "sentiment", "polarity", "class", "target", "category", "gold"))
_INDEX = re.compile(r"[+-]?[0-9]+", re.ASCII)


#: The config keys naming a sentiment file's columns, in the order the readers take them.
COLUMN_KEYS = ("text_column", "label_column", "text_pair_column")


def column_indexes(text_column: str, label_column: str, pair_column: str | None = None) -> tuple[int, ...]:
    """`header=false`: the columns as 0-based indexes (text, label[, pair]); the default names stand for 0
    and 1, a pair column has no default.

    Raises:
        BertTasksError: A column that is not an integer (a name, which a headerless file cannot have).
    """
    indexes = []
    given = [(text_column, DEFAULT_TEXT, 0), (label_column, DEFAULT_LABEL, 1)]
    given += [(pair_column, None, 2)] if pair_column is not None else []
    for key, (value, default, example) in zip(COLUMN_KEYS, given, strict=False):
        if value == default:
            indexes.append(example)
        elif _INDEX.fullmatch(value.strip()):
            indexes.append(int(value))
        else:
            raise BertTasksError(
                f"{key}={value!r} with header=false: a file without a header row has no column "
                f"names; give a 0-based column index (e.g. {key}={example}), or set header=true"
            )
    return tuple(indexes)


def positions(indexes: tuple[int, ...], width: int, where: str, kind: str) -> tuple[int, ...]:
    """The column indexes, maybe negative, as positions in a row of `width` fields; one-line errors."""
    found: list[int] = []
    for key, index in zip(COLUMN_KEYS, indexes, strict=False):
        if not -width <= index < width:
            raise BertTasksError(
                f"{where}: {key}={index} but the row has {width} {kind}-separated column(s) (indexes "
                f"0..{width - 1}, or -{width}..-1 from the end); fix {key}"
            )
        if index % width in found:
            other = COLUMN_KEYS[found.index(index % width)]
            raise BertTasksError(
                f"{where}: {other}={indexes[found.index(index % width)]} and {key}={index} are the same "
                f"column of {width}; give them different columns"
            )
        found.append(index % width)
    return tuple(found)


def check_distinct(where: str, names: Sequence[str | None]) -> None:
    """Refuse two settings that name one column (text, label, pair): a model would read its label as its
    text, or its text twice. `positions` says the same of indexes."""
    given = [(key, name) for key, name in zip(COLUMN_KEYS, names, strict=False) if name is not None]
    for n, (key, name) in enumerate(given):
        other = next((earlier for earlier, seen in given[:n] if seen == name), None)
        if other is not None:
            raise BertTasksError(
                f"{where}: {other} and {key} are both {name!r}, the same column; give them different columns"
            )


def choose_columns(
    where: str, names: Sequence[str], text_column: str, label_column: str
) -> tuple[str, str] | None:
    """The (text, label) columns among `names`: the configured ones, else the one plausible default each.

    None when a configured column is absent and cannot be guessed: the caller words the error, listing
    the columns found. A guess is one INFO line naming the file and the columns taken.
    """
    chosen: list[str] = []
    guessed = []
    for key, value, default, spellings in (
        ("text_column", text_column, DEFAULT_TEXT, TEXT_NAMES),
        ("label_column", label_column, DEFAULT_LABEL, LABEL_NAMES),
    ):
        if value in names:
            chosen.append(value)
            continue
        taken = (*chosen, text_column, label_column)
        candidates = (
            [n for n in names if _plain(n) in spellings and n not in taken] if value == default else []
        )
        if len(candidates) != 1:
            return None
        chosen.append(candidates[0])
        guessed.append(f"{key}={candidates[0]!r}")
    if guessed:
        logger.info(
            "%s: reading %s, the one column named like it (set text_column/label_column to choose others)",
            where,
            " and ".join(guessed),
        )
    return chosen[0], chosen[1]


def _plain(name: str) -> str:
    """A column name as the spellings above are written: lowercase, no `_`, `-`, spaces or dots."""
    return re.sub(r"[\s_.\-]", "", name.casefold())
