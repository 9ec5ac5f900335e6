"""The `bert-tasks` command: finetune / predict / evaluate in-process through `cli.main`, plus one real
console-script run end to end.

`main` returns the exit status, so user errors are checked as status 1 with one line on stderr and no
traceback; argparse mistakes exit with status 2.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from tests.helpers import (
    DATA,
    LABELS,
    LONG_NER_TEXT,
    fast_overrides,
    train_steps,
    write_jsonl,
)

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def sentiment_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentiment model trained through the CLI (read-only for the tests below)."""
    out = tmp_path_factory.mktemp("cli") / "sentiment"
    assert main(["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, out)]) == 0
    return out


@pytest.fixture(scope="module")
def ner_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An NER model trained through the CLI (read-only for the tests below)."""
    out = tmp_path_factory.mktemp("cli") / "ner"
    assert main(["finetune", "ner", *fast_overrides("ner", tiny_model, out)]) == 0
    return out


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a user error (and nothing on stdout, no traceback)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert lines[0].startswith("bert-tasks: error: ")
    return lines[0]


@pytest.mark.parametrize("quiet", [False, True])
@pytest.mark.slow
def test_quiet_hides_the_progress_bars_with_the_log(
    quiet: bool, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quiet leaves results and warnings only: no INFO line and no progress bar (train or evaluate)."""
    flags = ["--quiet"] if quiet else []
    overrides = fast_overrides("sentiment", tiny_model, tmp_path / "run", max_steps=2)
    assert main([*flags, "finetune", "sentiment", *overrides]) == 0
    stderr = capsys.readouterr().err
    assert ("train:" in stderr) is not quiet and ("model saved to" in stderr) is not quiet, stderr


@pytest.mark.slow
def test_finetune_recipe_then_overrides(tiny_model: Path, tmp_path: Path) -> None:
    """YAML recipe values apply, key=value overrides win over them, and the run saves the merged config."""
    out = tmp_path / "run"
    train_file, _ = DATA["sentiment"]
    recipe = {
        "model": str(tiny_model),
        "train_file": str(train_file),
        "validation_file": None,
        "batch_size": 4,
        "lr": 1e-3,
        "max_length": 32,
        "stride": 8,
        "logging_steps": 1,
        "mixed_precision": "no",
        "output_dir": str(out),
    }
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    assert main(["finetune", "sentiment", "--recipe", str(recipe_path), "lr=2e-4", "max_steps=3"]) == 0
    saved = load_recipe(out / "recipe.yaml")
    assert (saved.lr, saved.max_steps, saved.batch_size, saved.mixed_precision) == (2e-4, 3, 4, "no")
    assert saved.validation_file is None
    assert train_steps(out) == [1, 2, 3]


@pytest.mark.slow
def test_finetune_refuses_a_used_dir_then_overwrites(
    sentiment_dir: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --overwrite: exit 1, a one-line hint naming --overwrite/--resume; with it: replaced."""
    out = shutil.copytree(sentiment_dir, tmp_path / "run")
    argv = ["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, out, max_steps=1)]
    capsys.readouterr()
    assert main(argv) == 1
    line = error_line(capsys)
    assert "--overwrite" in line and "--resume" in line
    assert train_steps(out) == [1, 2, 3, 4, 5]
    assert main([*argv, "--overwrite"]) == 0
    assert train_steps(out) == [1]


def test_unknown_config_key_is_one_line_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' name for a key points at ours; status 1, no traceback, nothing trained."""
    assert main(["finetune", "sentiment", "learning_rate=3e-5"]) == 1
    line = error_line(capsys)
    assert "unknown config key 'learning_rate'" in line and "did you mean 'lr'?" in line


def test_debug_shows_the_traceback() -> None:
    """--debug re-raises the user error instead of printing one line."""
    with pytest.raises(BertTasksError, match="unknown config key 'learning_rate'"):
        main(["--debug", "finetune", "sentiment", "learning_rate=3e-5"])


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "sentiment", "--bogus", "text"],
        ["predict", "sentiment", "text", "--bogus"],
        ["finetune", "sentiment", "--epochs", "3"],
        ["predict", "nonsense", "text"],
    ],
)
def test_argparse_mistakes_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown flags (before or after positionals) and unknown tasks are usage errors: status 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: bert-tasks" in capsys.readouterr().err


