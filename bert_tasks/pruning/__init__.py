"""Attention-head pruning (`bert-tasks prune`): `plan` (checks and the choice rule, no torch) and `run`.

`prune` is imported on first use (PEP 562), so `plan_pruning` answers a bad request before torch loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bert_tasks.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from bert_tasks.pruning.plan import plan_pruning
    from bert_tasks.pruning.run import prune

#: Public name -> the module that defines it.
_EXPORTS = {"plan_pruning": "bert_tasks.pruning.plan", "prune": "bert_tasks.pruning.run"}
__all__ = ["plan_pruning", "prune"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
