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
def test_the_cli_lets_openmp_threads_sleep_after_a_brief_spin_and_a_users_setting_wins() -> None:
    """Set before torch starts OpenMP (it reads the variables once); after `import torch` it cannot apply."""
    script = (
        "import os, sys\n"
        "from bert_tasks.runtime import configure_cli_process, openmp_waits, wait_briefly\n"
        "configure_cli_process()\n"
        "import torch\n"
        "print(os.environ.get('GOMP_SPINCOUNT'), wait_briefly(), openmp_waits())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    quiet = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert quiet.stdout.split() == ["3000", "True", "3000", "spins,", "then", "sleep"]
    for own, waits in (({"OMP_WAIT_POLICY": "ACTIVE"}, "spinning"), ({"GOMP_SPINCOUNT": "0"}, "0")):
        mine = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env={**env, **own}
        )
        assert mine.stdout.split()[0] == own.get("GOMP_SPINCOUNT", "None")  # left as the user set it
        assert mine.stdout.split()[2] == waits
    late = "import torch\nfrom bert_tasks.runtime import wait_briefly\nprint(wait_briefly())\n"
    after_torch = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, env=env)
    assert after_torch.stdout.split() == ["False"]  # too late to apply, and said so
