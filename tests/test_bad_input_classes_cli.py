"""Every bad-input class of issue #15 through the real command, in a subprocess: `python -m bert_tasks ...`
(what the `bert-tasks` console script runs), its working dir a fresh folder holding the user's files.

Each refusal is checked the same way (`assert_refused`): exit status 1, exactly one stderr line
`bert-tasks: error: ...` holding what is wrong, where (file:line, key or path) and what to do, no
traceback, and a before/after tree hash (every entry's path, type, mode, size, content hash, symlink
target) of the working dir and of every data or model dir the command was given: nothing was written,
moved or deleted, and a refused command leaves no output dir behind. One table per class; its members are
forms the library-level tests (tests/test_bad_inputs.py, tests/test_config_edges.py, tests/data/...) do not
use. Cases answered before torch loads (~0.3 s each) are fast; those that load a model are marked slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from bert_tasks.training import train
from tests.helpers import FIXTURES, fast_overrides, one_thread, tiny_config

REPO = Path(__file__).resolve().parents[1]
#: The command as a shell line (for process substitution and FIFOs) and as an argv.
BERT_TASKS = [sys.executable, "-m", "bert_tasks"]
SHELL_BERT_TASKS = " ".join(shlex.quote(part) for part in BERT_TASKS)
ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": os.environ.get("HOME", "/root"),
    "PYTHONPATH": str(REPO),  # this checkout's package, whatever is installed
    "LANG": "C.UTF-8",  # argv bytes that are not UTF-8 become lone surrogates, as on a user's machine
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_EVALUATE_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
TEXT = "Aspirin helped."

#: path -> (type, mode, and a file's size and SHA-256 or a link's target)
Tree = dict[str, tuple[Any, ...]]


def tree(root: Path) -> Tree:
    """`root` and everything below it, symlinks as links (never followed), FIFOs as FIFOs (never read)."""
    entries: Tree = {}
    for folder, dirs, names in os.walk(root):
        for path in [Path(folder), *(Path(folder, name) for name in dirs + names)]:
            info = path.lstat()
            entry: tuple[Any, ...] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode))
            if stat.S_ISLNK(info.st_mode):
                entry += (os.readlink(path),)
            elif stat.S_ISREG(info.st_mode):
                entry += (info.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
            entries[str(path.relative_to(root))] = entry
    return entries


@dataclass
class Call:
    """One command: an argv, or a bash line (`{bt}` is the command) for `<(...)` and FIFOs."""

    argv: list[str] | None = None
    shell: str | None = None
    stdin: bytes | None = None


@dataclass
class Place:
    """Where a case runs: `work` is the command's cwd, `data` a folder of inputs given by absolute path.

    Every model dir a case asks for (`model`, `copy`) is added to the dirs whose trees are compared.
    """

    work: Path
    data: Path
    request: pytest.FixtureRequest
    reads: list[Path] = field(default_factory=list)

    def write(self, name: str, content: str | bytes, *, folder: Path | None = None) -> Path:
        path = (folder or self.work) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", newline="")
        return path

    def model(self, fixture: str) -> Path:
        """A session fixture's model dir (`tiny_model`, `sentiment_run`, `ner_run`), read only."""
        path = Path(self.request.getfixturevalue(fixture))
        if path not in self.reads:
            self.reads.append(path)
        return path

    def copy(self, fixture: str, name: str) -> Path:
        """A copy of a fixture's model dir in `data`, to damage."""
        return shutil.copytree(self.model(fixture), self.data / name)

    def finetune(self, task: str, *args: str, output_dir: str = "out", **overrides: Any) -> list[str]:
        """A tiny run on the committed fixtures into `output_dir` (relative to the working dir)."""
        tiny = self.model("tiny_model")
        return ["finetune", task, *fast_overrides(task, tiny, Path(output_dir), **overrides), *args]


