"""Reading user files: whole-file UTF-8 with one-line errors, and JSON records with their `file:line`.

Shared by every reader (sentiment, NER, prediction input) so a bad byte or a broken JSON line is
reported the same way everywhere.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bert_tasks.errors import BertTasksError


def read_utf8(path: str | Path) -> str:
    """The file's text; missing, empty or non-UTF-8 files raise a BertTasksError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise BertTasksError(
            f"{path}: file not found; check the path (relative paths start at the current dir)"
        )
    data = path.read_bytes()
    if not data.strip():
        raise BertTasksError(f"{path}: the file is empty; give a file with at least one example")
    return decode_utf8(data, str(path))


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
        for number, record in enumerate(records, start=1):
            # A parsed array has no line numbers left; the record's position is what the user can find.
            yield _object(f"{path}: record {number}", record)
        return
    # split("\n"), not splitlines(): JSON strings may legitimately contain U+2028 and the like.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield f"{path}:{number}", _json_line(f"{path}:{number}", line)


def read_texts(path: str) -> list[str]:
    """Texts to predict from a file, or standard input for `-`: one per non-blank line, where a line that
    opens with `{` is a JSON object with a 'text' field (so JSONL files and mixed pipes both work)."""
    if path == "-":
        path = "<stdin>"
        lines = decode_utf8(sys.stdin.buffer.read(), path).splitlines()
    else:
        lines = read_utf8(path).splitlines()  # one-line errors for missing, empty, non-UTF-8 files
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.lstrip().startswith("{"):
            texts += [line] if line.strip() else []
            continue
        record = _json_line(f"{path}:{number}", line)
        if not isinstance(record.get("text"), str):
            raise BertTasksError(f"{path}:{number}: JSON line has no 'text' string field")
        texts.append(record["text"])
    return texts


def _json_line(where: str, line: str) -> dict[str, Any]:
    """One JSON Lines record, which must be an object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BertTasksError(f"{where}: invalid JSON ({e.msg}); write one JSON object per line") from None
    return _object(where, record)[1]


def _object(where: str, record: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(record, dict):
        raise BertTasksError(
            f"{where}: expected a JSON object, found {type(record).__name__}; fix the record"
        )
    return where, record
