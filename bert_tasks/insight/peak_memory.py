"""Peak memory of one call, on CPU and CUDA, for benchmarks and the attention-memory check.

CUDA has an allocator that counts (`max_memory_allocated`). The CPU has none that torch exposes, so on
CPU the torch profiler's memory records are replayed in time order: allocations at the start of the op
that made them, frees at the end of the op that released them. That is the peak of live tensor bytes,
which is what the attention-memory formula predicts (process RSS would add the allocator's caching).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Bytes of tensor memory live at the busiest moment of `fn()`, above what was live before it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    changes: list[tuple[float, int]] = []
    for event in prof.events():
        delta = event.self_cpu_memory_usage
        if delta > 0:
            changes.append((event.time_range.start, delta))
        elif delta < 0:
            changes.append((event.time_range.end, delta))
    live = peak = 0
    for _, delta in sorted(changes):
        live += delta
        peak = max(peak, live)
    return peak
