"""Resumable checkpoints and the best weights: written whole or not at all, the newest few kept.

A checkpoint is Accelerate's `save_state` (model, optimizer, scheduler, grad scaler, every process's RNG
states) plus `run_state.json` (step, epoch, best metric, early-stopping count, log history, the loss not
yet logged). It is written to `step-N.tmp` and renamed only once complete, so a crash or SIGKILL
mid-write leaves the previous checkpoint as the latest usable one; the next save clears the debris.
Checkpoints are taken at optimizer updates only, so no half-accumulated gradient is ever part of one.

`best/` is a plain Hugging Face model dir. Under FSDP, where each process holds a shard of every weight,
its weights are gathered whole first (`full_state_dict`) and split into the shards again when the run
restores them (`load_best`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.errors import BertTasksError
from bert_tasks.output_paths import failure_reason, is_write_failure
from bert_tasks.training.output_dir import CHECKPOINT_FILES, RUN_STATE, foreign_in_checkpoint, is_run_entry

if TYPE_CHECKING:  # imported where used: finding the latest checkpoint (--resume's first check) needs none
    import torch
    from accelerate import Accelerator
    from transformers import PreTrainedModel

CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
_COMPLETE = re.compile(r"step-(\d+)")
logger = logging.getLogger(__name__)


def save_checkpoint(
    accelerator: Accelerator,
    model: torch.nn.Module,
    output_dir: Path,
    step: int,
    run_state: dict[str, Any],
    keep: int,
) -> Path:
    """Save everything needed to continue at `step`, then keep only the newest `keep` checkpoints.

    Every process must call this (each writes its own RNG state). The weights keep the fused attention's
    in-memory names (`fused_qkv_names`), which every launcher, FSDP included, can save and load.
    """
    from bert_tasks.inference.quantize import weight_bytes
    from bert_tasks.modeling.attention import fused_qkv_names
    from bert_tasks.training.together import failing_together

    folder = output_dir / CHECKPOINT_DIR
    final = folder / f"step-{step:08d}"
    partial = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        _remove_incomplete(folder)
    accelerator.wait_for_everyone()
    latest = latest_checkpoint(output_dir)
    needed = tree_bytes(latest) if latest is not None else 3 * weight_bytes(model)  # weights + 2 moments
    intact = f"{latest} is intact: free space, then --resume" if latest else "no checkpoint is complete yet"
    what = f"checkpoint {final}"
    # Every process writes its RNG state there, the main one the rest: all must be done before run_state.
    with (
        failing_together(accelerator, f"writing {what}"),
        written_whole(partial, what, needed, intact),
        fused_qkv_names(accelerator.unwrap_model(model)),
    ):
        accelerator.save_state(str(partial))
    with failing_together(accelerator, f"completing {what}"):
        if accelerator.is_main_process:
            listed = {CHECKPOINT_FILES: sorted(os.listdir(partial))}  # what is the run's, when it goes
            with written_whole(partial, what, needed, intact):
                (partial / RUN_STATE).write_text(json.dumps({**run_state, **listed}))
            os.replace(partial, final)
            drop_old_checkpoints(output_dir, keep)
    return final


def drop_old_checkpoints(output_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints; one holding a file that no save wrote is kept
    whole, with a warning as it leaves the newest `keep`: the file is the user's."""
    complete = _complete_checkpoints(output_dir)  # oldest first
    for old in complete[:-keep]:
        held = foreign_in_checkpoint(old)
        if held:
            if old == complete[-keep - 1]:
                logger.warning(
                    "%s holds %s, which no bert-tasks run wrote, so this checkpoint is kept rather than "
                    "deleted with it; move the file out and a later save removes the checkpoint",
                    old,
                    held[0] if len(held) == 1 else f"{held[0]} (and {len(held) - 1} more)",
                )
            continue
        (old / RUN_STATE).unlink()  # first, so a deletion cut short never looks like a checkpoint
        shutil.rmtree(old)


