"""Entities in place, for people: `predict ner --html` marks each text's entities displaCy-style (a colour
per type, the score on hover, a legend), `evaluate ner --html` sets gold beside predicted per sentence
with each error's kind, filterable by kind and type.

The markup is built here with `html.escape` (every text a user wrote is escaped, nothing else changes
it); entities.js adds the hover tips, the legend's type switches and the evaluation page's filters.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from bert_tasks.insight.html_page import entity_colours, render_page

#: How the evaluation page names each error kind (the keys of the NER metric's `errors`).
KIND_NAMES = {
    "wrong_type": "wrong type",
    "wrong_boundary": "wrong boundary",
    "wrong_type_and_boundary": "wrong type and boundary",
    "missed": "missed",
    "spurious": "spurious",
}
_ASSETS = ["entities.css", "entities.js"]

Entity = tuple[str, int, int]  # (type, first word, last word)


def predictions_page(texts: Sequence[str], predictions: Sequence[Sequence[dict[str, Any]]]) -> str:
    """Each text with its predicted entities (`{"label", "start", "end", "score"}`, character offsets)
    marked in place; a legend of the types with their counts."""
    counts = Counter(entity["label"] for entities in predictions for entity in entities)
    colours = entity_colours(counts)
    blocks = []
    for number, (text, entities) in enumerate(zip(texts, predictions, strict=True), start=1):
        parts, cursor = [], 0
        for entity in sorted(entities, key=lambda e: e["start"]):
            parts.append(html.escape(text[cursor : entity["start"]]))
            tip = f"{entity['label']} · score {entity['score']:.3f}"
            parts.append(_mark(text[entity["start"] : entity["end"]], entity["label"], colours, tip))
            cursor = entity["end"]
        parts.append(html.escape(text[cursor:]))
        found = f"{len(entities)} entit{'y' if len(entities) == 1 else 'ies'}"
        blocks.append(
            f'<article class="doc"><h2>text {number} <span class="muted">{found}</span></h2>'
            f'<p class="text">{"".join(parts)}</p></article>'
        )
    total = sum(counts.values())
    title = f"Entities: {len(texts)} text{'s' if len(texts) != 1 else ''}, {total} entities"
    body = (
        f"<header><h1>{html.escape(title)}</h1>{_legend(counts, colours)}"
        '<p class="muted">Hover an entity for its score (the mean probability of its words\' tags); click a '
        "type in the legend to hide or show it.</p></header>"
        f'<main>{"".join(blocks)}</main><div id="tip" role="tooltip" hidden></div>'
    )
    return render_page(title, body, _ASSETS)


def evaluation_page(
    tokens: Sequence[Sequence[str]],
    gold: Sequence[Sequence[str]],
    predicted: Sequence[tuple[Sequence[str], Any]],
    metrics: dict[str, Any],
) -> str:
    """Gold beside predicted for every sentence, each error marked with its kind; the header counts them
    and filters the sentences by kind and by entity type.

    `predicted` holds each sentence's tags and their probabilities (`NerTask.predict_tags`); the errors
    are the NER metric's own rule (`sentence_errors`), so the page's counts are metrics.json's.
    """
    from bert_tasks.metrics.ner.ner import sentence_errors
    from bert_tasks.tasks.ner import entity_spans

    rows = []
    kinds: Counter[str] = Counter()
    types: Counter[str] = Counter()  # gold entities per type, for the legend
    predicted_types: set[str] = set()
    for words, gold_tags, (tags, probs) in zip(tokens, gold, predicted, strict=True):
        errors = sentence_errors(list(gold_tags), list(tags))
        kinds.update(kind for kind, _, _ in errors)
        gold_spans, pred_spans = entity_spans(gold_tags), entity_spans(tags)
        types.update(kind for kind, _, _ in gold_spans)
        predicted_types.update(kind for kind, _, _ in pred_spans)
        scores = {span: float(probs[span[1] : span[2] + 1].mean()) for span in pred_spans}
        rows.append((words, gold_spans, pred_spans, scores, errors))
    colours = entity_colours([*types, *predicted_types])
    sections = [_sentence(i, *row, colours) for i, row in enumerate(rows)]
    with_errors = sum(1 for *_, errors in rows if errors)
    title = f"NER evaluation: {len(rows)} sentences"
    body = (
        f"<header><h1>{html.escape(title)}</h1>{_summary(metrics, rows)}"
        f"{_filters(len(rows), with_errors, kinds, colours)}{_legend(types, colours, 'gold')}</header>"
        f'<main>{"".join(sections)}</main><div id="tip" role="tooltip" hidden></div>'
    )
    return render_page(title, body, _ASSETS)


def _summary(metrics: dict[str, Any], rows: list[tuple]) -> str:
    gold = sum(len(row[1]) for row in rows)
    predicted = sum(len(row[2]) for row in rows)
    correct = sum(len(set(row[1]) & set(row[2])) for row in rows)
    return (
        f'<p class="summary">entity F1 <b>{metrics["f1"]:.4f}</b> (precision {metrics["precision"]:.4f}, '
        f'recall {metrics["recall"]:.4f}) · <span id="gold-count">{gold}</span> gold entities · '
        f'<span id="pred-count">{predicted}</span> predicted · <span id="correct-count">{correct}</span> '
        "correct</p>"
    )


def _filters(sentences: int, with_errors: int, kinds: Counter[str], colours: dict[str, str]) -> str:
    chips = [
        f'<button type="button" class="chip" data-kind="all" aria-pressed="false">all sentences ({sentences})'
        "</button>",
        f'<button type="button" class="chip" data-kind="errors" aria-pressed="true">with errors '
        f"({with_errors})</button>",
    ]
    for kind, name in KIND_NAMES.items():
        chips.append(
            f'<button type="button" class="chip kind-{kind}" data-kind="{kind}" aria-pressed="false">'
            f'{name} (<span class="count">{kinds[kind]}</span>)</button>'
        )
    options = "".join(f'<option value="{html.escape(t)}">{html.escape(t)}</option>' for t in colours)
    return (
        f'<div class="controls"><span id="kind-filter" class="chips">{"".join(chips)}</span>'
        f'<label>Type <select id="type-filter"><option value="">all types</option>{options}</select></label>'
        f'<span id="shown" class="muted"></span></div>'
    )


def _legend(counts: Counter[str], colours: dict[str, str], counted: str = "") -> str:
    items = "".join(
        f'<button type="button" class="chip legend-type" data-type="{html.escape(name)}" aria-pressed="true" '
        f'style="background:{colour}">{html.escape(name)} <span class="muted">{counts[name]}</span></button>'
        for name, colour in colours.items()
    )
    what = f"{counted} entities per type" if counted else "entities per type"
    return f'<div class="legend" aria-label="{what}">{items}</div>'


def _mark(text: str, label: str, colours: dict[str, str], tip: str, kind: str | None = None) -> str:
    """One entity: its text on its type's colour, the type as a tag; `kind` marks an error."""
    error = f' error kind-{kind}" data-kind="{kind}' if kind else ""
    return (
        f'<mark class="entity{error}" data-type="{html.escape(label)}" data-tip="{html.escape(tip)}" '
        f'style="background:{colours[label]}">{html.escape(text)}'
        f'<span class="entity-type">{html.escape(label)}</span></mark>'
    )


