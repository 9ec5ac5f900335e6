"""`python -m bert_tasks` for tests/test_distributed.py, plus what only a test needs from each process.

Launched as `accelerate launch ... tests/distributed_train.py finetune ...`, it runs the CLI unchanged and
writes, per process, into the output dir: `rank{i}.safetensors`, the weights right after the last update
(before the run restores its best weights from disk, which would make the ranks equal by construction),
and `rank{i}.json`, how many times DDP all-reduced gradients (once per synchronised backward).
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations as real objects.
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from safetensors.torch import save_file
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from bert_tasks import training
from bert_tasks.cli import main

FINISH = training._finish


class RecordingAccelerator(Accelerator):
    """An Accelerator whose DDP model counts its gradient all-reduces."""

    all_reduces = 0

    def prepare_model(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        model = super().prepare_model(model, *args, **kwargs)
        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(self, _counting_all_reduce)
        return model


def _counting_all_reduce(
    accelerator: RecordingAccelerator, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    if bucket.is_last():
        accelerator.all_reduces += 1
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]


def _finish_recording(*args: Any, **kwargs: Any) -> Path:
    run = inspect.signature(FINISH).bind(*args, **kwargs).arguments
    accelerator, output_dir = run["accelerator"], run["output_dir"]
    weights = accelerator.unwrap_model(run["model"]).state_dict()
    rank = accelerator.process_index
    save_file(
        {name: value.detach().clone() for name, value in weights.items()},
        output_dir / f"rank{rank}.safetensors",
    )
    record = {"num_processes": accelerator.num_processes, "step": run["state"].global_step}
    record["all_reduces"] = accelerator.all_reduces
    (output_dir / f"rank{rank}.json").write_text(json.dumps(record))
    return FINISH(*args, **kwargs)


training.Accelerator = RecordingAccelerator  # type: ignore[misc]
training._finish = _finish_recording
sys.exit(main())
