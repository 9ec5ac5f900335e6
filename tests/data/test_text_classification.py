"""Text-classification readers: every format, and every bad row reported as file:line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bert_tasks.data.text_classification import read_text_classification
from bert_tasks.errors import BertTasksError
from tests.helpers import write_file as write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_glue_tsv_keeps_quotes_and_skips_blank_lines() -> None:
    ds = read_text_classification(FIXTURES / "sent_glue.tsv", "sentence", "label")
    assert ds.column_names == ["text", "label"]
    assert ds["label"] == ["1", "0", "1"]
    assert ds[0]["text"] == 'it \'s a charming and "quietly" affecting journey . '


def test_csv_with_quoted_commas_and_newlines() -> None:
    ds = read_text_classification(FIXTURES / "sent_reviews.csv", "review", "sentiment")
    assert ds["text"] == [
        "Great food, friendly staff.",
        "The room was small,\nbut clean.",
        "Cold soup and a rude waiter.",
    ]
    assert ds["label"] == ["positive", "positive", "negative"]


def test_jsonl_ignores_extra_keys_and_reads_unicode() -> None:
    ds = read_text_classification(FIXTURES / "sent_reviews.jsonl", "text", "label")
    assert len(ds) == 3
    assert ds[2] == {"text": "Café crème was perfect.", "label": "positive"}


def test_json_array_with_integer_labels() -> None:
    ds = read_text_classification(FIXTURES / "sent_reviews.json", "body", "rating")
    assert ds["label"] == ["1", "0"]  # integer labels become strings, to be named by label_names


def test_json_extension_with_json_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "data.json", '{"text": "fine", "label": "pos"}\n{"text": "bad", "label": "neg"}\n')
    assert read_text_classification(path, "text", "label")["label"] == ["pos", "neg"]


def test_byte_order_mark_is_tolerated(tmp_path: Path) -> None:
    path = write(tmp_path, "bom.csv", "\ufefftext,label\nhello,pos\n")
    assert read_text_classification(path, "text", "label")["text"] == ["hello"]


def test_real_sst2_dev(shared_data: Path) -> None:
    ds = read_text_classification(shared_data / "sst2" / "dev.tsv", "sentence", "label")
    assert len(ds) == 872
    assert ds[0] == {"text": "it 's a charming and often affecting journey . ", "label": "1"}


BAD_ROWS = [
    ("a.tsv", "text\tlabel\nfine\t1\n\t0\n", "a.tsv:3: empty text in column 'text'"),
    ("b.tsv", "text\tlabel\nfine\t1\nbad\t\n", "b.tsv:3: missing label in column 'label'"),
    ("c.tsv", "text\tlabel\nfine\t1\nno tab here\n", "c.tsv:3: expected 2 tab-separated columns"),
    ("d.csv", 'text,label\n"multi\nline",pos\n,neg\n', "d.csv:4: empty text"),
    ("e.jsonl", '{"text": "ok", "label": "a"}\n\n{"text": "ok"}\n', "e.jsonl:3: expected columns"),
    ("f.jsonl", '{"text": "ok", "label": "a"}\n{"text": "ok", "label": null}\n', "f.jsonl:2: missing label"),
    ("g.jsonl", '{"text": "ok", "label": "a"}\n{"text": "ok",\n', "g.jsonl:2: invalid JSON"),
    ("h.json", '[{"text": "ok", "label": "a"}, {"text": " ", "label": "b"}]', "h.json: record 2: empty text"),
    ("i.json", '[{"text": "ok", "label": "a"},', "i.json:1: invalid JSON"),
]


@pytest.mark.parametrize(("name", "content", "expected"), BAD_ROWS)
def test_bad_rows_name_file_and_line(tmp_path: Path, name: str, content: str, expected: str) -> None:
    with pytest.raises(BertTasksError, match=re.escape(expected)):
        read_text_classification(write(tmp_path, name, content), "text", "label")


def test_missing_column_lists_found_and_expected(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError) as err:
        read_text_classification(write(tmp_path, "s.tsv", "sentence\tscore\nfine\t1\n"), "text", "label")
    message = str(err.value)
    assert "s.tsv:1" in message
    assert "header has columns sentence, score" in message
    assert "text_column='text'" in message


def test_non_utf8_names_line_and_offset(tmp_path: Path) -> None:
    path = write(tmp_path, "latin1.tsv", "sentence\tlabel\nok\t1\ncaf\xe9 noir\t1\n".encode("latin-1"))
    with pytest.raises(BertTasksError, match=r"latin1\.tsv:3: byte 0xe9 at offset 23 is not UTF-8"):
        read_text_classification(path, "sentence", "label")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("empty.csv", "", "the file is empty"),
        ("blank.jsonl", "\n\n", "the file is empty"),
        ("header.csv", "text,label\n", "no rows found"),
        ("data.xlsx", "text,label\nhi,pos\n", "unsupported file type '.xlsx'; use one of .csv, .tsv, .txt"),
    ],
)
def test_unusable_files(tmp_path: Path, name: str, content: str, expected: str) -> None:
    with pytest.raises(BertTasksError, match=re.escape(expected)):
        read_text_classification(write(tmp_path, name, content), "text", "label")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError, match="file not found"):
        read_text_classification(tmp_path / "nope.csv", "text", "label")
