"""Self-contained HTML pages: one file with its style, script and data inline, that opens from file://.

No page loads anything at view time (no CDN script, font or image), so a page mailed or archived still
works offline. A page's data travels as JSON inside `<script type="application/json">`, with `<`, `>` and
`&` escaped, so no text in it (a `</script>` in a user's sentence) can end the element early; the script
reads it with `JSON.parse` and writes text with `textContent`, never as markup.

Standard library only (`string.Template`, `json`, `html`): the pages are a shell and a few small
scripts, which no templating library would make shorter.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from importlib.resources import files
from string import Template
from typing import Any

#: The shell, the shared style and each page's script and style (bert_tasks/resources/html/).
_ASSETS = files("bert_tasks") / "resources" / "html"
#: Pastel colours for entity types, after displaCy's; types beyond them get evenly spread hues.
_ENTITY_COLOURS = (
    "#7aecec",
    "#feca74",
    "#aa9cfc",
    "#bfe1d9",
    "#ff9561",
    "#c887fb",
    "#9cc9cc",
    "#ffeb80",
    "#f0b3c4",
    "#bfeeb7",
)


def render_page(title: str, body: str, assets: Sequence[str], data: Any = None) -> str:
    """The whole page: `body` (trusted markup built with `html.escape`) plus the named assets inline.

    `assets` are file names under resources/html: `.css` files join the shared style, `.js` files the
    script, in the order given.
    """
    style = [_asset("page.css"), *(_asset(name) for name in assets if name.endswith(".css"))]
    script = [_asset(name) for name in assets if name.endswith(".js")]
    return Template(_asset("page.html")).substitute(
        title=html.escape(title),
        style="\n".join(style),
        body=body,
        data=script_json(data),
        script="\n".join(script),
    )


def script_json(data: Any) -> str:
    """`data` as JSON that is safe inside a `<script>` element (and compact: no spaces)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def entity_colours(types: Iterable[str]) -> dict[str, str]:
    """One background colour per entity type, by the types' sorted order (stable across pages)."""
    names = sorted(set(types))
    spread = max(len(names), 1)
    return {
        name: _ENTITY_COLOURS[i] if i < len(_ENTITY_COLOURS) else f"hsl({360 * i / spread:.0f} 70% 78%)"
        for i, name in enumerate(names)
    }


def _asset(name: str) -> str:
    return (_ASSETS / name).read_text(encoding="utf-8")
