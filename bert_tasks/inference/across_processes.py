"""`predict --out` under `accelerate launch`: the input's chunks shared across processes, one output in order.

Every process reads the whole input and cuts it into the chunks one process would predict
(`stream.chunks`); with N processes, process i predicts the chunks i, N + i, 2N + i, ... After each round
of N chunks, Accelerate's `gather_object` brings the round's predictions to every process in process
order, which is input order, and the main process appends them to its `JsonlOutput`. So memory holds one
round, never the input, and the output follows stream.py's rules to the letter: lines go to
`OUT.partial`, whose complete lines are always the predictions of the first inputs in order, renamed to
OUT after the last round. Each chunk is predicted in the batches one process would make of it, so the
output is one process's output byte for byte (on the same kind of device, with as many threads).

A failure on one process (a record holding a field the prediction writes, the model, a full disk on the
main process) ends every process in the same round, each with one line (`training/together.py`), rather
than leaving the others waiting at the next gather.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from bert_tasks.errors import BertTasksError
from bert_tasks.inference.stream import CHUNK_CHARS, CHUNK_TEXTS, JsonlOutput, Record, chunks
from bert_tasks.runtime import progress_bars_wanted
from bert_tasks.training.together import failing_together

if TYPE_CHECKING:
    from bert_tasks.inference.predictor import Predictor

T = TypeVar("T")


def predict_across_processes(
    open_predictor: Callable[[], Predictor],
    records: Iterable[Record],
    out_path: str | Path,
    input_path: str | None,
    total: int | None = None,
    max_texts: int = CHUNK_TEXTS,
    max_chars: int = CHUNK_CHARS,
) -> int | None:
    """Predict `records` into `out_path` with every process of the launch: the number of records written
    on the main process, None on the others (which write nothing)."""
    # cpu=True where there is no accelerator: else CPU processes would each predict everything alone
    # rather than join one gloo process group (as Run.setup does for training).
    state = PartialState(cpu=not torch.accelerator.is_available())
    try:
        written = _predict_rounds(
            state, open_predictor, records, out_path, input_path, total, max_texts, max_chars
        )
    finally:
        # Ended here rather than by gloo's destructor at exit: a process leaving with its group alive
        # while another still works was seen to abort ("terminate called without an active exception").
        state.destroy_process_group()
    return written


def _predict_rounds(
    state: PartialState,
    open_predictor: Callable[[], Predictor],
    records: Iterable[Record],
    out_path: str | Path,
    input_path: str | None,
    total: int | None,
    max_texts: int,
    max_chars: int,
) -> int | None:
    """The rounds of chunks, predicted by every process and written by the main one."""
    main = state.is_main_process
    with ExitStack() as stack:
        with failing_together(state, "loading the model or opening --out"):
            predictor = open_predictor()
            predictor.progress = False  # the bar below counts records, on the main process only
            out = stack.enter_context(JsonlOutput(out_path, input_path)) if main else None
        show = main and progress_bars_wanted() and sys.stderr.isatty()
        bar = stack.enter_context(tqdm(total=total, desc="predict", unit="texts", disable=not show))
        seen = 0
        for group in _rounds(chunks(records, max_texts, max_chars), state.num_processes):
            size = sum(len(chunk) for chunk in group)
            mine = group[state.process_index] if state.process_index < len(group) else []
            with failing_together(state, "predicting its share of the input"):
                predicted = predictor.annotate(mine) if mine else []
            gathered = gather_object([predicted])  # one list per process, in process (= input) order
            with failing_together(state, f"writing {out_path}"):
                if out is not None:
                    out.write([record for part in gathered for record in part])
            seen += size
            bar.update(size)
        if seen == 0:
            raise BertTasksError("nothing to predict: the input holds no text")
        # Also the launch's last meeting: nobody leaves before the main process has moved OUT into place.
        with failing_together(state, f"moving {out_path} into place"):
            if out is not None:
                out.finish()
        return out.written if out is not None else None


def _rounds(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive groups of `size` items (the last one shorter)."""
    iterator = iter(items)
    while group := list(itertools.islice(iterator, size)):
        yield group
