"""Process settings of the CLI: reuse_freed_memory (on Linux with glibc, once per process) and OpenMP's
passive waits."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from bert_tasks.runtime import reuse_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_glibc_keeps_freed_memory_once_per_process() -> None:
    assert reuse_freed_memory() is True
    assert reuse_freed_memory.cache_info().currsize == 1  # later calls are free and change nothing


@pytest.mark.slow  # a fresh process that imports torch
def test_only_the_cli_turns_it_on(sentiment_run: Path) -> None:
    """A process-wide setting: a library user's Predictor leaves it alone; the CLI turns it on."""
    probe = (
        "import sys\n"
        "from bert_tasks.inference.predictor import Predictor\n"
        "from bert_tasks.runtime import reuse_freed_memory\n"
        "Predictor(sys.argv[1]).predict(['fine'])\n"
        "print(reuse_freed_memory.cache_info().currsize)\n"
        "from bert_tasks.cli import main\n"
        "main(['predict', 'sentiment', '--model', sys.argv[1], '--json', 'fine'])\n"
        "print(reuse_freed_memory.cache_info().currsize)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(sentiment_run)], capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    assert (lines[0], lines[-1]) == ("0", "1")


@pytest.mark.slow
def test_the_cli_lets_openmp_threads_sleep_and_a_users_setting_wins() -> None:
    """Set before torch starts OpenMP (it reads the variable once); after `import torch` it cannot apply."""
    script = (
        "import os, sys\n"
        "from bert_tasks.runtime import configure_cli_process, wait_passively\n"
        "configure_cli_process()\n"
        "import torch\n"
        "print(os.environ['OMP_WAIT_POLICY'], wait_passively())\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    quiet = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert quiet.stdout.split() == ["PASSIVE", "True"]
    own = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
    )
    assert own.stdout.split() == ["ACTIVE", "False"]
    late = "import torch\nfrom bert_tasks.runtime import wait_passively\nprint(wait_passively())\n"
    after_torch = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, env=env)
    assert after_torch.stdout.split() == ["False"]  # too late to apply, and said so