def _words_marked(
    words: Sequence[str], spans: Sequence[Entity], colours: dict[str, str], tips: dict, kinds: dict
) -> str:
    """The sentence's words joined by spaces with `spans` marked (their tips and error kinds by span)."""
    starts = {span[1]: span for span in spans}
    parts, i = [], 0
    while i < len(words):
        span = starts.get(i)
        if span is None:
            parts.append(html.escape(words[i]))
            i += 1
            continue
        text = " ".join(words[span[1] : span[2] + 1])
        parts.append(_mark(text, span[0], colours, tips[span], kinds.get(span)))
        i = span[2] + 1
    return " ".join(parts)


def _sentence(
    index: int,
    words: Sequence[str],
    gold: list[Entity],
    predicted: list[Entity],
    scores: dict[Entity, float],
    errors: list[tuple[str, Entity | None, Entity | None]],
    colours: dict[str, str],
) -> str:
    """One sentence: gold and predicted side by side, then its errors listed, each with its kind."""
    gold_kinds = {g: kind for kind, g, _ in errors if g is not None}
    pred_kinds = {p: kind for kind, _, p in errors if p is not None}
    gold_tips = {g: f"gold {g[0]}" + _kind_said(gold_kinds.get(g)) for g in gold}
    pred_tips = {p: f"{p[0]} · score {scores[p]:.3f}" + _kind_said(pred_kinds.get(p)) for p in predicted}
    items = []
    for kind, g, p in errors:
        involved = _attribute_list(e[0] for e in (g, p) if e is not None)
        said = " → ".join(
            f"{side} “{html.escape(' '.join(words[e[1] : e[2] + 1]))}” {html.escape(e[0])}"
            for side, e in (("gold", g), ("predicted", p))
            if e is not None
        )
        items.append(
            f'<li data-kind="{kind}" data-types="{involved}"><span class="kind kind-{kind}">'
            f"{KIND_NAMES[kind]}</span> {said}</li>"
        )
    entity_types = _attribute_list(e[0] for e in [*gold, *predicted])
    error_kinds = " ".join(sorted({kind for kind, _, _ in errors}))
    return (
        f'<section class="sentence" data-index="{index}" data-kinds="{error_kinds}" '
        f'data-types="{entity_types}"><h2>sentence {index + 1}</h2><div class="pair">'
        f'<div class="gold"><span class="side">gold</span>'
        f"{_words_marked(words, gold, colours, gold_tips, gold_kinds)}</div>"
        f'<div class="pred"><span class="side">predicted</span>'
        f"{_words_marked(words, predicted, colours, pred_tips, pred_kinds)}</div></div>"
        f'<ul class="errors">{"".join(items)}</ul></section>'
    )


def _kind_said(kind: str | None) -> str:
    return f" · {KIND_NAMES[kind]}" if kind else ""


def _attribute_list(names: Iterable[str]) -> str:
    """Names as a JSON list in an attribute (a type name may hold spaces), for entities.js's filters."""
    return html.escape(json.dumps(sorted(set(names)), ensure_ascii=False))
