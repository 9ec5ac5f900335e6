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
- `check_texts`: both rules for texts to predict, before any model loads.
- `opens_json`: the format of a stream without a name extension, told by its first line.
- `text_records`: texts to predict, as plain lines, JSON Lines, a JSON array, or a CSV/TSV table.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from bert_tasks.data import echoed_json
from bert_tasks.errors import BertTasksError

#: Unicode categories that draw nothing: controls (Cc) and format characters (Cf).
_INVISIBLE = frozenset(("Cc", "Cf"))
#: Characters no text may hold: NUL, and the UTF-16 surrogate halves (never a character on their own).
_FORBIDDEN = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOM = b"\xef\xbb\xbf"
#: Line breaks as a text file has them: LF, CRLF, or a lone CR (never U+2028 and the like, which JSON
#: strings may hold raw).
_LINE_BREAK = re.compile("\r\n|\r|\n")
#: Suffixes that say a file is JSON: its first line is then read as JSON or refused, never taken for text.
_JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
#: Suffixes that say a file is a table of texts to predict, and their delimiters.
_TABLE_DELIMITERS = {".csv": ",", ".tsv": "\t"}
_JSONL_FIX = (
    "this input is JSON Lines (its first line is a JSON object), so write every line as a JSON object with "
    "a 'text'"
)


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


def check_texts(texts: Sequence[object]) -> None:
    """Refuse a text to predict that is no string, is empty (`is_blank`) or holds a lone surrogate, naming
    it by its position (`text 3`): the one rule of the command line, the library and the server."""
    for index, text in enumerate(texts):
        check_text_to_predict(text, f"text {index + 1}")


def check_text_to_predict(text: object, name: str) -> None:
    """`check_texts`' rule for one text, named `name` (`text 3`)."""
    if not isinstance(text, str) or is_blank(text):
        raise BertTasksError(f"{name} is empty; give at least one word to predict on")
    check_text(text, name, nul=True)  # a lone surrogate: the tokenizer would choke


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
    except OSError as error:
        raise _unreadable(path, error) from None


def _unreadable(path: str | Path, error: OSError) -> BertTasksError:
    """Each reason a path does not open, in its own line."""
    if isinstance(error, FileNotFoundError):
        return BertTasksError(
            f"{path}: file not found; check the path (relative paths start at the current dir)"
        )
    if isinstance(error, IsADirectoryError):
        return BertTasksError(f"{path}: is a directory, not a file; give the path of a file")
    if isinstance(error, PermissionError):
        return BertTasksError(
            f"{path}: permission denied (the file is not readable by this user); "
            "check its permissions (chmod +r) or copy it somewhere readable"
        )
    return BertTasksError(f"{path}: cannot read the file ({error.strerror or error}); check the path")


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
        _refuse_pair_lines(path, text)
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
    for number, line in numbered_lines(text):
        if not is_blank(line):
            yield f"{path}:{number}", _json_line(f"{path}:{number}", line)


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number, line) of a whole file's text, numbered as an editor shows them: breaks are LF, CRLF or a
    lone CR (old Mac exports), never `splitlines()`' U+2028, \\x0b or \\x1c, which tokens and JSON strings
    may hold."""
    return enumerate(_LINE_BREAK.split(text), start=1)


def read_texts(path: str) -> list[str]:
    """Texts to predict from a file, or standard input for `-` (the format rule of `text_records`)."""
    return [record["text"] for _, record in text_records(path)]


def text_records(
    path: str, check: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, record) for each text to predict in a file, or standard input for `-`, as it is read.

    The format is decided once for the whole input, never line by line: JSON Lines when the first
    non-blank line is a JSON object (then every non-blank line must be one, passing `check`: by default
    `check_text_record`, a 'text' string; a task's `check_input` may take other fields, such as NER's
    'tokens'; the record is yielded whole, so `id` and any other field travel with it), a JSON array when
    the whole input is an array of such objects, else plain text: one text per non-blank line (record
    `{"text": line}`, passing `check` too, which may add fields: `predict --pair`'s second text),
    whatever the line starts with (`{`, `[` and quotes are text too) - except in a file named `.json`,
    `.jsonl` or `.ndjson`, whose broken first line is an error rather than a text. A file named `.csv` or
    `.tsv` is a table: a header, then one record per row (`_table_records`).

    JSON Lines and plain text are read a line at a time, so memory does not grow with the input; an
    input whose first line opens with `[` is read whole, since only its end says whether it is an array.
    """
    name = "<stdin>" if path == "-" else path
    check = check or check_text_record
    if path != "-" and Path(path).suffix.lower() in _TABLE_DELIMITERS:
        yield from _table_records(path, check)
        return
    lines = _nonblank_lines(path, name)
    first = next(lines, None)
    if first is None:
        if path != "-":  # an empty file is a mistake; an empty pipe is a producer with nothing to say
            raise BertTasksError(f"{path}: the file is empty; give a file with at least one example")
        return
    if isinstance(_json_or_none(first[1]), dict):
        for where, line in itertools.chain([first], lines):
            yield where, check(where, _jsonl_text_line(where, line))
        return
    if first[1].lstrip().startswith("["):
        buffered = [first, *lines]
        joined = "\n".join(line for _, line in buffered)
        records = _json_or_none(joined)
        if isinstance(records, list) and records and all(isinstance(r, dict) for r in records):
            _parse(name, joined, "fix the file", echoed_json.loads)  # its numbers are written back too
            for number, record in enumerate(records, start=1):
                yield f"{name}: record {number}", check(f"{name}: record {number}", record)
            return
        if _declared_json(path):
            raise _not_json_array(records, buffered)
        lines = iter(buffered)
    else:
        if _declared_json(path):
            named = f"the file is named {Path(path).suffix}, so write each line as a JSON object"
            _jsonl_text_line(*first, f"{named} with a 'text' or rename it .txt")  # raises: no object here
        lines = itertools.chain([first], lines)
    for where, line in lines:
        yield where, check(where, {"text": check_text(line, where, "the line")})


