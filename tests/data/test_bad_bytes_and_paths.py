"""Paths that are streams, invisible "texts", NULs and lone surrogates: one rule each, through every reader.

Every refusal is asserted as its exact one-line message. The readers are the public ones: sentiment
(`read_text_classification`), NER (`read_ner_file`, `read_conll`, `read_jsonl_spans`, `read_jsonl_tokens`)
and prediction input (`read_texts`).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bert_tasks.config import Config
from bert_tasks.data.files import check_text, is_blank, read_texts
from bert_tasks.data.ner_files import read_conll, read_jsonl_tokens, read_ner_file
from bert_tasks.data.text_classification import read_text_classification
from bert_tasks.errors import BertTasksError

NUL_FIX = "; remove it (NULs usually mean a binary or UTF-16 file: re-save it as UTF-8 text)"
SURROGATE_FIX = (
    " (half of a UTF-16 pair, not a character: an unpaired \\u escape in JSON, or a byte that is not UTF-8); "
    "fix the text or re-save it as UTF-8"
)
EMPTY_TEXT = "empty text in column 'text'; fill it in or drop the row"


def sentiment(path: Path) -> object:
    return read_text_classification(path, "text", "label")


def ner(path: Path) -> object:
    return read_ner_file(path, Config(task="ner"))


READERS: dict[str, Callable[[Path], object]] = {
    "sentiment": sentiment,
    "ner": ner,
    "texts": lambda path: read_texts(str(path)),
}
#: A valid file for each reader, by name (the extension picks the format).
GOOD = {
    "sentiment": ("data.csv", "text,label\nGreat food.,pos\nCold soup.,neg\n"),
    "ner": ("data.conll", "Aspirin\tB-Chemical\nhelped\tO\n\nFever\tB-Disease\n"),
    "texts": ("texts.txt", "First.\nSecond.\n"),
}


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", newline="")
    return path


def refusal(read: Callable[[], object]) -> str:
    """The message of the BertTasksError `read` raises, checked to be one line."""
    with pytest.raises(BertTasksError) as err:
        read()
    message = str(err.value)
    assert "\n" not in message and "\r" not in message
    return message


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Callable[[str, bytes], Path]]:
    """make(name, data): a real FIFO that a writer thread fills with `data` once a reader opens it."""
    writers: list[threading.Thread] = []

    def make(name: str, data: bytes) -> Path:
        path = tmp_path / name
        os.mkfifo(path)

        def feed() -> None:
            deadline = time.monotonic() + 10
            while True:  # non-blocking open: fails (ENXIO) until a reader has the FIFO open
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError as e:
                    if e.errno != errno.ENXIO or time.monotonic() > deadline:
                        return
                    time.sleep(0.01)
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        writers.append(writer)
        return path

    yield make
    for writer in writers:
        writer.join(timeout=10)


# --- 1. Paths: whatever opens is read; each reason it does not open is its own line ---------------------


@pytest.mark.parametrize("reader", sorted(GOOD))
def test_a_fifo_is_read_as_a_file(fifo: Callable[[str, bytes], Path], reader: str) -> None:
    name, content = GOOD[reader]
    data = READERS[reader](fifo(name, content.encode()))
    assert len(data) == 2  # two rows, two sentences' tokens, two texts  # type: ignore[arg-type]


def test_a_fifo_of_ner_json_is_read_once(fifo: Callable[[str, bytes], Path]) -> None:
    """read_ner_file looks at the first record to pick the reader, then parses what it read: a FIFO
    cannot be read twice."""
    records = b'{"text": "Aspirin helped", "spans": [{"start": 0, "end": 7, "label": "Chemical"}]}\n'
    assert ner(fifo("spans.jsonl", records))["tags"] == [["B-Chemical", "O"]]  # type: ignore[index]
    tokens = b'{"tokens": ["Aspirin", "helped"], "tags": ["B-Chemical", "O"]}\n'
    assert ner(fifo("tokens.jsonl", tokens))["tokens"] == [["Aspirin", "helped"]]  # type: ignore[index]


def test_an_empty_fifo_is_an_empty_file(fifo: Callable[[str, bytes], Path]) -> None:
    path = fifo("empty.csv", b"")
    assert refusal(lambda: sentiment(path)) == (
        f"{path}: the file is empty; give a file with at least one example"
    )


def test_a_pipe_by_its_dev_fd_path_is_read_like_process_substitution() -> None:
    """`--file <(grep ...)` hands over /dev/fd/N: a pipe, not a regular file."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"From a pipe.\n{not JSON, just text}\n")
        os.close(write_end)
        assert read_texts(f"/dev/fd/{read_end}") == ["From a pipe.", "{not JSON, just text}"]
    finally:
        os.close(read_end)