@pytest.mark.slow
def test_predict_table(sentiment_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default output is a table: a header, then label, probability and text per input."""
    texts = ["Loved every minute of it.", "The battery died after a day."]
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(sentiment_dir), *texts]) == 0
    header, *rows = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["label", "score", "text"]
    assert len(rows) == len(texts)
    for row, text in zip(rows, texts, strict=True):
        label, score, rest = row.split(maxsplit=2)
        assert label in LABELS["sentiment"] and 0.5 <= float(score) <= 1.0 and rest == text


@pytest.mark.slow
def test_predict_json_lines(sentiment_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints exactly one JSON object per text, in input order, unicode kept as is."""
    texts = ["Très bien ☺", "Awful.", "Fine, I guess."]
    capsys.readouterr()
    assert main(["predict", "sentiment", "--json", "--model", str(sentiment_dir), *texts]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line) for line in out.splitlines()]
    assert [record["text"] for record in records] == texts
    assert "Très bien ☺" in out
    for record in records:
        assert record["label"] in LABELS["sentiment"]
        assert sum(record["scores"].values()) == pytest.approx(1.0)


@pytest.mark.slow
def test_predict_ner_json_and_table(ner_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NER --json gives entities with exact offsets; the table marks them in the text."""
    capsys.readouterr()
    assert main(["predict", "ner", "--model", str(ner_dir), "--json", LONG_NER_TEXT]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["text"] == LONG_NER_TEXT and record["entities"]
    for entity in record["entities"]:
        assert LONG_NER_TEXT[entity["start"] : entity["end"]] == entity["text"]
    assert main(["predict", "ner", "--model", str(ner_dir), LONG_NER_TEXT]) == 0
    table = capsys.readouterr().out
    first = record["entities"][0]
    assert f"[{first['text']}]({first['label']})" in table.splitlines()[0]
    assert f"{first['start']:>5}-{first['end']:<5}" in table


@pytest.mark.slow
def test_options_after_positionals(sentiment_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`predict sentiment --model DIR "text"` and `predict sentiment "text" --model DIR` agree."""
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(sentiment_dir), "--json", "Great fun."]) == 0
    before = capsys.readouterr().out
    assert main(["predict", "sentiment", "Great fun.", "--model", str(sentiment_dir), "--json"]) == 0
    after = capsys.readouterr().out
    assert before == after and json.loads(before)["text"] == "Great fun."


