"""One rule each for: the format of a `--file` of texts (decided once per input), label spellings, CSV
quotes left open, CoNLL column separators and span offsets. Refusals are asserted as exact one-line messages.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import pytest

from bert_tasks.config import Config
from bert_tasks.data.files import read_texts, text_records
from bert_tasks.data.ner_files import read_conll, read_jsonl_spans, read_ner_file
from bert_tasks.data.text_classification import read_text_classification
from bert_tasks.errors import BertTasksError

JSONL_FIX = (
    "this input is JSON Lines (its first line is a JSON object), so write every line as a JSON object "
    "with a 'text'"
)
OPEN_QUOTE = (
    "a quote opened here is not closed before the following rows, so they were read as one field; "
    'close the quote, or write a quote inside a field as ""'
)


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8", newline="")
    return path


def refusal(read, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(BertTasksError) as err:
        read(*args)
    message = str(err.value)
    assert "\n" not in message and "\r" not in message
    return message


def sentiment(path: Path):  # type: ignore[no-untyped-def]
    return read_text_classification(path, "text", "label")


# --- 4. The format of a file of texts is decided once, from its first non-blank line ---------------------

PLAIN = [
    ("brace first", "{not json\nplain\n", ["{not json", "plain"]),
    ("brace later", 'fine\n{"text": "looks like JSON"}\n', ["fine", '{"text": "looks like JSON"}']),
    ("JSON but not an object", '[1, 2]\n"quoted"\n5\n', ["[1, 2]", '"quoted"', "5"]),
    ("blank lines and CRLF", "\n  \r\nOne.\r\n\r\nTwo.\r\n", ["One.", "Two."]),
    ("lone CR line ends", "One.\rTwo.\r", ["One.", "Two."]),
    ("line separator inside a text", "One\u2028still one.\nTwo.\n", ["One\u2028still one.", "Two."]),
]


@pytest.mark.parametrize(("content", "texts"), [c[1:] for c in PLAIN], ids=[c[0] for c in PLAIN])
def test_plain_text_every_line_is_a_text(tmp_path: Path, content: str, texts: list[str]) -> None:
    assert read_texts(str(write(tmp_path, "t.txt", content))) == texts


JSON_LINES = [
    ("jsonl", '\n{"text": "From JSON.", "id": 1}\n\n{"text": "Also."}\n', ["From JSON.", "Also."]),
    ("raw U+2028 in a string", '{"text": "a\u2028b"}\n{"text": "c"}\n', ["a\u2028b", "c"]),
    ("a JSON array of records", '[\n  {"text": "One."},\n  {"text": "Two."}\n]\n', ["One.", "Two."]),
]


@pytest.mark.parametrize(("content", "texts"), [c[1:] for c in JSON_LINES], ids=[c[0] for c in JSON_LINES])
def test_json_records_give_their_text(tmp_path: Path, content: str, texts: list[str]) -> None:
    assert read_texts(str(write(tmp_path, "t.jsonl", content))) == texts


BAD_JSON_LINES = [
    ('{"text": "a"}\nSecond line.\n', f"{{path}}:2: invalid JSON (Expecting value); {JSONL_FIX}"),
    (
        '{"text": "a"}\n\n{"text": "b",\n',
        f"{{path}}:3: invalid JSON (Expecting property name enclosed in double quotes); {JSONL_FIX}",
    ),
    ('{"text": "a"}\n5\n', f"{{path}}:2: expected a JSON object, found a number (5); {JSONL_FIX}"),
    (
        '{"text": "a"}\n{"body": "b"}\n',
        "{path}:2: JSON line has no 'text' string field (found body); give every record a 'text'",
    ),
    (
        '{"text": 5}\n',
        "{path}:1: JSON line has no 'text' string field ('text' is a number (5)); "
        "give a string (quote numbers)",
    ),
    (
        '{"text": null}\n',
        "{path}:1: JSON line has no 'text' string field ('text' is null); give a string (quote numbers)",
    ),
    ('{"text": ""}\n', "{path}:1: empty text in the 'text' field; fill it in or drop the record"),
]


@pytest.mark.parametrize(("content", "expected"), BAD_JSON_LINES)
def test_json_lines_every_line_must_be_a_record_with_a_text(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = write(tmp_path, "t.jsonl", content)
    assert refusal(read_texts, str(path)) == expected.format(path=path)


NAMED_AS_JSON = [
    ("t.jsonl", "{'text': 'single quotes'}\n", "{path}:1: invalid JSON (Expecting property name"),
    ("t.jsonl", '{"text": "a",}\n{"text": "b"}\n', "{path}:1: invalid JSON (Expecting property name"),
    ("t.ndjson", "plain words\n", "{path}:1: invalid JSON (Expecting value); the file is named .ndjson"),
    ("t.jsonl", '"a string"\n', "{path}:1: expected a JSON object, found a string"),
    ("t.json", '[{"text": "a"},\n\n{"text": "b"}\n', "{path}:3: invalid JSON (Expecting ',' delimiter)"),
    ("t.json", '["a", "b"]\n', "{path}:1: expected a JSON array of objects with a 'text', found a list"),
]


@pytest.mark.parametrize(("name", "content", "expected"), NAMED_AS_JSON)
def test_a_file_named_as_json_is_never_read_as_text(
    tmp_path: Path, name: str, content: str, expected: str
) -> None:
    # A broken first line of a .jsonl is a typo, not a request to predict each line's raw JSON as a text.
    path = write(tmp_path, name, content)
    assert refusal(read_texts, str(path)).startswith(expected.format(path=path))


def pipe(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_standard_input_follows_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe(monkeypatch, b"fine\n{not json\n")
    assert read_texts("-") == ["fine", "{not json"]
    pipe(monkeypatch, b'{"text": "From a pipe."}\n{"text": "Second."}\n')
    assert read_texts("-") == ["From a pipe.", "Second."]
    pipe(monkeypatch, b'{"text": "From a pipe."}\nSecond line.\n')
    assert refusal(read_texts, "-") == f"<stdin>:2: invalid JSON (Expecting value); {JSONL_FIX}"
    pipe(monkeypatch, b"")
    assert read_texts("-") == []


def test_closed_standard_input_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # what Python leaves for a command started with `<&-`
    assert refusal(read_texts, "-").startswith("--file -: standard input is closed; pipe the texts in")


TABLES = [
    (  # a quoted field over two lines, a blank row, an id column that travels
        "t.csv",
        'id,text,source\n1,I loved it,web\n2,"Awful, just\nawful",mail\n\n3,ok,x\n',
        [
            ("{path}:2", {"id": "1", "text": "I loved it", "source": "web"}),
            ("{path}:3", {"id": "2", "text": "Awful, just\nawful", "source": "mail"}),
            ("{path}:6", {"id": "3", "text": "ok", "source": "x"}),
        ],
    ),
    ("t.tsv", 'text\tid\n"quoted" stays\t7\n', [("{path}:2", {"text": '"quoted" stays', "id": "7"})]),
    ("t.CSV", "\ufefftext,label\r\nfine,1\r\n", [("{path}:2", {"text": "fine", "label": "1"})]),
]


@pytest.mark.parametrize(("name", "content", "records"), TABLES)
def test_a_table_gives_its_text_column_and_keeps_every_column(
    tmp_path: Path, name: str, content: str, records: list[tuple[str, dict[str, str]]]
) -> None:
    """A .csv/.tsv used to be read as lines: its header predicted as a text, each row with its label."""
    path = write(tmp_path, name, content)
    assert list(text_records(str(path))) == [(where.format(path=path), record) for where, record in records]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("a.csv", "", "{path}: the file is empty; give a header with a 'text' column"),
        (
            "a.csv",
            "sentence,label\nfine,1\n",
            "{path}:1: the header ('sentence', 'label') has no 'text' column",
        ),
        ("a.csv", "text,text\na,b\n", "{path}:1: the header names column 'text' twice"),
        ("a.csv", "text,id\na,1\nb\n", "{path}:3: 1 fields, but the header has 2 columns; fix the row"),
        ("a.csv", 'text,id\n"open,1\nb,2\n', "{path}:2: " + OPEN_QUOTE),
        ("a.csv", "text,id\n,1\n", "{path}:2: empty text in the 'text' field"),
        (
            "a.tsv",
            "text\tid\nfine\t1\n\xff\t2\n",
            "{path}:3: byte 0xff is not UTF-8; re-save the file as UTF-8",
        ),
    ],
)
def test_a_bad_table_is_one_line_naming_its_line(
    tmp_path: Path, name: str, content: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape").replace(b"\xc3\xbf", b"\xff"))
    assert refusal(read_texts, str(path)).startswith(expected.format(path=path))


# --- 5. Labels: numeric spellings normalised, non-labels refused, near-duplicate spellings warned -------


@pytest.mark.parametrize(
    ("name", "content", "labels"),
    [
        ("a.csv", "text,label\na,1\nb,1.0\nc,01\nd, +1 \ne,0\nf,-1\n", ["1", "1", "1", "1", "0", "-1"]),
        ("b.tsv", "text\tlabel\na\t00\nb\t2.\nc\tpos\n", ["0", "2", "pos"]),
        (
            "c.jsonl",
            '{"text": "a", "label": 1.0}\n{"text": "b", "label": 1}\n{"text": "c", "label": "1"}\n',
            ["1"] * 3,
        ),
        ("d.json", '[{"text": "a", "label": -0.0}, {"text": "b", "label": "2.50"}]', ["0", "2.50"]),
    ],
)
def test_numeric_label_spellings_are_one_label(
    tmp_path: Path, name: str, content: str, labels: list[str]
) -> None:
    assert sentiment(write(tmp_path, name, content))["label"] == labels


@pytest.mark.parametrize(
    ("name", "content", "labels"),
    [
        ("a.jsonl", '{"text": "a", "label": true}\n{"text": "b", "label": false}\n', ["true", "false"]),
        ("b.csv", "text,label\na,True\nb,FALSE\nc,false\n", ["true", "false", "false"]),
    ],
)
def test_boolean_labels_are_spelled_as_json_spells_them(
    tmp_path: Path, name: str, content: str, labels: list[str]
) -> None:
    assert sentiment(write(tmp_path, name, content))["label"] == labels


def test_two_spellings_read_as_one_label_give_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = [1, 1.0, 1, "+1", "0", 0, True, "True", "true", "neg"]
    content = "".join(json.dumps({"text": "t", "label": label}) + "\n" for label in records)
    path = write(tmp_path, "s.jsonl", content)
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        labels = sentiment(path)["label"]
    assert labels == ["1", "1", "1", "1", "0", "0", "true", "true", "true", "neg"]
    [record] = caplog.records
    assert record.getMessage() == (
        f"{path}: label spellings read as one label: +1 (1) and 1 (2) and 1.0 (1) as '1'; True (1) and "
        "true (2) as 'true'; if they are different classes, name them apart"
    )


NOT_LABELS = [
    (
        '{"text": "a", "label": 2.5}',
        "label 2.5 (a float) in column 'label' is not a class; write labels as strings or integers "
        "(or set regression=true for numbers)",
    ),
    (
        '{"text": "a", "label": NaN}',
        "label NaN (a float) in column 'label' is not a class; write labels as strings or integers "
        "(or set regression=true for numbers)",
    ),
    (
        '{"text": "a", "label": {"x": 1}}',
        "label is an object ({\"x\": 1}) in column 'label', not a class name; write labels as strings or "
        "integers",
    ),
    ('{"text": "a", "label": null}', "missing label in column 'label'; give every row a label"),
    (
        '{"text": 5, "label": "pos"}',
        "text is a number (5), not a string, in column 'text'; write the text as a JSON string",
    ),
    (
        '{"text": 2.5, "label": "pos"}',
        "text is a number (2.5), not a string, in column 'text'; write the text as a JSON string",
    ),
    (
        '{"text": true, "label": "pos"}',
        "text is a boolean (true), not a string, in column 'text'; write the text as a JSON string",
    ),
    (
        '{"text": ["a"], "label": "pos"}',
        "text is a list ([\"a\"]), not a string, in column 'text'; write the text as a JSON string",
    ),
    ('{"text": null, "label": "pos"}', "empty text in column 'text'; fill it in or drop the row"),
]


@pytest.mark.parametrize(("record", "expected"), NOT_LABELS)
def test_what_is_not_a_label_or_a_text_says_what_was_found(
    tmp_path: Path, record: str, expected: str
) -> None:
    path = write(tmp_path, "s.jsonl", '{"text": "ok", "label": "pos"}\n' + record + "\n")
    assert refusal(sentiment, path) == f"{path}:2: {expected}"


@pytest.mark.parametrize(
    ("labels", "listed"),
    [
        (["Positive", "positive", "positive", "negative"], "'Positive' (1) / 'positive' (2)"),
        (["pos", "pos.", "neg", '"neg"', "neg"], "'pos' (1) / 'pos.' (1); '\"neg\"' (1) / 'neg' (2)"),
        (["pos", "pos\u200b", "POS"], "'POS' (1) / 'pos' (1) / 'pos\\u200b' (1)"),
    ],
)
def test_near_duplicate_label_spellings_give_one_warning_and_stay_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, labels: list[str], listed: str
) -> None:
    records = "".join(json.dumps({"text": "t", "label": label}) + "\n" for label in labels)
    path = write(tmp_path, "s.jsonl", records)
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        data = sentiment(path)
    assert data["label"] == labels  # warned, never merged
    [record] = caplog.records
    assert record.getMessage() == (
        f"{path}: label spellings that differ only by case or surrounding characters are separate classes: "
        f"{listed}; if they mean one class, spell them the same in the data"
    )


@pytest.mark.parametrize(
    "labels",
    [["1", "-1", "0"], ["pos", "neg", "neutral"], ["B", "C"], [":)", ":("], ["true", "false"]],
)
def test_distinct_labels_give_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, labels: list[str]
) -> None:
    path = write(tmp_path, "s.csv", "text,label\n" + "".join(f"t,{label}\n" for label in labels))
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        sentiment(path)
    assert caplog.records == []


def test_surrounding_whitespace_is_stripped_not_a_second_spelling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "s.csv", 'text,label\na,pos\nb,"pos "\nc, pos\n')
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        assert sentiment(path)["label"] == ["pos", "pos", "pos"]
    assert caplog.records == []


# --- 6. A CSV quote left open swallows the rows after it: refused where the field starts ---------------


def rows(count: int) -> list[str]:
    return [f"review {i},{'pos' if i % 2 else 'neg'}" for i in range(count)]


OPEN_QUOTES = [
    ("never closed", 'text,label\nok,pos\n"it was great,pos\nbad,neg\nfine,pos\n', 3),
    (
        "closed rows later",
        "\n".join(["text,label", *rows(9), '"He said hi,pos', *rows(10), 'the end" of it,neg', *rows(20)])
        + "\n",
        11,
    ),
    ("in the label column", 'text,label\nok,"pos\nbad,neg\nworse,neg\n', 2),
    ("after a legit multi-line field", 'text,label\n"two\nlines",pos\n"open,neg\nbad,neg\n', 4),
    ("CRLF line ends", 'text,label\r\nok,pos\r\n"open,neg\r\nbad,neg\r\n', 3),
    ("CR line ends", 'text,label\rok,pos\r"open,neg\rbad,neg\r', 3),
    (
        "swallows more than the csv field limit",
        'text,label\nok,pos\n"open,pos\n' + "\n".join(rows(20000)) + "\n",
        3,
    ),
]


@pytest.mark.parametrize(("content", "line"), [c[1:] for c in OPEN_QUOTES], ids=[c[0] for c in OPEN_QUOTES])
def test_a_quote_left_open_is_refused_where_it_opens(tmp_path: Path, content: str, line: int) -> None:
    path = write(tmp_path, "s.csv", content)
    assert refusal(sentiment, path) == f"{path}:{line}: {OPEN_QUOTE}"


def test_forty_rows_with_an_open_quote_are_not_read_as_thirty(tmp_path: Path) -> None:
    lines = rows(40)
    lines[12] = '"' + lines[12]  # opens a field that a later stray quote closes ten rows on
    lines[22] = 'a "quoted" word,pos'
    path = write(tmp_path, "s.csv", "\n".join(["text,label", *lines]) + "\n")
    assert refusal(sentiment, path) == f"{path}:14: {OPEN_QUOTE}"


@pytest.mark.parametrize(
    ("content", "texts"),
    [
        (
            'text,label\n"The room was small,\nbut clean.",pos\nok,neg\n',
            ["The room was small,\nbut clean.", "ok"],
        ),
        ('text,label\n"one\ntwo\n\nthree",pos\n', ["one\ntwo\n\nthree"]),
        ('text,label\n"She said ""hi""\nand left",pos\n', ['She said "hi"\nand left']),
        ('text,label\n"I love it\nreally, ""truly""",pos\n', ['I love it\nreally, "truly"']),
        ('text,label\n"a; b\nc\td",pos\n', ["a; b\nc\td"]),
    ],
)
def test_legitimate_multi_line_fields_are_read(tmp_path: Path, content: str, texts: list[str]) -> None:
    assert sentiment(write(tmp_path, "s.csv", content))["text"] == texts


