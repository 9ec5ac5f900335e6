"""`python -m bert_tasks` that signals itself once, at a chosen point: the interruption tests' driver.

    python tests/interrupted_run.py SIGNAL POINT finetune sentiment key=value ...

POINT is `micro-batch:N` (just before the N-th backward pass, so in the middle of an optimizer update
when grad_accum > 1), `checkpoint:NAME` (while checkpoint NAME is being written: Accelerate has written
the weights and the optimizer state into NAME.tmp, the rest is still to come) or `loading` (as the base
model's tokenizer starts loading: the data are read, output_dir is claimed and still empty). The process
signals itself, so where it stops does not depend on how fast the machine is, as a timer or a poll would.
SIGSTOP pauses it there, holding what it holds (output_dir's lock), until the test sends SIGCONT.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from bert_tasks.cli import main


def signal_at_micro_batch(signum: int, number: int) -> None:
    """Send `signum` just before the `number`-th backward pass (1-based) of the training loop."""
    backward = Accelerator.backward
    calls = 0

    def counting_backward(self: Accelerator, loss: torch.Tensor, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == number:
            os.kill(os.getpid(), signum)
        backward(self, loss, **kwargs)

    Accelerator.backward = counting_backward


def signal_while_writing(signum: int, checkpoint: str) -> None:
    """Send `signum` right after the first `torch.save` into `<checkpoint>.tmp` (the optimizer state)."""
    save = torch.save

    def watched_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        save(obj, f, *args, **kwargs)
        if isinstance(f, str | os.PathLike) and Path(f).parent.name == f"{checkpoint}.tmp":
            os.kill(os.getpid(), signum)

    torch.save = watched_save


def signal_while_loading(signum: int) -> None:
    """Send `signum` as the run starts loading its base model (its tokenizer first)."""
    from transformers import AutoTokenizer

    from_pretrained = AutoTokenizer.from_pretrained

    def watched_from_pretrained(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signum)
        return from_pretrained(*args, **kwargs)

    AutoTokenizer.from_pretrained = watched_from_pretrained  # type: ignore[method-assign]


if __name__ == "__main__":
    name, point, *argv = sys.argv[1:]
    kind, _, where = point.partition(":")
    if kind == "micro-batch":
        signal_at_micro_batch(signal.Signals[name], int(where))
    elif kind == "checkpoint":
        signal_while_writing(signal.Signals[name], where)
    elif kind == "loading":
        signal_while_loading(signal.Signals[name])
    else:
        sys.exit(f"unknown point {point!r}; use micro-batch:N, checkpoint:NAME or loading")
    sys.exit(main(argv))
