"""A tiny sentiment and NER run summarised as numbers, pinned in `fixtures/reference_run.json`.

The stored summary was written by the code before the renovation of the package layout (run object,
task registry, model-dir contract); `test_train.py::test_the_tiny_recipe_gives_the_stored_weights_and_log`
checks that today's code gives the same log and weights. Regenerate it only for a change that is meant
to alter training, from the repo root: `python -m tests.reference_run`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from tests.helpers import FIXTURES, build_tiny_model, one_thread, read_log, tiny_config

REFERENCE = FIXTURES / "reference_run.json"
#: Log fields that measure the machine, not the run.
_TIMING = ("examples_per_s",)


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """The run's log (without timings), scores, and per-tensor sum and sum of squares of its weights."""
    weights = load_file(run_dir / "model.safetensors")
    return {
        "log": [{k: v for k, v in record.items() if k not in _TIMING} for record in read_log(run_dir)],
        "metrics": json.loads((run_dir / "metrics.json").read_text()),
        "weights": {
            name: [float(t.double().sum()), float(t.double().square().sum())]
            for name, t in sorted(weights.items())
        },
    }


def reference_runs(workdir: Path) -> dict[str, dict[str, Any]]:
    """Train the tiny sentiment and NER recipes (one thread, fp32) and summarise both."""
    model = build_tiny_model(workdir / "tiny-bert")
    with one_thread():
        from bert_tasks.training import train

        return {
            task: summarize_run(train(tiny_config(task, model, workdir / task)))
            for task in ("sentiment", "ner")
        }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        REFERENCE.write_text(json.dumps(reference_runs(Path(tmp)), indent=1) + "\n")
    sys.stdout.write(f"wrote {REFERENCE}\n")
