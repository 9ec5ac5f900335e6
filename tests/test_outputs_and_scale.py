"""Outputs that must not grow with the problem, and output places that cannot take them, through the commands.

- Scale: `evaluate` on a 1,000-class model stays bounded in memory and time (the confusion-matrix PNG shows
  the most frequent classes, the text report prints no 1,000 x 1,000 matrix); `memory --batch` far beyond
  the machine is refused from the formula's estimate before anything that size is allocated.
- Output paths: `evaluate --out`, `attention --out` and `export OUT` follow one rule (OutputDir), checked
  before the model loads: one stderr line naming the path and the reason, no traceback, nothing changed
  outside the output path.
- Standard output: a reader that goes away (`| head -1`) ends the command quietly with 128 + SIGPIPE; a
  full one (`> /dev/full`) should end with one line and status 1 (cli.main does not catch it yet).
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

from bert_tasks.cli import main
from bert_tasks.inference.evaluate import EVALUATE_MARK
from bert_tasks.insight.memory import available_bytes, measurement_bytes
from bert_tasks.insight.plots import CONFUSION_PLOT_CLASSES, MAX_SIDE_PIXELS, plot_confusion_matrix
from bert_tasks.model_dir import POLICY_KEY, ModelPolicy
from bert_tasks.modeling.load import bundled_model_dir, load_config
from tests.helpers import DATA, tiny_bert_config, write_jsonl

PNG = b"\x89PNG\r\n\x1a\n"
NUM_CLASSES, NUM_ROWS = 1000, 2000
TEXT = "The patient was treated with aspirin."
#: Child processes: offline, quiet, and on the CPU count the tests use.
CHILD_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "2"}

pytestmark = pytest.mark.usefixtures("single_thread")


# Helpers.


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data.startswith(PNG) and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def tree(root: Path, inside: Path | None = None) -> dict[str, tuple[int, int] | None]:
    """Every file under `root` with (size, mtime), every directory as None, leaving out `inside`'s subtree.

    Directories carry no mtime: creating (and removing) the output path changes its parent's.
    """
    entries: dict[str, tuple[int, int] | None] = {}
    for path in root.rglob("*"):
        if inside is not None and (path == inside or inside in path.parents):
            continue
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            entries[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
        else:
            entries[str(path.relative_to(root))] = None
    return entries


def refusal(capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a refusal: no traceback, nothing else."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bert-tasks: error: "), err
    assert "Traceback" not in err
    return lines[0]


def no_model_load(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model loaded before the output path was checked")


def run_in_namespace(script: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`script` (sh) as root of a private user and mount namespace: it may mount tmpfs, which goes with it."""
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=CHILD_ENV,
        timeout=timeout,
    )


needs_unshare = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
BERT_TASKS = shlex.join([sys.executable, "-m", "bert_tasks", "--quiet"])


# Fixtures.


@pytest.fixture(scope="module")
def many_classes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny sentiment model dir with 1,000 named classes, and a 2,000-row labelled file for it."""
    root = tmp_path_factory.mktemp("many-classes")
    names = [f"class_{i:04d}" for i in range(NUM_CLASSES)]
    config = tiny_bert_config(
        num_labels=NUM_CLASSES,
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
    )
    setattr(config, POLICY_KEY, ModelPolicy("sentiment", max_length=32, stride=8).to_json())
    model_dir = root / "model"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        BertForSequenceClassification(config).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(model_dir)
    rng = random.Random(0)
    rows = [{"text": f"review {i}: the stay was fine", "label": rng.choice(names)} for i in range(NUM_ROWS)]
    return model_dir, write_jsonl(root / "test.jsonl", rows)


@pytest.fixture(scope="module")
def model_512(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with 512 positions (memory feeds random ids: no tokenizer needed)."""
    directory = tmp_path_factory.mktemp("tiny-512")
    BertModel(tiny_bert_config(max_position_embeddings=512)).save_pretrained(directory)
    return directory