def run(call: Call, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[bytes]:
    if call.shell is not None:
        command: list[str] = ["bash", "-c", call.shell.replace("{bt}", SHELL_BERT_TASKS)]
    else:
        command = [*BERT_TASKS, *(call.argv or [])]
    return subprocess.run(command, cwd=cwd, env=ENV, input=call.stdin, capture_output=True, timeout=timeout)


def assert_refused(call: Call, place: Place, *says: str) -> str:
    """Exit 1, one `bert-tasks: error:` line (the last) holding every part of `says`, no traceback, no tree
    changed."""
    roots = [place.work, place.data, FIXTURES, *place.reads]
    before = {root: tree(root) for root in roots}
    done = run(call, place.work)
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    # One error line; a warning about the data read before it (merged label spellings) may stand above it.
    [line] = [line for line in err.splitlines() if line.startswith("bert-tasks: error: ")]
    assert err.splitlines()[-1] == line
    for part in says:
        assert part in line, f"{part!r} not in {line!r}"
    for root in roots:
        assert tree(root) == before[root], f"{root} changed"
    return line


@pytest.fixture
def place(tmp_path: Path, request: pytest.FixtureRequest) -> Place:
    (tmp_path / "work").mkdir()
    (tmp_path / "data").mkdir()
    return Place(tmp_path / "work", tmp_path / "data", request)


Case = Callable[[Place], tuple[Call, tuple[str, ...]]]


def table(*cases: Case) -> dict[str, Case]:
    return {case.__name__: case for case in cases}


#: Cases whose command reads a valid file whole (and builds its Dataset) before it meets the bad one:
#: about 1 s each, so they run with the slow tests.
SLOW_CASES = {"no_entities_in_ner_training_data"}


def names(cases: dict[str, Case]) -> list[Any]:
    """The parametrize list of a table, SLOW_CASES marked slow."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CASES else name for name in cases]


def check(cases: dict[str, Case], name: str, place: Place) -> None:
    call, says = cases[name](place)
    assert_refused(call, place, *says)


# --- 1. Paths ---------------------------------------------------------------------------------------------


def output_dir_is_a_file(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("notes.txt", "my notes\n")
    argv = p.finetune("sentiment", output_dir="notes.txt")
    return Call(argv), ("output_dir notes.txt", "exists and is not a directory", "choose another output_dir")


def output_dir_inside_a_file(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("notes.txt", "my notes\n")
    argv = p.finetune("ner", output_dir="notes.txt/run")
    return Call(argv), ("output_dir notes.txt/run", "Not a directory", "choose another output_dir")


def output_dir_under_proc(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = p.finetune("sentiment", output_dir="/proc/self/bert-run")
    return Call(argv), ("output_dir /proc/self/bert-run is under /proc", "choose another output_dir")


def output_dir_through_a_symlink_loop(p: Place) -> tuple[Call, tuple[str, ...]]:
    (p.work / "cycle").symlink_to("cycle")
    argv = p.finetune("sentiment", output_dir="cycle/run")
    return Call(argv), (
        "output_dir cycle/run",
        "Too many levels of symbolic links",
        "choose another output_dir",
    )


def evaluate_out_is_a_file(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("report", "an older report\n")
    data = str(FIXTURES / "run_sentiment_validation.jsonl")
    argv = [
        "evaluate",
        "sentiment",
        "--model",
        str(p.model("sentiment_run")),
        "--data",
        data,
        "--out",
        "report",
    ]
    return Call(argv), ("evaluate output report", "exists and is not a directory", "pass --out a directory")


def attention_out_not_an_image(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = ["attention", "--model", str(p.model("tiny_model")), "--out", "heads.svg", TEXT]
    return Call(argv), ("attention output heads.svg", "not .svg files", "give a path ending in .png")


def attention_out_inside_a_file(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("plots", "not a folder\n")
    argv = ["attention", "--model", str(p.model("tiny_model")), "--out", "plots/map.png", TEXT]
    return Call(argv), ("attention output plots/map.png: plots exists and is not a directory", "pass --out")


def export_out_under_sys(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = [
        "export",
        "--quantize",
        "int8",
        "/sys/kernel/int8-model",
        "--model",
        str(p.model("sentiment_run")),
    ]
    return Call(argv), ("export /sys/kernel/int8-model: is under /sys", "choose a new directory")


def export_out_is_a_symlink_loop(p: Place) -> tuple[Call, tuple[str, ...]]:
    (p.work / "int8").symlink_to("int8")
    argv = ["export", "--quantize", "int8", "int8", "--model", str(p.model("sentiment_run"))]
    return Call(argv), ("export int8: is a symbolic link (to int8)", "choose a new directory")


def missing_model_path_for_predict(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = ["predict", "ner", "--model", "./models/ner-v2", TEXT]
    return Call(argv), (
        "model dir ./models/ner-v2: no such directory",
        "pass a dir written by `bert-tasks finetune`",
    )


def missing_model_path_for_finetune(p: Place) -> tuple[Call, tuple[str, ...]]:
    (p.work / "models").mkdir()
    argv = p.finetune("sentiment", model="models/bert-small")  # "org/name" form, but models/ is a dir here
    return Call(argv), ("model models/bert-small: no such directory", "pass a saved model dir or a hub id")


def missing_model_path_for_export(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = ["export", "--quantize", "int8", "int8", "--model", "~/no-such-bert-tasks-model/v1"]
    return Call(argv), ("~/no-such-bert-tasks-model/v1: no such directory", "pass a dir written by")


def fifo_training_file_is_read(p: Place) -> tuple[Call, tuple[str, ...]]:
    """A FIFO named .csv is read like a file: the refusal names its header, which only a read could see."""
    os.mkfifo(p.work / "reviews.csv")
    p.write("source.csv", "review,stars\nGreat,5\n", folder=p.data)
    feed = f"timeout 30 sh -c 'cat {shlex.quote(str(p.data / 'source.csv'))} > reviews.csv' &"
    argv = shlex.join(p.finetune("sentiment", train_file="reviews.csv"))
    shell = f"{feed} {{bt}} {argv}; status=$?; wait; exit $status"
    return Call(shell=shell), (
        "reviews.csv:1: header has columns review, stars",
        "set text_column/label_column",
    )


def process_substitution_training_file_is_read(p: Place) -> tuple[Call, tuple[str, ...]]:
    """`train_file=<(...)` is /dev/fd/N, a pipe without an extension: read, its format told by its lines."""
    argv = shlex.join(p.finetune("ner", train_file="STREAM"))
    stream = "<(printf 'Aspirin\\tB-Chemical\\nhelped\\n')"
    shell = "{bt} " + argv.replace("train_file=STREAM", f"train_file={stream}")
    return Call(shell=shell), (
        "/dev/fd/",
        ":2: expected at least 2 columns (token ... tag), found 1",
        "fix the line",
    )


def standard_input_training_file_is_read(p: Place) -> tuple[Call, tuple[str, ...]]:
    """`cat train.jsonl | bert-tasks finetune ... train_file=/dev/stdin`: JSON Lines, told by line 1."""
    stdin = (
        b'{"text": "Great.", "label": "pos"}\n{"text": "Bad.", "label": "neg"}\n{"text": "", "label": "x"}\n'
    )
    return Call(p.finetune("sentiment", train_file="/dev/stdin"), stdin=stdin), (
        "/dev/stdin:3: empty text in column 'text'",
        "fill it in or drop the row",
    )


def process_substitution_recipe_is_read(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = shlex.join(p.finetune("sentiment"))
    shell = "{bt} " + argv + " --recipe <(printf 'weight_decay: -0.5\\n')"
    return Call(shell=shell), ("bad config: weight_decay=-0.5, must be >= 0", "(in recipe /dev/fd/")


PATHS = table(
    output_dir_is_a_file,
    output_dir_inside_a_file,
    output_dir_under_proc,
    output_dir_through_a_symlink_loop,
    evaluate_out_is_a_file,
    attention_out_not_an_image,
    attention_out_inside_a_file,
    export_out_under_sys,
    export_out_is_a_symlink_loop,
    missing_model_path_for_predict,
    missing_model_path_for_finetune,
    missing_model_path_for_export,
    fifo_training_file_is_read,
    process_substitution_training_file_is_read,
    standard_input_training_file_is_read,
    process_substitution_recipe_is_read,
)


@pytest.mark.parametrize("name", names(PATHS))
@pytest.mark.slow
def test_paths(name: str, place: Place) -> None:
    check(PATHS, name, place)


@contextmanager
def unwritable(path: Path) -> Iterator[str]:
    """`path` (a file or a folder) made unwritable for this user in a way the kernel enforces: immutable
    for root (which ignores modes), read-only modes for anyone else. Yields the OS's reason; skips where
    neither is possible (root on a file system without `chattr +i`)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield "Permission denied"
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: no write can be refused")
    try:
        yield "Operation not permitted"
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.slow
def test_unwritable_dirs_for_every_output(place: Place) -> None:
    """finetune's output_dir, evaluate --out and export OUT in a folder nobody may write to: one line each
    naming the path and the OS's reason; the folder stays empty."""
    locked = place.work / "locked"
    locked.mkdir()
    data = str(FIXTURES / "run_sentiment_validation.jsonl")
    model = str(place.model("sentiment_run"))
    calls = {
        "cannot create output_dir locked/run": place.finetune("sentiment", output_dir="locked/run"),
        "evaluate output locked/report: cannot create the directory locked/report": [
            *["evaluate", "sentiment", "--model", model, "--data", data, "--out", "locked/report"]
        ],
        "export locked/int8: cannot create the directory locked/int8": [
            *["export", "--quantize", "int8", "locked/int8", "--model", model]
        ],
    }
    with unwritable(locked) as reason:
        for says, argv in calls.items():
            assert_refused(Call(argv), place, says, reason)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file anyway: nothing to observe")
def test_an_unreadable_training_file(place: Place) -> None:
    data = place.write("train.jsonl", '{"text": "ok", "label": "pos"}\n{"text": "no", "label": "neg"}\n')
    data.chmod(0)
    try:
        assert_refused(
            Call(place.finetune("sentiment", train_file="train.jsonl")),
            place,
            "train.jsonl: permission denied",
            "check its permissions (chmod +r)",
        )
    finally:
        data.chmod(0o644)


# --- 2. Bytes ---------------------------------------------------------------------------------------------


def surrogate_pair_reversed_in_spans_text(p: Place) -> tuple[Call, tuple[str, ...]]:
    ok = '{"text": "Aspirin", "spans": [{"start": 0, "end": 7, "label": "Chemical"}]}\n'
    bad = '{"text": "Fever \\udc00\\ud800", "spans": [{"start": 0, "end": 5, "label": "Disease"}]}\n'
    path = p.write("train.jsonl", ok + ok + bad, folder=p.data)
    return Call(p.finetune("ner", train_file=path)), (
        f"{path}:3: lone surrogate \\udc00 at character offset 6 of the text in 'text'",
        "fix the text or re-save it as UTF-8",
    )


def surrogate_in_a_tag(p: Place) -> tuple[Call, tuple[str, ...]]:
    record = '{"tokens": ["Aspirin", "helped"], "tags": ["B-Chemical", "O\\udbff"]}\n'
    path = p.write("train.jsonl", record)
    return Call(p.finetune("ner", train_file="train.jsonl")), (
        f"{path}:1: lone surrogate \\udbff at character offset 1 of tag 2 in 'tags'",
        "re-save it as UTF-8",
    )


def nul_inside_a_conll_tag(p: Place) -> tuple[Call, tuple[str, ...]]:
    path = p.write("train.iob", "Aspirin B-Chem\x00ical\nhelped O\n\nFever B-Disease\n", folder=p.data)
    return Call(p.finetune("ner", train_file=path)), (
        f"{path}:1: NUL character (\\x00) at character offset 14 of the line",
        "re-save it as UTF-8 text",
    )


def command_line_text_with_a_byte_that_is_not_utf8(p: Place) -> tuple[Call, tuple[str, ...]]:
    """`bert-tasks predict ... $'na\\xefve'`: the byte reaches Python as U+DCEF, refused before any model."""
    argv: list[Any] = ["predict", "sentiment", "--model", str(p.model("sentiment_run")), "fine", b"na\xefve"]
    return Call([os.fsdecode(a) if isinstance(a, bytes) else a for a in argv]), (
        "text 2: lone surrogate \\udcef at character offset 2 of the text",
        "fix the text or re-save it as UTF-8",
    )


def file_of_texts_whose_format_is_json_lines(p: Place) -> tuple[Call, tuple[str, ...]]:
    """The first line is a JSON object, so every line must be one: the third is plain text."""
    p.write("texts.txt", '{"text": "Great film."}\r\n{"text": "Dull."}\r\n{so-so} plot\r\n')
    argv = ["predict", "sentiment", "--model", str(p.model("sentiment_run")), "--file", "texts.txt"]
    return Call(argv), (
        "texts.txt:3: invalid JSON",
        "this input is JSON Lines (its first line is a JSON object)",
    )


def nul_in_standard_input(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = ["predict", "sentiment", "--model", str(p.model("sentiment_run")), "--file", "-"]
    return Call(argv, stdin=b"Fine.\nGood.\nBin\x00ary\n"), (
        "<stdin>:3: NUL character (\\x00) at character offset 3 of the line",
        "re-save it as UTF-8 text",
    )


BYTES = table(
    surrogate_pair_reversed_in_spans_text,
    surrogate_in_a_tag,
    nul_inside_a_conll_tag,
    command_line_text_with_a_byte_that_is_not_utf8,
    file_of_texts_whose_format_is_json_lines,
    nul_in_standard_input,
)


@pytest.mark.parametrize("name", names(BYTES))
@pytest.mark.slow
def test_bytes(name: str, place: Place) -> None:
    check(BYTES, name, place)


# --- 3. Numbers at their edges, config edges -------------------------------------------------------------


def batch_size_1e20_in_a_recipe(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("recipe.yaml", "batch_size: 1e+20\n")
    argv = [*p.finetune("sentiment"), "--recipe", "recipe.yaml"]
    argv.remove("batch_size=8")
    return Call(argv), (
        "bad config: batch_size=100000000000000000000",
        "<= 1048576",
        "(in recipe recipe.yaml)",
    )


def epochs_plus_infinity(p: Place) -> tuple[Call, tuple[str, ...]]:
    return Call(p.finetune("ner", epochs="+Infinity")), (
        "bad config: epochs=inf, must be a finite number",
        "(on the command line)",
    )


def seed_two_to_the_32_as_a_float(p: Place) -> tuple[Call, tuple[str, ...]]:
    return Call(p.finetune("sentiment", seed="4.294967296e9")), (
        "bad config: seed=4294967296, must be >= 0 and <= 4294967295",
        "(on the command line)",
    )


def negative_seed_in_a_recipe(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("recipe.yaml", "seed: -0x1\n")
    return Call([*p.finetune("sentiment"), "--recipe", "recipe.yaml"]), (
        "bad config: seed=-1, must be >= 0",
        "(in recipe recipe.yaml)",
    )


def alias_bomb_through_a_merge_key(p: Place) -> tuple[Call, tuple[str, ...]]:
    laughs = "\n".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9))
    p.write("recipe.yaml", f"l0: &l0 [lol]\n{laughs}\n<<: *l8\n")
    return Call([*p.finetune("sentiment"), "--recipe", "recipe.yaml"]), (
        "recipe.yaml:1: YAML anchor/alias 'l0' in a recipe",
        "write the value out",
    )


def duplicate_key_in_a_recipe_quoted_once(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("recipe.yaml", "lr: 1.0e-4\nepochs: 1\n'lr': 3.0e-4\n")
    return Call([*p.finetune("sentiment"), "--recipe", "recipe.yaml"]), (
        "recipe.yaml:3: duplicate key 'lr' (first on line 1)",
        "keep one of them",
    )


def empty_output_dir_in_quotes(p: Place) -> tuple[Call, tuple[str, ...]]:
    """`output_dir=""` as a script passes it on (the quotes reach the program): empty, not a dir named ""."""
    return Call(p.finetune("sentiment", output_dir='""')), (
        "bad config: output_dir='', must not be empty",
        "give a value, or output_dir=none to unset it",
    )


def nested_list_on_the_command_line(p: Place) -> tuple[Call, tuple[str, ...]]:
    return Call(p.finetune("sentiment", label_names="[negative,[positive]]")), (
        "label_names='[negative,[positive]]' on the command line: expected a list like [a,b] or none",
        "fix the value",
    )


def nested_mapping_for_a_path(p: Place) -> tuple[Call, tuple[str, ...]]:
    p.write("recipe.yaml", "test_file:\n  path: test.jsonl\n")
    return Call([*p.finetune("sentiment"), "--recipe", "recipe.yaml"]), (
        "test_file={'path': 'test.jsonl'} in recipe recipe.yaml: a nested mapping",
        "config keys are flat, give test_file: VALUE",
    )


CONFIG = table(
    batch_size_1e20_in_a_recipe,
    epochs_plus_infinity,
    seed_two_to_the_32_as_a_float,
    negative_seed_in_a_recipe,
    alias_bomb_through_a_merge_key,
    duplicate_key_in_a_recipe_quoted_once,
    empty_output_dir_in_quotes,
    nested_list_on_the_command_line,
    nested_mapping_for_a_path,
)


@pytest.mark.parametrize("name", names(CONFIG))
@pytest.mark.slow
def test_numbers_and_config_edges(name: str, place: Place) -> None:
    check(CONFIG, name, place)


# --- 4. Silently wrong results, refused -------------------------------------------------------------------


def unbalanced_quote_in_a_crlf_csv(p: Place) -> tuple[Call, tuple[str, ...]]:
    rows = [f"review {i},{'positive' if i % 2 else 'negative'}" for i in range(12)]
    rows[4] = '"a ""great"" film, then it drags,positive'  # opened, never closed
    path = p.write("train.csv", "text,label\r\n" + "\r\n".join(rows) + "\r\n", folder=p.data)
    return Call(p.finetune("sentiment", train_file=path)), (
        f"{path}:6: a quote opened here is not closed before the following rows",
        "close the quote",
    )


def invisible_only_text_in_a_csv(p: Place) -> tuple[Call, tuple[str, ...]]:
    path = p.write("train.csv", "text,label\nGreat.,positive\n\u2063\ufeff\u2060,negative\n", folder=p.data)
    return Call(p.finetune("sentiment", train_file=path)), (
        f"{path}:3: empty text in column 'text'",
        "fill it in or drop the row",
    )


def invisible_only_command_line_text(p: Place) -> tuple[Call, tuple[str, ...]]:
    argv = ["predict", "ner", "--model", str(p.model("ner_run")), "--", TEXT, "\u00ad\u180e\u200b"]
    return Call(argv), ("text 2 is empty", "give at least one word to predict on")


def duplicate_id2label_names(p: Place) -> tuple[Call, tuple[str, ...]]:
    model = p.copy("sentiment_run", "model")
    config = json.loads((model / "config.json").read_text())
    config["id2label"] = {"0": "positive", "1": "positive"}
    (model / "config.json").write_text(json.dumps(config))
    argv = ["predict", "sentiment", "--model", str(model), "--json", TEXT]
    return Call(argv), (
        f"{model / 'config.json'}: 'id2label' gives ids 0 and 1 the same name 'positive'",
        "fix config.json",
    )


def boolean_offset_in_evaluation_data(p: Place) -> tuple[Call, tuple[str, ...]]:
    path = p.write(
        "gold.jsonl",
        '{"text": "Aspirin helped", "spans": [{"start": 0, "end": 7, "label": "Chemical"}]}\n'
        '{"text": "Fever rose", "spans": [{"start": 0, "end": true, "label": "Disease"}]}\n',
    )
    argv = ["evaluate", "ner", "--model", str(p.model("ner_run")), "--data", "gold.jsonl"]  # out: the model's
    return Call(argv), (
        f"{path}:2: span 1: end is a boolean (true), not an integer character offset",
        "fix the offsets",
    )


def narrow_no_break_space_between_token_and_tag(p: Place) -> tuple[Call, tuple[str, ...]]:
    path = p.write("train.conll", "Aspirin B-Chemical\nhelped\u202fO\n", folder=p.data)
    return Call(p.finetune("ner", train_file=path)), (
        f"{path}:2: expected at least 2 columns (token ... tag), found 1",
        "U+202F is part of a token",
        "fix the line or set conll_tag_index",
    )


def one_class_after_numeric_spellings_merge(p: Place) -> tuple[Call, tuple[str, ...]]:
    """1, 1.0, +1 and 01 are one label: a training set of one class, refused."""
    path = p.write("train.tsv", "text\tlabel\nGood\t1\nFine\t1.0\nGreat\t+1\nNice\t01\n", folder=p.data)
    return Call(p.finetune("sentiment", train_file=path)), (
        f"{path}: the training data has one label only ('1')",
        "add examples of another label",
    )


def no_entities_in_ner_training_data(p: Place) -> tuple[Call, tuple[str, ...]]:
    records = "".join(json.dumps({"tokens": ["a", "b"], "tags": ["O", "O"]}) + "\n" for _ in range(3))
    path = p.write("train.jsonl", records, folder=p.data)
    return Call(p.finetune("ner", train_file=path)), (
        f"{path}: the training data has one label only ('O')",
        "for NER: tag some entities",
    )


def float_label_in_a_json_array(p: Place) -> tuple[Call, tuple[str, ...]]:
    path = p.write(
        "train.json", '[{"text": "a", "label": "pos"}, {"text": "b", "label": 0.5}]', folder=p.data
    )
    return Call(p.finetune("sentiment", train_file=path)), (
        f"{path}: record 2: label 0.5 (a float) in column 'label' is not a class",
        "write labels as strings or integers",
    )


def boolean_label_and_number_text(p: Place) -> tuple[Call, tuple[str, ...]]:
    path = p.write(
        "train.jsonl", '{"text": "ok", "label": "pos"}\n{"text": 1e3, "label": false}\n', folder=p.data
    )
    return Call(p.finetune("sentiment", train_file=path)), (
        f"{path}:2: text is a number (1000.0), not a string",
        "write the text as a JSON string",
    )


SILENT = table(
    unbalanced_quote_in_a_crlf_csv,
    invisible_only_text_in_a_csv,
    invisible_only_command_line_text,
    duplicate_id2label_names,
    boolean_offset_in_evaluation_data,
    narrow_no_break_space_between_token_and_tag,
    one_class_after_numeric_spellings_merge,
    no_entities_in_ner_training_data,
    float_label_in_a_json_array,
    boolean_label_and_number_text,
)


@pytest.mark.parametrize("name", names(SILENT))
@pytest.mark.slow
def test_silently_wrong_results_are_refused(name: str, place: Place) -> None:
    check(SILENT, name, place)


# --- 5. Model dirs that do not match ----------------------------------------------------------------------


def edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def edit_policy(**changes: Any) -> Callable[[Path], None]:
    def edit(model: Path) -> None:
        edit_json(model / "config.json", lambda c: c["bert_tasks"].update(changes))

    return edit


#: name -> (edit of a copied NER run, the command after `--model DIR`, what the line says)
POLICIES: dict[str, tuple[Callable[[Path], None], list[str], str]] = {
    "max_length a boolean": (edit_policy(max_length=True), ["predict", "ner"], "max_length' is True"),
    "stride negative": (edit_policy(stride=-4), ["evaluate", "ner"], "stride' is -4, not an integer in [0, "),
    "viterbi a string": (
        edit_policy(viterbi="false"),
        ["export", "--quantize", "int8"],
        "viterbi' is 'false'",
    ),
    "policy a list": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(bert_tasks=["ner"])),
        ["predict", "ner"],
        "'bert_tasks' is list, not an object",
    ),
}


@pytest.mark.parametrize("case", POLICIES)
@pytest.mark.slow
def test_a_saved_policy_of_wrong_type_or_range(case: str, place: Place) -> None:
    """Answered from config.json before torch loads, by predict, evaluate and export alike."""
    edit, command, says = POLICIES[case]
    model = place.copy("ner_run", "model")
    edit(model)
    argv = [*command, "--model", str(model)]
    if command[0] == "predict":
        argv.append(TEXT)
    elif command[0] == "evaluate":
        argv += ["--data", str(FIXTURES / "run_ner_validation.conll"), "--out", "report"]
    else:
        argv.append("int8")
    assert_refused(Call(argv), place, f"{model / 'config.json'}: ", says, "fix config.json or train")


def weights_edit(
    edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
) -> Callable[[Path], None]:
    def rewrite(model: Path) -> None:
        weights = model / "model.safetensors"
        save_file(edit(load_file(weights)), weights, metadata={"format": "pt"})

    return rewrite


def vocab_without(*tokens: str) -> Callable[[Path], None]:
    """tokenizer.json replaced by the vocab.txt of the same vocabulary, less `tokens`."""

    def rewrite(model: Path) -> None:
        vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
        (model / "tokenizer.json").unlink()
        kept = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1]) if token not in tokens]
        (model / "vocab.txt").write_text("\n".join(kept) + "\n")

    return rewrite


