"""The client mistakes every server test sends, with the status and message each must get back.

Shared by the in-process tests (test_server_app.py) and the tests against a real server process
(test_server_process.py), which start the server with the limits below.
"""

from __future__ import annotations

#: The limits the servers under test run with (small, so that 413 is cheap to reach).
MAX_TEXTS, MAX_CHARS = 8, 400
USAGE = 'send {"texts": ["..."]} or {"records": [{"id": ..., "text": "..."}]}'

#: (name, body bytes, status, the start of the one-line `detail`).
ERROR_CASES = [
    ("not JSON", b'{"texts": ', 400, "the body is not valid JSON (Expecting value); " + USAGE),
    ("empty body", b"", 400, "the body is empty; " + USAGE),
    (
        "not UTF-8",
        b'{"texts": ["caf\xe9"]}',
        400,
        "the body is not valid JSON (not UTF-8, or nested too deeply)",
    ),
    ("nested too deeply", b"[" * 100_000 + b"]" * 100_000, 400, "the body is not valid JSON"),
    (
        "a field nested 300 levels deep",
        b'{"records": [{"text": "fine", "x": ' + b"[" * 300 + b"]" * 300 + b"}]}",
        400,
        "the body nests lists and objects more than 128 levels deep",
    ),
    (
        "an id nested 300 levels deep",
        b'{"records": [{"id": ' + b"[" * 300 + b"]" * 300 + b', "text": "fine"}]}',
        400,
        "the body nests lists and objects more than 128 levels deep",
    ),
    (
        "an id too large for a double",
        b'{"records": [{"id": 1e400, "text": "fine"}]}',
        400,
        "the body is not valid JSON (1e400 is too large for a double; send it as a string)",
    ),
    (
        "a NaN id",
        b'{"records": [{"id": NaN, "text": "fine"}]}',
        400,
        "the body is not valid JSON (NaN is no JSON number",
    ),
    (
        "an id of more digits than a double holds",
        b'{"records": [{"id": 0.10000000000000000001, "text": "fine"}]}',
        400,
        "the body is not valid JSON (0.10000000000000000001 would come back as 0.1, all a double holds",
    ),
    (
        "an id of 5000 digits",
        b'{"records": [{"id": ' + b"9" * 5000 + b', "text": "fine"}]}',
        400,
        "the body is not valid JSON (a number of 5000 digits, more than the 4300 Python reads",
    ),
    ("a list, not an object", b'["a text"]', 422, "the body: Input should be a valid dictionary"),
    ("texts not a list", b'{"texts": "a text"}', 422, "texts: Input should be a valid list"),
    ("a text not a string", b'{"texts": ["fine", 5]}', 422, "texts.1: Input should be a valid string"),
    (
        "both keys",
        b'{"texts": ["a"], "records": [{"text": "b"}]}',
        422,
        "the body: Value error, give exactly",
    ),
    ("neither key", b"{}", 422, "the body: Value error, give exactly one of 'texts' and 'records'"),
    ("an unknown key", b'{"texts": ["a"], "text": "b"}', 422, "text: Extra inputs are not permitted"),
    (
        "a record without text",
        b'{"records": [{"id": 1}]}',
        422,
        "record 1: JSON line has no 'text' string field (found id)",
    ),
    (
        "an empty text",
        b'{"texts": ["fine", "  "]}',
        422,
        "text 2 is empty; give at least one word to predict on",
    ),
    ("zero-width only", '{"texts": ["\u200b\ufeff"]}'.encode(), 422, "text 1 is empty"),
    (
        "a lone surrogate",
        b'{"texts": ["a \\ud800 b"]}',
        422,
        "text 1: lone surrogate \\ud800 at character offset 2",
    ),
    (
        "a field the prediction writes",
        b'{"records": [{"id": 1, "text": "fine", "label": "gold"}]}',
        422,
        "record 1: the record has a field 'label', which the prediction writes; rename that field",
    ),
    (
        "too many texts",
        ('{"texts": [' + ", ".join(['"a"'] * (MAX_TEXTS + 1)) + "]}").encode(),
        413,
        f"{MAX_TEXTS + 1} texts in one request, more than --max-texts {MAX_TEXTS}; split it",
    ),
    (
        "too many characters",
        ('{"texts": ["' + "a" * (MAX_CHARS + 1) + '"]}').encode(),
        413,
        f"{MAX_CHARS + 1} characters in one request, more than --max-chars {MAX_CHARS}; split it",
    ),
    (
        "too many bytes",
        b'{"texts": ["' + b" " * (MAX_CHARS * 8 + (1 << 20)) + b'"]}',
        413,
        "a body of ",
    ),
]
