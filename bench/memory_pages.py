"""Peak resident memory of `bert-tasks memory`, with and without its fresh-pages switch.

The CLI turns glibc's mmap off for the whole process (`runtime.reuse_freed_memory`: training steps reuse
freed heap memory). `bert-tasks memory` allocates and frees T x T matrices of hundreds of MiB between
small records, which fragments such a heap, so it lets glibc serve large tensors with fresh mmap pages
while it measures (`insight/memory._large_tensors_from_fresh_pages`). This script runs the command in
fresh processes, with the switch as shipped and with it replaced by a no-op, and prints each process's
peak RSS (getrusage of the finished child), alternating the two, median of the repeats.

    python bench/memory_pages.py --batch 16 --seq-len 512 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys

#: Runs `bert-tasks memory` in this child; with "off", the switch is a no-op (the heap as the CLI sets it).
CHILD = """
import contextlib, sys
if sys.argv[1] == "off":
    import bert_tasks.insight.memory as memory
    memory._large_tensors_from_fresh_pages = contextlib.nullcontext
from bert_tasks.cli import main
sys.exit(main(["--quiet", "memory", "--batch", sys.argv[2], "--seq-len", sys.argv[3]]))
"""


def peak_rss_mib(mode: str, batch: int, seq_len: int) -> float:
    """Run one child to completion; its peak resident set in MiB (ru_maxrss is KiB on Linux).

    RUSAGE_CHILDREN reports the largest child so far, so each call runs in a process of its own.
    """
    subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(batch), str(seq_len)], check=True, stdout=subprocess.DEVNULL
    )
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    peaks: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.repeats):
        for mode in ("on", "off"):
            command = [sys.executable, __file__, "--child", mode, str(args.batch), str(args.seq_len)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            peaks[mode].append(float(output.strip()))
    print(f"CPU: {cpu_model()} | bert-tasks memory --batch {args.batch} --seq-len {args.seq_len}")
    print("| fresh pages while measuring | peak RSS MiB (median) | runs |")
    print("| --- | ---: | --- |")
    for mode, label in (("on", "on (as shipped)"), ("off", "off (the CLI's heap)")):
        runs = ", ".join(f"{value:.0f}" for value in peaks[mode])
        print(f"| {label} | {statistics.median(peaks[mode]):.0f} | {runs} |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(peak_rss_mib(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    else:
        main()
