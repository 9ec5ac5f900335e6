"""Sentiment files the way public sets ship them: headerless `text<TAB>label`, `.txt`, GLUE's
`sentence<TAB>label`, any extension with `format=`; and the one-line refusals of each."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bert_tasks.config import load_recipe
from bert_tasks.data.splits import read_splits
from bert_tasks.data.text_classification import read_text_classification
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks import SentimentTask
from tests.helpers import write_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: UCI "Sentiment Labelled Sentences" layout: `sentence<TAB>0|1`, no header, `.txt`.
HEADERLESS = (
    "So there is no way to plug it in.\t0\nGood case, excellent value.\t1\nGreat for the jawbone.\t1\n"
)


def refusal(read, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(BertTasksError) as err:
        read(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_headerless_txt_file_reads_text_0_and_label_1(tmp_path: Path) -> None:
    data = read_text_classification(
        write_file(tmp_path, "amazon_cells_labelled.txt", HEADERLESS), header=False
    )
    assert data["label"] == ["0", "1", "1"]
    assert data["text"][1] == "Good case, excellent value."


@pytest.mark.parametrize(
    ("columns", "content"),
    [
        (("1", "0"), "0\tawful film\n1\tlovely film\n"),
        (("-1", "0"), "0\tx\tawful film\n1\ty\tlovely film\n"),
        (("2", "-3"), "0\tx\tawful film\n1\ty\tlovely film\n"),
    ],
)
def test_headerless_columns_are_indexes_negative_from_the_end(
    tmp_path: Path, columns: tuple[str, str], content: str
) -> None:
    data = read_text_classification(write_file(tmp_path, "s.tsv", content), *columns, header=False)
    assert (data["text"], data["label"]) == (["awful film", "lovely film"], ["0", "1"])


def test_headerless_csv_keeps_its_quoting(tmp_path: Path) -> None:
    path = write_file(tmp_path, "s.csv", '"Fine, really",pos\n"Bad, ""very""",neg\n')
    assert read_text_classification(path, header=False)["text"] == ["Fine, really", 'Bad, "very"']


def test_header_false_is_a_config_key_that_reaches_the_reader(tmp_path: Path) -> None:
    path = write_file(tmp_path, "train.txt", HEADERLESS)
    cfg = load_recipe(None, [f"train_file={path}", "header=false"], task="sentiment")
    assert read_splits(SentimentTask(), cfg)["train"]["label"] == ["0", "1", "1"]


HEADERLESS_REFUSALS = [
    (
        ("review", "label"),
        HEADERLESS,
        "text_column='review' with header=false: a file without a header row has no column names; give "
        "a 0-based column index (e.g. text_column=0), or set header=true",
    ),
    (
        ("0", "2"),
        HEADERLESS,
        "{path}:1: label_column=2 but the row has 2 tab-separated column(s) (indexes 0..1, or -2..-1 from "
        "the end); fix label_column",
    ),
    (
        ("0", "-2"),
        HEADERLESS,
        "{path}:1: text_column=0 and label_column=-2 are the same column of 2; give them different columns",
    ),
    (
        ("text", "label"),
        "0\tawful film, really\n1\tlovely film\n1\tsweet and short\n",
        "{path}: label column 1 holds text, not labels (3 of 3 labels are several words, 3 different, e.g. "
        "'awful film, really'); if the columns are the other way round, set text_column=1 label_column=0",
    ),
    (
        ("text", "label"),
        "0\tawful\n1\tlovely\n",
        "{path}: label column 1 holds text, not labels (every text in column 0 is a number, e.g. 'awful'); "
        "if the columns are the other way round, set text_column=1 label_column=0",
    ),
    (
        ("text", "label"),
        "fine\t1\nbad\t0\tmore\n",
        "{path}:2: expected 2 tab-separated columns (as on the first row; header=false), found 3; "
        "fix the row",
    ),
]


@pytest.mark.parametrize(("columns", "content", "expected"), HEADERLESS_REFUSALS)
def test_headerless_mistakes_are_one_line(
    tmp_path: Path, columns: tuple[str, str], content: str, expected: str
) -> None:
    path = write_file(tmp_path, "s.txt", content)
    assert refusal(read_text_classification, path, *columns, header=False) == expected.format(path=path)


def test_a_wrong_index_is_refused_before_the_file_is_read(tmp_path: Path) -> None:
    message = refusal(read_text_classification, tmp_path / "missing.tsv", "0", "label_col", header=False)
    assert message.startswith("label_column='label_col' with header=false")


def test_a_glue_tsv_trains_with_no_column_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_recipe(None, [f"train_file={FIXTURES / 'sent_glue.tsv'}"], task="sentiment")
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        data = read_splits(SentimentTask(), cfg)["train"]
    assert data["label"] == ["1", "0", "1"]
    assert data["text"][1] == "unflinchingly bleak and desperate "
    [record] = [r for r in caplog.records if r.name == "bert_tasks.data.columns"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        f"{FIXTURES / 'sent_glue.tsv'}: reading text_column='sentence', the one column named like it "
        "(set text_column/label_column to choose others)"
    )