# --- 7. CoNLL columns are split at ASCII spaces and tabs only; span offsets are integers, not booleans ----


@pytest.mark.parametrize(
    ("content", "tokens"),
    [
        ("New\u00a0York B-LOC\nis O\n", ["New\u00a0York", "is"]),
        ("New\u00a0York NNP B-NP B-LOC\n", ["New\u00a0York"]),
        ("10\u2009mg O\nof O\nSt\u3000John B-PER\n", ["10\u2009mg", "of", "St\u3000John"]),
        ("New\u00a0York\tB-LOC\n\u00a0x\u00a0\tO\n", ["New\u00a0York", "\u00a0x\u00a0"]),
        ("a\u2028b O\nc\x1cd O\n", ["a\u2028b", "c\x1cd"]),
    ],
)
def test_non_ascii_whitespace_is_part_of_a_conll_token(
    tmp_path: Path, content: str, tokens: list[str]
) -> None:
    assert read_conll(write(tmp_path, "x.conll", content))["tokens"] == [tokens]


def test_a_no_break_space_is_no_column_separator(tmp_path: Path) -> None:
    path = write(tmp_path, "x.conll", "Aspirin B-Chemical\nhelped\u00a0O\n")
    assert refusal(read_conll, path) == (
        f"{path}:2: expected at least 2 columns (token ... tag), found 1 (columns are separated by tabs or "
        "ASCII spaces; U+00A0 is part of a token); fix the line or set conll_tag_index"
    )


