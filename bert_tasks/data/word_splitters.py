"""How raw text becomes words: the `word_splitter` a NER model is saved with, one regex each.

A NER model tags words, so a text to predict on is first split into words, and those words must be cut
the way the training corpus cut its own: a model that learned `hepatotoxicity` `.` meets a different
word in `hepatotoxicity.`. The choice is saved with the model (`ModelPolicy`) and used for raw text at
prediction and for texts with character spans at reading; `data/splitter_choice.py` picks it from a
corpus of tokens when the user does not.

Every splitter is one regex whose matches are the words (with their character offsets, so entities map
back onto the text). A match that shows nothing (`files.is_blank`: whitespace, controls, zero-width
characters) is skipped, so every word has a character the tokenizer sees, whichever pattern found it.

Hand-written rather than NLTK's Treebank tokenizer for `ptb`: that one splits only a text's final
period (it expects one sentence per call), gives no offsets for its modified quotes, and is a large
dependency for a dozen lines of regex.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import regex

from bert_tasks.data.files import is_blank
from bert_tasks.errors import BertTasksError

#: The splitter of models saved before `word_splitter` existed, and of `word_splitter=none` without a
#: corpus of tokens to infer from.
DEFAULT = "default"
#: `regex:<pattern>`: the user's own pattern, whose matches are the words.
REGEX_PREFIX = "regex:"

_W = r"[\p{L}\p{N}\p{M}_]"  # a word character: letters, digits, combining marks (NFD accents), underscore
_OTHER = r"[^\p{L}\p{N}\p{M}_\s\p{C}]"  # any other visible character: a word of its own
#: The named splitters, in the order they are preferred when two reproduce a corpus equally well.
PRESETS = {
    # A run of word characters, or one other visible character: BC5CDR's and NCBI-disease's convention
    # ("22 - oxacalcitriol", "Parkinson ' s"); what prediction has always done.
    "default": rf"{_W}+|{_OTHER}",
    # Penn Treebank / CoNLL-2003 newswire: clitics split off ("Germany 's", "is n't"), abbreviations
    # ("U.S."), hyphenated words, numbers and dates ("EU-wide", "3,000", "1996-08-22") kept whole.
    "ptb": (
        rf"[\p{{L}}\p{{M}}]+(?=(?i:n't)(?!{_W}))|(?i:n't)(?!{_W})|'(?i:s|re|ve|ll|d|m)(?!{_W})"
        rf"|(?:\p{{L}}\.){{2,}}|{_W}+(?:(?:[-&/.:]|(?<=\p{{N}}),(?=\p{{N}})){_W}+)*|-{{2,}}|\.{{2,}}|{_OTHER}"
    ),
    # Social media: URLs, @handles and #hashtags whole (a URL's closing punctuation is not part of it),
    # everything else as `default` (which would cut "@user" into "@" "user", and a URL into ten words).
    "social": rf"(?:https?://|www\.)\S*[^\s.,;:!?)\]}}'\"]|[@#]{_W}+|{_W}+|{_OTHER}",
    # Runs of visible characters (whitespace and invisible ones separate): for text whose words are
    # already separated by spaces.
    "whitespace": r"[^\s\p{C}]+",
}


#: Text a user's pattern is tried on: letters of several scripts, digits, punctuation, spaces and an
#: accent. A pattern with an empty match here (`\w*`, `(?=a)`) would cut most texts into no words.
_PROBE = (
    "The U.S. patient's 3,000-mg (aspirin) dose: #tag @user https://x.org/a?b=c "
    "é e\u0301 日本語 1996-08-22!\n\t"
)


@dataclass(frozen=True)
class WordSplitter:
    """A named splitter: `split(text)` gives the words and their `[start, end)` offsets in `text`."""

    spec: str
    pattern: regex.Pattern

    def split(self, text: str) -> tuple[list[str], list[tuple[int, int]]]:
        """The words of `text` and their offsets (`text[start:end] == word`), blank matches skipped."""
        matches = [m for m in self.pattern.finditer(text) if m.end() > m.start() and not is_blank(m.group())]
        return [m.group() for m in matches], [m.span() for m in matches]


def splitter_problem(spec: str | None) -> str | None:
    """What is wrong with `spec` as a splitter (a config or policy value): None when it names one, or is
    None (infer it); else the rule it breaks, worded to follow `word_splitter=<spec>`."""
    if spec is None or spec in PRESETS:
        return None
    if not spec.startswith(REGEX_PREFIX):
        return f"must be one of {', '.join(PRESETS)} or regex:<pattern>"
    if not spec[len(REGEX_PREFIX) :]:
        return "has no pattern after regex:; give one, e.g. regex:\\S+"
    try:
        pattern = regex.compile(spec[len(REGEX_PREFIX) :])
    except regex.error as error:
        return f"is not a valid regular expression ({error}); fix the pattern"
    empty = next((m for m in pattern.finditer(_PROBE) if m.end() == m.start()), None)
    if empty is not None or pattern.fullmatch(""):
        return (
            "can match the empty string, and an empty match is no word (a pattern such as (?=a) finds no "
            "words at all, so no entities); give a pattern whose every match holds a character, e.g. "
            "regex:\\S+ (+ rather than *)"
        )
    return None


@lru_cache(maxsize=32)
def word_splitter(spec: str) -> WordSplitter:
    """The splitter `spec` names: a preset, or `regex:<pattern>`; anything else is one line."""
    problem = splitter_problem(spec)
    if problem is not None:
        raise BertTasksError(f"word_splitter={spec!r} {problem}")
    return WordSplitter(spec, regex.compile(PRESETS.get(spec) or spec[len(REGEX_PREFIX) :]))