#: name -> (edit of a copied NER run, the command, what the line says; {model} is the copy)
MISFITS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "intermediate size in config.json": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(intermediate_size=64)),
        "evaluate",
        "model {model}: its weights do not match its config.json: bert.encoder.layer.0.intermediate",
    ),
    "an encoder key missing from the weights": (
        weights_edit(lambda w: {k: v for k, v in w.items() if "layer.1.attention.output.dense" not in k}),
        "export",
        "bert.encoder.layer.1.attention.output.dense.bias [32] is not in the weights",
    ),
    "a tokenizer.json vocab id that is a string": (
        lambda m: edit_json(m / "tokenizer.json", lambda t: t["model"]["vocab"].update(aspirin="one")),
        "predict",
        "{model}/tokenizer.json: could not load the tokenizer (invalid type: string",
    ),
    "a vocab.txt without [CLS] and [SEP]": (
        vocab_without("[CLS]", "[SEP]"),
        "attention",
        "{model}/vocab.txt: the vocabulary (30520 tokens) lacks [CLS], [SEP]",
    ),
}
COMMANDS = {
    "predict": lambda model: ["predict", "ner", "--model", str(model), TEXT],
    "evaluate": lambda model: [
        *["evaluate", "ner", "--model", str(model), "--data", str(FIXTURES / "run_ner_validation.conll")],
        *["--out", "report"],
    ],
    "export": lambda model: ["export", "--quantize", "int8", "int8", "--model", str(model)],
    "attention": lambda model: ["attention", "--model", str(model), "--out", "map.png", TEXT],
}


