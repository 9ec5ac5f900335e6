"""`predict --out`: input records kept whole and in order, predicted in bounded chunks, and what a failed
run leaves (`OUT.partial`, never a half OUT); the output path's mistakes are answered before torch loads.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.data.files import text_records
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import Predictor
from bert_tasks.inference.stream import JsonlOutput, chunks, predict_to_jsonl, prediction_inputs
from tests.helpers import cli_error_line, write_jsonl
from tests.test_cli_startup import probe

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def predictor(sentiment_run: Path) -> Predictor:
    return Predictor(sentiment_run, batch_size=64)


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_out_keeps_every_field_and_the_order_and_predicts_as_json_does(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        {"id": 3, "text": "Loved it.", "source": "web"},
        {"text": "Cold soup.", "id": "b-7", "meta": {"stars": 1}},
        {"text": "Fine."},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    model = ["--model", str(sentiment_run)]
    assert main(["predict", "sentiment", *model, "--file", str(source), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"3 predictions written to {out}"
    written = read_jsonl(out)
    assert main(["predict", "sentiment", *model, "--file", str(source), "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for record, line, plain in zip(records, written, printed, strict=True):
        assert list(line)[: len(record)] == list(record) and {k: line[k] for k in record} == record
        assert {k: v for k, v in line.items() if k not in record or k == "text"} == plain
    assert not (tmp_path / "out.jsonl.partial").exists()


@pytest.mark.slow
def test_a_plain_text_file_and_arguments_become_records(sentiment_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("First line.\n\n{not json\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["predict", "sentiment", "An argument.", "--model", str(sentiment_run), "--file", str(source)]
    assert main([*argv, "--out", str(out)]) == 0
    assert [line["text"] for line in read_jsonl(out)] == ["An argument.", "First line.", "{not json"]


@pytest.mark.slow
def test_a_large_file_is_predicted_in_chunks_not_at_once(
    predictor: Predictor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 lines: the predictor sees bounded chunks in input order, and every id comes back in place."""
    lines = 20_000
    source = tmp_path / "big.jsonl"
    with source.open("w", encoding="utf-8") as stream:
        for n in range(lines):
            stream.write(json.dumps({"id": n, "text": f"review {n} was {'good' if n % 3 else 'bad'}"}) + "\n")
    seen: list[int] = []
    annotate = predictor.annotate

    def spy(chunk: list[tuple[str, dict[str, object]]]) -> list[dict[str, object]]:
        seen.append(len(chunk))
        return annotate(chunk)

    monkeypatch.setattr(predictor, "annotate", spy)
    records, total = prediction_inputs([], str(source))
    assert total == lines  # a regular file is read through once before the model runs
    with JsonlOutput(tmp_path / "big.out.jsonl", str(source)) as out:
        assert predict_to_jsonl(predictor, records, out, total, max_texts=2048) == lines
    assert seen == [2048] * 9 + [lines - 9 * 2048]
    with (tmp_path / "big.out.jsonl").open(encoding="utf-8") as stream:
        assert all(json.loads(line)["id"] == n for n, line in enumerate(stream))


def test_chunks_are_bounded_by_characters_too() -> None:
    records = [(f"t:{n}", {"text": "x" * 300}) for n in range(10)]
    assert [len(chunk) for chunk in chunks(records, max_texts=100, max_chars=1000)] == [4, 4, 2]
    assert [where for chunk in chunks(records, 3, 10**6) for where, _ in chunk] == [w for w, _ in records]