def _table_records(
    path: str, check: Callable[[str, dict[str, Any]], dict[str, Any]]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, record) per row of a CSV/TSV file, the header's names as the record's keys.

    The text is the `text` column, as in a JSON record, and every column travels with it (as a string:
    a table has no types), so `--out` keeps a row's id. Python's csv module reads it a row at a time, as
    the training reader reads a table (quoted fields may span lines; TSV has no quoting), never whole.
    """
    delimiter = _TABLE_DELIMITERS[Path(path).suffix.lower()]
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    with _open_input(path) as stream:
        reader = csv.reader(_decoded_lines(stream, path), delimiter=delimiter, quoting=quoting)
        start, header = 1, None
        try:
            for fields in reader:
                where, start = f"{path}:{start}", reader.line_num + 1
                if not fields or all(is_blank(field) for field in fields):
                    continue
                if header is None:
                    header = _table_header(where, fields)
                    continue
                _check_row_width(where, fields, header)
                yield where, check(where, dict(zip(header, fields, strict=True)))
        except csv.Error as error:
            raise BertTasksError(f"{path}:{start}: {error}; fix the row (an unclosed quote?)") from None
    if header is None:
        raise BertTasksError(f"{path}: the file is empty; give a header with a 'text' column, then rows")


def _check_row_width(where: str, fields: list[str], header: list[str]) -> None:
    """A row as wide as the header; narrower with a line break in a field is a quote left open."""
    if len(fields) == len(header):
        return
    if any("\n" in field for field in fields):
        raise BertTasksError(open_quote(where))
    raise BertTasksError(
        f"{where}: {len(fields)} fields, but the header has {len(header)} columns; fix the row (a field "
        'holding the delimiter is quoted: "a, b")'
    )


def open_quote(where: str) -> str:
    """The message for a CSV quote left open, which swallowed the rows after it (training and predict)."""
    return (
        f"{where}: a quote opened here is not closed before the following rows, so they were read as one "
        'field; close the quote, or write a quote inside a field as ""'
    )


def _decoded_lines(stream: BinaryIO, path: str) -> Iterator[str]:
    """The stream's lines as text, line ends kept for the csv module; a byte that is not UTF-8 is one line
    naming its line (a byte-order mark at the start is skipped, as spreadsheet exports add one)."""
    for number, raw in enumerate(stream, start=1):
        line = raw.removeprefix(_BOM) if number == 1 else raw
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BertTasksError(
                f"{path}:{number}: byte 0x{line[error.start]:02x} is not UTF-8; re-save the file as UTF-8"
            ) from None


def _table_header(where: str, names: list[str]) -> list[str]:
    """The header of a table to predict: names its `text` column, and no column twice."""
    names = [name.strip() for name in names]
    if "text" not in names:
        raise BertTasksError(
            f"{where}: the header ({', '.join(map(repr, names))}) has no 'text' column, which predict reads "
            "from a table; name the texts' column text"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BertTasksError(f"{where}: the header names column {twice[0]!r} twice; name each column once")
    return names


def _not_json_array(records: Any, buffered: list[tuple[str, str]]) -> BertTasksError:
    """The error for a file named as JSON whose text is not a non-empty array of objects."""
    fix = "fix the file or rename it .txt to predict its lines as texts"
    if records is None:
        try:
            echoed_json.loads("\n".join(line for _, line in buffered))
        except json.JSONDecodeError as e:  # its line counts the non-blank lines joined: name the file's own
            return BertTasksError(f"{buffered[e.lineno - 1][0]}: invalid JSON ({e.msg}); {fix}")
        except echoed_json.UnkeptNumber as e:
            return BertTasksError(f"{buffered[0][0]}: invalid JSON ({e}); {fix}")
        except (ValueError, RecursionError):
            pass
        return BertTasksError(f"{buffered[0][0]}: invalid JSON (nested too deeply or number too long); {fix}")
    return BertTasksError(
        f"{buffered[0][0]}: expected a JSON array of objects with a 'text', found {describe(records)}; {fix}"
    )


def _declared_json(path: str) -> bool:
    """Whether a file's name says JSON, so that a broken first line is an error rather than a text."""
    return path != "-" and Path(path).suffix.lower() in _JSON_SUFFIXES


