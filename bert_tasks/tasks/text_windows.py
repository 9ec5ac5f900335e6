"""Texts and text pairs into windows of at most `max_length` sub-tokens: the encoding of sentence tasks.

One text is cut by the fast tokenizer's own overflow windows (`stride` sub-tokens of overlap). A pair is
BERT's two segments, `[CLS] A [SEP] B [SEP]` with token_type_ids 0 for A and 1 for B, and only its longer
side is windowed: the shorter one (usually the aspect: "screen" beside a review) is whole in every window,
so each window asks the model the whole question. When the shorter side alone leaves no room for a window
of the longer one that moves on (more than `stride` sub-tokens), the pair cannot be read without cutting
it: one line names the example and what to change. The tokenizer's `only_first` / `only_second`
truncation does the windowing (its `longest_first` cannot return overflowing windows of a pair), chosen
per pair by which side is longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: How much of a text an error message quotes.
_QUOTED = 40


def text_windows(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, stride: int
) -> tuple[dict[str, list[Any]], list[int]]:
    """The model inputs of every window of `texts`, and the position in `texts` each window came from."""
    enc = tokenizer(
        list(texts), truncation=True, max_length=max_length, stride=stride, return_overflowing_tokens=True
    )
    rows = enc.pop("overflow_to_sample_mapping")
    return dict(enc), list(rows)


def pair_windows(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str],
    max_length: int,
    stride: int,
    pair_name: str,
    numbers: Sequence[int],
) -> tuple[dict[str, list[Any]], list[int]]:
    """The model inputs of every window of the (text, pair) rows, windows over each pair's longer side
    only, in row order; and the row each window came from.

    Messages name the pair side by `pair_name` (its column) and each row as `example N`, N from `numbers`
    (the rows' 1-based positions in the whole data).

    Raises:
        BertTasksError: A pair whose shorter side leaves no room for a window of the longer one.
    """
    lengths = [
        [len(ids) for ids in tokenizer(list(side), add_special_tokens=False)["input_ids"]]
        for side in (texts, pairs)
    ]
    special = tokenizer.num_special_tokens_to_add(pair=True)
    groups: dict[str, list[int]] = {"only_first": [], "only_second": []}
    for row, (first, second) in enumerate(zip(*lengths, strict=True)):
        if first + second + special > max_length and max_length - special - min(first, second) <= stride:
            where = f"example {numbers[row]} ({_quote(texts[row])} / {_quote(pairs[row])})"
            raise _no_room(where, pair_name, (first, second), max_length, stride, special)
        groups["only_first" if first >= second else "only_second"].append(row)
    found: list[tuple[int, int, dict[str, list[int]]]] = []  # (row, window number, its inputs)
    for truncation, rows in groups.items():
        if not rows:
            continue
        enc = tokenizer(
            [texts[row] for row in rows],
            [pairs[row] for row in rows],
            truncation=truncation,
            max_length=max_length,
            stride=stride,
            return_overflowing_tokens=True,
        )
        sources = enc.pop("overflow_to_sample_mapping")
        for window, source in enumerate(sources):
            found.append((rows[source], window, {key: values[window] for key, values in enc.items()}))
    found.sort(key=lambda item: item[:2])
    keys = found[0][2].keys() if found else ("input_ids", "attention_mask")
    return {key: [inputs[key] for *_, inputs in found] for key in keys}, [row for row, *_ in found]


def _no_room(
    where: str, pair_name: str, lengths: tuple[int, int], max_length: int, stride: int, special: int
) -> BertTasksError:
    short, long = (pair_name, "text") if lengths[1] <= lengths[0] else ("text", pair_name)
    room = max_length - special - min(lengths)
    return BertTasksError(
        f"{where}: its {short} is {min(lengths)} sub-tokens, which leaves {room} of max_length="
        f"{max_length} (after {special} special tokens) for windows of its {long}, not more than stride="
        f"{stride}; the {short} is never cut, so shorten it, raise max_length or lower stride"
    )


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTED else text[: _QUOTED - 3] + "...")
