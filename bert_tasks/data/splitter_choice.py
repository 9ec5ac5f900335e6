"""Which `word_splitter` cuts raw text the way a training corpus of tokens cut its own sentences.

A corpus of tokens (CoNLL, JSONL tokens, the hub) does not keep its raw text, so each sentence is
written back as text people write (`raw_text`: Moses' detokenizer, which knows where English puts no
space: `said .` -> `said.`, `( OCT )` -> `(OCT)`, `Germany 's` -> `Germany's`), every candidate splitter
cuts that text, and its words are compared with the corpus' tokens by their character spans. A
sentence joined with plain spaces would not do: splitting at whitespace gives back any such text
exactly, whichever convention the corpus follows.

The agreement is the F1 of the two span sets over the corpus (`2 * same / (tokens + words)`): 1.0 when
every sentence comes out as the corpus has it; a splitter that merges tokens, or cuts one apart, loses
on both sides. Ties go to the earlier candidate (`PRESETS` order: `default` first).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from bert_tasks.data.word_splitters import PRESETS, WordSplitter, word_splitter

if TYPE_CHECKING:
    from sacremoses import MosesDetokenizer

#: The splitters a corpus is measured against (a user's regex is never guessed).
CANDIDATES = tuple(PRESETS)
#: At most this many sentences are measured, spread evenly over the corpus (about 1 s per 10,000).
MAX_SENTENCES = 20_000


@dataclass(frozen=True)
class SplitterChoice:
    """The splitter that gives the corpus back best, and every candidate's agreement (`CANDIDATES` order)."""

    splitter: str
    agreement: dict[str, float]
    sentences: int

    def describe(self) -> str:
        """One line: the choice, its agreement, and the others'."""
        rates = self.agreement.items()
        others = ", ".join(f"{name} {rate:.1%}" for name, rate in rates if name != self.splitter)
        return (
            f"word_splitter={self.splitter}: its words agree with the training corpus' tokens at "
            f"{self.agreement[self.splitter]:.1%} (span F1 on {self.sentences} sentences written back as raw "
            f"text; {others}); set word_splitter= to choose another"
        )


@lru_cache(maxsize=1)
def _detokenizer() -> MosesDetokenizer:
    from sacremoses import MosesDetokenizer  # deferred: only training on a corpus of tokens needs it

    return MosesDetokenizer(lang="en")


def raw_text(tokens: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """A sentence of tokens as raw text, and each token's `[start, end)` in it.

    The detokenizer only decides where the spaces go; should it change a token, the sentence is joined
    with spaces instead (never seen on BC5CDR, NCBI-disease or CoNLL-2003).
    """
    text = _detokenizer().detokenize(list(tokens), unescape=False)
    spans, cursor = [], 0
    for token in tokens:
        start = text.find(token, cursor)
        if start < 0 or text[cursor:start].strip():
            return _joined(tokens)
        spans.append((start, start + len(token)))
        cursor = start + len(token)
    return text, spans


def _joined(tokens: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    starts = list(itertools.accumulate((len(t) + 1 for t in tokens[:-1]), initial=0))
    return " ".join(tokens), [(start, start + len(t)) for start, t in zip(starts, tokens, strict=True)]


def agreement(splitter: WordSplitter, sentences: Iterable[Sequence[str]]) -> float:
    """How well `splitter` gives back the sentences' tokens from their raw text (span F1, see above)."""
    return _agreement(splitter, [raw_text(sentence) for sentence in sentences])


def _agreement(splitter: WordSplitter, texts: Iterable[tuple[str, list[tuple[int, int]]]]) -> float:
    same = total = 0
    for text, spans in texts:
        found = set(splitter.split(text)[1])
        same += len(found.intersection(spans))
        total += len(spans) + len(found)
    return 2 * same / total if total else 1.0


def choose_splitter(sentences: Sequence[Sequence[str]]) -> SplitterChoice:
    """The candidate that agrees best with the corpus' tokens, measured on at most `MAX_SENTENCES`."""
    step = max(1, -(-len(sentences) // MAX_SENTENCES))
    sample = [sentences[i] for i in range(0, len(sentences), step)]
    texts = [raw_text(sentence) for sentence in sample]  # written back once, cut by every candidate
    rates = {name: _agreement(word_splitter(name), texts) for name in CANDIDATES}
    best = max(CANDIDATES, key=lambda name: (rates[name], -CANDIDATES.index(name)))
    return SplitterChoice(best, rates, len(sample))