def _nonblank_lines(path: str, name: str) -> Iterator[tuple[str, str]]:
    """(`name:line`, text) of each non-blank line, decoded as read; line breaks are LF, CRLF or a lone CR
    (never U+2028 and the like, which JSON strings may hold raw).

    Lines are numbered as an editor shows them; a byte that is not UTF-8 is one line naming the line and
    its offset in the input (a byte-order mark at the start is skipped, as spreadsheet exports add one).
    """
    with _open_input(path) as stream:
        number, offset = 0, 0
        for raw in stream:
            start = 3 if offset == 0 and raw.startswith(_BOM) else 0
            try:
                decoded = raw[start:].decode("utf-8")
            except UnicodeDecodeError as e:
                line = number + raw.count(b"\n", 0, start + e.start) + 1
                raise BertTasksError(
                    f"{name}:{line}: byte 0x{raw[start + e.start]:02x} at offset {offset + start + e.start} "
                    "is not UTF-8; re-save the file as UTF-8"
                ) from None
            offset += len(raw)
            decoded = decoded.removesuffix("\n")
            # CRLF is one break; any other CR is a line break of its own (old Mac files)
            for piece in decoded.removesuffix("\r").split("\r"):
                number += 1
                if not is_blank(piece):
                    yield f"{name}:{number}", piece


@contextmanager
def _open_input(path: str) -> Iterator[BinaryIO]:
    """Standard input for `-`, else the path opened for reading, with `read_bytes`' one-line errors."""
    if path == "-":
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            raise BertTasksError(
                "--file -: standard input is closed; pipe the texts in (... | bert-tasks predict ...) or "
                "give --file FILE"
            )
        yield sys.stdin.buffer
        return
    try:
        stream = open(path, "rb")  # noqa: SIM115 (held open while the caller iterates)
    except OSError as error:
        raise _unreadable(path, error) from None
    with stream:
        yield stream


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an int of over 4300 digits
        return None


def _parse(where: str, line: str, fix: str, loads: Callable[[str], Any] = json.loads) -> Any:
    """One JSON value; anything `loads` refuses (bad syntax, absurd nesting or digits, for inputs to
    predict a number that would not be written back as read: `echoed_json`) is one line."""
    try:
        return loads(line)
    except (ValueError, RecursionError) as e:
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply or number too long"
        reason = str(e) if isinstance(e, echoed_json.UnkeptNumber) else reason
        raise BertTasksError(f"{where}: invalid JSON ({reason}); {fix}") from None


def _jsonl_text_line(where: str, line: str, fix: str = _JSONL_FIX) -> dict[str, Any]:
    """One line of a JSON Lines input of texts: an object, as the first line was (`fix` says why); its
    fields are written back with the prediction, so its numbers must be kept (`echoed_json`)."""
    record = _parse(where, line, fix, echoed_json.loads)
    if not isinstance(record, dict):
        raise BertTasksError(f"{where}: expected a JSON object, found {describe(record)}; {fix}")
    return record


def check_text_record(where: str, record: dict[str, Any]) -> dict[str, Any]:
    """One JSON record of texts to predict, once its 'text' is checked."""
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
    # NULs pass, as in every text to predict: a record's NUL is a "\u0000" someone wrote (a raw one is no
    # JSON), not the sign of a binary file that a file's reader refuses; a command-line text is one too.
    check_text(value, where, "the text", nul=True)
    return record


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
    if _is_pair(record):
        raise _pair_error(where)
    if not isinstance(record, dict):
        raise BertTasksError(
            f"{where}: expected a JSON object, found {type(record).__name__}; fix the record"
        )
    return where, record


#: spaCy's training data: `["text", {"entities": [[start, end, "TYPE"]]}]` (or `{"cats": ...}`).
_PAIR_FIX = (
    'write one JSON object per line instead: {"text": ..., "entities": [[start, end, "TYPE"], ...]} '
    '(NER) or {"text": ..., "label": ...} (sentiment)'
)


_OPENS_WITH_STRING = re.compile(r'\s*\[\s*"')


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], dict)
    )


def _pair_error(where: str) -> BertTasksError:
    return BertTasksError(f"{where}: a [text, annotations] pair (spaCy's training format); {_PAIR_FIX}")


def _refuse_pair_lines(path: str | Path, text: str) -> None:
    """A file of one `[text, annotations]` pair per line would parse as one array of texts and objects:
    say what it is instead of "expected a JSON object, found str"."""
    number, line = next((n, line) for n, line in numbered_lines(text) if not is_blank(line))
    if not _OPENS_WITH_STRING.match(line):
        return  # an array of records opens with an object: not parsed twice
    try:
        first = json.loads(line)
    except (ValueError, RecursionError):
        return  # a pretty-printed array: its records are checked one by one (`_object`)
    if _is_pair(first):
        raise _pair_error(f"{path}:{number}")
