"""A full disk during a real `finetune`: one line, what is intact, and no dir that looks finished.

The run writes into a small tmpfs mounted in a private user and mount namespace (`unshare -rm`), so the
test needs no root and leaves no mount behind; the same shell then lists what the tmpfs holds, before
the namespace (and the tmpfs) goes away.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.helpers import fast_overrides

#: Lists every file under the output dir with its size, as JSON (run inside the namespace).
LIST_TREE = (
    "import json, pathlib, sys; root = pathlib.Path(sys.argv[1]); "
    "print(json.dumps({str(p.relative_to(root)): p.stat().st_size for p in root.rglob('*') if p.is_file()}))"
)


def finetune_on_a_small_disk(
    size_kib: int, overrides: list[str], workdir: Path, launcher: Sequence[str] = (sys.executable, "-m")
) -> tuple[int, str, dict]:
    """Run finetune with output_dir on a `size_kib` tmpfs; (exit status, stderr, {file: size} left).

    `launcher` runs the module `bert_tasks`: the interpreter by default, or `accelerate launch ... -m`.
    """
    disk = workdir / "disk"
    disk.mkdir()
    out = disk / "run"
    finetune = [*launcher, "bert_tasks", "finetune", "sentiment", *overrides, f"output_dir={out}"]
    script = (
        f"mount -t tmpfs -o size={size_kib}k tmpfs {shlex.quote(str(disk))} || exit 99\n"
        f"{shlex.join(finetune)} 2> {shlex.quote(str(workdir / 'stderr'))}\n"
        "status=$?\n"
        f"{shlex.join([sys.executable, '-c', LIST_TREE, str(out)])}\n"
        "exit $status\n"
    )
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    env.update({key: os.environ[key] for key in ("PYTHONPATH",) if key in os.environ})
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode != 99, f"could not mount a tmpfs: {result.stderr}"
    return result.returncode, (workdir / "stderr").read_text(), json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow  # a real process
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_full_disk_at_the_final_save_leaves_best_and_no_finished_dir(
    tiny_model: Path, tmp_path: Path
) -> None:
    """best/ (one evaluation, ~3.9 MiB) fits on the 6 MiB disk; the final model dir beside it does not."""
    overrides = fast_overrides("sentiment", tiny_model, tmp_path / "unused", max_steps=2)
    overrides = [item for item in overrides if not item.startswith("output_dir=")]
    status, stderr, left = finetune_on_a_small_disk(6 * 1024, overrides, tmp_path)
    lines = stderr.strip().splitlines()
    assert status == 1, stderr
    assert "Traceback" not in stderr
    assert lines[-1].startswith("bert-tasks: error: could not write the model to "), lines[-1]
    assert "(No space left on device); it needs about " in lines[-1]
    assert "the best weights (step 2) are intact in " in lines[-1]
    assert "best/model.safetensors" in left  # intact, and loadable: nothing half-written beside it
    assert "metrics.json" not in left and "model.safetensors" not in left  # nothing looks finished
    assert not any(name.startswith(".model.tmp") for name in left)  # the half-written copy is gone


@pytest.mark.slow  # a real process
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_full_disk_at_a_checkpoint_keeps_the_last_complete_one(tiny_model: Path, tmp_path: Path) -> None:
    """One checkpoint (weights and AdamW's two moments, ~12 MiB) fits on 18 MiB; the second does not."""
    overrides = fast_overrides("sentiment", tiny_model, tmp_path / "unused", max_steps=3, save_every=1)
    overrides = [item for item in overrides if not item.startswith(("output_dir=", "validation_file="))]
    status, stderr, left = finetune_on_a_small_disk(18 * 1024, overrides, tmp_path)
    line = stderr.strip().splitlines()[-1]
    assert status == 1 and "Traceback" not in stderr, stderr
    assert line.startswith("bert-tasks: error: could not write checkpoint "), line
    assert "checkpoints/step-00000002 (No space left on device)" in line
    assert line.endswith("checkpoints/step-00000001 is intact: free space, then --resume")
    assert "checkpoints/step-00000001/run_state.json" in left
    assert not any(name.startswith("checkpoints/step-00000002") for name in left)


@pytest.mark.slow  # two real processes
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_full_disk_on_the_main_process_ends_every_process_of_a_launch(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Only the main process writes the final model: its failure must end the other process too, at once.

    Before, the other process waited at its next barrier for the one that had gone: gloo ended it with a
    "Connection closed by peer" traceback; NCCL would wait out its timeout.
    """
    overrides = fast_overrides("sentiment", tiny_model, tmp_path / "unused", max_steps=2, batch_size=2)
    overrides = [item for item in overrides if not item.startswith("output_dir=")]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(port), "-m"]
    started = time.monotonic()
    status, stderr, left = finetune_on_a_small_disk(6 * 1024, overrides, tmp_path, launch)
    assert time.monotonic() - started < 200, "a process waited for the failed one"
    assert status != 0, stderr
    errors = sorted(line for line in stderr.splitlines() if line.startswith("bert-tasks: error: "))
    # The other process heard of it at once and said so in one line, not a "Connection closed" traceback.
    assert len(errors) == 2, stderr[-3000:]
    assert errors[0] == (
        "bert-tasks: error: another process of this launch failed while saving the model (it says why); "
        "this one stops"
    )
    assert errors[1].startswith("bert-tasks: error: could not write the model to "), errors[1]
    assert "[rank" not in stderr  # torch prefixes a process's traceback with its rank
    assert "best/model.safetensors" in left and "metrics.json" not in left
