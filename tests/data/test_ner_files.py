"""NER readers: every format, the repairs they make, and the one-line errors they raise."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bert_tasks.config import Config
from bert_tasks.data.ner_files import (
    read_conll,
    read_jsonl_spans,
    read_jsonl_tokens,
    read_ner_file,
    repair_bio,
    token_input,
    words_with_offsets,
)
from bert_tasks.errors import BertTasksError
from tests.helpers import write_file as write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_conll_tab_file_whitespace_separator_and_bio_repair(caplog):
    with caplog.at_level(logging.WARNING):
        data = read_conll(FIXTURES / "ner_sample.conll")
    assert data["tokens"] == [
        ["Lithium", "carbonate", "-", "induced", "nephrogenic", "diabetes", "insipidus", "."],
        ["Fever", "and", "headache", "resolved", "."],  # the " \t " line separated the sentences
        ["Cisplatin", "nephrotoxicity"],
    ]
    first = ["B-Chemical", "I-Chemical", "O", "O", "B-Disease", "I-Disease", "I-Disease", "O"]
    assert data["tags"][0] == first
    # I-Disease after O and I-Disease after B-Chemical both start an entity, as conlleval reads them.
    assert data["tags"][1] == ["B-Disease", "O", "B-Disease", "O", "O"]
    assert data["tags"][2] == ["B-Chemical", "B-Disease"]
    assert data["repaired_tags"] == [0, 1, 1]  # per sentence, for `debug data`
    [record] = caplog.records
    assert "repaired 2 invalid BIO" in record.getMessage()
    assert f"{FIXTURES / 'ner_sample.conll'}:12" in record.getMessage()


def test_conll2003_four_columns_and_docstart():
    data = read_conll(FIXTURES / "ner_conll2003.txt", tag_index=-1)
    assert data["tokens"] == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"]]
    assert data["tags"] == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"]]
    chunks = read_conll(FIXTURES / "ner_conll2003.txt", tag_index=2)
    assert chunks["tags"][0] == ["B-NP", "B-VP", "B-NP", "I-NP", "O"]


def test_conll_wrong_tag_column_says_what_to_set():
    path = FIXTURES / "ner_conll2003.txt"
    with pytest.raises(BertTasksError, match=rf"{path}:3: tag 'NNP' is not BIO.*conll_tag_index"):
        read_conll(path, tag_index=1)


def test_conll_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path, "bad.conll", "Aspirin\tB-Chemical\n\nrash\tB-Disease\nfever\n")
    with pytest.raises(BertTasksError, match=rf"{path}:4: expected at least 2 columns .* found 1"):
        read_conll(path)
    empty_token = write(tmp_path, "empty.tsv", "Aspirin\tB-Chemical\n\tO\n")
    with pytest.raises(BertTasksError, match=rf"{empty_token}:2: empty token"):
        read_conll(empty_token)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "file not found"),
        ("\n \n", "file is empty"),
        (b"Aspirin\tB-Chemical\nna\xefve\tO\n", r":2: byte 0xef at offset \d+ is not UTF-8"),
        ("-DOCSTART- -X- -X- O\n\n", "no sentences found"),
    ],
)
def test_conll_unreadable_files(tmp_path, content, message):
    path = tmp_path / "x.conll" if content is None else write(tmp_path, "x.conll", content)
    with pytest.raises(BertTasksError, match=message):
        read_conll(path)


def test_conll_crlf_and_bom(tmp_path):
    path = write(tmp_path, "win.conll", b"\xef\xbb\xbfAspirin\tB-Chemical\r\nrash\tB-Disease\r\n\r\n")
    row = {"tokens": ["Aspirin", "rash"], "tags": ["B-Chemical", "B-Disease"], "repaired_tags": 0}
    assert read_conll(path)[0] == row


def test_conll_lone_cr_line_ends_are_line_breaks(tmp_path):
    # Old Mac exports end lines with a lone CR; read as one line, the whole file would be one "token".
    path = write(tmp_path, "mac.conll", b"Aspirin\tB-Chemical\rrash\tB-Disease\r\rFever\tB-Disease\r")
    data = read_conll(path)
    assert data["tokens"] == [["Aspirin", "rash"], ["Fever"]]
    assert data["tags"] == [["B-Chemical", "B-Disease"], ["B-Disease"]]


def test_conll_line_numbers_count_lone_cr_breaks(tmp_path):
    path = write(tmp_path, "mac.conll", b"Aspirin\tB-Chemical\rrash\r")
    with pytest.raises(BertTasksError, match=r"mac\.conll:2: expected at least 2 columns"):
        read_conll(path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "Aspirin B-Chemical\nNew York B-LOC\n",
            r"w\.conll:2: 3 columns, but the file's token lines have 2 "
            r"\(as .*w\.conll:1\) \(a line without tabs is split at spaces",
        ),
        ("EU NNP B-ORG\n\nrain O\n", r"w\.conll:3: 2 columns, but the file's token lines have 3"),
        ("Aspirin\tB-Chemical\nrash\tNN\tB-Disease\n", r"w\.conll:2: 3 columns, .* have 2 \(as [^)]*\); fix"),
    ],
    ids=["a token with a space", "a column fewer", "an extra tab column"],
)
def test_conll_lines_of_another_column_count_are_refused(tmp_path, content, expected):
    # Token is column 0 and tag the last: without this check `New York B-LOC` silently loses `York`.
    with pytest.raises(BertTasksError, match=expected):
        read_conll(write(tmp_path, "w.conll", content))


def test_conll_comment_lines_are_skipped_and_a_hash_token_is_kept(tmp_path, caplog):
    # CoNLL-U's `# sent_id`/`# text` and MultiCoNER's `# id ... domain=en` lines hold no tag.
    content = (
        "# sent_id = 1\n# text = Aspirin rash\nAspirin\tB-Chemical\n#\tO\nrash\tB-Disease\n\n"
        "# newdoc\nFever\tO\n"
    )
    with caplog.at_level(logging.WARNING):
        data = read_conll(write(tmp_path, "c.conll", content))
    assert data["tokens"] == [["Aspirin", "#", "rash"], ["Fever"]]
    assert data["tags"] == [["B-Chemical", "O", "B-Disease"], ["O"]]
    [record] = caplog.records
    assert "skipped 3 comment line(s)" in record.getMessage() and "c.conll:1" in record.getMessage()


def test_repair_bio_positions():
    fixed, positions = repair_bio(["I-A", "I-A", "B-B", "I-A", "O", "I-B"])
    assert fixed == ["B-A", "I-A", "B-B", "B-A", "O", "B-B"]
    assert positions == [0, 3, 5]


IOBES = "Lithium\tB-Chemical\ncarbonate\tE-Chemical\ncaused\tO\nfever\tS-Disease\n\nrash\tS-Disease\n"
BILOU = {"tokens": ["acute", "renal", "failure", "and", "rash"], "tags": ["B-D", "I-D", "L-D", "O", "U-D"]}


def test_iobes_bilou_and_bmes_tags_are_read_as_the_same_entities_in_bio(tmp_path, caplog):
    from seqeval.metrics.sequence_labeling import get_entities

    with caplog.at_level(logging.WARNING):
        conll = read_conll(write(tmp_path, "iobes.conll", IOBES))
        tokens = read_jsonl_tokens(write(tmp_path, "bilou.jsonl", json.dumps(BILOU) + "\n"))
    assert conll["tags"] == [["B-Chemical", "I-Chemical", "O", "B-Disease"], ["B-Disease"]]
    assert conll["repaired_tags"] == [0, 0]  # a conversion is no repair
    assert tokens["tags"] == [["B-D", "I-D", "I-D", "O", "B-D"]]
    assert get_entities(tokens["tags"][0]) == [("D", 0, 2), ("D", 4, 4)]  # BILOU's own two entities
    first, second = (r.getMessage() for r in caplog.records)
    assert "read 3 IOBES/BILOU/BMES tag(s) as BIO" in first and first.endswith("iobes.conll:2")
    assert "read 2 IOBES/BILOU/BMES tag(s) as BIO" in second and second.endswith("bilou.jsonl:1")
    bmes = {"tokens": ["a", "b", "c", "d"], "tags": ["B-X", "M-X", "E-X", "S-Y"]}
    assert read_jsonl_tokens(write(tmp_path, "bmes.jsonl", json.dumps(bmes)))["tags"] == [
        ["B-X", "I-X", "I-X", "B-Y"]
    ]


def test_a_converted_file_still_repairs_a_stray_inside_tag(tmp_path, caplog):
    path = write(tmp_path, "mixed.conll", "a\tS-X\nb\tE-Y\nc\tO\n")  # E-Y cannot continue an X entity
    with caplog.at_level(logging.WARNING):
        data = read_conll(path)
    assert data["tags"] == [["B-X", "B-Y", "O"]] and data["repaired_tags"] == [1]
    converted, repaired = (r.getMessage() for r in caplog.records)
    assert "read 2 IOBES/BILOU/BMES tag(s)" in converted and converted.endswith(f"{path}:1")
    assert "repaired 1 invalid BIO tag(s)" in repaired and repaired.endswith(f"{path}:2")


def test_jsonl_tokens_with_configured_fields():
    data = read_jsonl_tokens(FIXTURES / "ner_tokens.jsonl", tokens_column="words", tag_column="ner")
    assert len(data) == 2
    assert data[0]["tags"] == ["B-Chemical", "O", "O", "B-Disease", "I-Disease", "O"]


def test_jsonl_tokens_errors_name_the_line(tmp_path):
    lines = '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a", "b"], "tags": ["O"]}\n'
    path = write(tmp_path, "t.jsonl", lines)
    with pytest.raises(BertTasksError, match=rf"{path}:2: 2 tokens but 1 tags"):
        read_jsonl_tokens(path)
    broken = write(tmp_path, "b.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": [\n')
    with pytest.raises(BertTasksError, match=rf"{broken}:2: invalid JSON"):
        read_jsonl_tokens(broken)


def test_jsonl_spans_words_tags_offsets_and_cut_word_warning(caplog):
    with caplog.at_level(logging.WARNING):
        data = read_jsonl_spans(FIXTURES / "ner_spans.jsonl")
    assert data[0]["tokens"] == ["Cisplatin", "caused", "acute", "renal", "failure", "."]
    assert data[0]["tags"] == ["B-Chemical", "O", "B-Disease", "I-Disease", "I-Disease", "O"]
    assert data[1]["tokens"] == ["Headache", "after", "5", "-", "fluorouracil", "😀", "(", "مريض", ")", "."]
    assert data[1]["tags"][:5] == ["B-Disease", "O", "B-Chemical", "I-Chemical", "I-Chemical"]
    for row in data:
        assert [row["text"][s:e] for s, e in row["word_offsets"]] == row["tokens"]
    # "kalemia" cuts the word "Hypokalemia": the whole word is tagged, and the warning says where.
    assert data[2]["tags"] == ["B-Disease", "O", "O", "O"]
    [record] = caplog.records
    assert f"{FIXTURES / 'ner_spans.jsonl'}:3 'kalemia'" in record.getMessage()


def test_a_span_sharing_its_only_word_with_another_is_reported_as_dropped(tmp_path, caplog):
    """HER2 and neu in one word: the word can carry one tag, so the warning names the span that is lost."""
    spans = [{"start": 0, "end": 4, "label": "Gene"}, {"start": 4, "end": 7, "label": "Protein"}]
    path = write(tmp_path, "two.jsonl", json.dumps({"text": "HER2neu rises", "spans": spans}) + "\n")
    with caplog.at_level(logging.WARNING):
        data = read_jsonl_spans(path)
    assert data[0]["tags"] == ["B-Gene", "O"]
    cut, lost = (record.getMessage() for record in caplog.records)
    assert cut.endswith(f"whole words were tagged instead: {path}:1 'HER2'")
    assert lost.startswith(f"{path}: 1 span(s) tag no word of their own")
    assert lost.endswith(
        f"were dropped: {path}:1 'neu' (Protein); a word_splitter that splits them apart keeps them"
    )


def test_jsonl_spans_overlap_is_an_error(tmp_path):
    line = '{"text": "renal failure", "spans": [{"start": 0, "end": 13, "label": "Disease"}, '
    line += '{"start": 6, "end": 13, "label": "Disease"}]}\n'
    path = write(tmp_path, "o.jsonl", line)
    with pytest.raises(BertTasksError, match=rf"{path}:1: spans 'renal failure' .* and 'failure' .* overlap"):
        read_jsonl_spans(path)
    line = '{"text": "rash", "spans": [{"start": 0, "end": 9, "label": "Disease"}]}'
    outside = write(tmp_path, "x.jsonl", line)
    with pytest.raises(BertTasksError, match=rf"{outside}:1: span .* within the text"):
        read_jsonl_spans(outside)


@pytest.mark.parametrize(
    "text",
    [
        "Fever 🤒🏽 after 👨‍👩‍👧 exposure",  # emoji with skin tone and zero-width joiners
        "المريض يعاني من الصداع بعد الأسبرين",  # RTL
        "bell\x07 tab\tnull\x00 rtl-mark\u200f zwsp\u200b end",  # control and invisible characters
        "cafe\u0301 and na\u0308ive",  # combining marks stay inside the word
        "",
        "acute renal failure , " * 5000,  # very long
    ],
)
def test_words_with_offsets_round_trip(text):
    words, offsets = words_with_offsets(text)
    assert [text[s:e] for s, e in offsets] == words
    assert all(word.strip() and word.isprintable() for word in words)
    assert offsets == sorted(offsets)


def test_words_with_offsets_split_like_bc5cdr():
    words, _ = words_with_offsets("Parkinson's 5-FU café\u0301.")
    assert words == ["Parkinson", "'", "s", "5", "-", "FU", "café\u0301", "."]


def test_read_ner_file_dispatch(tmp_path):
    cfg = Config(task="ner", tokens_column="words", tag_column="ner")
    assert len(read_ner_file(FIXTURES / "ner_sample.conll", cfg)) == 3
    assert read_ner_file(FIXTURES / "ner_tokens.jsonl", cfg)[1]["tokens"] == ["No", "adverse", "events", "."]
    assert "word_offsets" in read_ner_file(FIXTURES / "ner_spans.jsonl", cfg).column_names
    records = '[{"text": "rash", "spans": [{"start": 0, "end": 4, "label": "Disease"}]}]'
    array = write(tmp_path, "a.json", records)
    assert read_ner_file(array, cfg)["tags"] == [["B-Disease"]]
    wrong = write(tmp_path, "w.jsonl", '{"sentence": "rash"}\n')
    with pytest.raises(BertTasksError, match=r"NER JSON needs 'words' \+ 'ner'"):
        read_ner_file(wrong, cfg)
    with pytest.raises(BertTasksError, match=r"unknown NER file type '\.csv'"):
        read_ner_file(write(tmp_path, "x.csv", "a,b\n"), cfg)


def test_integer_tags_are_ids_into_label_names(tmp_path):
    """A datasets export writes `ner_tags` as ids: label_names (id order) names them, as for sentiment."""
    path = write(tmp_path, "ids.jsonl", '{"tokens": ["Aspirin", "helps"], "tags": [1, 0]}\n')
    cfg = Config(task="ner", label_names=["O", "B-Chemical", "I-Chemical"])
    assert read_ner_file(path, cfg)["tags"] == [["B-Chemical", "O"]]
    with pytest.raises(BertTasksError) as error:
        read_ner_file(path, Config(task="ner"))
    assert str(error.value) == (
        f"{path}:1: field 'tags' must be a list of strings; name integer tag ids with "
        "label_names=[O,B-X,I-X,...] in id order"
    )
    outside = write(tmp_path, "outside.jsonl", '{"tokens": ["Aspirin"], "tags": [3]}\n')
    with pytest.raises(
        BertTasksError, match=rf"{outside}:1: tag id 3 in 'tags' is not an index of label_names"
    ):
        read_ner_file(outside, cfg)


@pytest.mark.parametrize(
    ("tokens", "text", "offsets"),
    [
        (["ab"], "xab ab", [(4, 6)]),  # the place that starts a word, not the first substring
        (["x", "ab"], "xab ab", [(0, 1), (1, 3)]),  # glued to the previous token: right at the cursor
        (["ab"], "xab", [(1, 3)]),  # inside a word only: the first place
        (["New", "York", "-", "based"], "New York-based", [(0, 3), (4, 8), (8, 9), (9, 14)]),
        (["Dr", "Smith"], "Dr. Smith", [(0, 2), (4, 9)]),
    ],
)
def test_a_token_is_found_where_it_starts_a_word(tokens, text, offsets):
    assert token_input("record 1", {"tokens": tokens, "text": text}) == (tokens, text, offsets)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            {"tokens": ["rash"], "tags": ["B-Disease "]},
            "tag 1 'B-Disease ' in 'tags' has spaces around it; write it as 'B-Disease'",
        ),
        (
            {"text": "rash", "spans": [{"start": 0, "end": 4, "label": " Disease"}]},
            "span label ' Disease' has spaces around it; write it as 'Disease'",
        ),
    ],
)
def test_a_tag_with_spaces_around_it_is_refused_not_a_type_of_its_own(tmp_path, record, expected):
    path = write(tmp_path, "spaced.jsonl", json.dumps(record) + "\n")
    with pytest.raises(BertTasksError) as error:
        read_ner_file(path, Config(task="ner"))
    assert str(error.value) == f"{path}:1: {expected}"


def test_jsonl_tokens_all_empty_is_one_line_and_one_empty_record_is_kept(tmp_path):
    """A file of only empty records broke the metrics with a ZeroDivisionError (evaluate, and finetune
    after training); one empty record among others is a `debug data` warning, as before."""
    only_empty = write(tmp_path, "empty.jsonl", '{"tokens": [], "tags": []}\n' * 2)
    with pytest.raises(BertTasksError, match=rf"{only_empty}: every record's 'tokens' is an empty list"):
        read_jsonl_tokens(only_empty)
    empty_then_one = '{"tokens": [], "tags": []}\n{"tokens": ["rash"], "tags": ["O"]}\n'
    mixed = write(tmp_path, "mixed.jsonl", empty_then_one)
    assert read_jsonl_tokens(mixed)["tokens"] == [[], ["rash"]]
