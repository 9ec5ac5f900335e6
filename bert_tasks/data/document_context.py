"""A sentence's neighbours in its document, as unlabelled context for NER (FLERT's document features).

A CoNLL-2003-style file marks where each document starts (`-DOCSTART-`), and its sentences are short
(14.5 words on average): a lowercased "jordan" or "cska" is PER, LOC or ORG by what the next sentences
say. The reader keeps up to `MAX_CONTEXT_WORDS` words of the same document on each side of every
sentence, in the columns below; the NER task puts the nearest `document_context` of them around the
sentence, labels and scores the sentence alone (Schweter & Akbik 2020, "FLERT").
"""

from __future__ import annotations

#: Raw columns holding a sentence's preceding and following words within its document.
BEFORE, AFTER = "context_before", "context_after"
#: The most context words a reader keeps on each side; `document_context` may use up to this many.
MAX_CONTEXT_WORDS = 64


def document_contexts(
    sentences: list[list[str]], documents: list[int], limit: int = MAX_CONTEXT_WORDS
) -> tuple[list[list[str]], list[list[str]]]:
    """Per sentence, the last `limit` words of the sentences before it and the first `limit` words of the
    sentences after it, both within its document (`documents[i]`: sentence i's document number)."""
    before, after = [], []
    for i, document in enumerate(documents):
        left: list[str] = []
        j = i - 1
        while j >= 0 and documents[j] == document and len(left) < limit:
            left[:0] = sentences[j]
            j -= 1
        right: list[str] = []
        j = i + 1
        while j < len(sentences) and documents[j] == document and len(right) < limit:
            right.extend(sentences[j])
            j += 1
        before.append(left[len(left) - limit :] if len(left) > limit else left)
        after.append(right[:limit])
    return before, after
