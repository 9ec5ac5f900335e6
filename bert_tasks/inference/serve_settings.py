"""What one `bert-tasks serve` process runs, importable without the server's libraries.

The CLI reads its defaults and checks them before FastAPI, uvicorn or torch load; `server.py` runs them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from bert_tasks.errors import BertTasksError

#: Request bytes allowed per allowed character: JSON escapes (`\u00e9`) take six, ids and keys the rest.
_BYTES_PER_CHAR = 8
_BODY_SLACK = 1 << 20


@dataclass(frozen=True)
class ServeSettings:
    """What one server process runs: the model dir and its task, batching and per-request limits."""

    model_dir: str
    task: str
    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_texts: int = 256
    max_chars: int = 200_000
    allow_pickle: bool = False
    quantize: str | None = None
    #: torch's CPU threads in this process; None: torch's own choice (OMP_NUM_THREADS, else every core).
    threads: int | None = None

    @property
    def max_body_bytes(self) -> int:
        """A body larger than this is refused (413) before it is parsed."""
        return self.max_chars * _BYTES_PER_CHAR + _BODY_SLACK

    def check(self) -> None:
        """One line per setting out of range, before anything loads."""
        for name, low in (("max_batch", 1), ("max_texts", 1), ("max_chars", 1), ("max_wait_ms", 0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= low):
                flag = "--" + name.replace("_", "-")
                raise BertTasksError(f"{flag} must be a number of at least {low}, got {value}")
        if self.threads is not None and self.threads < 1:
            raise BertTasksError(f"--threads must be at least 1, got {self.threads}")


def threads_per_worker(workers: int, threads: int | None) -> int | None:
    """torch threads for each of `workers` processes: `threads` when given; else, for several workers
    with no OMP_NUM_THREADS set, the cores this process may use divided among them (at least one each).

    Each worker's torch would otherwise take every core, so N workers on C cores would run N x C threads
    that preempt each other wherever OpenMP's threads spin while they wait (OMP_WAIT_POLICY=ACTIVE made
    one server 3x slower beside its own event loop). With the CLI's brief spin, 2 workers of 2 threads
    and of 1 thread were within noise of each other on 2 cores (BENCHMARKS.md, "Two workers on two
    cores"); the split keeps that true whatever the wait policy.
    """
    if threads is not None or workers == 1 or os.environ.get("OMP_NUM_THREADS"):
        return threads
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return max(1, len(usable) // workers)
