"""`python -m bert_tasks` for tests/test_distributed.py, plus what only a test needs from each process.

Launched as `accelerate launch ... tests/distributed_train.py finetune ...`, it runs the CLI unchanged and
writes, per process, into the output dir: `rank{i}.safetensors`, the weights right after the last update
(before the run restores its best weights from disk, which would make the ranks equal by construction),
and `rank{i}.json`, how many times DDP all-reduced gradients (once per synchronised backward) and whether
the parameters are shards (FSDP's DTensors). Under FSDP only `rank0.safetensors` is written, holding the
whole gathered weights, and `best-at-finish/` keeps a copy of `best/` (which the run deletes once it has
saved the final model).

Launched with recipes/accelerate/fsdp.yaml, it also takes Accelerate's FSDP path on CPU processes, which
Accelerate itself takes only on GPUs and other accelerators (on CPU it would silently run DDP instead).
torch's FSDP2 (`fully_shard`) runs on CPU tensors over gloo, so this tests the real sharded run.
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations as real objects.
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, parse_flag_from_env
from safetensors.torch import save_file
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from bert_tasks.cli import main
from bert_tasks.training import run as run_module
from bert_tasks.training.checkpoints import BEST_DIR, full_state_dict

FINISH = run_module.Run.finish


class RecordingAccelerator(Accelerator):
    """An Accelerator whose DDP model counts its gradient all-reduces, and that runs FSDP on CPU."""

    all_reduces = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and parse_flag_from_env("ACCELERATE_USE_FSDP"):
            _shard_on_cpu()

    def prepare_model(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        model = super().prepare_model(model, *args, **kwargs)
        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(self, _counting_all_reduce)
        return model


def _shard_on_cpu() -> None:
    """Switch Accelerate's shared state to FSDP, as it does itself on GPUs.

    Both states: every `AcceleratorState()` copies PartialState's fields over its own again. The plugin
    reads the launcher's FSDP_* variables (fsdp.yaml: version 2, wrap each BertLayer, full state dict).
    """
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = FullyShardedDataParallelPlugin()


def _counting_all_reduce(
    accelerator: RecordingAccelerator, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    if bucket.is_last():
        accelerator.all_reduces += 1
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]


def _finish_recording(run: run_module.Run) -> Path:
    accelerator, output_dir = run.accelerator, run.output_dir
    rank = accelerator.process_index
    if accelerator.is_fsdp2:
        weights = full_state_dict(accelerator, run.model)  # every process: a collective
        if (output_dir / BEST_DIR).is_dir() and accelerator.is_main_process:
            shutil.copytree(output_dir / BEST_DIR, output_dir / "best-at-finish")
    else:
        weights = accelerator.unwrap_model(run.model).state_dict()
    if weights:
        save_file(
            {name: value.detach().clone() for name, value in weights.items()},
            output_dir / f"rank{rank}.safetensors",
        )
    record = {"num_processes": accelerator.num_processes, "step": run.state.global_step}
    record["all_reduces"] = accelerator.all_reduces
    record["sharded"] = any(isinstance(param, DTensor) for param in run.model.parameters())
    (output_dir / f"rank{rank}.json").write_text(json.dumps(record))
    return FINISH(run)


run_module.Accelerator = RecordingAccelerator  # type: ignore[misc]
run_module.Run.finish = _finish_recording  # type: ignore[method-assign]
sys.exit(main())
