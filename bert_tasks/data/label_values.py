"""What one label value of a sentiment file means, by the shape of its labels: a class, a set, a number.

- **class** (one label per text): strings are stripped, integer spellings normalised (`01`, `1.0`, 1.0 ->
  `1`), booleans spelled as JSON spells them (`True` -> `true`).
- **set** (multi-label): a JSON list of classes (`["joy", "surprise"]`, `[]` for none), or a string of
  classes separated by `|` (`joy|surprise`); `\\|` is a `|` inside a class name and `\\\\` a backslash.
  Each class is normalised as above; an empty class (`joy||surprise`) or one given twice is an error.
- **number** (regression): a JSON number or a string that reads as one (`4`, `3.5`, ` 2e1 `), finite.

`auto` is the set shape's inference (`multi_label` left unset): a file whose labels include a JSON list or
a string with an unescaped `|` is multi-label, and its plain labels are sets of one; any other file holds
classes. Nothing here imports `datasets`: every value is checked before a dataset is built.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from bert_tasks.data.files import check_text, describe, is_blank
from bert_tasks.errors import BertTasksError

#: The label shapes a reader is asked for (`auto`: classes, or sets when the values say so).
KINDS = ("class", "set", "number", "auto")
#: The class separator of a label set written as a string, and its escape.
SEPARATOR, ESCAPE = "|", "\\"
#: A label spelled as an integer: `1`, `01`, `+1`, `-2`, `1.0`, `1.`.
INTEGER_LABEL = re.compile(r"[+-]?[0-9]+(?:\.0*)?", re.ASCII)
#: Boolean spellings, read as the labels `true` and `false` (JSON's spelling) whatever their case.
_BOOLEANS = {"true": "true", "false": "false"}
_UNESCAPED_SEPARATOR = re.compile(r"(?<!\\)(?:\\\\)*\|")


def class_label(value: Any, where: str, column: str) -> str:
    """The label as a class name (the rules above); a non-integer float, a list or a blank is refused."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise _error(
                where,
                f"label {json.dumps(value)} (a float) in column '{column}' is not a class",
                "write labels as strings or integers (or set regression=true for numbers)",
            )
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, dict)):
        fix = "write labels as strings or integers"
        if isinstance(value, list):
            fix = "multi_label=false reads one class per row: give one, or leave multi_label unset for lists"
        raise _error(where, f"label is {describe(value)} in column '{column}', not a class name", fix)
    if not isinstance(value, str) or is_blank(value):
        raise _error(where, f"missing label in column '{column}'", "give every row a label")
    label = check_text(value.strip(), where, f"the label in column '{column}'")
    if INTEGER_LABEL.fullmatch(label):
        return str(int(label.split(".")[0]))
    return _BOOLEANS.get(label.casefold(), label)


def is_set_form(value: Any) -> bool:
    """Whether a value is written as a label set: a JSON list (also as the text of a CSV cell), or a
    string with an unescaped `|`."""
    if isinstance(value, str):
        return bool(_UNESCAPED_SEPARATOR.search(value)) or _json_list(value) is not None
    return isinstance(value, list)


def _json_list(text: str) -> list[Any] | None:
    """A CSV cell (or JSON string) that holds a JSON list, `[]` or `["joy", "fear"]`, as that list."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        found = json.loads(text)
    except ValueError:  # "[sic]": a class name in brackets
        return None
    return found if isinstance(found, list) else None


def set_items(text: str) -> list[Any]:
    """The items of a label set written as text: a JSON list's, else the `|`-separated names."""
    found = _json_list(text)
    return split_classes(text) if found is None else found


