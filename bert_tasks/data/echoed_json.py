"""JSON that comes back: prediction inputs, whose every field (`id` first) is written with the prediction.

Python's `json` reads more than JSON holds and writes it back: `NaN` and `Infinity` (and `1e400`, read as
infinity) would be echoed as `NaN`/`Infinity`, which no JSON reader takes (a server answered `null`),
and a float with more digits than a double holds would come back as another number, so an id could
name another record. `loads` refuses those numbers in one reason each, and an integer past Python's digit
limit too (json's own error says nothing of digits). A number comes back as the same number, spelled as
Python spells it (`1E2` as `100.0`): send an id as a string to keep its spelling.
"""

from __future__ import annotations

import json
import math
import sys
from decimal import Decimal
from typing import Any


class UnkeptNumber(ValueError):
    """A JSON number (or non-JSON constant) that would not come back as written; the message is the
    reason, fit to follow `invalid JSON (` or `not valid JSON (`."""


def loads(text: str | bytes) -> Any:
    """`json.loads`, refusing the numbers that would not be echoed as the same JSON (`UnkeptNumber`)."""
    return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)


def _constant(name: str) -> float:
    raise UnkeptNumber(f"{name} is no JSON number; send a finite number, or the value as a string")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnkeptNumber(f"{_short(text)} is too large for a double; send it as a string")
    if Decimal(text) != Decimal(repr(value)):
        raise UnkeptNumber(
            f"{_short(text)} would come back as {value!r}, all a double holds of it; send it as a string"
        )
    return value


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    limit = sys.get_int_max_str_digits()
    if limit and digits > limit:
        raise UnkeptNumber(
            f"a number of {digits} digits, more than the {limit} Python reads; send it as a string"
        )
    return int(text)


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:37]}..."


def too_deep(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests lists and objects more than `limit` levels deep (walked without
    recursion, so any depth json read is safe to ask about)."""
    level = [value]
    for _ in range(limit):
        level = [
            item
            for container in level
            if isinstance(container, list | dict)
            for item in (container.values() if isinstance(container, dict) else container)
        ]
        if not level:
            return False
    return any(isinstance(item, list | dict) for item in level)
