"""`bert-tasks serve` answers its mistakes in one line before torch loads: settings out of range, a port
that cannot be bound, a model dir of the other task, and the missing 'serve' extra."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_startup import probe


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch", "0"], "--max-batch must be a number of at least 1, got 0"),
        (["--max-wait-ms", "nan"], "--max-wait-ms must be a number of at least 0, got nan"),
        (["--max-texts", "-1"], "--max-texts must be a number of at least 1, got -1"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
        (["--port", "70000"], "--port must be in [0, 65535], got 70000"),
        (["--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an address of this machine"),
        (["extra"], "serve takes one task, got also: extra"),
    ],
)
@pytest.mark.slow
def test_serve_settings_are_checked_before_torch_loads(
    sentiment_run: Path, tmp_path: Path, flags: list[str], message: str
) -> None:
    answer = probe(["serve", "sentiment", "--model", str(sentiment_run), *flags], tmp_path)
    assert answer["status"] == 1 and message in answer["stderr"], answer
    assert answer["loaded"] == []


@pytest.mark.slow
def test_a_port_in_use_and_a_model_of_the_other_task(sentiment_run: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        answer = probe(["serve", "sentiment", "--model", str(sentiment_run), "--port", str(port)], tmp_path)
    assert answer["status"] == 1 and f"--port {port}: cannot listen there" in answer["stderr"], answer
    assert answer["loaded"] == []
    answer = probe(["serve", "ner", "--model", str(sentiment_run)], tmp_path)
    assert "holds a sentiment model, not a ner model" in answer["stderr"] and answer["loaded"] == []


@pytest.mark.slow
def test_serve_without_its_extra_names_it(sentiment_run: Path, tmp_path: Path) -> None:
    """uvicorn missing (an import that fails): one line naming the extra, before torch loads."""
    script = (
        "import sys, json; sys.modules['uvicorn'] = None\n"
        "from bert_tasks.cli import main\n"
        f"status = main(['serve', 'sentiment', '--model', {str(sentiment_run)!r}])\n"
        "print(json.dumps({'status': status, 'torch': 'torch' in sys.modules}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=True
    )
    assert json.loads(result.stdout.splitlines()[-1]) == {"status": 1, "torch": False}
    assert result.stderr.strip() == (
        "bert-tasks: error: bert-tasks serve needs the 'serve' extra (uvicorn is not installed); "
        "install it with: pip install 'bert-tasks[serve]'"
    )
