"""`accelerate launch -m bert_tasks predict ... --out`: two CPU processes (gloo) share the input's chunks
and the main one writes one output, byte for byte what one process writes; a failure on one process ends
both with one line each and leaves stream.py's partial file; what several processes cannot do is refused
in one line before torch loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_startup import probe
from tests.test_distributed import launch_result

#: 7,000 records: chunks of 2,048 -> two rounds of two chunks, the last one short.
RECORDS = 7_000


def write_input(path: Path, clash_at: int | None = None) -> Path:
    """Records with ids of two kinds and a field of their own; every 50th text long enough to window."""
    with path.open("w", encoding="utf-8") as stream:
        for n in range(RECORDS):
            text = f"review {n} was {'good' if n % 3 else 'bad'}" + (" and long" * 40 if n % 50 == 0 else "")
            record = {"id": n if n % 2 else f"r-{n}", "text": text, "source": "web"}
            if n == clash_at:
                record["label"] = "gold"
            stream.write(json.dumps(record) + "\n")
    return path


def predict_command(model: Path, source: Path, out: Path) -> list[str]:
    return [
        "-m",
        "bert_tasks",
        "predict",
        "sentiment",
        "--model",
        str(model),
        "--file",
        str(source),
        "--out",
        str(out),
    ]


@pytest.mark.slow
def test_two_processes_write_what_one_process_writes_byte_for_byte(
    sentiment_run: Path, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl")
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the launch runs each of its processes
    single = subprocess.run(
        [sys.executable, *predict_command(sentiment_run, source, one)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr.decode()[-3000:]
    launched = launch_result(*predict_command(sentiment_run, source, two))
    assert launched.returncode == 0, launched.stderr[-5000:]
    assert launched.stdout.splitlines() == [
        f"{RECORDS} predictions written to {two}"
    ]  # the main process only
    assert two.read_bytes() == one.read_bytes()
    with two.open(encoding="utf-8") as lines:
        assert [json.loads(line)["id"] for line in lines] == [
            n if n % 2 else f"r-{n}" for n in range(RECORDS)
        ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.jsonl", "one.jsonl", "two.jsonl"]


@pytest.mark.slow
def test_a_failure_on_one_process_ends_both_with_one_line_each(sentiment_run: Path, tmp_path: Path) -> None:
    """Record 6,501 (the second process's chunk of the second round) holds a field the prediction writes:
    that process names it, the main one says another process failed, and OUT.partial holds the first
    round, complete and in order."""
    source = write_input(tmp_path / "in.jsonl", clash_at=6_500)
    out = tmp_path / "out.jsonl"
    launched = launch_result(*predict_command(sentiment_run, source, out))
    assert launched.returncode != 0
    errors = [line for line in launched.stderr.splitlines() if line.startswith("bert-tasks: ")]
    assert (
        set(errors)
        == {
            "bert-tasks: error: another process of this launch failed while predicting its share of the "
            "input (it says why); this one stops",
            f"bert-tasks: error: {source}:6501: the record has a field 'label', which the prediction writes; "
            "rename that field (e.g. to 'gold_label') or drop it, so that neither value is lost",
        }
        and len(errors) == 2
    )
    assert not out.exists()
    with (tmp_path / "out.jsonl.partial").open(encoding="utf-8") as lines:
        assert [json.loads(line)["id"] for line in lines] == [n if n % 2 else f"r-{n}" for n in range(4096)]


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        ([], "predict across 2 processes writes one file: give --out OUT.jsonl (and --file)"),
        (["--json"], "predict across 2 processes writes one file: give --out OUT.jsonl (and --file)"),
        (["--out", "o.jsonl", "--file", "-"], "--file -: standard input cannot be shared by the 2 processes"),
    ],
)
@pytest.mark.slow
def test_what_several_processes_cannot_do_is_one_line_before_torch_loads(
    sentiment_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: list[str], message: str
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun and `accelerate launch` tell each process
    answer = probe(["predict", "sentiment", "--model", str(sentiment_run), "a text", *tail], tmp_path)
    assert answer["status"] == 1 and message in answer["stderr"], answer
    assert answer["loaded"] == []
    assert list(tmp_path.iterdir()) == []
