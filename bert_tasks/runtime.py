"""Process-level settings: what `mixed_precision=auto` means here, the allocator, the libraries' chatter.

Each is a setting of the whole process, so the library never changes one behind a user's back: the CLI
turns them on (`configure_cli_process`), and library users opt in by calling the same functions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from functools import cache

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_MAX = -4
_TRIM_ABOVE = 1 << 30


#: Where launchers put the number of processes of a launch, in the order Accelerate's PartialState reads
#: them: the MPI launchers' variables, then WORLD_SIZE (torchrun, `accelerate launch`).
_PROCESS_COUNT_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE")


def launched_processes() -> int:
    """How many processes the launch that started this one has: 1 without a launcher.

    Read from the launcher's environment, so a command can refuse what several processes cannot do
    before torch loads (Accelerate's own reader, `get_int_from_env`, imports torch).
    """
    for name in _PROCESS_COUNT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return max(int(value), 1)
    return 1


def progress_bars_wanted() -> bool:
    """Progress bars go with the library's INFO lines: `--quiet` (or a `bert_tasks` logger set to WARNING
    or above by a program) hides both; a logger left unset, as in a notebook, shows them."""
    return logging.getLogger("bert_tasks").level <= logging.INFO


def logs_above_progress_bars() -> AbstractContextManager[None]:
    """Console log lines go through `tqdm.write` while bars live: above the bar, never through it.

    Only the loggers from `bert_tasks` up to the root that hold a console handler are redirected:
    `logging_redirect_tqdm` adds a handler to each logger it is given, and one added to a logger that
    had none would print every record a second time (to stdout, its default).
    """
    from tqdm.contrib.logging import logging_redirect_tqdm  # here: the CLI imports this module at start-up

    loggers, current = [], logging.getLogger("bert_tasks")
    while current is not None:
        if any(_is_console(handler) for handler in current.handlers):
            loggers.append(current)
        current = current.parent if current.propagate else None
    return logging_redirect_tqdm(loggers) if loggers else nullcontext()


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)


def resolve_mixed_precision(requested: str) -> str:
    """`auto` -> bf16 where the hardware runs it natively (CUDA Ampere+, CPUs with AVX512-BF16/AMX), else no.

    bf16 needs no loss scaling and, on such CPUs, runs matmuls several times faster than fp32; fp16 is
    only taken when asked for, since it needs a grad scaler and can overflow.
    """
    if requested != "auto":
        return requested
    import torch  # deferred: the CLI resolves precision only once a model is about to run

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no"


@cache
def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse; True when it did (Linux with glibc), else a no-op.

    glibc serves allocations above its mmap threshold (at most 32 MiB) with fresh `mmap` pages and
    unmaps them on free, so every training step or prediction batch that allocates the same large
    tensors again (the 47 MB dense gradient of the word embeddings, activations of a long batch) pays a
    page fault per 4 KiB page: a fresh zero-filled gradient of that size takes 11x longer than one in
    reused memory (14.4 against 1.3 ms, `bench/levers.py`). Turning mmap off and trimming only above
    1 GiB is what a caching allocator (jemalloc, tcmalloc: the usual advice for PyTorch on CPU) does,
    without preloading one. The cost: resident memory stays at its peak until the process exits, which
    is why only the CLI turns it on by default.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE))


#: Spins an idle OpenMP thread makes before it sleeps: about 30 µs, enough to catch the next op of the
#: same forward or backward pass, not the milliseconds of another process's time slice.
SPINS_BEFORE_SLEEP = "3000"


def wait_briefly() -> bool:
    """Let OpenMP's idle threads spin ~30 µs for the next op, then sleep; True if it applies.

    GNU OpenMP (torch's CPU wheels) keeps a thread that finished its share of an op spinning ~3 ms
    for the next one. On cores that another process also uses, the spinning threads take the time
    slices the threads with work left need: a MiniLM training step on 2 cores, 2 threads, took 235 ms
    alone and 1347 ms beside two busy processes. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) never
    collapses, but every op then wakes a sleeping thread: 14% of that step alone, and up to 1.4x for a
    small prediction. A 3,000-spin wait does not collapse and costs little: 261 ms alone against 304
    sleeping, 653 ms beside the busy processes against 567 sleeping and 996 spinning (threads.py;
    BENCHMARKS.md "Threads"). The setting is read once, when OpenMP starts with torch: after
    `import torch` it can no longer apply. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins (ACTIVE
    for a machine of one's own).
    """
    own = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ
    if "torch" not in sys.modules and not own:
        os.environ["GOMP_SPINCOUNT"] = SPINS_BEFORE_SLEEP
    return openmp_waits() != "spinning"


def openmp_waits() -> str:
    """How this process's idle OpenMP threads wait, as the environment set it (the start line says it,
    since a spinning wait on cores other processes use slows a run severalfold)."""
    spins = os.environ.get("GOMP_SPINCOUNT", "").strip()
    if spins.upper() in ("INFINITE", "INFINITY"):
        return "spinning"
    if spins:
        return f"{spins} spins, then sleep"
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return "passive"
    return "spinning"


def configure_cli_process() -> None:
    """What the `bert-tasks` command sets for its own process before anything heavy is imported.

    Keep freed memory for reuse, let idle OpenMP threads sleep after a brief spin, and silence the
    libraries' per-load chatter (our own progress bars and messages say what happens). Environment
    variables rather than calls, so nothing is imported for them; a user's own setting wins.
    """
    reuse_freed_memory()
    wait_briefly()
    # torch and transformers import about 450,000 objects that live as long as the process; with the
    # default thresholds the collector walks them all seven times while they load (about 0.7 s of every
    # command on 2 cores, bench/startup.py). Collect the young generation as usual, the old ones rarely.
    gc.set_threshold(_YOUNG_COLLECTION_THRESHOLD, 20, 100)
    for name, value in _QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    # A library imported before the CLI ran (a test, a notebook calling `main`) read the variables already.
    if "transformers" in sys.modules:
        transformers = sys.modules["transformers"]
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        datasets = sys.modules["datasets"]
        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


_YOUNG_COLLECTION_THRESHOLD = 50_000  # allocations between young collections (Python's default: 700)

_QUIET_LIBRARIES = {
    "TRANSFORMERS_VERBOSITY": "error",
    "DATASETS_VERBOSITY": "error",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_VERBOSITY": "error",  # its retry warnings when offline: one line per attempt
}