def label_set(value: Any, where: str, column: str) -> list[str]:
    """A label set as its class names, in the order written; `[]` (JSON) is a text with no label."""
    if isinstance(value, str) and not is_blank(value):
        items: Sequence[Any] = set_items(value)
    elif isinstance(value, list):
        items = value
    elif isinstance(value, (bool, int, float)):
        items = [value]
    else:
        raise _error(
            where,
            f"missing labels in column '{column}'",
            "give every row its labels (a JSON list, [] for none, or a|b)",
        )
    names = []
    for item in items:
        if isinstance(item, (list, dict)):
            raise _error(where, f"label {describe(item)} in the list in column '{column}'", "list classes")
        if isinstance(item, str) and is_blank(item):
            raise _error(where, f"an empty label in {_shown(value)} in column '{column}'", "drop it")
        names.append(class_label(item, where, column))
    twice = next((name for n, name in enumerate(names) if name in names[:n]), None)
    if twice is not None:
        raise _error(where, f"label {twice!r} is given twice in column '{column}'", "give it once")
    return names


def split_classes(text: str) -> list[str]:
    """`a|b` -> [a, b], with `\\|` a `|` inside a name and `\\\\` a backslash (other escapes kept as is)."""
    names, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char if char in (SEPARATOR, ESCAPE) else ESCAPE + char)
            escaped = False
        elif char == ESCAPE:
            escaped = True
        elif char == SEPARATOR:
            names.append("".join(current))
            current = []
        else:
            current.append(char)
    names.append("".join(current) + (ESCAPE if escaped else ""))
    return names


def number_label(value: Any, where: str, column: str) -> float:
    """A regression target: a finite number within float32's range (the model computes in float32),
    given as a JSON number or a string that reads as one."""
    number = _as_number(value)
    if number is None:
        blank = value is None or (isinstance(value, str) and is_blank(value))
        found = "missing" if blank else describe(value)
        raise _error(
            where,
            f"label in column '{column}' is {found}, not a number",
            "give every row a number (regression=true reads labels as numbers)",
        )
    if math.isnan(number) or (math.isinf(number) and not _written_in_digits(value)):
        raise _error(where, f"label {_shown(value)} in column '{column}' is not finite", "give a number")
    if abs(number) > FLOAT32_MAX:
        raise _error(
            where,
            f"label {_shown_number(value)} in column '{column}' is beyond float32's range (±3.4e38), in "
            "which the model computes",
            "rescale the labels (e.g. divide them by a power of ten)",
        )
    return number


#: The largest finite float32: a regression head cannot write a value beyond it.
FLOAT32_MAX = 3.4028234663852886e38


def _as_number(value: Any) -> float | None:
    """The value as a float (inf for an integer too large for one), or None where it is no number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer past float64's range
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and not is_blank(value):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _written_in_digits(value: Any) -> bool:
    """An integer, or a string with a digit: a finite number ("1e400"), not "inf" or "nan"."""
    return isinstance(value, int) or (isinstance(value, str) and any(c.isdigit() for c in value))


def _shown_number(value: Any) -> str:
    """A number as the file gave it, or its size where it is an integer too long to print."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"(an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits)"
    return _shown(value)


def read_label(value: Any, where: str, column: str, kind: str) -> Any:
    """One label by `kind` (`KINDS`); under `auto` a set-form value is a set, any other a class."""
    if kind == "number":
        return number_label(value, where, column)
    if kind == "set" or (kind == "auto" and is_set_form(value)):
        return label_set(value, where, column)
    if kind == "auto" and isinstance(value, str):  # `a\|b`: a set's escapes, in a class of one
        [value] = split_classes(value)
    return class_label(value, where, column)


def settle_auto(labels: list[Any]) -> list[Any]:
    """`auto` labels of one file: all sets (a plain class as a set of one) when any is a set, else as read."""
    if not any(isinstance(label, list) for label in labels):
        return labels
    return [label if isinstance(label, list) else [label] for label in labels]


def classes_of(label: Any) -> list[str]:
    """The class names of one label as read: a class alone, a set's classes, none for a number."""
    if isinstance(label, list):
        return label
    return [] if isinstance(label, float) else [label]


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:60]


def _error(where: str, what: str, fix: str) -> BertTasksError:
    return BertTasksError(f"{where}: {what}; {fix}")