@pytest.mark.slow  # each command loads torch and transformers before it can see the misfit
@pytest.mark.parametrize("case", MISFITS)
def test_a_model_dir_whose_parts_do_not_match(case: str, place: Place) -> None:
    edit, command, says = MISFITS[case]
    model = place.copy("ner_run", "model")
    edit(model)
    assert_refused(Call(COMMANDS[command](model)), place, says.format(model=model))


@pytest.fixture(scope="module")
def checkpointed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 5 updates with checkpoints at 4 and 5 and no metrics.json: what --resume continues."""
    out = tmp_path_factory.mktemp("checkpointed") / "run"
    with one_thread():
        run_dir = train(tiny_config("sentiment", tiny_model, out, save_every=1, validation_file=None))
    (run_dir / "metrics.json").unlink()
    return run_dir


def resume_argv(place: Place, run_dir: Path) -> list[str]:
    tiny = place.model("tiny_model")
    return [
        "finetune",
        "sentiment",
        *fast_overrides("sentiment", tiny, run_dir, save_every=1, validation_file=None),
        "--resume",
    ]


@pytest.mark.slow  # the checkpointed run trains in this process
def test_resume_with_a_read_only_train_log(checkpointed: Path, place: Place) -> None:
    """A train_log.jsonl left read-only (immutable, for root) in the run dir: --resume would rewrite it
    after the model loaded; refused before torch loads, naming the file and what to do, nothing changed."""
    run_dir = shutil.copytree(checkpointed, place.data / "run")
    log = run_dir / "train_log.jsonl"
    with unwritable(log):
        assert_refused(
            Call(resume_argv(place, run_dir)),
            place,
            f"--resume: output_dir {run_dir} holds train_log.jsonl, which the run writes again but this user",
            f"make it writable (chmod u+w {log}) and --resume again",
        )


@pytest.mark.slow  # torch loads before the checkpoint is read
def test_resume_from_a_checkpoint_whose_optimizer_file_is_not_ours(checkpointed: Path, place: Place) -> None:
    """optimizer.bin replaced by another program's safetensors file: named, with the checkpoint to use."""
    run_dir = shutil.copytree(checkpointed, place.data / "run")
    step = run_dir / "checkpoints" / "step-00000005"
    save_file({"exp_avg": torch.zeros(3)}, step / "optimizer.bin")
    assert_refused(
        Call(resume_argv(place, run_dir)),
        place,
        f"checkpoint {step} is damaged: optimizer.bin is not what bert-tasks wrote",
        f"delete {step} and --resume again to continue from step-00000004",
    )


