"""OutputDir on a real file system: one run per directory, and --overwrite deletes only what runs wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bert_tasks.errors import BertTasksError
from bert_tasks.training.output_dir import MANIFEST, RECIPE_HEADER, OutputDir

REPO = Path(__file__).resolve().parents[2]

# Claims argv[1] in a fresh interpreter, says so, and holds it until killed.
HOLD = """
import sys, time
from bert_tasks.training.output_dir import OutputDir
claimed = OutputDir.claim(sys.argv[1], overwrite=False, resume=False, reads=())
print("claimed", flush=True)
time.sleep(120)
"""


def refusal(
    path: str | Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    reads: Sequence[str | Path] = (),
    lock: bool = True,
) -> str:
    """The one-line message claiming `path` is refused with (the defaults: a plain new run)."""
    with pytest.raises(BertTasksError) as refused:
        OutputDir.claim(path, overwrite=overwrite, resume=resume, reads=reads, lock=lock)
    message = str(refused.value)
    assert "\n" not in message
    return message


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def manifest(folder: Path) -> list[str]:
    return json.loads((folder / MANIFEST).read_text())["entries"]


def run_dir(folder: Path, *entries: str, inside: str = "weights.bin") -> Path:
    """A directory as a run with a manifest leaves it: `entries` (a trailing / makes a dir holding `inside`)
    and their list."""
    for entry in entries:
        write(folder / entry / inside if entry.endswith("/") else folder / entry)
    (folder / MANIFEST).write_text(json.dumps({"entries": [entry.rstrip("/") for entry in entries]}))
    return folder


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_fresh_dir_is_claimed_without_writing_then_recorded_and_cleared(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "sst2"
    beside = write(tmp_path / "runs" / "notes.txt")
    with OutputDir.claim(out, overwrite=False, resume=False, reads=()) as claimed:
        assert claimed.created and out.is_dir()
        assert listing(out) == []  # claiming writes nothing
        write(out / "recipe.yaml")
        claimed.record("recipe.yaml")
        write(out / "checkpoints" / "step-00000010" / "model.safetensors")
        claimed.record(out / "checkpoints" / "step-00000010", "checkpoints")
        assert manifest(out) == ["checkpoints", "recipe.yaml"]

    with OutputDir.claim(out, overwrite=True, resume=False, reads=()) as again:
        assert not again.created
        again.clear_previous()
        assert listing(out) == [MANIFEST] and manifest(out) == []
        write(out / "metrics.json")
        again.record("metrics.json")
    assert manifest(out) == ["metrics.json"]
    assert beside.exists()


def test_overwrite_names_the_first_foreign_entry_and_deletes_nothing(tmp_path: Path) -> None:
    out = run_dir(tmp_path / "run", "recipe.yaml", "checkpoints/", inside="step-00000001/model.safetensors")
    write(out / "zz-results.csv")
    write(out / "my-notes.txt")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    assert refusal(out, overwrite=True) == (
        f"output_dir {out} holds my-notes.txt (and 1 more), which no bert-tasks run wrote; nothing was "
        "deleted, move it elsewhere or choose another output_dir"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert refusal(out) == (  # the refused claim let go of its lock
        f"output_dir {out} is not empty; pass --overwrite to replace its previous run, --resume to continue "
        "it, or choose another output_dir"
    )


@pytest.mark.parametrize(
    "files",
    [{"metrics.json": "{}"}, {"metrics.json": "{}", "recipe.yaml": "task: mine\n"}],
    ids=["metrics-only", "with-own-recipe"],
)
def test_user_files_with_run_names_but_no_manifest_are_not_a_run(
    tmp_path: Path, files: dict[str, str]
) -> None:
    out = tmp_path / "results"
    for name, text in files.items():
        write(out / name, text)

    assert refusal(out, overwrite=True) == (
        f"output_dir {out} is not a bert-tasks run (no {MANIFEST}); nothing was deleted, choose another "
        "output_dir"
    )
    assert {name: (out / name).read_text() for name in files} == files
    assert listing(out) == sorted(files)


@pytest.mark.parametrize(
    "flags", [{}, {"overwrite": True}, {"resume": True}], ids=["new", "overwrite", "resume"]
)
def test_symlinked_output_dir_is_refused_and_its_target_untouched(
    tmp_path: Path, flags: dict[str, bool]
) -> None:
    target = run_dir(tmp_path / "real", "recipe.yaml", "checkpoints/")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)

    assert refusal(link, **flags) == (
        f"output_dir {link} is a symlink (to {target}); bert-tasks never writes through one, name the real "
        "directory or another output_dir"
    )
    assert link.is_symlink() and listing(target) == [MANIFEST, "checkpoints", "recipe.yaml"]
    assert (target / "checkpoints" / "weights.bin").exists()


def test_output_dir_holding_the_training_data_is_refused_under_overwrite(tmp_path: Path) -> None:
    out = run_dir(tmp_path / "run", "recipe.yaml", "data/")
    train = write(out / "data" / "train.csv")
    (tmp_path / "alias").symlink_to(out / "data")  # the same file by another name: compared resolved
    reads = [tmp_path / "alias" / "train.csv", "bert-base-uncased", tmp_path / "missing.csv"]

    assert refusal(out, overwrite=True, reads=reads) == (
        f"output_dir {out} holds data/train.csv which this run reads; choose another output_dir"
    )
    assert train.exists() and listing(out) == [MANIFEST, "data", "recipe.yaml"]


def test_base_model_inside_output_dir_is_refused_under_overwrite(tmp_path: Path) -> None:
    out = run_dir(tmp_path / "run", "recipe.yaml", "best/")

    assert refusal(out, overwrite=True, reads=["bert-base-uncased", out / "best"]) == (
        f"output_dir {out} holds best which this run reads; choose another output_dir"
    )
    assert (out / "best" / "weights.bin").exists()


@pytest.mark.parametrize(
    "flags", [{}, {"overwrite": True}, {"resume": True}], ids=["new", "overwrite", "resume"]
)
def test_output_dir_equal_to_the_model_dir_is_refused(tmp_path: Path, flags: dict[str, bool]) -> None:
    model = run_dir(tmp_path / "model", "config.json", "model.safetensors", "vocab.txt")

    assert refusal(model, reads=[tmp_path / "train.csv", f"{model}/./"], **flags) == (
        f"model and output_dir are the same dir ({model}); training there would replace the old model before "
        "the new one is complete; write the new run to another output_dir"
    )
    assert listing(model) == [MANIFEST, "config.json", "model.safetensors", "vocab.txt"]


def test_a_second_process_is_refused_while_the_first_holds_the_dir_and_admitted_once_it_is_killed(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "claimed\n", holder.stderr
        assert refusal(out) == (
            f"output_dir {out} is in use by another bert-tasks run (pid {holder.pid}); wait for it or choose "
            "another output_dir"
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=30) == -signal.SIGKILL

    with OutputDir.claim(out, overwrite=False, resume=False, reads=()) as claimed:  # no stale lock
        assert not claimed.created and listing(out) == []


def test_abandon_removes_only_the_empty_dirs_this_claim_created(tmp_path: Path) -> None:
    fresh = tmp_path / "runs" / "new"
    OutputDir.claim(fresh, overwrite=False, resume=False, reads=()).abandon()
    assert listing(tmp_path) == []  # runs/ too: this claim made it

    written = tmp_path / "written"
    claimed = OutputDir.claim(written, overwrite=False, resume=False, reads=())
    write(written / "recipe.yaml")
    claimed.record("recipe.yaml")
    claimed.abandon()
    assert listing(written) == [MANIFEST, "recipe.yaml"]

    existing = tmp_path / "existing"
    existing.mkdir()
    OutputDir.claim(existing, overwrite=False, resume=False, reads=()).abandon()
    assert existing.is_dir()

    failed = tmp_path / "failed"
    with pytest.raises(ValueError), OutputDir.claim(failed, overwrite=False, resume=False, reads=()):
        raise ValueError("bad data")  # the run failed before writing: its new empty dir goes
    assert sorted(os.listdir(tmp_path)) == ["existing", "written"]
    OutputDir.claim(written, overwrite=False, resume=True, reads=()).release()  # every lock was let go


def test_an_old_run_without_manifest_is_replaced_under_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "old"
    write(out / "recipe.yaml", f"{RECIPE_HEADER}; reload with bert_tasks.load_recipe(path).\ntask: sst2\n")
    for name in ("train_log.jsonl", "metrics.json", "config.json", "model.safetensors", "tokenizer.json"):
        write(out / name)
    write(out / "checkpoints" / "step-00000100" / "model.safetensors")
    write(out / "eval-test" / "metrics.json")
    beside = write(tmp_path / "keep.txt")

    with OutputDir.claim(out, overwrite=True, resume=False, reads=()) as claimed:
        claimed.clear_previous()
    assert listing(out) == [MANIFEST] and manifest(out) == []
    assert beside.exists()


def test_an_old_run_with_a_foreign_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "old"
    write(out / "recipe.yaml", f"{RECIPE_HEADER}.\n")
    write(out / "notes.txt")

    assert refusal(out, overwrite=True) == (
        f"output_dir {out} holds notes.txt, which no bert-tasks run wrote; nothing was deleted, move it "
        "elsewhere or choose another output_dir"
    )
    assert listing(out) == ["notes.txt", "recipe.yaml"]


def test_clearing_unlinks_a_symlinked_entry_without_following_it(tmp_path: Path) -> None:
    elsewhere = write(tmp_path / "elsewhere" / "model.safetensors").parent
    out = run_dir(tmp_path / "run", "recipe.yaml")
    (out / "best").symlink_to(elsewhere, target_is_directory=True)
    (out / MANIFEST).write_text(json.dumps({"entries": ["recipe.yaml", "best"]}))

    with OutputDir.claim(out, overwrite=True, resume=False, reads=()) as claimed:
        claimed.clear_previous()
    assert listing(out) == [MANIFEST]
    assert listing(elsewhere) == ["model.safetensors"]


@pytest.mark.parametrize(
    "entries",
    [["../outside"], ["recipe.yaml", "a/b"], "recipe.yaml", None],
    ids=["parent", "nested", "str", "null"],
)
def test_a_damaged_manifest_is_refused_and_nothing_deleted(tmp_path: Path, entries: object) -> None:
    outside = write(tmp_path / "outside")
    out = run_dir(tmp_path / "run", "recipe.yaml")
    (out / MANIFEST).write_text(json.dumps({"entries": entries}))

    assert refusal(out, overwrite=True) == (
        f"output_dir {out} has a damaged {MANIFEST}; nothing was deleted, choose another output_dir"
    )
    assert outside.exists() and listing(out) == [MANIFEST, "recipe.yaml"]


def test_paths_that_cannot_be_an_output_dir(tmp_path: Path) -> None:
    afile = write(tmp_path / "afile")
    assert refusal("") == "output_dir is empty; name a directory"
    assert refusal(afile) == f"output_dir {afile} exists and is not a directory; choose another output_dir"
    assert refusal(afile / "run") == (
        f"cannot create output_dir {afile / 'run'}: Not a directory ({afile / 'run'}); choose another "
        "output_dir"
    )
    assert refusal(tmp_path / "nope", resume=True) == (
        f"--resume: output_dir {tmp_path / 'nope'} does not exist; check the path, or drop --resume to "
        "start a new run"
    )
    assert refusal(tmp_path, resume=True, overwrite=True) == (
        f"output_dir {tmp_path}: --resume continues its run, --overwrite replaces it; pass one"
    )
    assert listing(tmp_path) == ["afile"]


def test_resume_keeps_the_previous_entries_listed(tmp_path: Path) -> None:
    out = run_dir(tmp_path / "run", "recipe.yaml", "checkpoints/")
    with OutputDir.claim(out, overwrite=False, resume=True, reads=()) as claimed:
        claimed.clear_previous()  # nothing to clear when resuming
        write(out / "metrics.json")
        claimed.record("metrics.json")
    assert manifest(out) == ["checkpoints", "metrics.json", "recipe.yaml"]


@pytest.mark.slow
def test_the_module_imports_without_the_training_stack() -> None:
    heavy = "{'torch', 'transformers', 'datasets', 'accelerate'}"
    code = f"import sys, bert_tasks.training.output_dir; print(sorted({heavy} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout == "[]\n"


def test_the_other_processes_of_a_run_check_without_locking_writing_or_deleting(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    OutputDir.claim(missing, overwrite=False, resume=False, reads=(), lock=False).abandon()
    assert not missing.exists()

    out = run_dir(tmp_path / "run", "recipe.yaml")
    with OutputDir.claim(out, overwrite=True, resume=False, reads=()) as main:
        assert main.owner
        other = OutputDir.claim(out, overwrite=True, resume=False, reads=(), lock=False)  # not "in use"
        assert not other.owner
        other.clear_previous()
        other.record("train_log.jsonl")
        assert listing(out) == [MANIFEST, "recipe.yaml"] and manifest(out) == ["recipe.yaml"]
        write(out / "notes.txt")
        assert refusal(out, overwrite=True, lock=False).startswith(f"output_dir {out} holds notes.txt,")


def run_with_subdirs(folder: Path) -> Path:
    """A run dir whose checkpoints/, best/ and best.tmp/ hold what a run writes there, and no more."""
    run_dir(folder, "recipe.yaml", "checkpoints/", inside="step-00000001/model.safetensors")
    write(folder / "checkpoints" / "step-00000002.tmp" / "optimizer.bin")  # a write cut short
    for name in ("best", "best.tmp"):
        write(folder / name / "model.safetensors")
        write(folder / name / "config.json")
    (folder / MANIFEST).write_text(
        json.dumps({"entries": ["best", "best.tmp", "checkpoints", "recipe.yaml"]})
    )
    return folder


def snapshot(folder: Path) -> dict[str, int]:
    """Every entry below `folder` and its mtime: a deletion, a write or a new entry shows."""
    return {str(path.relative_to(folder)): path.lstat().st_mtime_ns for path in folder.rglob("*")}


@pytest.mark.parametrize(
    "inside",
    ["checkpoints/notes.txt", "best/notes.txt", "best.tmp/notes.txt", "checkpoints/step-00000002/"],
    ids=["checkpoints", "best", "best.tmp", "step-dir-no-run-wrote"],
)
def test_overwrite_refuses_a_users_file_inside_the_runs_subdirs(tmp_path: Path, inside: str) -> None:
    """checkpoints/ and best/ are the run's, but not what the user put in them: --overwrite names it and
    deletes nothing (a step-N dir counts as the run's only as a dir, so a file named like one is foreign)."""
    out = run_with_subdirs(tmp_path / "run")
    if inside.endswith("/"):  # a *file* named like a checkpoint dir
        write(out / inside.rstrip("/"))
    else:
        write(out / inside, "what I tried")
    before = snapshot(out)
    assert refusal(out, overwrite=True) == (
        f"output_dir {out} holds {inside.rstrip('/')}, which no bert-tasks run wrote; nothing was deleted, "
        "move it elsewhere or choose another output_dir"
    )
    assert snapshot(out) == before


def test_overwrite_clears_the_runs_own_entries_of_its_subdirs_and_keeps_a_file_added_since(
    tmp_path: Path,
) -> None:
    """What the previous run wrote in checkpoints/ and best/ goes (step-N dirs, half-written ones, a
    model's files); a file the user adds after the check (while the model loads) stays, and so its dir."""
    out = run_with_subdirs(tmp_path / "run")
    with OutputDir.claim(out, overwrite=True, resume=False, reads=()) as claimed:
        notes = write(out / "checkpoints" / "notes.txt", "what I tried")
        claimed.clear_previous()
    assert listing(out) == [MANIFEST, "checkpoints"]
    assert listing(out / "checkpoints") == ["notes.txt"] and notes.read_text() == "what I tried"


def test_resume_refuses_a_users_file_in_best_which_the_run_replaces_whole(tmp_path: Path) -> None:
    """A resumed run replaces best/ at each improvement: a user's file there is named before the run
    starts; one in checkpoints/ is kept by the run (never deleted), so it does not stop --resume."""
    out = run_with_subdirs(tmp_path / "run")
    write(out / "checkpoints" / "notes.txt")
    OutputDir.claim(out, overwrite=False, resume=True, reads=()).release()
    write(out / "best" / "notes.txt")
    before = snapshot(out)
    assert refusal(out, resume=True) == (
        f"--resume: output_dir {out} holds best/notes.txt, which no bert-tasks run wrote and the run "
        "replaces best/ whole; nothing was deleted, move it elsewhere and --resume again"
    )
    assert snapshot(out) == before
