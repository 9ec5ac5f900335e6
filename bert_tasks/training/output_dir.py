"""One run per output_dir: lock it while the run lives, and let --overwrite delete only what runs wrote.

Each run lists the top-level entries it creates in a manifest (MANIFEST) inside its output_dir, so
replacing a previous run deletes exactly those and never the user's own files. Inside the run's own
checkpoints/ and best/ the names say what a run wrote (`RUN_SUBDIRS`: step-N dirs, a saved model's
files); anything else there is the user's, and stops --overwrite (and --resume, which replaces best/
whole) before anything is deleted. An exclusive flock on the directory itself keeps a second run out; the
kernel drops it when its process dies, so it never goes stale. Standard library only: the CLI claims the
directory before it imports torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Collection, Sequence
from pathlib import Path
from types import TracebackType

from bert_tasks.errors import BertTasksError
from bert_tasks.output_paths import kernel_dir, refuse_inside

MANIFEST = ".bert-tasks-run.json"
#: What runs wrote before manifests existed; such a run is known by the first line of its recipe.yaml.
OLD_RUN_ENTRIES = frozenset(
    {"recipe.yaml", "train_log.jsonl", "metrics.json", "checkpoints", "best", "best.tmp", "config.json"}
    | {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    | {"vocab.txt", "training_curves.png"}
)
RECIPE_HEADER = "# Resolved bert-tasks config"
#: The checkpoint dirs a run writes in checkpoints/ (`step-N.tmp` while one is written).
CHECKPOINT_ENTRY = re.compile(r"step-\d+(\.tmp)?")
#: The files `save_pretrained` writes for best/ (whole or in shards).
MODEL_FILE = re.compile(
    r"config\.json|generation_config\.json|model\.safetensors(\.index\.json)?|model-\d+-of-\d+\.safetensors"
)
#: The file a complete checkpoint (a step-N dir) is known by, written last.
RUN_STATE = "run_state.json"
#: The key of run_state.json listing the entries the checkpoint's save wrote: anything else in its step-N
#: dir is the user's (notes, an exported copy), never deleted with the checkpoint.
CHECKPOINT_FILES = "checkpoint_files"
#: The run's subdirs that hold only what it wrote there: name -> (pattern of its entries, they are dirs).
RUN_SUBDIRS = {
    "checkpoints": (CHECKPOINT_ENTRY, True),
    "best": (MODEL_FILE, False),
    "best.tmp": (MODEL_FILE, False),
}
#: What a resumed run replaces whole (save_best): a user's file there would go with it.
REPLACED_ON_RESUME = ("best", "best.tmp")

StrPath = str | os.PathLike[str]


class OutputDir:
    """A checked output_dir: what the run has recorded in it, and what its previous run left to clear.

    The process that holds the lock (`owner`) is the only one that writes the manifest or deletes.
    """

    def __init__(self, path: Path, fd: int | None, created: list[Path]) -> None:
        self.path = path
        self.owner = fd is not None
        self._fd = fd
        self._created = created  # deepest first: the directories abandon() may remove
        self._entries: set[str] = set()  # what the manifest lists
        self._previous: list[str] | None = None  # what clear_previous() deletes; None without overwrite

    @property
    def created(self) -> bool:
        """Whether this claim created the directory (so abandon() may remove it)."""
        return bool(self._created)

    @classmethod
    def claim(
        cls,
        path: StrPath,
        *,
        overwrite: bool,
        resume: bool,
        reads: Sequence[StrPath] = (),
        lock: bool = True,
    ) -> OutputDir:
        """Check `path` against the run's flags and lock it: the run's first step, so a refusal costs nothing.

        `reads` are the run's data files and base model (hub ids and missing paths are ignored). Creates
        the directory if it is missing, and writes nothing in it. `lock=False` (the other processes of a
        multi-process run) only checks: no directory made, no lock taken, nothing recorded or deleted.
        """
        if not os.fspath(path).strip():
            raise BertTasksError("output_dir is empty; name a directory")
        out = Path(path)
        if out.is_symlink():
            raise BertTasksError(
                f"output_dir {out} is a symlink (to {os.readlink(out)}); bert-tasks never writes through "
                "one, name the real directory or another output_dir"
            )
        if out.exists() and not out.is_dir():
            raise BertTasksError(f"output_dir {out} exists and is not a directory; choose another output_dir")
        kernel = kernel_dir(out)
        if kernel is not None:  # the rule of every command's output (output_paths)
            raise BertTasksError(
                f"output_dir {out} is under {kernel}, a kernel filesystem that holds no files; choose "
                "another output_dir"
            )
        if resume and overwrite:
            raise BertTasksError(
                f"output_dir {out}: --resume continues its run, --overwrite replaces it; pass one"
            )
        if resume and not out.is_dir():
            raise BertTasksError(
                f"--resume: output_dir {out} does not exist; check the path, or drop --resume to start a "
                "new run"
            )
        for read in reads:  # the model or teacher dir (the same dir is answered once it is locked)
            if os.path.isdir(read) and os.path.realpath(read) != os.path.realpath(out):
                refuse_inside(out, read, "output_dir")
        created = _make_dirs(out) if lock else []
        claimed = cls(out, _lock(out, created) if lock else None, created)
        try:
            claimed._check(overwrite=overwrite, resume=resume, reads=reads)
        except BaseException:
            claimed.abandon()
            raise
        return claimed

    @classmethod
    def reopen(cls, path: StrPath) -> OutputDir:
        """Lock a dir that a command has just written (a finished run, or files of its own) to list what
        it adds there (`bert-tasks prune`'s report beside its recovery run): they join the manifest, so
        `--overwrite` replaces them with the rest. The entries already listed stay listed."""
        out = Path(path)
        claimed = cls(out, _lock(out, []), [])
        try:
            claimed._entries = _read_manifest(out) or set()
        except BaseException:
            claimed.release()
            raise
        return claimed

    def _check(self, *, overwrite: bool, resume: bool, reads: Sequence[StrPath]) -> None:
        """The rules that depend on what the directory holds: checked under the lock, so no run races them."""
        out = self.path
        if self.owner and not os.access(out, os.W_OK | os.X_OK):
            raise BertTasksError(f"output_dir {out} is not writable; fix its permissions or choose another")
        names = sorted(name for name in os.listdir(out) if not _is_manifest(name)) if out.is_dir() else []
        if not names:
            self._previous = [] if overwrite else None
            return
        real = os.path.realpath(out)
        existing = [os.path.realpath(read) for read in reads if os.path.exists(read)]
        if real in existing:  # data are files: a directory the run reads is its model
            raise BertTasksError(
                f"model and output_dir are the same dir ({out}); training there would replace the old model "
                "before the new one is complete; write the new run to another output_dir"
            )
        if not (overwrite or resume):
            raise BertTasksError(
                f"output_dir {out} is not empty; pass --overwrite to replace its previous run, "
                "--resume to continue it, or choose another output_dir"
            )
        listed = _read_manifest(out)
        is_run = listed is not None or _is_old_run(out)
        owned = listed if listed is not None else OLD_RUN_ENTRIES if is_run else frozenset()
        self._entries = {name for name in names if self._owns(name, owned)} | set(listed or ())
        if resume:
            self._check_rewritable(sorted(self._entries & set(names)))
            self._refuse_foreign([f for name in REPLACED_ON_RESUME for f in _foreign_inside(out, name)], True)
            return
        for read in existing:
            if os.path.commonpath([read, real]) == real:
                held = os.path.relpath(read, real)
                raise BertTasksError(
                    f"output_dir {out} holds {held} which this run reads; choose another output_dir"
                )
        if not is_run:
            raise BertTasksError(
                f"output_dir {out} is not a bert-tasks run (no {MANIFEST}); nothing was deleted, "
                "choose another output_dir"
            )
        foreign = [name for name in names if not self._owns(name, owned)]
        inside = [f for name in names if self._owns(name, owned) for f in _foreign_inside(out, name)]
        self._refuse_foreign(foreign + inside, False)
        self._previous, self._entries = names, set()

    def _refuse_foreign(self, foreign: Sequence[str], resume: bool) -> None:
        """Files no run wrote, where the run would delete: named before anything is deleted."""
        if not foreign:
            return
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        held = f"output_dir {self.path} holds {foreign[0]}{more}, which no bert-tasks run wrote"
        if resume:
            raise BertTasksError(
                f"--resume: {held} and the run replaces {Path(foreign[0]).parts[0]}/ whole; nothing was "
                "deleted, move it elsewhere and --resume again"
            )
        raise BertTasksError(f"{held}; nothing was deleted, move it elsewhere or choose another output_dir")

    def _check_rewritable(self, names: Sequence[str]) -> None:
        """--resume appends to the run's log and replaces its checkpoints and final files: one of them that
        this user cannot write (read-only, immutable, another owner's) would fail after the model loaded."""
        for name in names:
            if name.startswith("eval-"):  # evaluate's reports beside the model: a run never writes them
                continue
            entry = self.path / name
            need = os.W_OK | os.X_OK if entry.is_dir() and not entry.is_symlink() else os.W_OK
            if not os.access(entry, need, follow_symlinks=False):
                raise BertTasksError(
                    f"--resume: output_dir {self.path} holds {name}, which the run writes again but this "
                    f"user cannot write; make it writable (chmod u+w {entry}) and --resume again"
                )

    def _owns(self, name: str, owned: Collection[str]) -> bool:
        """Listed entries, and the eval-* dirs `bert-tasks evaluate` writes beside a run's model."""
        entry = self.path / name
        return name in owned or (name.startswith("eval-") and entry.is_dir() and not entry.is_symlink())

    def clear_previous(self) -> None:
        """With overwrite, delete the previous run's entries and nothing else; call it before record().

        The old manifest is replaced only afterwards, so a deletion cut short is finished by the next one.
        """
        if self._previous is None or not self.owner:
            return
        for name in self._previous:
            _remove(self.path / name)
        self._previous = []
        self._write_manifest()

    def record(self, *names: StrPath) -> None:
        """Add what the run creates (a name, or a path in output_dir) to the manifest; owner only."""
        new = set()
        for name in names:
            relative = Path(name)
            if relative.is_relative_to(self.path):
                relative = relative.relative_to(self.path)
            if not relative.parts or relative.is_absolute() or relative.parts[0] == "..":
                raise ValueError(f"{name!r} is not a path inside output_dir {self.path}")
            new.add(relative.parts[0])
        if self.owner and not new <= self._entries | {MANIFEST}:
            self._entries |= new - {MANIFEST}
            self._write_manifest()

    def is_foreign(self, name: str) -> bool:
        """Whether output_dir holds `name` and no bert-tasks run wrote it: a user's file, never replaced."""
        return name not in self._entries and os.path.lexists(self.path / name)

    def _write_manifest(self) -> None:
        """Through a temporary file and a rename: a crash leaves the old manifest or the new, never half."""
        temp = self.path / f"{MANIFEST}.{os.getpid()}.tmp"
        with temp.open("w", encoding="utf-8") as file:
            json.dump({"written_by": "bert-tasks", "entries": sorted(self._entries)}, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, self.path / MANIFEST)

    def abandon(self) -> None:
        """After a failure before the run wrote anything: remove what this claim created if empty, unlock."""
        _remove_empty(self._created)
        self.release()

    def release(self) -> None:
        """Unlock: another run may claim the directory from now on."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        """Release; after an error also abandon, which removes at most an empty directory this claim made."""
        if kind is None:
            self.release()
        else:
            self.abandon()


def _make_dirs(out: Path) -> list[Path]:
    """Create `out` and its missing parents; return those this call created, deepest first."""
    missing = []
    for folder in [out, *out.parents]:
        if folder.exists():
            break
        missing.append(folder)
    created: list[Path] = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # another process made it just now: not ours to remove
        except OSError as e:
            _remove_empty(created[::-1])
            raise BertTasksError(
                f"cannot create output_dir {out}: {e.strerror} ({folder}); choose another output_dir"
            ) from e
        created.append(folder)
    return created[::-1]


def _lock(out: Path, created: list[Path]) -> int:
    """An exclusive flock on the directory itself: no lock file to clean up or to find stale."""
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        _remove_empty(created)
        raise BertTasksError(f"cannot open output_dir {out}: {e.strerror}; choose another output_dir") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        os.close(fd)  # the directory is the other run's now: never removed here, even if this claim made it
        pid = f" (pid {holder})" if holder else ""
        raise BertTasksError(
            f"output_dir {out} is in use by another bert-tasks run{pid}; wait for it or choose another "
            "output_dir"
        ) from None
    except OSError as e:
        os.close(fd)
        _remove_empty(created)
        raise BertTasksError(f"cannot lock output_dir {out}: {e.strerror}; choose a local directory") from e
    return fd


def _lock_holder(fd: int) -> int | None:
    """The pid holding a flock on `fd`'s directory, from /proc/locks (Linux); None where unknown."""
    stat = os.fstat(fd)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii") as locks:
            for fields in map(str.split, locks):
                if "FLOCK" in fields and inode in fields:
                    return int(fields[fields.index(inode) - 1]) or None
    except (OSError, ValueError):
        pass
    return None


def _read_manifest(out: Path) -> set[str] | None:
    """The entries the manifest lists; None without one. Refuses names that would reach outside `out`."""
    path = out / MANIFEST
    if not os.path.lexists(path):
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["entries"]
        if isinstance(entries, list) and all(
            isinstance(e, str) and e not in {"", ".", ".."} and Path(e).name == e for e in entries
        ):
            return set(entries)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    raise BertTasksError(
        f"output_dir {out} has a damaged {MANIFEST}; nothing was deleted, choose another output_dir"
    )


def _is_old_run(out: Path) -> bool:
    """A run written before manifests: its recipe.yaml is a regular file that save_config wrote."""
    recipe = out / "recipe.yaml"
    if recipe.is_symlink() or not recipe.is_file():
        return False
    with recipe.open("rb") as file:
        return file.read(len(RECIPE_HEADER)) == RECIPE_HEADER.encode()


def _is_manifest(name: str) -> bool:
    """The manifest and the temporary file a crash during its writing may leave."""
    return name == MANIFEST or (name.startswith(MANIFEST + ".") and name.endswith(".tmp"))


def _foreign_inside(out: Path, name: str) -> list[str]:
    """What run subdir `name` of `out` holds that no run wrote there (`RUN_SUBDIRS`), as `name/entry`.

    A symlinked or missing subdir holds nothing of its own: --overwrite removes only the link."""
    folder = out / name
    if name not in RUN_SUBDIRS or folder.is_symlink() or not folder.is_dir():
        return []
    found = []
    for entry in sorted(os.listdir(folder)):
        if not is_run_entry(folder / entry):
            found.append(f"{name}/{entry}")
        elif name == "checkpoints":
            found += [f"{name}/{entry}/{inner}" for inner in foreign_in_checkpoint(folder / entry)]
    return found


def foreign_in_checkpoint(step_dir: Path) -> list[str]:
    """The entries of a complete step-N dir that its save did not write (run_state.json lists those), by
    name. A checkpoint of a bert-tasks that kept no list, or one without a readable run_state.json (half
    written or half deleted), is taken as wholly the run's."""
    try:
        listed = json.loads((step_dir / RUN_STATE).read_text(encoding="utf-8"))[CHECKPOINT_FILES]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(listed, list):
        return []
    own = {*map(str, listed), RUN_STATE}
    return sorted(name for name in os.listdir(step_dir) if name not in own)


def is_run_entry(entry: Path) -> bool:
    """Whether `entry` in one of `RUN_SUBDIRS` is what a run writes there: its name, and a dir (step-N)
    or a regular file (a model's) as the run makes it, never a symlink."""
    pattern, is_dir = RUN_SUBDIRS[entry.parent.name]
    if entry.is_symlink() or not pattern.fullmatch(entry.name):
        return False
    return entry.is_dir() if is_dir else entry.is_file()


def _remove(entry: Path) -> None:
    """Delete one entry the previous run wrote; in a run subdir only the run's own entries, then the dir
    itself if that leaves it empty (a file added since the claim's check stays)."""
    if entry.is_symlink() or not entry.is_dir():
        entry.unlink(missing_ok=True)  # a symlink goes, never what it points to
        return
    if entry.name not in RUN_SUBDIRS:
        shutil.rmtree(entry)
        return
    for inner in entry.iterdir():
        if is_run_entry(inner):
            _remove(inner)
    _remove_empty([entry])


def _remove_empty(folders: list[Path]) -> None:
    """rmdir each folder (deepest first) until one is not empty: never deletes a file."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