@pytest.mark.parametrize(
    ("span", "expected"),
    [
        (
            '{"start": true, "end": 7, "label": "Chemical"}',
            "span 1: start is a boolean (true), not an integer character offset; fix the offsets",
        ),
        (
            '{"start": 0, "end": true, "label": "Chemical"}',
            "span 1: end is a boolean (true), not an integer character offset; fix the offsets",
        ),
        (
            '{"start": false, "end": 1, "label": "Chemical"}',
            "span 1: start is a boolean (false), not an integer character offset; fix the offsets",
        ),
        (
            '{"start": 0.0, "end": 7, "label": "Chemical"}',
            "span 1: start is a number (0.0), not an integer character offset; fix the offsets",
        ),
        (
            '{"start": "0", "end": 7, "label": "Chemical"}',
            'span 1: start is a string ("0"), not an integer character offset; fix the offsets',
        ),
    ],
)
def test_span_offsets_must_be_integers(tmp_path: Path, span: str, expected: str) -> None:
    ok = '{"start": 0, "end": 7, "label": "Chemical"}'
    path = write(
        tmp_path,
        "s.jsonl",
        f'{{"text": "Aspirin", "spans": [{ok}]}}\n{{"text": "Aspirin", "spans": [{span}]}}\n',
    )
    assert refusal(read_jsonl_spans, path) == f"{path}:2: {expected}"
    assert refusal(read_ner_file, path, Config(task="ner")) == f"{path}:2: {expected}"