# 1. Reports and plots bounded as the label count grows.

#: Runs evaluate_file as the CLI process would, and reports its time and peak-RSS growth as JSON.
EVALUATE_CHILD = """
import json, resource, sys, time
from pathlib import Path
from bert_tasks.runtime import configure_cli_process
configure_cli_process()
from bert_tasks.inference.evaluate import evaluate_file
from bert_tasks.inference.predictor import Predictor  # torch and transformers: before the baseline
from bert_tasks.insight import plots  # matplotlib too
from bert_tasks.tasks.sentiment import SentimentTask
model, data, out = sys.argv[1:4]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
metrics = evaluate_file("sentiment", model, data, [], Path(out))
report = SentimentTask().render_metrics(metrics)
seconds = time.perf_counter() - start
growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"seconds": seconds, "growth": growth, "report": report}))
"""


@pytest.mark.slow  # a real process, for a peak RSS of its own
def test_evaluate_with_1000_classes_is_bounded_in_memory_and_time(
    many_classes: tuple[Path, Path], tmp_path: Path
) -> None:
    """It used to draw every cell of a 1,000 x 1,000 matrix (~600-inch figure): 22.7 GB, then killed."""
    model_dir, data = many_classes
    out = tmp_path / "report"
    child = subprocess.run(
        [sys.executable, "-c", EVALUATE_CHILD, str(model_dir), str(data), str(out)],
        capture_output=True,
        text=True,
        env=CHILD_ENV,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.splitlines()[-1])
    assert result["seconds"] < 30, result["seconds"]
    assert result["growth"] < 2**30, f"peak RSS grew by {result['growth'] / 2**20:.0f} MiB"
    metrics = json.loads((out / "metrics.json").read_text())
    matrix = metrics["confusion_matrix"]  # the full matrix is kept where the report points
    assert len(matrix) == NUM_CLASSES and all(len(row) == NUM_CLASSES for row in matrix)
    assert sum(map(sum, matrix)) == NUM_ROWS
    width, height = png_size(out / "confusion_matrix.png")
    assert max(width, height) <= MAX_SIDE_PIXELS
    report = result["report"].splitlines()
    assert len(report) < NUM_CLASSES + 10  # the per-class table (linear), no 1,000 matrix rows
    assert max(map(len, report)) < 400
    assert "confusion matrix: 1000 classes, too many to print" in result["report"]
    assert "metrics.json" in report[-1]


