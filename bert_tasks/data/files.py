"""Reading user input: whole-file UTF-8 with one-line errors, JSON records with their `file:line`, and
the rules every text obeys wherever it comes from (file, standard input, command line).

Shared by every reader (sentiment, NER, prediction input) and the predictor, so a bad byte, an unreadable
path, a broken JSON line, an invisible "text" or a lone surrogate is reported the same way everywhere:

- `read_bytes`: any path that opens is read (a FIFO, `/dev/stdin`, a shell's `<(...)`), and each reason
  it does not open is its own line (not found, a directory, permission denied, other).
- `is_blank`: a text with nothing but whitespace, control (Cc) and format (Cf: U+200B, U+FEFF, bidi
  marks) characters is empty.
- `check_text`: NUL characters and lone surrogates (an unpaired `\\ud800` JSON escape, or an undecodable
  command-line byte) are refused with where they are and their character offset.
- `check_texts_to_predict`: both rules for texts to predict, before any model loads.
- `opens_json`: the format of a stream without a name extension, told by its first line.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bert_tasks.errors import BertTasksError

#: Unicode categories that draw nothing: controls (Cc) and format characters (Cf).
_INVISIBLE = frozenset(("Cc", "Cf"))
#: Characters no text may hold: NUL, and the UTF-16 surrogate halves (never a character on their own).
_FORBIDDEN = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The line breaks of a `--file` of texts: LF, CRLF, or a lone CR (never U+2028 and the like, which
#: JSON strings may hold raw).
_LINE_BREAK = re.compile("\r\n|\r|\n")


def is_blank(text: str) -> bool:
    """True when `text` shows nothing: only whitespace, control (Cc) and format (Cf) characters.

    The one emptiness rule of every reader and of prediction: a "text" of zero-width spaces or byte-order
    marks is as empty as one of spaces. A text that opens with a letter or digit is answered at once:
    readers ask this of every line and token (360,000 times for BC5CDR), mostly of words.
    """
    if text[:1].isalnum():
        return False
    return all(c.isspace() or unicodedata.category(c) in _INVISIBLE for c in text)


def check_text(text: str, where: str, what: str = "the text", *, nul: bool = False) -> str:
    """`text`, unless it holds a NUL or a lone surrogate: then a BertTasksError naming `where` and the offset.

    `where` is `file:line` (or `file: record N`), or `text N` for command-line texts; `what` names the
    string inside it ("the text in column 'review'", "token 3"). `nul=True` lets NULs through: in a text
    to predict one is just a control character (the tokenizer skips it), while in a data file it almost
    always means a UTF-16 or binary file.
    """
    found = (_SURROGATE if nul else _FORBIDDEN).search(text)
    if found is None:
        return text
    offset, code = found.start(), ord(found.group())
    if code == 0:
        raise BertTasksError(
            f"{where}: NUL character (\\x00) at character offset {offset} of {what}; remove it "
            "(NULs usually mean a binary or UTF-16 file: re-save it as UTF-8 text)"
        )
    raise BertTasksError(
        f"{where}: lone surrogate \\u{code:04x} at character offset {offset} of {what} (half of a UTF-16 "
        "pair, not a character: an unpaired \\u escape in JSON, or a byte that is not UTF-8); "
        "fix the text or re-save it as UTF-8"
    )


def check_texts_to_predict(texts: Sequence[object]) -> None:
    """The rule for texts to predict, from arguments, a file or Python: each is a string that shows
    something (`is_blank`) and holds no lone surrogate. Needs no model, so the CLI applies it before the
    model loads."""
    for index, text in enumerate(texts):
        if not isinstance(text, str) or is_blank(text):  # zero-width characters only are empty too
            raise BertTasksError(f"text {index + 1} is empty; give at least one word to predict on")
        check_text(text, f"text {index + 1}", nul=True)  # a lone surrogate: the tokenizer would choke


def opens_json(text: str) -> bool:
    """Whether the first line that shows something opens a JSON object or array.

    How a stream without a name extension (`<(...)` is /dev/fd/63, /dev/stdin) is told apart from a
    delimited or column file: from its content, once for the whole file.
    """
    first = next((line for line in _LINE_BREAK.split(text) if not is_blank(line)), "")
    return first.lstrip().startswith(("{", "["))


def shown(value: str) -> str:
    """A user string as a message shows it: as is when printable, else its repr (one line, escapes shown)."""
    return value if value.isprintable() else repr(value)


def read_bytes(path: str | Path) -> bytes:
    """Every byte of whatever `path` opens (a file, a FIFO, `/dev/stdin`, `<(...)`); one-line errors."""
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except FileNotFoundError:
        raise BertTasksError(
            f"{path}: file not found; check the path (relative paths start at the current dir)"
        ) from None
    except IsADirectoryError:
        raise BertTasksError(f"{path}: is a directory, not a file; give the path of a file") from None
    except PermissionError:
        raise BertTasksError(
            f"{path}: permission denied (the file is not readable by this user); "
            "check its permissions (chmod +r) or copy it somewhere readable"
        ) from None
    except OSError as e:
        raise BertTasksError(f"{path}: cannot read the file ({e.strerror or e}); check the path") from None


def read_utf8(path: str | Path) -> str:
    """The file's text; unreadable, empty or non-UTF-8 files raise a BertTasksError naming file and line."""
    text = decode_utf8(read_bytes(path), str(path))
    if is_blank(text):
        raise BertTasksError(f"{path}: the file is empty; give a file with at least one example")
    return text