def save_best(
    model: PreTrainedModel, output_dir: Path, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """Replace `best/` with `model` through `best.tmp` and a rename: `best/` never holds half a model.

    `state_dict` (default: the model's own) is what `full_state_dict` gathered when the model is sharded.
    """
    from bert_tasks.inference.quantize import weight_bytes

    final = output_dir / BEST_DIR
    partial = final.with_name(final.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    intact = f"the previous best weights in {final} are intact" if final.is_dir() else "no best weights yet"
    with written_whole(partial, f"the best weights ({final})", weight_bytes(model), intact):
        model.save_pretrained(partial, state_dict=state_dict)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


@contextmanager
def written_whole(partial: Path, what: str, needed: int, intact: str) -> Iterator[None]:
    """Write into `partial` (a temporary dir): on a failed write remove it, and say so in one line.

    A full disk (ENOSPC), a quota or a permission error would otherwise end in a traceback and leave a
    half-written dir taking the space the next try needs. The line says what could not be written, how
    much it needs against what is free, and what is still intact (`intact`). torch.save reports a failed
    write as a RuntimeError ("... failed writing file ..." or, on a full disk, "unexpected pos ...") and
    safetensors as a SafetensorError ("I/O error: No space left on device"): those count when their words
    say so or the disk has less room than the write needs; their other errors pass.
    """
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as error:
        disk_full = "No space left on device" in str(error) or shutil.disk_usage(partial.parent).free < needed
        if not (is_write_failure(error) or disk_full):
            raise
        shutil.rmtree(partial, ignore_errors=True)
        free = shutil.disk_usage(partial.parent).free
        raise BertTasksError(
            f"could not write {what} ({_reason(error, disk_full)}); it needs about {_mib(needed)} and "
            f"{_mib(free)} are free on {partial.parent}; {intact}"
        ) from error


def _reason(error: Exception, disk_full: bool) -> str:
    """The failure in a few words: the OS's own, or plain words for torch's "unexpected pos ..."."""
    if disk_full and not isinstance(error, OSError):
        return "No space left on device"
    return failure_reason(error)


def tree_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def full_state_dict(accelerator: Accelerator, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights under transformers' names on the main process, `{}` on the others.

    Every process must call this: under FSDP each one holds a shard (a DTensor) of every weight, and
    both the attention's split of its fused `qkv` (a state_dict hook) and the all-gather of each shard are
    collectives. Not `accelerator.get_state_dict`: under FSDP2 it runs torch's `get_model_state_dict`,
    which looks each key up as a module attribute and finds no `query`/`key`/`value` (AttributeError).
    Gathered weights go to CPU, so the main process never holds the whole model on its accelerator.
    """
    from torch.distributed.tensor import DTensor

    state_dict = accelerator.unwrap_model(model).state_dict()
    whole = {
        name: tensor.full_tensor().cpu() if isinstance(tensor, DTensor) else tensor
        for name, tensor in state_dict.items()
    }
    return whole if accelerator.is_main_process else {}


def load_best(model: torch.nn.Module, output_dir: Path) -> None:
    """Load `best/` into the unwrapped `model`; every process reads it (output_dir is shared).

    Under FSDP the parameters are shards: each whole tensor is wrapped as a DTensor replicated on the
    parameters' device mesh (every process read the same file, so no communication) and
    `load_state_dict` copies each process's slice into its shard; the attention's hook fuses the
    query/key/value DTensors into `qkv` on the way, as it fuses plain tensors. Not torch's
    `set_model_state_dict`: it turns into DTensors only keys that name a parameter, so query/key/value
    would reach that hook as plain tensors, which cannot be copied into a DTensor.

    Raises:
        BertTasksError: best/ was removed, or its weights are damaged or another model's.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor, Replicate

    weights = output_dir / BEST_DIR / "model.safetensors"
    try:
        state_dict = load_file(weights)
    except (OSError, SafetensorError) as error:
        raise _unusable_best(weights, error) from None
    mesh = next((param.device_mesh for param in model.parameters() if isinstance(param, DTensor)), None)
    if mesh is not None:
        buffers = {name for name, _ in model.named_buffers()}  # FSDP shards parameters only
        replicate = [Replicate()] * mesh.ndim
        state_dict = {
            name: tensor
            if name in buffers
            else DTensor.from_local(tensor.to(mesh.device_type), mesh, replicate, run_check=False)
            for name, tensor in state_dict.items()
        }
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as error:  # missing, unexpected or mis-shaped keys: not this run's best/
        raise _unusable_best(weights, error) from None


def _unusable_best(weights: Path, error: Exception) -> BertTasksError:
    """The run ends by restoring its best weights: without them, only a new run gives a model."""
    return BertTasksError(
        f"{weights}: the run's best weights cannot be restored ({_first_sentence(error)}); they were "
        "removed or damaged: train again with --overwrite"
    )


def load_checkpoint(accelerator: Accelerator, model: torch.nn.Module, checkpoint: Path) -> None:
    """Restore model, optimizer, scheduler and RNG states from `checkpoint` (every process).

    Raises:
        BertTasksError: a state file is not what bert-tasks wrote (truncated, garbage, a pickle torch's
            weights_only refuses, another run's state): named, with the checkpoint to fall back to; the
            weights are of another shape (other labels): named, and nothing to delete.
    """
    from bert_tasks.modeling.attention import fused_qkv_names

    _check_random_states(checkpoint, accelerator.process_index, accelerator.num_processes)
    _check_same_shapes(checkpoint, accelerator.unwrap_model(model))
    try:
        with fused_qkv_names(accelerator.unwrap_model(model)):
            accelerator.load_state(str(checkpoint))
    except Exception as error:  # safetensors, torch.load, pickle and load_state_dict each raise their own
        unreadable = _unreadable_state_file(checkpoint)
        if unreadable is None:  # every file reads: one holds another run's state (other shapes, keys)
            reason = f"{type(error).__name__}: {_first_sentence(error)}"
            raise _damaged(checkpoint, f"its state does not fit this run ({reason})") from error
        file, reason = unreadable
        raise _damaged(checkpoint, f"{file.name} is not what bert-tasks wrote ({reason})") from error


def _check_same_shapes(checkpoint: Path, model: torch.nn.Module) -> None:
    """Weights of another shape (a head for other labels, a regression head) are not damage: `load_state`
    would fail on them, and the damaged line would tell the user to delete a sound checkpoint.

    Reads the safetensors header only; a missing file (FSDP saves a dir) or a damaged one is left to
    `load_state`, whose failure `_damaged` names."""
    from safetensors import SafetensorError, safe_open

    from bert_tasks.modeling.attention import fused_qkv_names

    try:
        with safe_open(checkpoint / "model.safetensors", framework="pt") as weights:
            names = list(weights.keys())  # a safe_open handle is no mapping: it cannot be iterated
            saved = {name: list(weights.get_slice(name).get_shape()) for name in names}
    except (OSError, SafetensorError):
        return
    with fused_qkv_names(model):  # the names the checkpoint was saved under
        current = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    differ = [name for name in saved.keys() & current.keys() if saved[name] != current[name]]
    if differ:
        name = min(differ, key=lambda name: (-len(saved[name]), name))  # a weight rather than its bias
        raise BertTasksError(
            f"--resume: checkpoint {checkpoint} was trained with {name} of shape {saved[name]} and this "
            f"run's model has {current[name]}: other labels or another label shape; {ANOTHER_RUNS_CHECKPOINT}"
        )


#: What a --resume into a sound checkpoint of another run's labels or shape is told to do.
ANOTHER_RUNS_CHECKPOINT = (
    "resume with the data and settings it was trained with, or start a new output_dir (or --overwrite); "
    "nothing was deleted"
)
#: What every process's RNG state file holds (Accelerate's keys); the device's own are optional.
_RNG_KEYS = ("random_state", "numpy_random_seed", "torch_manual_seed")


def _check_random_states(checkpoint: Path, process: int, processes: int) -> None:
    """This process's RNG states must read: Accelerate goes on without them in silence, and the resumed
    run then draws other dropout masks and data orders than the checkpointed one would have."""
    from accelerate.utils import load
    from accelerate.utils.constants import RNG_STATE_NAME

    saved = len(list(checkpoint.glob(f"{RNG_STATE_NAME}_*.pkl")))
    file = checkpoint / f"{RNG_STATE_NAME}_{process}.pkl"
    if not file.is_file() and 0 < saved <= process:
        raise BertTasksError(
            f"checkpoint {checkpoint} was written by {saved} process(es) and this launch has {processes}; "
            f"resume it with {saved} (the data order and random states are per process)"
        )
    if not file.is_file():
        raise _damaged(checkpoint, f"{file.name} is missing")
    try:
        states = load(file)
        missing = [key for key in _RNG_KEYS if key not in states]
        if missing:
            raise KeyError(f"no {missing[0]!r}")
    except Exception as error:  # missing, truncated, garbage, a refused pickle: the readers' errors vary
        raise _damaged(
            checkpoint, f"{file.name} is not what bert-tasks wrote ({_first_sentence(error)})"
        ) from None


def _unreadable_state_file(checkpoint: Path) -> tuple[Path, str] | None:
    """The first state file of `checkpoint` that does not read the way accelerate reads it, and why.

    `load_state`'s errors name no file; reading the files again costs a failed resume only. RNG states
    (*.pkl) are checked before `load_state`, by `_check_random_states`.
    """
    from accelerate.utils import load
    from safetensors.torch import load_file

    for file in sorted(checkpoint.iterdir()):
        try:
            if file.suffix == ".safetensors":
                load_file(file)
            elif file.suffix in (".bin", ".pt"):
                load(file, map_location="cpu")  # weights_only, as accelerate loads them
        except Exception as error:  # the readers' error types vary (SafetensorError, UnpicklingError, ...)
            return file, _first_sentence(error)
    return None


def _damaged(checkpoint: Path, what: str) -> BertTasksError:
    """--resume cannot continue from `checkpoint`: say why, and from which earlier one it can."""
    earlier = [
        path for path in _complete_checkpoints(checkpoint.parent.parent) if _step(path) < _step(checkpoint)
    ]
    if earlier:
        fallback = f"delete {checkpoint} and --resume again to continue from {earlier[-1].name}"
    else:
        fallback = "no earlier checkpoint is kept: train again with --overwrite"
    return BertTasksError(f"checkpoint {checkpoint} is damaged: {what}; {fallback}")


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step-"))


def _first_sentence(error: Exception) -> str:
    """The reader's own words, short: torch's messages go on for several sentences of advice."""
    text = str(error).strip() or type(error).__name__
    return re.split(r"(?<=[^.\s])\. |\n", text, maxsplit=1)[0].rstrip(".")


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    complete = _complete_checkpoints(output_dir)
    return complete[-1] if complete else None


def load_run_state(checkpoint: Path) -> dict[str, Any]:
    """The run's progress saved with `checkpoint`; a damaged run_state.json is one line (see `_damaged`)."""
    try:
        state = json.loads((checkpoint / RUN_STATE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _damaged(
            checkpoint, f"{RUN_STATE} is not what bert-tasks wrote ({_first_sentence(error)})"
        ) from None
    if not isinstance(state, dict):
        raise _damaged(checkpoint, f"{RUN_STATE} holds {type(state).__name__}, not the run's state")
    state.pop(CHECKPOINT_FILES, None)  # the checkpoint's own listing, no part of the run's progress
    return state


def _complete_checkpoints(output_dir: Path) -> list[Path]:
    """`step-N` dirs holding run_state.json (written last), oldest first."""
    folder = output_dir / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [
        path for path in folder.iterdir() if _COMPLETE.fullmatch(path.name) and (path / RUN_STATE).is_file()
    ]
    return sorted(found, key=lambda path: int(path.name.removeprefix("step-")))


def _remove_incomplete(folder: Path) -> None:
    """Delete what a killed run left half-written (`step-N.tmp`, a deletion cut short); a file of the
    user's in checkpoints/ (no step-N dir: `is_run_entry`) stays."""
    if not folder.is_dir():
        return
    complete = set(_complete_checkpoints(folder.parent))
    for path in folder.iterdir():
        if path not in complete and is_run_entry(path):
            shutil.rmtree(path)
