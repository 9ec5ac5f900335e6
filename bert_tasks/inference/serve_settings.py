"""What one `bert-tasks serve` process runs, importable without the server's libraries.

The CLI reads its defaults and checks them before FastAPI, uvicorn or torch load; `server.py` runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bert_tasks.errors import BertTasksError

#: Request bytes allowed per allowed character: JSON escapes (`\u00e9`) take six, ids and keys the rest.
_BYTES_PER_CHAR = 8
_BODY_SLACK = 1 << 20


@dataclass(frozen=True)
class ServeSettings:
    """What one server process runs: the model dir and its task, batching and per-request limits."""

    model_dir: str
    task: str
    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_texts: int = 256
    max_chars: int = 200_000
    allow_pickle: bool = False
    quantize: str | None = None

    @property
    def max_body_bytes(self) -> int:
        """A body larger than this is refused (413) before it is parsed."""
        return self.max_chars * _BYTES_PER_CHAR + _BODY_SLACK

    def check(self) -> None:
        """One line per setting out of range, before anything loads."""
        for name, low in (("max_batch", 1), ("max_texts", 1), ("max_chars", 1), ("max_wait_ms", 0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= low):
                flag = "--" + name.replace("_", "-")
                raise BertTasksError(f"{flag} must be a number of at least {low}, got {value}")