@pytest.mark.slow
def test_a_run_stopped_by_bad_input_leaves_the_partial_file_of_the_first_chunks(
    predictor: Predictor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Standard input is checked as it streams: a bad line 2,501 stops the run with its line; OUT does
    not exist, OUT.partial holds the first 2,000 predictions, complete and in order; a rerun rewrites it."""
    good = "".join(json.dumps({"id": n, "text": f"text {n}"}) + "\n" for n in range(2500))
    piped = (good + "{broken\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(piped), encoding="utf-8"))
    out_path = tmp_path / "out.jsonl"
    records, total = prediction_inputs([], "-")
    assert total is None
    with (
        pytest.raises(BertTasksError, match=r"^<stdin>:2501: invalid JSON"),
        JsonlOutput(out_path, "-") as out,
    ):
        predict_to_jsonl(predictor, records, out, total, max_texts=1000)
    assert not out_path.exists()
    assert [line["id"] for line in read_jsonl(tmp_path / "out.jsonl.partial")] == list(range(2000))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(good.encode()), encoding="utf-8"))
    with JsonlOutput(out_path, "-") as out:
        predict_to_jsonl(predictor, text_records("-"), out, max_texts=1000)
    assert [line["id"] for line in read_jsonl(out_path)] == list(range(2500))
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_an_empty_pipe_writes_nothing(
    sentiment_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n \n"), encoding="utf-8"))
    out = tmp_path / "out.jsonl"
    assert (
        main(["predict", "sentiment", "--model", str(sentiment_run), "--file", "-", "--out", str(out)]) == 1
    )
    assert "nothing to predict: the input holds no text" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_pipe_without_out_names_standard_input(
    sentiment_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n"), encoding="utf-8"))
    line = cli_error_line(["predict", "sentiment", "--model", str(sentiment_run), "--file", "-"], capsys)
    assert "nothing to predict: standard input holds no text (empty, or blank lines only)" in line


def test_a_table_streams_through_out_with_its_columns(sentiment_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "reviews.csv"
    source.write_text('id,text,stars\n17,"Loved it, truly",5\nb-2,Cold soup.,1\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["predict", "sentiment", "--model", str(sentiment_run), "--file", str(source), "--out", str(out)]
    assert main(argv) == 0
    written = read_jsonl(out)
    assert [{k: line[k] for k in ("id", "text", "stars")} for line in written] == [
        {"id": "17", "text": "Loved it, truly", "stars": "5"},
        {"id": "b-2", "text": "Cold soup.", "stars": "1"},
    ]
    assert all(line["label"] in ("negative", "positive") for line in written)


def test_a_field_the_prediction_writes_is_refused_with_its_line(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "gold.jsonl", [{"text": "Good.", "label": "positive"}])
    out = tmp_path / "out.jsonl"
    assert (
        main(
            ["predict", "sentiment", "--model", str(sentiment_run), "--file", str(source), "--out", str(out)]
        )
        == 1
    )
    assert (
        f"{source}:1: the record has a field 'label', which the prediction writes" in capsys.readouterr().err
    )
    assert source.read_text() and not out.exists() and not (tmp_path / "out.jsonl.partial").exists()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1e400", "1e400 is too large for a double; send it as a string"),
        ("-Infinity", "-Infinity is no JSON number"),
        ("NaN", "NaN is no JSON number"),
        ("0.10000000000000000001", "0.10000000000000000001 would come back as 0.1"),
        ("9" * 5000, "a number of 5000 digits, more than the 4300 Python reads"),
    ],
)
def test_an_id_that_would_not_be_written_back_as_read_is_one_line_with_its_line(
    sentiment_run: Path, tmp_path: Path, value: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`1e400` was written back as `Infinity` and `NaN` as `NaN`: lines no JSON reader takes."""
    source = tmp_path / "in.jsonl"
    source.write_text(f'{{"id": 1, "text": "Good."}}\n{{"id": {value}, "text": "Bad."}}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["predict", "sentiment", "--model", str(sentiment_run), "--file", str(source), "--out", str(out)]
    assert f"{source}:2: invalid JSON ({reason}" in cli_error_line(argv, capsys)
    assert not out.exists() and not (tmp_path / "out.jsonl.partial").exists()
    array = tmp_path / "in.json"
    array.write_text(f'[{{"id": {value}, "text": "Bad."}}]', encoding="utf-8")
    with pytest.raises(BertTasksError) as error:
        list(text_records(str(array)))
    assert str(error.value).startswith(str(array)) and f"invalid JSON ({reason}" in str(error.value)


def test_number_ids_come_back_as_the_same_numbers(sentiment_run: Path, tmp_path: Path) -> None:
    """Python spells a float its own way (`1E2` as `100.0`); the value, and every digit of an int, stay."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": 1E2, "text": "a"}\n{"id": 123456789012345678901234567890, "text": "b"}\n')
    out = tmp_path / "out.jsonl"
    assert (
        main(
            ["predict", "sentiment", "--model", str(sentiment_run), "--file", str(source), "--out", str(out)]
        )
        == 0
    )
    assert [line["id"] for line in read_jsonl(out)] == [100.0, 123456789012345678901234567890]
    assert out.read_text().startswith('{"id": 100.0,')


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (["--out", "{tmp}/taken.jsonl"], "--out {tmp}/taken.jsonl: already exists; give a new path"),
        (["--out", "{tmp}/in.jsonl"], "--out {tmp}/in.jsonl: already exists"),
        (
            ["--file", "{tmp}/o.jsonl.partial", "--out", "{tmp}/o.jsonl"],
            "--out {tmp}/o.jsonl: its partial file {tmp}/o.jsonl.partial is the input; give another --out",
        ),
        (
            ["--out", "{tmp}/notes.jsonl"],
            "--out {tmp}/notes.jsonl: {tmp}/notes.jsonl.partial exists and is no partial output of predict",
        ),
        (["--out", "{tmp}/no/such/dir/o.jsonl"], "--out {tmp}/no/such/dir/o.jsonl: cannot write"),
        (["--out", "{tmp}/o.jsonl", "--format", "text"], "--out writes JSON Lines, --format text prints"),
        (["--out", "{tmp}/o.jsonl", "--format", "label-studio"], "--out writes JSON Lines"),
    ],
)
@pytest.mark.slow
def test_output_mistakes_are_one_line_before_torch_loads(
    sentiment_run: Path, tmp_path: Path, tail: list[str], message: str
) -> None:
    users = {name: write_jsonl(tmp_path / name, [{"text": name}]) for name in ("in.jsonl", "o.jsonl.partial")}
    users["taken.jsonl"] = write_jsonl(tmp_path / "taken.jsonl", [{"text": "the user's own file"}])
    users["notes.jsonl.partial"] = tmp_path / "notes.jsonl.partial"
    users["notes.jsonl.partial"].write_text("my own notes\n", encoding="utf-8")
    argv = ["predict", "sentiment", "--model", str(sentiment_run), "--file", str(tmp_path / "in.jsonl")]
    answer = probe([*argv, *(item.format(tmp=tmp_path) for item in tail)], tmp_path)
    assert answer["status"] == 1 and message.format(tmp=tmp_path) in answer["stderr"], answer
    assert answer["loaded"] == []
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(users)
    assert read_jsonl(users["o.jsonl.partial"]) == [{"text": "o.jsonl.partial"}]
    assert read_jsonl(users["taken.jsonl"]) == [{"text": "the user's own file"}]
    assert users["notes.jsonl.partial"].read_text(encoding="utf-8") == "my own notes\n"


@pytest.mark.slow
def test_a_killed_run_leaves_complete_lines_in_order_in_the_partial_file(
    sentiment_run: Path, tmp_path: Path
) -> None:
    """SIGKILL in the middle: OUT never appears; every complete line of OUT.partial is a valid record,
    and they are the first inputs in order."""
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"id": n, "text": f"text number {n}"}) + "\n" for n in range(200_000))
    )
    out = tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    command = [sys.executable, "-m", "bert_tasks", "predict", "sentiment", "--model", str(sentiment_run)]
    process = subprocess.Popen(
        [*command, "--file", str(source), "--out", str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    try:
        deadline = time.monotonic() + 120
        while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert not out.exists()
    lines = partial.read_bytes().split(b"\n")
    complete = [json.loads(line) for line in lines[:-1]]
    assert complete and [record["id"] for record in complete] == list(range(len(complete)))
    assert len(complete) < 200_000