# --- 6. What must work: streams are read, not refused -----------------------------------------------------


@pytest.mark.slow  # predicts with a model
def test_a_fifo_and_process_substitution_of_plain_text_starting_with_a_brace(place: Place) -> None:
    """`--file FIFO` and `--file <(...)`: read once, whole, as plain text (the first line starts with `{` but
    is no JSON object, so every line is a text); exit 0, and nothing outside stdout written."""
    model = place.model("sentiment_run")
    os.mkfifo(place.work / "texts")
    lines = "{not JSON} but a review\\nA second one.\\n"
    feed = f"timeout 60 sh -c \"printf '{lines}' > texts\" &"
    predict = f"{{bt}} predict sentiment --model {shlex.quote(str(model))} --json --file"
    for shell in (f"{feed} {predict} texts; s=$?; wait; exit $s", f"{predict} <(printf '{lines}')"):
        before = {root: tree(root) for root in (place.work, model)}
        done = run(Call(shell=shell), place.work)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert [json.loads(line)["text"] for line in done.stdout.splitlines()] == [
            "{not JSON} but a review",
            "A second one.",
        ]
        assert {root: tree(root) for root in (place.work, model)} == before


@pytest.mark.slow  # reads the tiny model's config with transformers
def test_memory_far_beyond_ram_says_how_much_it_would_need(place: Place) -> None:
    argv = ["memory", "--model", str(place.model("tiny_model")), "--batch", str(10**9), "--seq-len", "64"]
    line = assert_refused(Call(argv), place, "memory: batch 1000000000 x seq_len 64 in fp32 would need about")
    assert " GiB " in line and "pass a smaller --batch or --seq-len" in line
