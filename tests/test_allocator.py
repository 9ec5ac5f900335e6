"""reuse_freed_memory: on Linux with glibc the setting is made, once per process."""

from __future__ import annotations

import platform
import sys

import pytest

from bert_tasks.allocator import reuse_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_glibc_keeps_freed_memory_once_per_process() -> None:
    assert reuse_freed_memory() is True
    assert reuse_freed_memory.cache_info().currsize == 1  # later calls are free and change nothing