@pytest.mark.parametrize("reader", sorted(GOOD))
def test_a_missing_file(tmp_path: Path, reader: str) -> None:
    path = tmp_path / GOOD[reader][0]
    assert refusal(lambda: READERS[reader](path)) == (
        f"{path}: file not found; check the path (relative paths start at the current dir)"
    )


@pytest.mark.parametrize("reader", sorted(GOOD))
def test_a_directory(tmp_path: Path, reader: str) -> None:
    path = tmp_path / GOOD[reader][0]
    path.mkdir()
    assert refusal(lambda: READERS[reader](path)) == (
        f"{path}: is a directory, not a file; give the path of a file"
    )


@pytest.mark.parametrize("reader", sorted(GOOD))
def test_a_path_through_a_file_says_why_it_cannot_be_read(tmp_path: Path, reader: str) -> None:
    """Any other OSError: its strerror, here ENOTDIR for a path that goes through a regular file."""
    path = write(tmp_path, "plain", "x") / GOOD[reader][0]
    assert refusal(lambda: READERS[reader](path)) == (
        f"{path}: cannot read the file (Not a directory); check the path"
    )


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root, which reads a chmod 000 file anyway: permission denied cannot happen",
)
@pytest.mark.parametrize("reader", sorted(GOOD))
def test_an_unreadable_file(tmp_path: Path, reader: str) -> None:
    path = write(tmp_path, *GOOD[reader])
    path.chmod(0)
    try:
        assert refusal(lambda: READERS[reader](path)) == (
            f"{path}: permission denied (the file is not readable by this user); "
            "check its permissions (chmod +r) or copy it somewhere readable"
        )
    finally:
        path.chmod(0o644)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            PermissionError(errno.EACCES, "Permission denied"),
            "permission denied (the file is not readable by "
            "this user); check its permissions (chmod +r) or copy it somewhere readable",
        ),
        (
            OSError(errno.EIO, "Input/output error"),
            "cannot read the file (Input/output error); check the path",
        ),
    ],
)
def test_open_errors_map_to_one_line_even_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, expected: str
) -> None:
    """The same mapping as test_an_unreadable_file, where root's reads cannot fail for real."""
    from bert_tasks.data import files

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(files, "open", fail, raising=False)
    for reader, (name, content) in GOOD.items():
        path = write(tmp_path, name, content)
        assert refusal(lambda r=reader, p=path: READERS[r](p)) == f"{path}: {expected}"


# --- 2. A text with nothing visible is empty --------------------------------------------------------------

INVISIBLE = {
    "zero-width space": "\u200b",
    "byte-order mark": "\ufeff",
    "word joiner and spaces": " \u2060 \t",
    "bidi marks": "\u200e\u202e\u200f",
    "no-break space": "\u00a0",
    "controls": "\x0b\x07\x1f",
    "ideographic space": "\u3000",
}


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_is_blank(text: str) -> None:
    assert is_blank(text)
    assert is_blank("")
    assert not is_blank(text + "a")
    assert not is_blank("\u200b😀")
    assert not is_blank("\u0301")  # a combining mark on its own is drawn (a dotted circle)


