"""Standard output that goes away or fills up: the command ends quietly or in one line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}


def predict_into(shell_tail: str, model_dir: Path, texts: int) -> subprocess.CompletedProcess[str]:
    """`bert-tasks predict ner` on `texts` piped texts, its stdout going to `shell_tail`."""
    command = f"{sys.executable} -m bert_tasks predict ner --model {model_dir} --file - {shell_tail}"
    return subprocess.run(
        [
            "bash",
            "-c",
            f"yes 'aspirin caused a rash' | head -{texts} | {command}; echo status=${{PIPESTATUS[2]}}",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


@pytest.mark.slow  # real processes
def test_a_reader_that_stops_early_ends_the_command_quietly(ner_run: Path) -> None:
    """`| head -1`: the pipe closes while thousands of lines are still to come; SIGPIPE's status, no
    BrokenPipeError and no 'Exception ignored' at exit."""
    done = predict_into("| head -1", ner_run, 5000)
    assert done.stdout.splitlines()[-1] == "status=141", done.stderr[-2000:]
    assert "Error" not in done.stderr and "Exception" not in done.stderr


@pytest.mark.slow  # a real process
def test_a_full_disk_behind_stdout_is_one_line(ner_run: Path) -> None:
    """`> /dev/full` (every write fails with ENOSPC): exit 1 and one line, no traceback."""
    done = predict_into("> /dev/full", ner_run, 3)
    assert done.stdout.splitlines()[-1] == "status=1"
    errors = [line for line in done.stderr.splitlines() if line.startswith("bert-tasks: error:")]
    assert errors == [
        "bert-tasks: error: could not write to standard output (No space left on device); free space or "
        "write elsewhere"
    ]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
