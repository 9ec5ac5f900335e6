"""`bert-tasks finetune` and the output_dir it is pointed at, through the command itself.

Each refusal is one `bert-tasks: error:` line with exit status 1, and a snapshot of the whole working
dir (every entry's name, size and mtime) taken before and after shows that nothing was written, moved or
deleted. The runs are tiny; the refusals come before any model loads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.training.output_dir import MANIFEST
from tests.helpers import DATA, cli_error_line, fast_overrides, train_steps

#: Every entry under a directory, by relative path: (size, mtime in ns), symlinks not followed.
Tree = dict[str, tuple[int, int]]
#: 2001-01-01, in seconds since the epoch.
OLD = 978_307_200


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working dir for the command, so the snapshot covers everything it could touch."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def previous_run(sentiment_run: Path, workdir: Path) -> Path:
    """A copy of a finished tiny sentiment run: a dir `--overwrite` may replace."""
    return shutil.copytree(sentiment_run, workdir / "run", symlinks=True)


def tree(root: Path) -> Tree:
    """`root` and every entry below it: a directory's mtime changes with any entry made or removed."""
    entries: Tree = {}
    for folder, dirs, names in os.walk(root):
        for path in [Path(folder), *(Path(folder, name) for name in dirs + names)]:
            stat = path.lstat()
            entries[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return entries


def finetune(tiny_model: Path, output_dir: Path, *args: str, **overrides: object) -> list[str]:
    """The argv of a tiny `bert-tasks finetune sentiment` run into `output_dir`."""
    return ["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, output_dir, **overrides), *args]


def refused(argv: list[str], workdir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `bert-tasks argv`: exit status 1, one `bert-tasks: error:` line, no traceback, and nothing
    under `workdir` changed. Returns the line."""
    before = tree(workdir)
    line = cli_error_line(argv, capsys)
    assert tree(workdir) == before
    return line


def test_overwrite_refuses_a_run_dir_holding_a_users_file(
    previous_run: Path, tiny_model: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user keeps notes beside a previous run and trains again with --overwrite: the notes are not the
    run's to delete, so the command names them and deletes nothing, not even the run's own files."""
    (previous_run / "notes.txt").write_text("what I tried")
    line = refused(finetune(tiny_model, previous_run, "--overwrite"), workdir, capsys)
    assert "holds notes.txt, which no bert-tasks run wrote; nothing was deleted" in line


def test_overwrite_refuses_a_users_file_inside_the_runs_best_dir(
    previous_run: Path, tiny_model: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """best/ is the run's (its manifest lists it), a notes.txt the user put in it is not: --overwrite
    names it and deletes nothing, where it used to delete best/ whole."""
    (previous_run / "best").mkdir()
    (previous_run / "best" / "notes.txt").write_text("what I tried")
    line = refused(finetune(tiny_model, previous_run, "--overwrite"), workdir, capsys)
    assert "holds best/notes.txt, which no bert-tasks run wrote; nothing was deleted" in line


def test_a_symlinked_output_dir_is_refused(
    previous_run: Path, tiny_model: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """output_dir is a symlink (`latest -> run`, say): with --overwrite a run would clear the run it
    points to; it is refused in one line, and the link and its target stay as they are."""
    link = workdir / "latest"
    link.symlink_to(previous_run, target_is_directory=True)
    line = refused(finetune(tiny_model, link, "--overwrite"), workdir, capsys)
    assert f"output_dir {link} is a symlink (to {previous_run})" in line


def test_continuing_a_model_in_its_own_dir_is_refused(
    previous_run: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`model=DIR output_dir=DIR --overwrite` (train the saved model further, in place) would delete
    the model before the new one is saved: refused in one line, DIR untouched."""
    line = refused(finetune(previous_run, previous_run, "--overwrite"), workdir, capsys)
    assert f"model and output_dir are the same dir ({previous_run})" in line


@pytest.mark.parametrize(
    ("command", "inside"),
    [
        (["export", "--model", "{run}", "--format", "onnx", "{out}"], "onnx-inside"),
        (["export", "--model", "{run}", "--format", "torch", "--quantize", "int8", "{out}"], "."),
        (["prune", "sentiment", "--model", "{run}", "--heads", "1", "--out", "{out}"], "pruned-inside"),
        (["distill", "sentiment", "--teacher", "{run}", "output_dir={out}"], "student"),
        (["compress", "sentiment", "--model", "{run}", "--out", "{out}"], "compressed"),
        (["finetune", "sentiment", "model={run}", "output_dir={out}"], "again"),
    ],
)
def test_an_output_inside_the_model_dir_it_reads_is_refused(
    previous_run: Path, workdir: Path, capsys: pytest.CaptureFixture[str], command: list[str], inside: str
) -> None:
    """Writing into the source model dir changes the dir the command reads: one line, nothing written."""
    out = previous_run / inside
    argv = [part.format(run=previous_run, out=out) for part in command]
    line = refused(argv, workdir, capsys)
    where = "is the model dir" if inside == "." else "lies inside the model dir"
    assert f"{where} {previous_run}" in line and "choose a directory outside it" in line


def test_overwrite_refuses_a_dir_holding_the_training_data(
    previous_run: Path, tiny_model: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The training data live inside the output_dir that --overwrite would clear: refused in one line
    naming the file, which is still there."""
    data = Path(shutil.copy2(DATA["sentiment"][0], previous_run / "train.jsonl"))
    argv = finetune(tiny_model, previous_run, "--overwrite", train_file=data)
    line = refused(argv, workdir, capsys)
    assert "holds train.jsonl which this run reads" in line
    assert data.is_file()


def test_a_users_own_metrics_json_is_not_a_run(
    tiny_model: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dir with the user's own metrics.json (a name runs write too) is not taken for a previous run:
    --overwrite refuses to clear it and the file stays."""
    out = workdir / "results"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"accuracy": 0.91}))
    line = refused(finetune(tiny_model, out, "--overwrite"), workdir, capsys)
    assert f"output_dir {out} is not a bert-tasks run" in line


@pytest.mark.slow
def test_overwrite_replaces_a_previous_run(
    previous_run: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training again into a finished run's dir with --overwrite: exit 0, no error, and the dir holds
    the new run alone: its recipe and its log, every file written anew, each listed in its manifest."""
    for path in [previous_run, *previous_run.rglob("*")]:  # dated 2001, so a file left over shows
        os.utime(path, (OLD, OLD), follow_symlinks=False)
    capsys.readouterr()
    assert main(finetune(tiny_model, previous_run, "--overwrite", max_steps=2, lr=1e-4)) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "bert-tasks: error" not in err
    recipe = load_recipe(previous_run / "recipe.yaml")
    assert (recipe.max_steps, recipe.lr, recipe.overwrite) == (2, 1e-4, False)
    assert train_steps(previous_run) == [1, 2]
    assert all(path.lstat().st_mtime > OLD for path in previous_run.rglob("*"))
    listed = set(json.loads((previous_run / MANIFEST).read_text())["entries"])
    assert {path.name for path in previous_run.iterdir()} - {MANIFEST} <= listed


@pytest.mark.slow
def test_a_best_weights_write_cut_short_is_the_runs_own(
    previous_run: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kill while best/ is written leaves best.tmp: the manifest already lists it, so --overwrite
    replaces the run instead of refusing best.tmp as a foreign file."""
    assert "best.tmp" in json.loads((previous_run / MANIFEST).read_text())["entries"]
    (previous_run / "best.tmp").mkdir()
    (previous_run / "best.tmp" / "model.safetensors").write_bytes(b"half")
    assert main(finetune(tiny_model, previous_run, "--overwrite", max_steps=1)) == 0
    assert not (previous_run / "best.tmp").exists()