@pytest.mark.parametrize(
    "value", ["[" * 100_000 + "]" * 100_000, "1" * 5000], ids=["nested too deeply", "5000-digit number"]
)
def test_json_that_json_loads_cannot_hold_is_one_line(tmp_path: Path, value: str) -> None:
    reason = "invalid JSON (nested too deeply or number too long)"
    data = write(
        tmp_path, "s.jsonl", '{"text": "ok", "label": "a"}\n{"text": "ok", "label": ' + value + "}\n"
    )
    assert refusal(sentiment, data) == f"{data}:2: {reason}; write one JSON object per line"
    texts = write(tmp_path, "t.jsonl", '{"text": "ok"}\n{"text": ' + value + "}\n")
    if value.isdigit():  # an input to predict says which number (`echoed_json`)
        reason = (
            "invalid JSON (a number of 5000 digits, more than the 4300 Python reads; send it as a string)"
        )
    assert refusal(read_texts, str(texts)) == f"{texts}:2: {reason}; {JSONL_FIX}"


def test_a_column_the_reader_takes_named_twice_in_the_header_is_refused(tmp_path: Path) -> None:
    """`text,label,label` with opposite labels: reading either would be a silent guess."""
    path = write(tmp_path, "dup.csv", "text,label,label\nGreat,pos,neg\n")
    assert refusal(sentiment, path) == (
        f"{path}:1: the header names column 'label' 2 times; rename all but one of them, or set "
        "text_column/label_column to another column"
    )
    other = write(tmp_path, "note.csv", "text,label,note,note\nGreat,pos,a,b\n")  # unread columns may repeat
    assert sentiment(other)["label"] == ["pos"]