def decode_utf8(data: bytes, source: str) -> str:
    """`data` as text; non-UTF-8 input raises a BertTasksError naming `source` and the line."""
    try:
        return data.decode("utf-8-sig")  # -sig: tolerate the byte-order mark spreadsheet exports add
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BertTasksError(
            f"{source}:{line}: byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8; "
            "re-save the file as UTF-8"
        ) from None


def json_records(path: str | Path, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (`file:line`, or `file: record N` for a JSON array, object) from JSON Lines or a JSON array."""
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise BertTasksError(f"{path}:{e.lineno}: invalid JSON ({e.msg}); fix the file") from None
        except (ValueError, RecursionError):
            raise BertTasksError(
                f"{path}: invalid JSON (nested too deeply or number too long); fix the file"
            ) from None
        for number, record in enumerate(records, start=1):
            # A parsed array has no line numbers left; the record's position is what the user can find.
            yield _object(f"{path}: record {number}", record)
        return
    # split("\n"), not splitlines(): JSON strings may legitimately contain U+2028 and the like.
    for number, line in enumerate(text.split("\n"), start=1):
        if not is_blank(line):
            yield f"{path}:{number}", _json_line(f"{path}:{number}", line)


def read_texts(path: str) -> list[str]:
    """Texts to predict from a file, or standard input for `-`.

    The format is decided once for the whole input, never line by line: JSON Lines when the first
    non-blank line is a JSON object (then every non-blank line must be one, with a 'text' string), a JSON
    array when the whole input is an array of such objects, else plain text: one text per non-blank line,
    whatever the line starts with (`{`, `[` and quotes are text too).
    """
    if path == "-":
        path = "<stdin>"
        text = decode_utf8(sys.stdin.buffer.read(), path)
    else:
        text = read_utf8(path)  # one-line errors for unreadable, empty, non-UTF-8 files
    lines = [(f"{path}:{n}", line) for n, line in enumerate(_LINE_BREAK.split(text), start=1)]
    lines = [(where, line) for where, line in lines if not is_blank(line)]
    first = _json_or_none(lines[0][1]) if lines else None
    if isinstance(first, dict):
        return [_text_field(where, _jsonl_text_line(where, line)) for where, line in lines]
    records = _json_or_none(text) if lines and lines[0][1].lstrip().startswith("[") else None
    if isinstance(records, list) and records and all(isinstance(r, dict) for r in records):
        return [_text_field(f"{path}: record {n}", r) for n, r in enumerate(records, start=1)]
    return [check_text(line, where, "the line") for where, line in lines]


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an int of over 4300 digits
        return None


def _parse(where: str, line: str, fix: str) -> Any:
    """One JSON value; anything json.loads refuses (bad syntax, absurd nesting or digits) is one line."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as e:
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply or number too long"
        raise BertTasksError(f"{where}: invalid JSON ({reason}); {fix}") from None


def _jsonl_text_line(where: str, line: str) -> dict[str, Any]:
    """One line of a JSON Lines input of texts: an object, as the first line was."""
    record = _parse(
        where,
        line,
        "this input is JSON Lines (its first line is a JSON object), so write every line as a JSON object "
        "with a 'text'",
    )
    if not isinstance(record, dict):
        raise BertTasksError(
            f"{where}: expected a JSON object, found {describe(record)}; this input is JSON Lines (its "
            "first line is a JSON object), so write every line as a JSON object with a 'text'"
        )
    return record


def _text_field(where: str, record: dict[str, Any]) -> str:
    """The 'text' of one JSON record of texts to predict."""
    if "text" not in record:
        found = ", ".join(map(shown, record)) or "none"
        raise BertTasksError(
            f"{where}: JSON line has no 'text' string field (found {found}); give every record a 'text'"
        )
    value = record["text"]
    if not isinstance(value, str):
        raise BertTasksError(
            f"{where}: JSON line has no 'text' string field ('text' is {describe(value)}); "
            "give a string (quote numbers)"
        )
    if is_blank(value):
        raise BertTasksError(f"{where}: empty text in the 'text' field; fill it in or drop the record")
    return check_text(value, where, "the text")


def describe(value: Any) -> str:
    """A JSON value as a message names it: `a number (5)`, `a boolean (true)`, `null`, `a list ([1, 2])`."""
    if value is None:
        return "null"
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}
    kind[dict] = "an object"
    spelled = json.dumps(value, ensure_ascii=True)
    spelled = spelled if len(spelled) <= 40 else spelled[:37] + "..."
    return f"{kind.get(type(value), type(value).__name__)} ({spelled})"


def _json_line(where: str, line: str) -> dict[str, Any]:
    """One JSON Lines record, which must be an object."""
    return _object(where, _parse(where, line, "write one JSON object per line"))[1]


def _object(where: str, record: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(record, dict):
        raise BertTasksError(
            f"{where}: expected a JSON object, found {type(record).__name__}; fix the record"
        )
    return where, record
