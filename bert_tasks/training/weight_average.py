"""An exponential moving average of the trained weights (`ema_decay`): what is scored, kept and saved.

Late in fine-tuning the weights wander around a minimum from update to update; their running average sits
closer to its middle (Polyak averaging; as timm and TF's `ExponentialMovingAverage` keep it). The run keeps
training the live weights; every evaluation, `best/` and the saved model use the average, swapped in for
the time it is read. The decay warms up as TF's does, `min(decay, (1 + t) / (10 + t))` after t updates, so
the first evaluations do not score mostly the pretrained weights and a randomly initialised head.

Written here rather than with `torch.optim.swa_utils.AveragedModel`: that deep-copies the whole wrapped
module (hooks, Accelerate's autocast wrapper) and has no decay warm-up; the update below is the same
one-kernel lerp its EMA uses. The average lives beside the model in fp32 and is saved with each checkpoint
(`state_dict`), so a resumed run averages on exactly where it stopped. One copy per process: identical
weights under DDP; refused under FSDP and DeepSpeed, whose processes hold different shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

#: TF's warm-up: the decay after t updates is at most (1 + t) / (10 + t).
_WARMUP_OFFSET = 10

#: Where Accelerate's `save_state` writes the first (here: the only) object registered for checkpointing.
SAVED_AVERAGE = "custom_checkpoint_0.pkl"


def saved_decay(checkpoint: Path) -> float:
    """The `ema_decay` a checkpoint was written with (0: it holds no average).

    Memory-mapped: the check reads one number, not the whole average that `load_state` reads next.
    """
    file = checkpoint / SAVED_AVERAGE
    return float(torch.load(file, weights_only=True, mmap=True)["decay"]) if file.exists() else 0.0


class WeightAverage:
    """The running average of a model's trainable weights, updated once per optimizer update."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self._params = [param for param in model.parameters() if param.requires_grad]
        self._average = [param.detach().float().clone() for param in self._params]
        self._live: list[torch.Tensor] | None = None  # the live weights while the average is swapped in

    def update(self) -> None:
        """Move the average towards the weights the optimizer just wrote."""
        decay = min(self.decay, (1 + self.updates) / (_WARMUP_OFFSET + self.updates))
        current = [param.detach().float() for param in self._params]
        # torch's own EMA (swa_utils.get_ema_multi_avg_fn) is this call: one fused kernel for all tensors.
        torch._foreach_lerp_(self._average, current, 1.0 - decay)
        self.updates += 1

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the average inside the block and its live weights again after it."""
        if self._live is None:
            self._live = [param.detach().clone() for param in self._params]
        with torch.no_grad():
            for param, live, average in zip(self._params, self._live, self._average, strict=True):
                live.copy_(param)
                param.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for param, live in zip(self._params, self._live, strict=True):
                    param.copy_(live)

    def copy_into_model(self) -> None:
        """Leave the average in the model for good (the run is over and keeps its last step)."""
        with torch.no_grad():
            for param, average in zip(self._params, self._average, strict=True):
                param.copy_(average)

    # What Accelerate's `register_for_checkpointing` saves with each checkpoint (main process).

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "average": [t.cpu() for t in self._average]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        for average, saved in zip(self._average, state["average"], strict=True):
            average.copy_(saved)