@pytest.mark.parametrize(
    ("name", "content", "guessed"),
    [
        (
            "a.csv",
            "Review,Sentiment\nFine,pos\nBad,neg\n",
            "text_column='Review' and label_column='Sentiment'",
        ),
        (
            "b.tsv",
            "id\ttweet\tpolarity\n1\tFine\tpos\n2\tBad\tneg\n",
            "text_column='tweet' and label_column=",
        ),
        (
            "c.jsonl",
            '{"content": "Fine", "class": "pos"}\n{"content": "Bad", "class": "neg"}\n',
            "text_column",
        ),
    ],
)
def test_one_plausible_column_is_taken_with_an_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, content: str, guessed: str
) -> None:
    path = write_file(tmp_path, name, content)
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        data = read_text_classification(path)
    assert (data["text"], data["label"]) == (["Fine", "Bad"], ["pos", "neg"])
    [record] = caplog.records
    assert record.getMessage().startswith(f"{path}: reading {guessed}")


@pytest.mark.parametrize(
    ("content", "columns"),
    [
        ("sentence,review,label\na,b,pos\n", "sentence, review, label"),  # two candidates: no guess
        ("words,label\na,pos\n", "words, label"),  # no candidate
        ("sentence,stars\na,5\n", "sentence, stars"),  # the label has none
    ],
)
def test_ambiguous_or_absent_columns_stay_an_error_listing_the_header(
    tmp_path: Path, content: str, columns: str
) -> None:
    path = write_file(tmp_path, "s.csv", content)
    assert refusal(read_text_classification, path) == (
        f"{path}:1: header has columns {columns}, expected text_column='text' and label_column='label'; set "
        "text_column/label_column to match the file (or header=false if it has no header row)"
    )


def test_a_configured_name_is_never_replaced_by_a_guess(tmp_path: Path) -> None:
    path = write_file(tmp_path, "s.csv", "sentence,label\na,pos\n")
    assert "expected text_column='body'" in refusal(read_text_classification, path, "body", "label")


@pytest.mark.parametrize(
    ("name", "content", "file_format"),
    [
        ("test.data", "text,label\nFine,pos\nBad,neg\n", "csv"),
        ("test.annotated", "text\tlabel\nFine\tpos\nBad\tneg\n", "tsv"),
        ("export", '{"text": "Fine", "label": "pos"}\n{"text": "Bad", "label": "neg"}\n', "json"),
    ],
)
def test_format_reads_any_extension(tmp_path: Path, name: str, content: str, file_format: str) -> None:
    data = read_text_classification(write_file(tmp_path, name, content), file_format=file_format)
    assert data["label"] == ["pos", "neg"]


def test_an_unknown_format_is_one_line_before_anything_is_read() -> None:
    with pytest.raises(BertTasksError) as err:
        load_recipe(None, ["format=xlsx"], task="sentiment")
    assert str(err.value) == (
        "bad config: format='xlsx', must be one of auto, csv, tsv, json for sentiment data "
        "(on the command line)"
    )


@pytest.mark.parametrize(
    ("files", "keys"),
    [
        (("sent_glue.tsv", "sentence\tlabel\n{rows}"), []),  # GLUE style: no column keys at all
        (("train.txt", "{rows}"), ["header=false"]),  # headerless text<TAB>label, .txt
    ],
)
@pytest.mark.slow
def test_the_cli_trains_on_these_layouts_with_no_column_keys(
    tiny_model: Path,
    tmp_path: Path,
    single_thread: None,
    capsys: pytest.CaptureFixture[str],
    files: tuple[str, str],
    keys: list[str],
) -> None:
    from bert_tasks.cli import main
    from tests.helpers import fast_overrides

    rows = "".join(f"{text}\t{label}\n" for text, label in [("a fine film", 1), ("dull and long", 0)] * 4)
    path = write_file(tmp_path, files[0], files[1].format(rows=rows))
    out = tmp_path / "run"
    argv = fast_overrides("sentiment", tiny_model, out, train_file=path, validation_file=path)
    assert main(["--quiet", "finetune", "sentiment", *argv, *keys]) == 0
    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}


@pytest.mark.parametrize(
    ("settings", "file", "message"),
    [
        (
            {"pair_column": "label"},
            "t.csv",
            "{path}:1: label_column and text_pair_column are both 'label', the same column; give them "
            "different columns",
        ),
        (
            {"text_column": "label"},
            "t.csv",
            "{path}:1: text_column and label_column are both 'label', the same column; give them different "
            "columns",
        ),
        (
            {"pair_column": "text"},
            "t.jsonl",
            "{path}:1: text_column and text_pair_column are both 'text', the same column; give them "
            "different columns",
        ),
    ],
)
def test_two_settings_naming_one_column_by_name_are_refused_as_by_index(
    tmp_path: Path, settings: dict[str, str], file: str, message: str
) -> None:
    """By index the same mistake was refused; by name the label was read as the aspect (or the text)."""
    content = (
        "text,label,aspect\nfine screen,pos,screen\nweak battery,neg,battery\n"
        if file.endswith(".csv")
        else '{"text": "fine screen", "label": "pos", "aspect": "screen"}\n'
    )
    path = write_file(tmp_path, file, content)
    assert refusal(read_text_classification, path, **settings) == message.format(path=path)