def escaped(text: str) -> str:
    """`text` as a JSON string body (escapes only)."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_invisible_text_is_empty_in_every_reader(tmp_path: Path, text: str) -> None:
    jsonl = write(
        tmp_path, "s.jsonl", f'{{"text": "ok", "label": "a"}}\n{{"text": "{escaped(text)}", "label": "b"}}\n'
    )
    assert refusal(lambda: sentiment(jsonl)) == f"{jsonl}:2: {EMPTY_TEXT}"
    csv = write(tmp_path, "s.csv", f'text,label\nok,a\n"{text}",b\n')
    assert refusal(lambda: sentiment(csv)) == f"{csv}:3: {EMPTY_TEXT}"
    label = write(tmp_path, "l.jsonl", f'{{"text": "ok", "label": "{escaped(text)}"}}\n')
    assert refusal(lambda: sentiment(label)) == (
        f"{label}:1: missing label in column 'label'; give every row a label"
    )
    tokens = write(tmp_path, "t.jsonl", f'{{"tokens": ["ok", "{escaped(text)}"], "tags": ["O", "O"]}}\n')
    assert refusal(lambda: read_jsonl_tokens(tokens)) == (
        f"{tokens}:1: token 2 is empty or invisible (whitespace, control or format characters only); "
        "remove it from 'tokens'"
    )
    conll = write(tmp_path, "t.conll", f"Aspirin\tB-Chemical\n{text}\tO\n")
    assert refusal(lambda: read_conll(conll)) == (
        f"{conll}:2: empty token in column 0; remove the line or put the token first"
    )
    texts = write(tmp_path, "t.jsonl", f'{{"text": "ok"}}\n{{"text": "{escaped(text)}"}}\n')
    assert refusal(lambda: read_texts(str(texts))) == (
        f"{texts}:2: empty text in the 'text' field; fill it in or drop the record"
    )


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_invisible_lines_are_blank_lines(tmp_path: Path, text: str) -> None:
    """Skipped between texts and JSON records; a sentence break in CoNLL; a file of them is empty."""
    plain = write(tmp_path, "t.txt", f"First.\n{text}\nSecond.\n")
    assert read_texts(str(plain)) == ["First.", "Second."]
    jsonl = write(
        tmp_path, "s.jsonl", f'{{"text": "ok", "label": "a"}}\n{text}\n{{"text": "no", "label": "b"}}\n'
    )
    assert sentiment(jsonl)["label"] == ["a", "b"]  # type: ignore[index]
    conll = write(tmp_path, "t.conll", f"Aspirin\tB-Chemical\n{text}\nFever\tB-Disease\n")
    assert read_conll(conll)["tokens"] == [["Aspirin"], ["Fever"]]
    for name, reader in (("e.csv", sentiment), ("e.conll", read_conll), ("e.txt", read_texts)):
        empty = write(tmp_path, name, f"{text}\n{text}\n")
        assert refusal(lambda r=reader, p=empty: r(p if r is not read_texts else str(p))) == (
            f"{empty}: the file is empty; give a file with at least one example"
        )


# --- 3. NUL characters and lone surrogates, with where and the character offset ---------------------------


def nul(where: str, offset: int, what: str) -> str:
    return f"{where}: NUL character (\\x00) at character offset {offset} of {what}{NUL_FIX}"


def surrogate(where: str, code: str, offset: int, what: str) -> str:
    return f"{where}: lone surrogate \\u{code} at character offset {offset} of {what}{SURROGATE_FIX}"


BAD_CHARACTERS = [
    # (file name, content, reader, expected message with {path})
    (
        "a.jsonl",
        '{"text": "ok", "label": "a"}\n{"text": "caf\\ud800 noir", "label": "b"}\n',
        sentiment,
        surrogate("{path}:2", "d800", 3, "the text in column 'text'"),
    ),
    (
        "b.json",
        '[{"text": "ok", "label": "a"}, {"text": "\\udfff", "label": "b"}]',
        sentiment,
        surrogate("{path}: record 2", "dfff", 0, "the text in column 'text'"),
    ),
    ("c.csv", "text,label\nok,a\nbin\x00ary,b\n", sentiment, nul("{path}:3", 3, "the text in column 'text'")),
    ("d.tsv", "text\tlabel\nok\tpo\x00s\n", sentiment, nul("{path}:2", 2, "the label in column 'label'")),
    (
        "e.jsonl",
        '{"text": "ok", "label": "a\\u0000"}\n',
        sentiment,
        nul("{path}:1", 1, "the label in column 'label'"),
    ),
    ("f.conll", "Aspirin\tB-Chemical\nhel\x00ped\tO\n", ner, nul("{path}:2", 3, "the line")),
    ("g.txt", "Aspirin B-Chemical\nhelped O\x00\n", ner, nul("{path}:2", 8, "the line")),
    (
        "h.jsonl",
        '{"tokens": ["Aspirin", "x\\udce9"], "tags": ["B-Chemical", "O"]}\n',
        ner,
        surrogate("{path}:1", "dce9", 1, "token 2 in 'tokens'"),
    ),
    (
        "i.jsonl",
        '{"tokens": ["Aspirin"], "tags": ["B-Chem\\u0000"]}\n',
        ner,
        nul("{path}:1", 6, "tag 1 in 'tags'"),
    ),
    (
        "j.jsonl",
        '{"text": "Aspirin \\ud83d helped", "spans": [{"start": 0, "end": 7, "label": "Chemical"}]}\n',
        ner,
        surrogate("{path}:1", "d83d", 8, "the text in 'text'"),
    ),
    (
        "k.jsonl",
        '{"text": "Aspirin", "spans": [{"start": 0, "end": 7, "label": "Chem\\u0000"}]}\n',
        ner,
        nul("{path}:1", 4, "the label of span 1"),
    ),
    ("l.txt", "fine\nnot\x00fine\n", read_texts, nul("{path}:2", 3, "the line")),
    (
        "m.jsonl",
        '{"text": "fine"}\n{"text": "\\udc80"}\n',
        read_texts,
        surrogate("{path}:2", "dc80", 0, "the text"),
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "reader", "expected"), BAD_CHARACTERS, ids=[case[0] for case in BAD_CHARACTERS]
)
def test_nul_and_lone_surrogates_are_refused_where_they_are(
    tmp_path: Path, name: str, content: str, reader: Callable[..., object], expected: str
) -> None:
    path = write(tmp_path, name, content)
    assert refusal(lambda: reader(str(path) if reader is read_texts else path)) == expected.format(path=path)


def test_check_text_for_command_line_texts() -> None:
    """What the predictor sees for `bert-tasks predict ... $'caf\\xe9'`: the byte became U+DCE9."""
    text = os.fsdecode(b"caf\xe9") if sys.getfilesystemencoding() == "utf-8" else "caf\udce9"
    assert refusal(lambda: check_text(text, "text 2")) == surrogate("text 2", "dce9", 3, "the text")
    assert refusal(lambda: check_text("a\x00", "text 1")) == nul("text 1", 1, "the text")
    assert (
        check_text("Fever 🤒 \u200f مريض", "text 1") == "Fever 🤒 \u200f مريض"
    )  # paired surrogates are fine


@pytest.mark.parametrize(
    ("reader", "content", "expected"),
    [
        ("sentiment", b"text,label\nGreat.,pos\nBad.,neg\n", ["pos", "neg"]),
        ("sentiment", b'text\tlabel\nA "quoted" word\tpos\n', ["pos"]),
        ("sentiment", b'\n{"text": "Great.", "label": "pos"}\n', ["pos"]),
        ("ner", b"Aspirin\tB-Chemical\nhelped\tO\n", [["B-Chemical", "O"]]),
        ("ner", b'{"tokens": ["Aspirin"], "tags": ["B-Chemical"]}\n', [["B-Chemical"]]),
    ],
)
def test_a_pipe_without_an_extension_is_told_by_its_first_line(
    reader: str, content: bytes, expected: list[object]
) -> None:
    """`train_file=<(...)` is /dev/fd/N: no extension, readable once; JSON when its first line opens an
    object or array, else TSV (a tab in the header) or CSV, or a column file for NER."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, content)
        os.close(write_end)
        data = READERS[reader](Path(f"/dev/fd/{read_end}"))
        assert data["label" if reader == "sentiment" else "tags"] == expected  # type: ignore[index]
    finally:
        os.close(read_end)


def test_a_config_path_keeps_the_name_it_was_given() -> None:
    """Not resolved through symlinks: /dev/fd/N stays /dev/fd/N (resolved, it is `pipe:[...]`)."""
    from bert_tasks.config import load_recipe

    cfg = load_recipe(None, ["train_file=/dev/fd/0"], task="sentiment")
    assert cfg.train_file == "/dev/fd/0"