def test_double_dash_allows_texts_starting_with_a_dash(
    sentiment_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--` ends the options, the usual way to pass a text such as '- not worth it -'."""
    argv = ["predict", "sentiment", "--model", str(sentiment_dir), "--json", "--", "-not worth it-"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "-not worth it-"


def test_predict_file_plain_lines_and_jsonl(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--file takes one text per non-blank line, or JSONL objects with a 'text'; arguments come first."""
    plain = tmp_path / "texts.txt"
    plain.write_text("First review.\n\n   \nSecond review.\n", encoding="utf-8")
    records = write_jsonl(tmp_path / "texts.jsonl", [{"text": "From JSON.", "id": 1}, {"text": "Also."}])
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(sentiment_dir), "--json", "--file", str(plain)]) == 0
    texts = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert texts == ["First review.", "Second review."]
    argv = [
        "predict",
        "sentiment",
        "Argument.",
        "--file",
        str(records),
        "--model",
        str(sentiment_dir),
        "--json",
    ]
    assert main(argv) == 0
    texts = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert texts == ["Argument.", "From JSON.", "Also."]


def test_predict_file_dash_reads_standard_input(
    sentiment_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--file -` reads the texts from standard input, lines or JSONL as from a file (the format decided
    once, from the first line: here JSON Lines, so every line is a record)."""
    piped = b'{"text": "From a pipe."}\n{"text": "Second line."}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(piped), encoding="utf-8"))
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(sentiment_dir), "--json", "--file", "-"]) == 0
    texts = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert texts == ["From a pipe.", "Second line."]


@pytest.mark.parametrize(
    ("piped", "message"),
    [
        (b"", "nothing to predict"),
        (b'{"text": "fine"}\n{not json\n', "<stdin>:2: invalid JSON"),
        (b"fine\ncaf\xe9\n", "<stdin>:2: byte 0xe9 at offset 8 is not UTF-8"),
    ],
)
def test_predict_bad_standard_input_exits_1(
    sentiment_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    piped: bytes,
    message: str,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(piped), encoding="utf-8"))
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(sentiment_dir), "--file", "-"]) == 1
    assert message in error_line(capsys)


@pytest.mark.parametrize(
    ("argv_tail", "message"),
    [
        (["--file", "{tmp}/missing.txt"], "{tmp}/missing.txt: file not found"),
        ([], "nothing to predict"),
        (["text", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["   "], "text 1 is empty"),
        (
            ["max_length=64", "Loved it."],
            "predict: the text 'max_length=64' is a max_length= setting, and predict takes none",
        ),
        (["Loved it.", "lr=1e-5", "--out", "{tmp}/o.jsonl"], "the text 'lr=1e-5' is a lr= setting"),
    ],
)
def test_predict_user_errors_exit_1(
    sentiment_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv_tail: list[str],
    message: str,
) -> None:
    """Bad predict input: status 1 and one line saying what is wrong."""
    tail = [item.format(tmp=tmp_path) for item in argv_tail]
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(sentiment_dir), *tail]) == 1
    assert message.format(tmp=tmp_path) in error_line(capsys)


def test_predict_missing_or_wrong_model_dir(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing dir, or the other task's model, fails in one line naming what to do."""
    capsys.readouterr()
    assert main(["predict", "sentiment", "--model", str(tmp_path / "nope"), "text"]) == 1
    assert "no such directory" in error_line(capsys)
    assert main(["predict", "ner", "--model", str(sentiment_dir), "text"]) == 1
    assert "use `bert-tasks predict sentiment`" in error_line(capsys)


def test_evaluate_sentiment_writes_metrics_and_confusion_matrix(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """evaluate scores every labelled row once and writes metrics.json plus the confusion-matrix PNG."""
    data = DATA["sentiment"][1]
    capsys.readouterr()
    assert (
        main(
            [
                "evaluate",
                "sentiment",
                "--model",
                str(sentiment_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["labels"] == LABELS["sentiment"]
    assert sum(map(sum, metrics["confusion_matrix"])) == 12
    assert f"accuracy {metrics['accuracy']:.4f}" in out
    assert (tmp_path / "confusion_matrix.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_evaluate_ner_defaults_to_a_dir_inside_the_model(
    ner_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --out the report goes to <model>/eval-<data stem>; NER metrics are entity-level."""
    model = shutil.copytree(ner_dir, tmp_path / "model")
    data = DATA["ner"][1]
    assert main(["evaluate", "ner", "--model", str(model), "--data", str(data)]) == 0
    report = model / f"eval-{data.stem}" / "metrics.json"
    metrics = json.loads(report.read_text())
    assert {"precision", "recall", "f1", "per_type"} <= set(metrics)
    assert sum(row["support"] for row in metrics["per_type"].values()) > 0
    assert f"entity F1 {metrics['f1']:.4f}" in capsys.readouterr().out


def test_evaluate_missing_data_file_exits_1(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing --data file is a user error, and no report dir is left behind."""
    capsys.readouterr()
    argv = ["evaluate", "sentiment", "--model", str(sentiment_dir), "--data", str(tmp_path / "none.jsonl")]
    assert main([*argv, "--out", str(tmp_path / "report")]) == 1
    assert "file not found" in error_line(capsys)
    assert not (tmp_path / "report").exists()


def test_evaluate_json_stdout_is_json(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json is for programs (`bert-tasks evaluate ... --json | jq .accuracy`): stdout must be JSON only."""
    data = DATA["sentiment"][1]
    capsys.readouterr()
    argv = [
        "evaluate",
        "sentiment",
        "--model",
        str(sentiment_dir),
        "--data",
        str(data),
        "--out",
        str(tmp_path),
    ]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "metrics.json").read_text())


@pytest.mark.slow  # fresh processes that import torch
def test_console_script_finetune_then_predict(tiny_model: Path, tmp_path: Path) -> None:
    """The installed `bert-tasks` entry point works end to end in a fresh process."""
    script = Path(sys.executable).with_name("bert-tasks")
    command = str(script) if script.exists() else shutil.which("bert-tasks")
    assert command, "the bert-tasks console script is not installed (pip install -e .)"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = tmp_path / "run"
    overrides = fast_overrides("sentiment", tiny_model, out, max_steps=2, validation_file=None)
    finetune = subprocess.run(
        [command, "finetune", "sentiment", *overrides], capture_output=True, text=True, env=env, timeout=120
    )
    assert finetune.returncode == 0, finetune.stderr[-2000:]
    assert f"model saved to {out}" in finetune.stderr  # progress and summary go to stderr, results to stdout
    predict = subprocess.run(
        [command, "predict", "sentiment", "--model", str(out), "--json", "Loved it.", "Hated it."],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert predict.returncode == 0, predict.stderr[-2000:]
    records = [json.loads(line) for line in predict.stdout.splitlines()]
    assert [record["text"] for record in records] == ["Loved it.", "Hated it."]
    assert all(record["label"] in LABELS["sentiment"] for record in records)


@pytest.mark.slow  # fresh processes that import torch
def test_predict_skips_the_training_and_plotting_imports(sentiment_dir: Path) -> None:
    """`bert-tasks predict` starts without importing matplotlib, scikit-learn or the training loop."""
    code = (
        "import sys\n"
        "from bert_tasks.cli import main\n"
        f"status = main(['predict', 'sentiment', '--model', {str(sentiment_dir)!r}, 'Loved it.'])\n"
        "print([name for name in ('matplotlib', 'sklearn', 'bert_tasks.training') if name in sys.modules])\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-1] == "[]"
