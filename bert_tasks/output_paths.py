"""The one rule every command's output directory follows (evaluate, attention, export); the paths of
attention's PNG and of every command's --html page.

It is checked and created before any model loads, a place that cannot hold files is refused in one line
naming the path and the OS's reason, and a command that fails leaves no directory it created behind.
Not `training.output_dir.OutputDir`: a run's dir has a manifest and a lock, these are plain folders.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from bert_tasks.errors import BertTasksError

#: Directories of kernel filesystems: they hold no files a command could write.
_KERNEL_DIRS = (Path("/proc"), Path("/sys"))
#: How the pages (their <meta name="generator">) and the PNGs (their tEXt Software chunk) say who wrote
#: them: a file without the mark is the user's, and no command replaces it.
GENERATOR = "bert-tasks"
_OUR_MARKS = (
    f'<meta name="generator" content="{GENERATOR}">'.encode(),
    f"tEXtSoftware\0{GENERATOR}".encode(),
)


@dataclass
class CommandOutput:
    """The directory a command writes into: one rule for evaluate, attention and export.

    `with CommandOutput(path, what, todo) as out:` refuses, in one line, a path under /proc or /sys, one that
    is a file (or, with `fresh`, a symlink or a non-empty directory), one that cannot be created, and one
    where no file can be written (read-only, no permission: a probe file is written and removed); it
    creates the missing directories first. The command then loads and computes, and writes inside
    `with out.writing():`, which says a failed write (a full disk) in one line too. If the command fails,
    the directories it created are removed again while empty; with `fresh` (export), everything written
    into the directory is removed, so a failed export leaves no half-written model dir behind.

    `what` names the path for the user ("evaluate output runs/x/eval-test"); `todo` says what to do.
    """

    path: Path
    what: str
    todo: str
    fresh: bool = False
    created: list[Path] = field(default_factory=list)  # deepest first

    def __enter__(self) -> CommandOutput:
        try:
            self._check()
        except (OSError, RuntimeError) as error:  # a directory that cannot be listed; a symlink loop
            raise self._refusal("cannot look into it", error) from None
        self._create()
        try:
            handle, probe = tempfile.mkstemp(dir=self.path, prefix=".bert-tasks-write-test-")
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            self._undo()
            raise self._refusal("cannot write files there", error) from None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is not None:
            self._undo()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Map a failed write (OSError, or safetensors' I/O error) to one line naming the path and reason."""
        try:
            yield
        except Exception as error:
            if not is_write_failure(error):
                raise
            written = getattr(error, "filename", None)
            raise self._refusal(f"could not write {written or 'there'}", error) from None

    def _check(self) -> None:
        path = self.path
        kernel = kernel_dir(path)
        if kernel is not None:
            raise BertTasksError(
                f"{self.what}: is under {kernel}, a kernel filesystem that holds no files; {self.todo}"
            )
        if self.fresh and path.is_symlink():
            raise BertTasksError(
                f"{self.what}: is a symbolic link (to {os.readlink(path)}); choose a new directory"
            )
        if path.exists() and not path.is_dir():
            named = "" if self.what.endswith(str(path)) else f"{path} "  # attention names its PNG
            raise BertTasksError(f"{self.what}: {named}exists and is not a directory; {self.todo}")
        if self.fresh and path.is_dir() and any(path.iterdir()):
            raise BertTasksError(f"{self.what}: already exists and is not empty; choose a new directory")

    def _create(self) -> None:
        missing = []
        for folder in [self.path, *self.path.parents]:
            if folder.exists() or folder.is_symlink():
                break  # a file there: creating its child says "Not a directory"
            missing.append(folder)
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except OSError as error:
                self._undo()
                raise self._refusal(f"cannot create the directory {folder}", error) from None
            self.created.insert(0, folder)

    def _undo(self) -> None:
        """Remove what this command wrote (`fresh`) and the directories it created while they are empty."""
        if self.fresh and self.path.is_dir() and not self.path.is_symlink():
            for child in list(self.path.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (it holds what the command wrote) or gone: the parents stay too
        self.created.clear()

    def _refusal(self, what_failed: str, error: Exception) -> BertTasksError:
        return BertTasksError(f"{self.what}: {what_failed} ({failure_reason(error)}); {self.todo}")


def refuse_inside(out: str | Path, source: str | Path, what: str) -> None:
    """Refuse an output dir that is the model dir `source` a command reads, or lies inside it (after
    symlinks): the command would change the model dir it reads, and nothing outside OUT is ever touched.
    `what` names the output ("export OUT", "prune --out"); needs no model."""
    real, read = os.path.realpath(out), os.path.realpath(source)
    if os.path.commonpath([real, read]) != read:
        return
    where = "is the model dir" if real == read else "lies inside the model dir"
    raise BertTasksError(f"{what} {out}: {where} {source} it reads; choose a directory outside it")


def kernel_dir(path: Path) -> Path | None:
    """/proc or /sys when `path` lies under one (after symlinks): a place no command's output can go."""
    resolved = Path(os.path.realpath(path))  # unlike Path.resolve, never raises on a symlink loop
    return next((d for d in _KERNEL_DIRS if resolved == d or d in resolved.parents), None)


def check_png_path(out: str | Path) -> None:
    """`attention --out` names a PNG file: its extension is .png and it is no directory (needs no model:
    the CLI checks it before torch loads)."""
    _check_file_path(out, "attention output", "PNG images", (".png",))


def check_html_path(out: str | Path, command: str) -> None:
    """`<command> --html` names an HTML page: .html (or .htm), no directory (checked before torch loads)."""
    _check_file_path(out, f"{command} --html", "HTML pages", (".html", ".htm"))


def page_output(out: str | Path, command: str) -> CommandOutput:
    """The folder of `<command> --html PAGE` under the one output rule; enter it before the model loads."""
    check_html_path(out, command)
    check_replaceable(Path(out), f"{command} --html")
    todo = "pass --html a .html path in a directory you can write to"
    return CommandOutput(Path(out).parent, f"{command} --html {out}", todo)


def check_replaceable(path: Path, what: str) -> None:
    """Refuse to replace a file that bert-tasks did not write: a page or image of the user's own."""
    if (path.exists() or path.is_symlink()) and not path.is_dir() and not written_by_us(path):
        raise BertTasksError(
            f"{what} {path}: exists and was not written by bert-tasks; give a new path, or remove the file "
            "first"
        )


def written_by_us(path: Path) -> bool:
    """Whether the file's head carries the mark bert-tasks writes into its pages and PNGs."""
    try:
        with path.open("rb") as file:
            head = file.read(4096)  # the generator meta and the PNG's tEXt chunk come first
    except OSError:
        return False
    return any(mark in head for mark in _OUR_MARKS)


def _check_file_path(out: str | Path, what: str, kind: str, suffixes: tuple[str, ...]) -> None:
    path = Path(out)
    if path.suffix.lower() not in suffixes:
        found = f"{path.suffix} files" if path.suffix else "a name without an extension"
        raise BertTasksError(
            f"{what} {out}: only {kind} are written, not {found}; give a path ending in {suffixes[0]}"
        )
    if path.is_dir():
        raise BertTasksError(f"{what} {out}: is a directory; give a file path ending in {suffixes[0]}")


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it: a failed write leaves no half file."""
    partial = path.with_name(f".{path.name}.tmp")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


#: How the writers word a failed write: torch.save ("... failed writing file ...") and safetensors
#: ("I/O error: No space left on device (os error 28)") raise their own errors, not OSError.
_WRITE_FAILURE_WORDS = re.compile(r"writ|I/O error|No space left", re.IGNORECASE)


def is_write_failure(error: BaseException) -> bool:
    """An OSError, or torch's/safetensors' own error whose words say that a write failed."""
    if isinstance(error, OSError):
        return True
    writer_error = isinstance(error, RuntimeError) or type(error).__name__ == "SafetensorError"
    return writer_error and bool(_WRITE_FAILURE_WORDS.search(str(error)))


def failure_reason(error: BaseException) -> str:
    """A failed write in the OS's few words ("No space left on device"), whoever raised it."""
    reason = error.strerror if isinstance(error, OSError) and error.strerror else _first_line(error)
    return re.sub(r"^.*I/O error: (.+?) \(os error \d+\)$", r"\1", reason)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
