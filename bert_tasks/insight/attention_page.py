"""`bert-tasks attention TEXT --html PAGE`: one text's attention as an explorable page, after bertviz's
head view, optionally beside a second model's and their difference.

The weights are `attention_maps`' (the fused attention's exact math path), the same numbers the PNG
heatmaps draw. They travel as 16-bit integers in ten-thousandths, base64-encoded: 2.7 bytes a weight,
so the default model's 6 x 12 heads over 128 word pieces make a 3.2 MB page (6.3 MB with --compare).
Longer texts are capped at `MAX_PAGE_PIECES` word pieces, and the page says so at its top.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import DEFAULT_MODEL
from bert_tasks.errors import BertTasksError
from bert_tasks.insight.attention_maps import attention_maps, check_head, parse_layer
from bert_tasks.insight.html_page import render_page
from bert_tasks.output_paths import page_output, write_atomically

if TYPE_CHECKING:
    from bert_tasks.insight.attention_maps import AttentionMaps

#: Word pieces a page shows at most ([CLS] and [SEP] included): 128 x 128 weights a head stays readable
#: and light; what a longer text would add is named in the page's note.
MAX_PAGE_PIECES = 128
#: Weights are sent as integers in units of 1 / WEIGHT_SCALE (4 decimals).
WEIGHT_SCALE = 10_000


def write_attention_page(
    text: str,
    out: str | Path,
    model: str | Path = DEFAULT_MODEL,
    compare: str | Path | None = None,
    layer: int | str | None = None,
    head: int | None = None,
    max_pieces: int = MAX_PAGE_PIECES,
) -> Path:
    """Write the page of `text`'s attention under `model` (and `compare`) to `out` and return its path.

    `layer` and `head` choose what the page opens on (default: the last layer, every head; "all" is the
    last layer too: the page's overview shows every layer).

    Raises:
        BertTasksError: an `out` that is not .html or cannot be written (checked before a model loads);
            what `attention_maps` refuses; a `compare` model that reads the text as other word pieces
            or has other layers and heads; a layer or head out of range.
    """
    with page_output(out, "attention") as target:
        first = attention_maps(text, model, max_pieces)
        second = None if compare is None else attention_maps(text, compare, max_pieces)
        if second is not None:
            _check_comparable(first, second, model, compare)
        index = parse_layer(layer, first.num_layers)
        check_head(head, first.num_heads)
        page = attention_page(first, second, first.num_layers - 1 if index is None else index, head)
        with target.writing():
            write_atomically(Path(out), page)
    return Path(out)


def attention_page(maps: AttentionMaps, compare: AttentionMaps | None, layer: int, head: int | None) -> str:
    """The page's HTML: controls, the two token columns and the layers x heads overview, filled by
    attention.js from the weights in the page's data."""
    names = [maps.model] if compare is None else _distinct_names(maps.model, compare.model)
    title = f"Attention: {' vs '.join(names)}"
    data: dict[str, Any] = {
        "tokens": maps.tokens,
        "layers": maps.num_layers,
        "heads": maps.num_heads,
        "scale": WEIGHT_SCALE,
        "layer": layer,
        "head": head,
        "models": [
            {"name": name, "weights": _encode(m)}
            for name, m in zip(names, [maps] if compare is None else [maps, compare], strict=True)
        ],
    }
    note = ""
    if maps.text_pieces > len(maps.tokens):
        note = (
            f'<p class="note" id="note">The text is {maps.text_pieces} word pieces; this page shows the '
            f"first {len(maps.tokens)} ([CLS], {len(maps.tokens) - 2} pieces of the text, [SEP]): the model "
            f"read only those. The last {maps.text_pieces - len(maps.tokens)} pieces are not shown; to see "
            "them, give their part of the text.</p>"
        )
    body = f"""<header>
<h1>{html.escape(title)}</h1>
<p class="muted">{len(maps.tokens)} word pieces, {maps.num_layers} layers x {maps.num_heads} heads.
Hover a word piece on the left to see what it attends to, on the right to see what attends to it; click
to pin it (click again to release). Pick a layer and a head, or every head of the layer (a colour each),
or jump from the overview.</p>
{note}
</header>
<div class="controls">
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
<span id="head-chips" class="chips"></span>
<span id="views" class="views"></span>
</div>
<p id="status" class="muted"></p>
<div class="attention">
<div class="view">
<div class="columns">
<div class="column" id="queries"></div>
<canvas id="lines" width="240" height="10"></canvas>
<div class="column" id="keys"></div>
</div>
</div>
<aside>
<h2>Layers x heads</h2>
<p class="muted" id="overview-note">Each square is one head's attention (rows: word pieces attending,
columns: attended to); click one to show it.</p>
<div id="overview"></div>
</aside>
</div>"""
    return render_page(title, body, ["attention.css", "attention.js"], data)


def _encode(maps: AttentionMaps) -> str:
    """[L, H, T, T] weights as little-endian uint16 ten-thousandths, base64 (row-major, as the page reads)."""
    units = (maps.probs * WEIGHT_SCALE).round().clamp(0, WEIGHT_SCALE).numpy().astype("<u2")
    return base64.b64encode(units.tobytes()).decode("ascii")


def _check_comparable(first: AttentionMaps, second: AttentionMaps, model: Any, compare: Any) -> None:
    if second.tokens != first.tokens:
        raise BertTasksError(
            f"--compare {compare}: reads the text as other word pieces than {model} (another vocabulary); "
            "compare two models with one tokenizer, e.g. a base model and a model fine-tuned from it"
        )
    if second.probs.shape[:2] != first.probs.shape[:2]:
        raise BertTasksError(
            f"--compare {compare}: has {second.num_layers} layers x {second.num_heads} heads, {model} has "
            f"{first.num_layers} x {first.num_heads}; compare models of one architecture"
        )


def _distinct_names(first: str, second: str) -> list[str]:
    """Two models' titles, told apart when their names agree (two dirs both called `best`)."""
    return [first, second] if first != second else [f"A: {first}", f"B: {second}"]
