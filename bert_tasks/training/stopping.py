"""Why a run stops before its last step: Ctrl-C or SIGTERM (checkpoint first, then exit) or a NaN/inf loss.

Both are noticed at optimizer updates, never mid-update, and every process reaches the same decision at
the same update: one that stopped alone would leave the others waiting in a collective forever.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

import torch
from accelerate import Accelerator


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped training after a checkpoint; the message says where it is and how to go on.

    A KeyboardInterrupt, so code that already handles Ctrl-C (a notebook, a sweep) still sees one.
    `signal_number` is the signal that asked for the stop (the CLI exits with 128 + it, as shells expect).
    """

    def __init__(self, message: str, signal_number: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signal_number = signal_number


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM: the run stopped at once, without a checkpoint (the last one stands)."""

    def __init__(self, signal_number: int) -> None:
        super().__init__("stopped at once by a second signal, without a checkpoint")
        self.signal_number = signal_number


#: The signals that ask a run to stop: Ctrl-C, and what Slurm, Kubernetes, systemd and `timeout` send
#: before they kill a process.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Ctrl-C / SIGTERM and NaN/inf losses, recorded cheaply at each update and agreed on by every process.

    Used as a context manager: inside it, the first SIGINT or SIGTERM only sets a flag (the loop finishes
    the update and writes a checkpoint) and a second one stops at once; on exit the previous handlers are
    back.

    The loss is never read per update on a single accelerator, where a read waits for the device: the
    first non-finite update is kept in a device tensor and read where the loop waits anyway (logging,
    evaluation, checkpoints). On CPU a read is free, and several processes must agree each update anyway
    (one all-gather of two numbers, beside the gradients' all-reduce), so there it is read every update.
    """

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.interrupted = False
        #: The signal that asked for the stop, once one did.
        self.signal_number: int | None = None
        self.every_update = accelerator.device.type == "cpu" or accelerator.num_processes > 1
        self._first_bad_step = torch.zeros((), dtype=torch.long, device=accelerator.device)  # 0: none
        # The handlers in place before the run; None too for one set outside Python.
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            self._previous = {number: signal.signal(number, self._on_signal) for number in STOP_SIGNALS}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, signal.SIG_DFL if previous is None else previous)

    def record_loss(self, loss_sum: torch.Tensor, step: int) -> None:
        """Remember `step` if `loss_sum` (the losses since the last log) is NaN/inf; no device sync."""
        bad = (self._first_bad_step == 0) & ~torch.isfinite(loss_sum)
        self._first_bad_step = torch.where(bad, step, self._first_bad_step)

    def poll(self, due: bool) -> tuple[int | None, bool]:
        """(first update with a NaN/inf loss or None, whether Ctrl-C was pressed) over all processes.

        Args:
            due: The loop waits for the device at this update anyway, so reading costs nothing extra.
        """
        if not (due or self.every_update or self.interrupted):
            return None, False
        interrupted = torch.tensor(int(self.interrupted), device=self._first_bad_step.device)
        flags = torch.stack([self._first_bad_step, interrupted])[None]  # [1, 2]
        if self.accelerator.num_processes > 1:
            flags = self.accelerator.gather(flags)  # [processes, 2]
        bad_steps = [step for step in flags[:, 0].tolist() if step]
        return (min(bad_steps) if bad_steps else None), bool(flags[:, 1].any())

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.interrupted:
            raise StoppedAtOnce(signum)  # a second Ctrl-C or SIGTERM: stop now, without a checkpoint
        self.interrupted, self.signal_number = True, signum
