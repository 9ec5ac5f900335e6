"""Predict inputs of any size into a JSON Lines file: read, predict and write in bounded chunks, in order.

Memory holds one chunk (at most `CHUNK_TEXTS` records or about `CHUNK_CHARS` characters), never the
whole input, and each output line is its input record with the prediction added under the task's record
keys (`id` and every other field pass through).

What a crash leaves: the lines go to `OUT.partial` beside OUT, each chunk in one write, and the file
takes its final name only after its last chunk; so OUT, when it exists, is complete, and a run that was
killed or stopped by an error leaves `OUT.partial`, whose complete lines are the predictions of the first
inputs in input order. There is no resume: a rerun predicts everything again and rewrites `OUT.partial`.

Chunks are consecutive runs of the input, predicted and written in order: the unit several processes
could share (each predicting every N-th chunk) while one output keeps the input order.

This module imports nothing heavy: the CLI checks the output path and reads a file once before any model
loads (`prediction_inputs`), so a mistake in either is answered first.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.files import check_texts, text_records
from bert_tasks.errors import BertTasksError
from bert_tasks.output_paths import failure_reason
from bert_tasks.runtime import progress_bars_wanted

if TYPE_CHECKING:
    from bert_tasks.inference.predictor import Predictor

#: A chunk ends after this many records...
CHUNK_TEXTS = 2048
#: ... or once its texts reach this many characters (a file of long documents stays bounded too).
CHUNK_CHARS = 1 << 20

Record = tuple[str, dict[str, Any]]  # (`file:line`, the input record with its "text" or other inputs)
Check = Callable[[str, dict[str, Any]], dict[str, Any]]  # a task's `check_input`


def input_chars(fields: dict[str, Any]) -> int:
    """The characters of a record's strings, and of the strings in its lists (NER's tokens): its size."""
    return sum(
        len(value) if isinstance(value, str) else sum(len(v) for v in value if isinstance(v, str))
        for value in fields.values()
        if isinstance(value, str | list)
    )


def prediction_inputs(
    texts: Sequence[str], path: str | None, check: Check | None = None
) -> tuple[Iterable[Record], int | None]:
    """The records to predict (command-line texts first, then the file's) and their count, when known.

    `check`: the task's `check_input` for every record (default: a 'text' each). A regular
    file is read through once here, before any model loads: its every mistake is answered first and the
    progress bar knows the total. Standard input and pipes can be read only once, so they are checked
    as they stream.
    """
    check_texts(texts)
    given = [(f"text {n}", {"text": text}) for n, text in enumerate(texts, start=1)]
    if check is not None:  # the command line's texts meet the task's rule too (a pair model's --pair)
        given = [(where, check(where, record)) for where, record in given]
    if path is None:
        return given, len(given)
    if path != "-" and _is_regular_file(path):
        total = len(given) + sum(1 for _ in text_records(path, check))
        return itertools.chain(given, text_records(path, check)), total
    return itertools.chain(given, text_records(path, check)), None


def chunks(records: Iterable[Record], max_texts: int, max_chars: int) -> Iterator[list[Record]]:
    """Consecutive runs of `records` of at most `max_texts` records or about `max_chars` characters."""
    chunk: list[Record] = []
    chars = 0
    for record in records:
        chunk.append(record)
        chars += input_chars(record[1])
        if len(chunk) >= max_texts or chars >= max_chars:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


class JsonlOutput:
    """The output file, checked before any model loads: a new path, not the input, in a writable dir.

    A path that exists is refused (it may be the user's file, or the input; nothing they wrote is
    replaced). The lines are written to `OUT.partial` (rewritten by a rerun, unless it is the input) and
    renamed to OUT by `finish`. Used as a
    context manager, so a command that fails before its first chunk leaves no empty `OUT.partial`.
    """

    def __init__(self, path: str | Path, input_path: str | None = None) -> None:
        self.path, self.partial = check_output(path, input_path)
        try:
            self._stream = open(self.partial, "wb")  # noqa: SIM115 (open until finish)
        except OSError as error:
            raise BertTasksError(
                f"--out {self.path}: cannot write {self.partial} ({failure_reason(error)}); "
                "give a path in an existing, writable directory"
            ) from None
        self.written = 0
        self.finished = False

    def __enter__(self) -> JsonlOutput:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        """Append one chunk's records as JSON lines, in one write, flushed to the file."""
        data = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode()
        try:
            self._stream.write(data)
            self._stream.flush()
        except OSError as error:
            raise self._failed(error) from None
        self.written += len(records)

    def finish(self) -> None:
        """Make the file durable, then give it its final name: OUT exists only complete."""
        try:
            os.fsync(self._stream.fileno())
            self._stream.close()
            os.replace(self.partial, self.path)
        except OSError as error:
            raise self._failed(error) from None
        self.finished = True

    def close(self) -> None:
        """Close; unfinished (an error, an interruption), `OUT.partial` keeps what was written, if any."""
        self._stream.close()
        if not self.finished and self.written == 0:
            self.partial.unlink(missing_ok=True)

    def _failed(self, error: OSError) -> BertTasksError:
        return BertTasksError(
            f"--out {self.path}: could not write {self.partial} ({failure_reason(error)}); "
            f"{self.written} complete records were written before; free space or write elsewhere"
        )


def check_output(path: str | Path, input_path: str | None) -> tuple[Path, Path]:
    """`(OUT, OUT.partial)`, unless OUT exists or its partial file is the input: `JsonlOutput`'s checks
    without opening anything (what the processes of a launch that do not write the file check too)."""
    path = Path(path)
    partial = path.with_name(f"{path.name}.partial")
    if path.exists() or path.is_symlink():
        raise BertTasksError(f"--out {path}: already exists; give a new path, or remove the file first")
    if input_path not in (None, "-") and partial.resolve() == Path(input_path).resolve():
        raise BertTasksError(f"--out {path}: its partial file {partial} is the input; give another --out")
    if not _is_partial_output(partial):
        raise BertTasksError(
            f"--out {path}: {partial} exists and is no partial output of predict (JSON Lines), so it is not "
            "replaced; rename or remove it, or give another --out"
        )
    return path, partial


def _is_partial_output(partial: Path) -> bool:
    """Whether `partial` is absent or may be an interrupted run's own: empty (killed before its first
    chunk), or opening with a JSON object line. Anything else is a file of the user's that happens to
    bear the name, and a rerun would overwrite it."""
    if not partial.exists() and not partial.is_symlink():
        return True
    if not partial.is_file():
        return False
    try:
        with partial.open("rb") as file:
            first = file.readline(1 << 20)
    except OSError:
        return False
    if not first:
        return True
    try:
        return isinstance(json.loads(first), dict)
    except (ValueError, RecursionError):
        return False


def predict_to_jsonl(
    predictor: Predictor,
    records: Iterable[Record],
    out: JsonlOutput,
    total: int | None = None,
    max_texts: int = CHUNK_TEXTS,
    max_chars: int = CHUNK_CHARS,
) -> int:
    """Predict `records` chunk by chunk into `out`, in input order; the number of records written.

    A progress bar on stderr counts records when stderr is a terminal (and `--quiet` is off); the
    Predictor's own bar per chunk is turned off for the run, so the two do not stack.
    """
    from tqdm.auto import tqdm

    show = progress_bars_wanted() and sys.stderr.isatty()
    progress, predictor.progress = predictor.progress, False
    try:
        with tqdm(total=total, desc="predict", unit="texts", disable=not show, file=sys.stderr) as bar:
            for chunk in chunks(records, max_texts, max_chars):
                out.write(predictor.annotate(chunk))
                bar.update(len(chunk))
    finally:
        predictor.progress = progress
    if out.written == 0:  # an empty pipe: no output file at all, as for a failed run
        raise BertTasksError("nothing to predict: the input holds no text")
    out.finish()
    return out.written


def _is_regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False  # text_records says why it does not open
