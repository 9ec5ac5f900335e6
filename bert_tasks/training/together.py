"""A failure on one process of a launch ends every process, each with one line, at once.

Only the main process writes the manifest, recipe.yaml, the log, best/ and the final model dir. Were it
to fail alone (a full disk), the other processes would wait at the next barrier for a process that is
gone: NCCL waits out its timeout (10 minutes and more), gloo ends them with "Connection closed by peer"
tracebacks. Each block that may fail on one process is followed by one all-reduce of "did it fail?", so
every process knows, and raises, before anyone moves on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import reduce

from bert_tasks.errors import BertTasksError


@contextmanager
def failing_together(state: Accelerator | PartialState, what: str) -> Iterator[None]:
    """Run the block on every process; if it raised on any of them, raise on all (`what` names the step).

    `state`: the run's Accelerator, or Accelerate's PartialState where no Accelerator is needed (prediction).
    """
    failure: Exception | None = None
    try:
        yield
    except Exception as error:  # whatever it is, the other processes must hear of it before it propagates
        failure = error
    if state.num_processes > 1:
        failed = torch.tensor(float(failure is not None), device=state.device)
        if reduce(failed, "sum").item() > 0 and failure is None:
            raise BertTasksError(
                f"another process of this launch failed while {what} (it says why); this one stops"
            )
    if failure is not None:
        raise failure