@pytest.mark.slow
def test_cli_report_of_many_classes_points_to_metrics_json(
    many_classes: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process, through the CLI: the command the 22.7 GB run was; seconds now, and the PNG capped."""
    model_dir, data = many_classes
    out = tmp_path / "report"
    argv = ["evaluate", "sentiment", "--model", str(model_dir), "--data", str(data), "--out", str(out)]
    start = time.perf_counter()
    assert main(argv) == 0
    assert time.perf_counter() - start < 30
    printed = capsys.readouterr().out
    assert "too many to print" in printed and "'confusion_matrix' in the metrics.json" in printed
    assert "confusion matrix (rows: gold, columns: predicted)" not in printed
    assert len(printed.splitlines()) < NUM_CLASSES + 10
    assert sorted(path.name for path in out.iterdir()) == [
        EVALUATE_MARK,
        "confusion_matrix.png",
        "metrics.json",
    ]
    assert max(png_size(out / "confusion_matrix.png")) <= MAX_SIDE_PIXELS


@pytest.mark.slow
def test_confusion_png_folds_the_rare_classes_into_other(tmp_path: Path) -> None:
    """Up to 30 classes every cell; beyond, the 30 most frequent + "other", at a capped size."""
    small = [[3, 1], [0, 2]]
    assert png_size(plot_confusion_matrix(small, ["neg", "pos"], tmp_path / "small.png")) == (480, 480)
    classes = CONFUSION_PLOT_CLASSES + 1
    matrix = [[(i + 1) * 10 if i == j else 1 for j in range(classes)] for i in range(classes)]
    labels = [f"label number {i} with a very long name indeed" for i in range(classes)]
    width, height = png_size(plot_confusion_matrix(matrix, labels, tmp_path / "many.png"))
    assert width == height == 20 * 120  # 30 + "other" cells, the figure at its 20-inch cap


def test_most_frequent_classes_keep_row_sums() -> None:
    import numpy as np

    from bert_tasks.insight.plots import _most_frequent

    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, size=(50, 50))
    counts[7, 7] = counts[3, 3] = 1000
    grid, names = _most_frequent(counts, [f"c{i}" for i in range(50)], 5)
    assert grid.shape == (6, 6) and set(names[:2]) == {"c3", "c7"} and names[-1] == "other (45)"
    assert grid.sum() == counts.sum()
    top = [int(name[1:]) for name in names[:5]]
    np.testing.assert_array_equal(grid[:5].sum(axis=1), counts[top].sum(axis=1))  # each row: its support


# 2. `memory --batch` far beyond the machine.


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--batch", "10000000"],
            r"memory: batch 10000000 x seq_len 512 in fp32 would need about [\d,.]+ GiB ",
        ),
        (["--batch", "0"], "batch and seq_len must be at least 1, got batch 0, seq_len 512; pass --batch"),
        (["--batch", "-3"], "got batch -3"),
        (["--seq-len", "0"], "got batch 8, seq_len 0; pass --batch and --seq-len of 1 or more"),
        (
            ["--seq-len", "513"],
            r"seq_len 513 is longer than model .*'s 512 positions; pass --seq-len 512 or less",
        ),
    ],
)
def test_memory_refuses_in_one_line_before_allocating(
    model_512: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    start = time.perf_counter()
    assert main(["memory", "--model", str(model_512), *args]) == 1
    assert time.perf_counter() - start < 10  # refused from the formula, not after trying
    assert re.search(message, refusal(capsys))


def test_memory_refusal_says_needed_and_available(
    model_512: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The formula's estimate (what the measurement would hold) against what the machine has now."""
    assert main(["memory", "--model", str(model_512), "--batch", "10000000", "--seq-len", "512"]) == 1
    line = refusal(capsys)
    needed = measurement_bytes(load_config(model_512), 10_000_000, 512, "fp32", torch.device("cpu"))
    assert f"about {needed / 2**30:,.1f} GiB" in line
    assert re.search(r"but this machine has [\d,.]+ GiB available", line)
    assert line.endswith("; pass a smaller --batch or --seq-len")


def test_available_memory_is_the_kernels_estimate() -> None:
    """MemAvailable (page cache that can be dropped counts), not only the free pages."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    mem_available = int(fields["MemAvailable"].split()[0]) * 1024
    assert available_bytes(torch.device("cpu")) == pytest.approx(mem_available, rel=0.2)


def test_the_estimate_covers_what_the_measurement_holds(
    model_512: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that fits goes ahead, and its measured peaks stay below the estimate it was admitted with."""
    from bert_tasks.insight.memory import attention_memory

    report = attention_memory(model_512, batch=2, seq_len=512)
    estimate = measurement_bytes(load_config(model_512), 2, 512, "fp32", torch.device("cpu"))
    assert report.eager_forward_peak < estimate
    assert max(lm.eager_peak for lm in report.layers) < estimate


#: The CLI's memory command in a fresh process, then its own peak RSS in MiB on stderr's last line.


# 3. Output paths: one rule per command, checked before the model loads.


def test_evaluate_out_that_is_a_file(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bert_tasks.inference.predictor.Predictor", no_model_load)
    out = tmp_path / "report.txt"
    out.write_text("mine")
    before = tree(tmp_path)
    argv = ["evaluate", "sentiment", "--model", str(sentiment_run), "--data", str(DATA["sentiment"][1])]
    assert main([*argv, "--out", str(out)]) == 1
    line = refusal(capsys)
    assert f"evaluate output {out}: exists and is not a directory; pass --out a directory" in line
    assert tree(tmp_path) == before and out.read_text() == "mine"


@pytest.mark.parametrize("where", ["/proc/bert-tasks-report", "/proc/self", "/sys/kernel/bert-tasks"])
def test_evaluate_out_under_proc_or_sys(
    sentiment_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setattr("bert_tasks.inference.predictor.Predictor", no_model_load)
    argv = ["evaluate", "sentiment", "--model", str(sentiment_run), "--data", str(DATA["sentiment"][1])]
    assert main([*argv, "--out", where]) == 1
    line = refusal(capsys)
    assert (
        f"evaluate output {where}: is under /" in line and "a kernel filesystem that holds no files" in line
    )


def test_evaluate_out_that_cannot_be_created(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder under a file: mkdir's own reason, and no folder of it is left behind."""
    monkeypatch.setattr("bert_tasks.inference.predictor.Predictor", no_model_load)
    (tmp_path / "notes").write_text("mine")
    before = tree(tmp_path)
    out = tmp_path / "notes" / "eval" / "today"
    argv = ["evaluate", "sentiment", "--model", str(sentiment_run), "--data", str(DATA["sentiment"][1])]
    assert main([*argv, "--out", str(out)]) == 1
    line = refusal(capsys)
    assert f"cannot create the directory {tmp_path / 'notes' / 'eval'} (Not a directory)" in line
    assert tree(tmp_path) == before


def test_evaluate_leaves_no_new_dir_when_it_fails_later(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The out dir is made before the model loads; a failure after that removes it again (while empty)."""
    from bert_tasks.errors import BertTasksError

    def broken(*args: object, **kwargs: object) -> None:
        raise BertTasksError("the weights do not load")

    monkeypatch.setattr("bert_tasks.inference.predictor.Predictor", broken)
    before = tree(tmp_path)
    argv = ["evaluate", "sentiment", "--model", str(sentiment_run), "--data", str(DATA["sentiment"][1])]
    assert main([*argv, "--out", str(tmp_path / "a" / "b")]) == 1
    assert "the weights do not load" in refusal(capsys)
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("name", "kind"), [("map.jpg", ".jpg files"), ("map.svg", ".svg files"), ("map", "a name")]
)
def test_attention_out_must_be_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, kind: str
) -> None:
    monkeypatch.setattr("bert_tasks.insight.attention_maps.attention_maps", no_model_load)
    out = tmp_path / "new" / name
    assert main(["attention", TEXT, "--model", "unused", "--out", str(out)]) == 1
    line = refusal(capsys)
    assert f"attention output {out}: only PNG images are written, not {kind}" in line
    assert line.endswith("give a path ending in .png")
    assert list(tmp_path.iterdir()) == []


def test_attention_out_folder_is_created_or_refused(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "maps" / "today" / "head0.png"
    assert main(["attention", TEXT, "--model", str(tiny_model), "--head", "0", "--out", str(out)]) == 0
    assert png_size(out)[0] > 0 and sorted(p.name for p in out.parent.iterdir()) == ["head0.png"]
    capsys.readouterr()

    (tmp_path / "notes").write_text("mine")
    (tmp_path / "folder.png").mkdir()
    before = tree(tmp_path)
    monkeypatch.setattr("bert_tasks.insight.attention_maps.attention_maps", no_model_load)
    assert main(["attention", TEXT, "--out", str(tmp_path / "notes" / "x" / "map.png")]) == 1
    assert f"cannot create the directory {tmp_path / 'notes' / 'x'} (Not a directory)" in refusal(capsys)
    assert main(["attention", TEXT, "--out", str(tmp_path / "folder.png")]) == 1
    assert "folder.png: is a directory; give a file path ending in .png" in refusal(capsys)
    assert main(["attention", TEXT, "--out", "/proc/map.png"]) == 1
    assert "attention output /proc/map.png: is under /proc" in refusal(capsys)
    assert tree(tmp_path) == before


def test_attention_failure_removes_the_folder_it_made(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "map.png"
    assert main(["attention", TEXT, "--model", str(tiny_model), "--layer", "9", "--out", str(out)]) == 1
    assert "layer 9 is out of range" in refusal(capsys)
    assert list(tmp_path.iterdir()) == []


def test_export_out_that_is_a_file_a_symlink_or_under_a_file(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bert_tasks.inference.quantize.load_finetuned", no_model_load)
    (tmp_path / "file").write_text("mine")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    before = tree(tmp_path)
    export = ["export", "--quantize", "int8", "--model", str(sentiment_run)]
    cases = {
        "file": "export {out}: exists and is not a directory; choose a new directory you can write to",
        "link": "export {out}: is a symbolic link (to "
        + str(tmp_path / "empty")
        + "); choose a new directory",
        "dangling": "export {out}: is a symbolic link (to " + str(tmp_path / "nowhere") + ")",
        "file/int8": "export {out}: cannot create the directory {out} (Not a directory)",
        "/proc/int8": "export {out}: is under /proc, a kernel filesystem that holds no files",
    }
    for name, message in cases.items():
        out = tmp_path / name
        assert main([*export, str(out)]) == 1
        assert message.format(out=out) in refusal(capsys), name
    assert tree(tmp_path) == before


def test_export_failure_leaves_no_half_model_dir(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails midway (here: the tokenizer's) removes the export again, with one line."""
    from transformers import PreTrainedTokenizerBase

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk)
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new" / "int8", tmp_path / "empty"):
        before = tree(tmp_path)
        assert main(["export", "--quantize", "int8", "--model", str(sentiment_run), str(out)]) == 1
        line = refusal(capsys)
        assert f"export {out}: could not write there (No space left on device)" in line
        assert tree(tmp_path) == before


@pytest.mark.slow  # real processes
@needs_unshare
def test_read_only_and_full_disks_are_one_line_for_every_command(
    sentiment_run: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """A read-only mount (no file can be made there) and an 8 KiB tmpfs (the write runs out of space)."""
    ro, full = tmp_path / "ro", tmp_path / "full"
    ro.mkdir()
    full.mkdir()
    data = DATA["sentiment"][1]
    commands = {
        "evaluate-ro": f"evaluate sentiment --model {sentiment_run} --data {data} --out {ro}/report",
        "attention-ro": f"attention {shlex.quote(TEXT)} --model {tiny_model} --out {ro}/map.png",
        "export-ro": f"export --quantize int8 --model {sentiment_run} {ro}/int8",
        "evaluate-full": f"evaluate sentiment --model {sentiment_run} --data {data} --out {full}/report",
        "export-full": f"export --quantize int8 --model {sentiment_run} {full}/int8",
    }
    lines = [
        f"mount -t tmpfs -o ro,size=64k tmpfs {ro} || exit 99",
        f"mount -t tmpfs -o size=8k tmpfs {full} || exit 99",  # metrics.json fits, no PNG or model does
    ]
    for name, command in commands.items():
        lines.append(f"{BERT_TASKS} {command} 2> {tmp_path}/{name}.err; echo {name} $?")
    lines += [
        f"echo ro: $(ls -A {ro})",
        f"echo full: $(ls -A {full})",
        f"echo report: $(ls -A {full}/report)",
    ]
    result = run_in_namespace("\n".join(lines))
    assert result.returncode != 99, f"could not mount a tmpfs: {result.stderr}"
    output = [line.split(maxsplit=1) for line in result.stdout.splitlines()]
    statuses = {words[0]: words[1] for words in output if words[0] in commands}
    listings = {words[0]: words[1:] for words in output if words[0].endswith(":")}
    assert statuses == dict.fromkeys(commands, "1"), result.stdout
    for name in commands:
        err = (tmp_path / f"{name}.err").read_text()
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (name, err)
        reason = "Read-only file system" if name.endswith("-ro") else "No space left on device"
        assert f"({reason})" in err, (name, err)
    assert f"cannot create the directory {ro}/report (Read-only" in (tmp_path / "evaluate-ro.err").read_text()
    assert "cannot write files there (Read-only file system)" in (tmp_path / "attention-ro.err").read_text()
    assert "could not write there (No space left on device)" in (tmp_path / "export-full.err").read_text()
    # What the mounts hold (listed inside the namespace): the failed export left nothing half-written,
    # the failed evaluate its mark, its whole metrics.json and no partial PNG.
    assert listings == {"ro:": [], "full:": ["report"], "report:": [f"{EVALUATE_MARK} metrics.json"]}, (
        result.stdout
    )


# 4. A closed or full standard output.


@pytest.fixture(scope="module")
def many_texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,500 short texts: their predictions (~90 KB as a table) are more than a pipe's 64 KiB buffer."""
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("".join(f"review {i}: the room was clean and the staff kind\n" for i in range(1500)))
    return path


def without_progress(stderr: str) -> list[str]:
    """stderr's lines without the progress bar (tqdm draws it after 2 s, unless --quiet)."""
    pieces = (piece.strip() for line in stderr.splitlines() for piece in line.split("\r"))
    return [piece for piece in pieces if piece and not piece.startswith("predict:")]


def predict_argv(model_dir: Path, texts: Path, *flags: str) -> list[str]:
    return [
        *shlex.split(BERT_TASKS),
        "predict",
        "sentiment",
        "--model",
        str(model_dir),
        "--file",
        str(texts),
        *flags,
    ]


@pytest.mark.slow  # a real process
@pytest.mark.parametrize("json_flag", [["--json"], []], ids=["json", "table"])
def test_predict_into_a_pipe_closed_early_ends_quietly(
    sentiment_run: Path, many_texts: Path, json_flag: list[str]
) -> None:
    """The reader takes one line and goes away: status 128 + SIGPIPE, and nothing on stderr (no
    BrokenPipeError, no "Exception ignored ... BrokenPipeError" at exit)."""
    argv = predict_argv(sentiment_run, many_texts, *json_flag)
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=CHILD_ENV)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # as head does after its line
    stderr = process.stderr.read().decode()
    status = process.wait(timeout=120)
    assert first.strip()
    assert status == 128 + signal.SIGPIPE, stderr
    assert without_progress(stderr) == [], stderr


@pytest.mark.slow  # a real process
def test_predict_through_head_in_a_shell(sentiment_run: Path, many_texts: Path) -> None:
    """`bert-tasks predict ... | head -1` in bash: head prints one line, bert-tasks' status is 141."""
    predict = shlex.join(predict_argv(sentiment_run, many_texts, "--json"))
    result = subprocess.run(
        ["bash", "-c", f"{predict} | head -1; echo status ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        env=CHILD_ENV,
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["label"], result.stdout
    assert lines[1] == f"status {128 + signal.SIGPIPE}"
    assert without_progress(result.stderr) == [], result.stderr


@pytest.mark.slow  # a real process
@pytest.mark.parametrize("count", [1500, 1], ids=["many-texts", "one-text"])
def test_predict_into_a_full_stdout_is_one_line_and_status_1(
    sentiment_run: Path, many_texts: Path, tmp_path: Path, count: int
) -> None:
    """`bert-tasks predict ... > /dev/full`: one line and status 1, as coreutils do (`seq 9 > /dev/full`).

    Many texts fail inside the command (print's write), one text only when the console script flushes.
    """
    texts = many_texts if count > 1 else tmp_path / "one.txt"
    if count == 1:
        texts.write_text("Loved it.\n")
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            predict_argv(sentiment_run, texts),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=CHILD_ENV,
            timeout=120,
        )
    lines = without_progress(result.stderr)
    assert result.returncode == 1, result.stderr
    assert lines == [
        "bert-tasks: error: could not write to standard output (No space left on device); free space or "
        "write elsewhere"
    ], result.stderr
