"""NER readers: CoNLL column files, JSONL (tokens + tags, or text + character spans), the Hub.

Every reader returns a `datasets.Dataset` with `tokens` (list[str]), `tags` (list[str], BIO) and
`repaired_tags` (how many of the row's tags the reader repaired, see below: what `debug data` counts);
the character-span reader also keeps `text` and `word_offsets` so predictions map back onto the raw string,
and the CoNLL reader `context_before`/`context_after` when the file marks its documents.

Gold tags are BIO (IOB2). Files in the other common schemes are read as BIO: IOBES/BIOES and BILOU
(`S-X`/`U-X` a one-word entity -> `B-X`, `E-X`/`L-X` its last word -> `I-X`) and BMES (`M-X` -> `I-X`);
the entities are the same, so scores and spans do not change, and the model learns and predicts BIO.
A stray `I-X` (after `O`, after another type, or first in a sentence) is *repaired* to `B-X` rather than
rejected: that is how seqeval's default mode and conlleval read such a tag anyway, so the repair changes
no score and makes the gold usable for training with valid BIO. Each file's conversion and repair
counts, with the first `file:line`, are logged as one warning each.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.document_context import AFTER, BEFORE, document_contexts
from bert_tasks.data.files import (
    check_text,
    check_text_record,
    describe,
    is_blank,
    json_records,
    numbered_lines,
    opens_json,
    read_utf8,
)
from bert_tasks.data.hub import load_hub_split
from bert_tasks.data.in_memory import Records
from bert_tasks.data.word_splitters import DEFAULT, WordSplitter, word_splitter
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

    from bert_tasks.config import Config

logger = logging.getLogger(__name__)

#: What `format=` names for NER files; `auto` reads by extension, and JSON by its first record's fields.
FILE_FORMATS = ("auto", "conll", "jsonl-tokens", "jsonl-spans", "label-studio", "doccano")
COLUMN_SUFFIXES = (".conll", ".txt", ".tsv", ".iob")
JSON_SUFFIXES = (".jsonl", ".json")
DOCSTART = "-DOCSTART-"
#: The BIO prefix each scheme's prefix is read as: IOBES/BIOES (S, E), BILOU (U, L), BMES (M, E, S).
BIO_OF_PREFIX = {"B": "B", "I": "I", "S": "B", "U": "B", "E": "I", "L": "I", "M": "I"}


def words_with_offsets(
    text: str, splitter: WordSplitter | None = None
) -> tuple[list[str], list[tuple[int, int]]]:
    """Split raw text into words and their `[start, end)` character offsets (`text[start:end] == word`),
    by `splitter` (default: the `default` rule, `data/word_splitters.py`)."""
    return (splitter or word_splitter(DEFAULT)).split(text)


def texts_to_columns(texts: list[str], splitter: WordSplitter | None = None) -> dict[str, list[Any]]:
    """Raw texts -> the `tokens`/`text`/`word_offsets` columns that prediction encodes and decodes."""
    split = [words_with_offsets(text, splitter) for text in texts]
    return {
        "tokens": [words for words, _ in split],
        "text": list(texts),
        "word_offsets": [[list(o) for o in offsets] for _, offsets in split],
    }


#: A prediction input of the user's own words: its tokens, its text (or None) and each token's offsets in
#: the text (None without one).
TokenInput = tuple[list[str], str | None, list[tuple[int, int]] | None]


def token_input(where: str, record: dict[str, Any]) -> TokenInput:
    """The tokens of a prediction input `{"tokens": [...]}` (optionally with its "text"), checked, with
    where each lies in the text: the first place at or after the previous token's end (characters in
    between, such as spaces, belong to no token). Each mistake is one line naming `where`."""
    tokens = record["tokens"]
    if not isinstance(tokens, list | tuple):
        raise BertTasksError(
            f"{where}: 'tokens' is {describe(tokens)}, not a list of strings; give the words as a list"
        )
    if not tokens:
        raise BertTasksError(f"{where}: 'tokens' is an empty list; give at least one token to predict on")
    for number, token in enumerate(tokens, start=1):
        if not isinstance(token, str):
            raise BertTasksError(
                f"{where}: token {number} in 'tokens' is {describe(token)}, not a string; give every "
                "token as a string"
            )
        if is_blank(token):
            raise BertTasksError(
                f"{where}: token {number} in 'tokens' is empty or invisible (whitespace, control or format "
                "characters only); remove it"
            )
        check_text(token, where, f"token {number} in 'tokens'", nul=True)
    if "text" not in record:
        return list(tokens), None, None
    text = check_text_record(where, record)["text"]
    offsets, cursor = [], 0
    for number, token in enumerate(tokens, start=1):
        start = _find_token(text, token, cursor)
        if start < 0:
            after = f"after token {number - 1} (character {cursor})" if number > 1 else ""
            raise BertTasksError(
                f"{where}: token {number} {token!r} does not occur in 'text' {after or 'at all'}; give the "
                "tokens as the text spells them, in its order, or leave 'text' out"
            )
        offsets.append((start, start + len(token)))
        cursor = start + len(token)
    return list(tokens), text, offsets


#: How many places of a token after the previous one `_find_token` weighs: a bound, so a long text
#: whose token only occurs inside other words costs no scan of the whole rest per token.
_TOKEN_PLACES = 16


def _find_token(text: str, token: str, cursor: int) -> int:
    """Where `token` lies in `text` at or after `cursor`, -1 if nowhere: the first place that starts a
    word (right at the cursor, or after a character that is no letter or digit), so "ab" in "xab ab" is
    the second; else the first place at all (a text that glues tokens in ways the tokens do not show)."""
    first = start = text.find(token, cursor)
    for _ in range(_TOKEN_PLACES):
        if start < 0:
            break
        if start == cursor or not text[start - 1].isalnum() or not token[0].isalnum():
            return start
        start = text.find(token, start + 1)
    return first


def inputs_to_columns(
    records: list[dict[str, Any]], splitter: WordSplitter | None = None
) -> dict[str, list[Any]]:
    """Prediction inputs -> the columns `encode_batch`/`decode` take: a record with 'tokens' keeps them as its
    words (`given_tokens`), one with a 'text' alone is cut into words by `splitter`."""
    columns: dict[str, list] = {"tokens": [], "text": [], "word_offsets": [], "given_tokens": []}
    for number, record in enumerate(records, start=1):
        if "tokens" in record:
            tokens, text, offsets = token_input(f"record {number}", record)
        else:
            text = record["text"]
            tokens, offsets = words_with_offsets(text, splitter)
        columns["tokens"].append(tokens)
        columns["text"].append(text)
        columns["word_offsets"].append(None if offsets is None else [list(o) for o in offsets])
        columns["given_tokens"].append("tokens" in record)
    return columns


def is_tag(tag: str) -> bool:
    """Whether `tag` is `O` or `P-TYPE` with a prefix P of BIO, IOBES, BILOU or BMES."""
    return tag == "O" or (len(tag) > 2 and tag[1] == "-" and tag[0] in BIO_OF_PREFIX)


def check_tag(tag: str, where: str) -> None:
    """Reject tags that are neither `O` nor `P-TYPE` with a prefix P of BIO, IOBES, BILOU or BMES (e.g. a
    part-of-speech tag from the wrong CoNLL column)."""
    if is_tag(tag):
        return
    raise BertTasksError(
        f"{where}: tag {tag!r} is not BIO (O, B-TYPE, I-TYPE; IOBES, BILOU and BMES prefixes are read as "
        "BIO); convert the file to BIO (IOB2) or point conll_tag_index at the tag column"
    )


def as_bio(tags: list[str]) -> tuple[list[str], list[int]]:
    """Read checked tags of any accepted scheme as BIO; return the BIO tags and the converted positions."""
    bio, converted = list(tags), []
    for i, tag in enumerate(bio):
        if tag != "O" and BIO_OF_PREFIX[tag[0]] != tag[0]:
            bio[i] = BIO_OF_PREFIX[tag[0]] + tag[1:]
            converted.append(i)
    return bio, converted


def repair_bio(tags: list[str]) -> tuple[list[str], list[int]]:
    """Turn each `I-X` that cannot continue an entity into `B-X`; return new tags and repaired positions."""
    fixed, repaired = list(tags), []
    for i, tag in enumerate(fixed):
        if tag.startswith("I-") and (i == 0 or fixed[i - 1][2:] != tag[2:]):
            fixed[i] = "B-" + tag[2:]
            repaired.append(i)
    return fixed, repaired


class _Count:
    """How many tags of one file a rewrite touched, and where the first was."""

    def __init__(self) -> None:
        self.count, self.first = 0, ""

    def add(self, positions: list[int], where: list[str]) -> None:
        if positions and not self.first:
            self.first = where[positions[0]]
        self.count += len(positions)


class _RepairLog:
    """Reads one file's tags as valid BIO and counts what it rewrote, so the user gets one warning line
    per kind of rewrite, not one per sentence."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.converted, self.repaired = path, _Count(), _Count()

    def to_bio(self, tags: list[str], where: list[str]) -> tuple[list[str], list[int]]:
        """Checked tags of one sentence (`where[i]` locates tag i) -> valid BIO and the repaired positions."""
        bio, converted = as_bio(tags)
        fixed, repaired = repair_bio(bio)
        self.converted.add(converted, where)
        self.repaired.add(repaired, where)
        return fixed, repaired

    def report(self) -> None:
        if self.converted.count:
            logger.warning(
                "%s: read %d IOBES/BILOU/BMES tag(s) as BIO (S-X, U-X -> B-X; E-X, L-X, M-X -> I-X: the same "
                "entities); the model predicts BIO; first at %s",
                self.path,
                self.converted.count,
                self.converted.first,
            )
        if self.repaired.count:
            logger.warning(
                "%s: repaired %d invalid BIO tag(s) (I-X not continuing an X entity -> B-X, as seqeval and "
                "conlleval read them); first at %s",
                self.path,
                self.repaired.count,
                self.repaired.first,
            )


def read_conll(path: str | Path, tag_index: int = -1) -> Dataset:
    """Read a CoNLL-style column file: token in column 0, tag in column `tag_index`.

    Columns are tab-separated when the line has a tab (tokens may then contain spaces), otherwise
    separated by runs of ASCII spaces (CoNLL-2003's `token POS chunk NER`); a no-break space or other
    non-ASCII whitespace is part of a token, never a separator. Blank lines (nothing visible: whitespace,
    control and format characters only) end a sentence; `-DOCSTART-` lines are document markers: a
    file that has them gets each sentence's neighbours in its document as two more columns
    (`data/document_context.py`).
    """
    path = Path(path)
    return _conll_dataset(path, read_utf8(path), tag_index)


def _conll_dataset(path: Path, text: str, tag_index: int) -> Dataset:
    if tag_index == 0:
        raise BertTasksError("conll_tag_index=0 points at the token column; use the tag column (e.g. -1)")
    repairs = _RepairLog(path)
    tokens: list[list[str]] = []
    tags: list[list[str]] = []
    repaired_tags: list[int] = []
    documents: list[int] = []  # per sentence: how many -DOCSTART- lines came before it
    document = 0
    sentence: list[str] = []
    sentence_tags: list[str] = []
    where: list[str] = []

    def flush() -> None:
        if sentence:
            fixed, repaired = repairs.to_bio(sentence_tags, where)
            tokens.append(list(sentence))
            tags.append(fixed)
            repaired_tags.append(len(repaired))
            documents.append(document)
        sentence.clear()
        sentence_tags.clear()
        where.clear()

    width: tuple[int, str] | None = None  # the first token line's column count, and where it is
    comments = _Count()
    for number, line in numbered_lines(text):
        at = f"{path}:{number}"
        if _is_comment(line, tag_index):
            comments.add([0], [at])
            continue
        columns = _conll_line(at, line, tag_index)
        if columns is None:
            flush()
            document += _is_docstart(line)
            continue
        width = width or (len(columns), at)
        if len(columns) != width[0]:
            raise _width_error(at, line, len(columns), width)
        sentence.append(columns[0])
        sentence_tags.append(columns[tag_index])
        where.append(at)
    flush()
    repairs.report()
    if comments.count:
        logger.warning(
            "%s: skipped %d comment line(s) (starting with '#' and holding no tag; a '#' token line is "
            "read as a token); first at %s",
            path,
            comments.count,
            comments.first,
        )
    if not tokens:
        raise BertTasksError(f"{path}: no sentences found (only -DOCSTART- or blank lines); check the file")
    if not document:
        return _token_dataset(tokens, tags, repaired_tags)
    before, after = document_contexts(tokens, documents)
    return _token_dataset(tokens, tags, repaired_tags, {BEFORE: before, AFTER: after})


def _columns(line: str) -> list[str]:
    """A CoNLL line's columns: split at tabs if it has one, else at runs of ASCII spaces, and nothing else."""
    if "\t" in line:
        return [c.strip(" ") for c in line.rstrip(" \t").split("\t")]
    return [c for c in line.split(" ") if c]


def _width_error(at: str, line: str, found: int, width: tuple[int, str]) -> BertTasksError:
    """Every token line must have the file's column count: `New York B-LOC` in a two-column file would
    otherwise lose `York` (the token is column 0, the tag the last), silently."""
    expected, first = width
    spaces = " (a line without tabs is split at spaces: a token with a space needs tab-separated columns)"
    hint = "" if "\t" in line else spaces
    return BertTasksError(
        f"{at}: {found} columns, but the file's token lines have {expected} (as {first}){hint}; fix the line"
    )


def _is_comment(line: str, tag_index: int) -> bool:
    """Whether a CoNLL line is a comment (`# sent_id = 3`, MultiCoNER's `# id ... domain=en`): it starts
    with `#` and its tag column holds no tag, so a hashtag token line (`#\tO`) stays a token."""
    if not line.startswith("#"):
        return False
    columns = _columns(line)
    return not (len(columns) >= _needed_columns(tag_index) and is_tag(columns[tag_index]))


def _needed_columns(tag_index: int) -> int:
    """How many columns a token line needs for its tag to sit at `tag_index` (token in column 0)."""
    return tag_index + 1 if tag_index > 0 else 1 - tag_index


def _is_docstart(line: str) -> bool:
    """Whether a CoNLL line is a document marker (`-DOCSTART- -X- -X- O`)."""
    return not is_blank(line) and _columns(line)[0] == DOCSTART


def _conll_line(at: str, line: str, tag_index: int) -> list[str] | None:
    """The checked columns of one CoNLL line, or None for a sentence break (a blank or `-DOCSTART-` line)."""
    if is_blank(line):
        return None
    check_text(line, at, "the line")
    columns = _columns(line)
    if columns[0] == DOCSTART:
        return None
    needed = _needed_columns(tag_index)
    if len(columns) < needed:
        odd = sorted({f"U+{ord(c):04X}" for c in line if c.isspace() and c not in " \t"})
        hint = f" (columns are separated by tabs or ASCII spaces; {', '.join(odd)} is part of a token)"
        raise BertTasksError(
            f"{at}: expected at least {needed} columns (token ... tag), found "
            f"{len(columns)}{hint if odd else ''}; fix the line or set conll_tag_index"
        )
    if is_blank(columns[0]):
        raise BertTasksError(f"{at}: empty token in column 0; remove the line or put the token first")
    check_tag(columns[tag_index], at)
    return columns


def _tokens_and_tags(
    where: str, record: dict[str, Any], tokens_column: str, tag_column: str, tag_names: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """One record's words and tags; integer tags (a datasets export's `ner_tags`) are ids into
    `tag_names` (the config's label_names, in id order)."""
    tokens, tags = record.get(tokens_column), record.get(tag_column)
    ids = isinstance(tags, list) and bool(tags) and all(_is_tag_id(t) for t in tags)
    if ids and tag_names is not None:
        tags = _named_tags(where, tags, tag_names, tag_column)
    for name, value in ((tokens_column, tokens), (tag_column, tags)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            todo = "name integer tag ids with label_names=[O,B-X,I-X,...] in id order" if ids else ""
            raise BertTasksError(
                f"{where}: field {name!r} must be a list of strings; "
                f"{todo or 'fix the record or set tokens_column/tag_column'}"
            )
    if len(tokens) != len(tags):
        raise BertTasksError(f"{where}: {len(tokens)} tokens but {len(tags)} tags; give one tag per token")
    for number, token in enumerate(tokens, start=1):
        if is_blank(token):
            raise BertTasksError(
                f"{where}: token {number} is empty or invisible (whitespace, control or format characters "
                f"only); remove it from {tokens_column!r}"
            )
        check_text(token, where, f"token {number} in {tokens_column!r}")
    for number, tag in enumerate(tags, start=1):
        check_text(tag, where, f"tag {number} in {tag_column!r}")
        if tag != tag.strip():
            raise _spaced_tag(where, f"tag {number} {tag!r} in {tag_column!r}", tag)
    for tag in tags:
        check_tag(tag, where)
    return tokens, tags


def _spaced_tag(where: str, what: str, tag: str) -> BertTasksError:
    """A tag or label with spaces around it would be an entity type of its own ('Disease ' besides
    'Disease'), scored apart from the rest."""
    return BertTasksError(f"{where}: {what} has spaces around it; write it as {tag.strip()!r}")


def _is_tag_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _named_tags(where: str, ids: list[int], names: Sequence[str], column: str) -> list[str]:
    outside = next((i for i in ids if not 0 <= i < len(names)), None)
    if outside is not None:
        raise BertTasksError(
            f"{where}: tag id {outside} in {column!r} is not an index of label_names (0 to "
            f"{len(names) - 1}); fix the record, or give label_names every tag in id order"
        )
    return [names[i] for i in ids]


def read_jsonl_tokens(
    path: str | Path,
    tokens_column: str = "tokens",
    tag_column: str = "tags",
    tag_names: Sequence[str] | None = None,
) -> Dataset:
    """Read JSON Lines records holding pre-split tokens and one BIO tag (or tag id into `tag_names`) per
    token."""
    path = Path(path)
    return _tokens_dataset(path, json_records(path, read_utf8(path)), tokens_column, tag_column, tag_names)


def _tokens_dataset(
    source: str | Path, records: Records, tokens_column: str, tag_column: str, tag_names: Sequence[str] | None
) -> Dataset:
    repairs = _RepairLog(source)
    tokens, tags, repaired_tags = [], [], []
    for where, record in records:
        words, word_tags = _tokens_and_tags(where, record, tokens_column, tag_column, tag_names)
        fixed, repaired = repairs.to_bio(word_tags, [where] * len(word_tags))
        tokens.append(words)
        tags.append(fixed)
        repaired_tags.append(len(repaired))
    repairs.report()
    if tokens and not any(tokens):  # one empty record teaches nothing (`debug data` warns); all: no data
        raise BertTasksError(
            f"{source}: every record's {tokens_column!r} is an empty list, so there is nothing to train on "
            "or score; give the sentences' tokens"
        )
    return _token_dataset(tokens, tags, repaired_tags)


def _token_dataset(
    tokens: list[list[str]],
    tags: list[list[str]],
    repaired_tags: list[int],
    context: dict[str, list[list[str]]] | None = None,
) -> Dataset:
    from datasets import Dataset  # deferred: every line is checked before the library loads

    return Dataset.from_dict(
        {"tokens": tokens, "tags": tags, "repaired_tags": repaired_tags, **(context or {})}
    )


def _check_spans(where: str, text: str, spans: Any) -> list[tuple[int, int, str]]:
    """Validate `[{"start", "end", "label"[, "text"]}]` and return them sorted; overlaps are an error.

    The one span check of every span format (JSONL spans, Label Studio, doccano): integer offsets in
    range, an entity type for a label, the span's own `text` (where the format keeps one) equal to
    `text[start:end]`, and no overlaps.
    """
    if not isinstance(spans, list):
        raise BertTasksError(f"{where}: 'spans' must be a list of {{start, end, label}} objects")
    checked = sorted(_check_span(where, number, text, span) for number, span in enumerate(spans, start=1))
    for (s1, e1, _), (s2, e2, _) in itertools.pairwise(checked):
        if s2 < e1:
            raise BertTasksError(
                f"{where}: spans {text[s1:e1]!r} [{s1}, {e1}) and {text[s2:e2]!r} [{s2}, {e2}) overlap; "
                "keep one of them (nested entities are not supported)"
            )
    return checked


def _check_span(where: str, number: int, text: str, span: Any) -> tuple[int, int, str]:
    """One span as (start, end, label), its offsets read as UTF-16 units where only they hit its text."""
    fields = span if isinstance(span, dict) else {}
    start, end, label = fields.get("start"), fields.get("end"), fields.get("label")
    for name, offset in (("start", start), ("end", end)):
        if isinstance(offset, bool) or (offset is not None and not isinstance(offset, int)):
            raise BertTasksError(
                f"{where}: span {number}: {name} is {describe(offset)}, not an integer character "
                "offset; fix the offsets"
            )
    said = fields.get("text")
    if isinstance(start, int) and isinstance(end, int) and "text" in fields and text[start:end] != said:
        start, end = _utf16_offsets(text, said, start, end) or (start, end)
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(text)):
        raise BertTasksError(
            f"{where}: span {span!r} needs integer start < end within the text (length {len(text)}); "
            "fix the offsets"
        )
    if "text" in fields and said != text[start:end]:
        claimed = repr(said) if isinstance(said, str) else describe(said)
        raise BertTasksError(
            f"{where}: span [{start}, {end}) covers {text[start:end]!r} but says its text is {claimed}; "
            "fix the offsets or the span's text"
        )
    if isinstance(label, str) and label.strip() and label != label.strip():
        raise _spaced_tag(where, f"span label {label!r}", label)
    if not isinstance(label, str) or not label or label.startswith(("B-", "I-")) or label == "O":
        raise BertTasksError(
            f"{where}: span label {label!r} must be an entity type such as 'Disease' (no B-/I- prefix)"
        )
    check_text(label, where, f"the label of span {number}")
    return start, end, label


def _utf16_offsets(text: str, said: Any, start: int, end: int) -> tuple[int, int] | None:
    """A span that misses its own text: the same offsets read as UTF-16 code units, if they hit it.

    Browser-based annotation tools count in JavaScript's UTF-16 units, so every span after an emoji
    (two units, one character) is shifted by one (label-studio#1347); the span's text says where it is.
    """
    units = text.encode("utf-16-le")
    if not 0 <= start < end <= len(units) // 2:
        return None
    first = len(units[: start * 2].decode("utf-16-le", errors="ignore"))
    last = len(units[: end * 2].decode("utf-16-le", errors="ignore"))
    return (first, last) if text[first:last] == said else None


Span = tuple[int, int, str]


def spans_to_tags(
    offsets: list[tuple[int, int]], spans: list[Span]
) -> tuple[list[str], list[Span], list[Span]]:
    """Tag words from sorted, non-overlapping character spans; return the tags, the spans that cut a word
    (tagged as whole words) and the spans left with no word to tag (dropped).

    A word touched by a span gets the span's label as a whole (a tokenizer-level tag cannot split it).
    A word touched by two spans keeps the first one: the second, when that was its only word, is lost.
    """
    tags = ["O"] * len(offsets)
    ends = [we for _, we in offsets]
    cutting: list[Span] = []
    lost: list[Span] = []
    for start, end, label in spans:
        inside = []
        for i in range(bisect.bisect_right(ends, start), len(offsets)):
            if offsets[i][0] >= end:
                break
            if tags[i] == "O":
                inside.append(i)
        if not inside:
            lost.append((start, end, label))
        elif any(offsets[i][0] < start or offsets[i][1] > end for i in inside):
            cutting.append((start, end, label))
        for n, i in enumerate(inside):
            tags[i] = ("B-" if n == 0 else "I-") + label
    return tags, cutting, lost


def read_jsonl_spans(
    path: str | Path, text_column: str = "text", splitter: WordSplitter | None = None
) -> Dataset:
    """Read JSON Lines records `{"text": ..., "spans": [{"start", "end", "label"}]}` into word-level BIO.

    Words come from `splitter` (the model's `word_splitter`, which prediction uses too), so training and
    prediction see the same words. A span that cuts a word (or covers no word) is kept at word
    granularity and listed in one warning; overlapping spans are an error.
    """
    path = Path(path)
    return spans_dataset(path, _jsonl_span_examples(path, read_utf8(path), text_column), splitter)


#: One text with its character spans, as a span format gives them: (`file:line`, text, spans).
SpanExample = tuple[str, str, Any]


def _jsonl_span_examples(path: Path, raw: str, text_column: str) -> Iterator[SpanExample]:
    return _span_examples(json_records(path, raw), text_column)


def _span_examples(records: Records, text_column: str) -> Iterator[SpanExample]:
    for where, record in records:
        yield where, span_text(where, record.get(text_column), text_column), record.get("spans", [])


def span_text(where: str, text: Any, field: str) -> str:
    """The text a span format annotates, which must be a string."""
    if not isinstance(text, str):
        raise BertTasksError(f"{where}: field {field!r} must be a string; fix the record or set text_column")
    return check_text(text, where, f"the text in {field!r}")


def spans_dataset(
    path: str | Path, examples: Iterable[SpanExample], splitter: WordSplitter | None = None
) -> Dataset:
    """Texts with character spans (any span format) -> words (cut by `splitter`), BIO tags, texts and
    word offsets.

    Every span passes `_check_spans`; spans that cut a word are listed in one warning.
    """
    columns: dict[str, list] = {"tokens": [], "tags": [], "repaired_tags": [], "text": [], "word_offsets": []}
    cut_reports: list[str] = []
    lost_reports: list[str] = []
    for where, text, raw_spans in examples:
        spans = _check_spans(where, text, raw_spans)
        words, offsets = words_with_offsets(text, splitter)
        tags, cutting, lost = spans_to_tags(offsets, spans)
        cut_reports += [f"{where} {text[s:e]!r}" for s, e, _ in cutting]
        lost_reports += [f"{where} {text[s:e]!r} ({label})" for s, e, label in lost]
        columns["tokens"].append(words)
        columns["tags"].append(tags)
        columns["repaired_tags"].append(0)  # spans give valid BIO by construction
        columns["text"].append(text)
        columns["word_offsets"].append([list(o) for o in offsets])
    if not columns["text"]:
        raise BertTasksError(f"{path}: no records found; give at least one annotated text")
    if cut_reports:
        logger.warning(
            "%s: %d span(s) do not fall on word boundaries; whole words were tagged instead: %s",
            path,
            len(cut_reports),
            _first_five(cut_reports),
        )
    if lost_reports:
        logger.warning(
            "%s: %d span(s) tag no word of their own (their word holds an earlier span, or they cover no "
            "word) and were dropped: %s; a word_splitter that splits them apart keeps them",
            path,
            len(lost_reports),
            _first_five(lost_reports),
        )
    from datasets import Dataset

    return Dataset.from_dict(columns)


def _first_five(reports: list[str]) -> str:
    return "; ".join(reports[:5]) + (" ..." if len(reports) > 5 else "")


def read_hub_ner(
    dataset_id: str, split: str, tokens_column: str = "tokens", tag_column: str = "ner_tags"
) -> Dataset:
    """Download one split of a Hub NER dataset (`path/config`, like `glue/sst2`) as `tokens`/`tags`.

    ClassLabel tag ids are mapped to their names, so the saved model gets real names in `id2label`.
    """
    from datasets import ClassLabel

    where = f"dataset={dataset_id} ({split})"
    data = load_hub_split(dataset_id, split, (tokens_column, tag_column), "tokens_column/tag_column")
    feature = getattr(data.features[tag_column], "feature", None)
    names = feature.names if isinstance(feature, ClassLabel) else None
    repairs = _RepairLog(Path(where))
    tags, repaired_tags = [], []
    for i, row in enumerate(data[tag_column]):
        row_tags = [names[t] for t in row] if names else [str(t) for t in row]
        for tag in row_tags:
            check_tag(tag, f"{where} row {i}")
        fixed, repaired = repairs.to_bio(row_tags, [f"row {i}"] * len(row_tags))
        tags.append(fixed)
        repaired_tags.append(len(repaired))
    repairs.report()
    return _token_dataset([list(t) for t in data[tokens_column]], tags, repaired_tags)


def read_ner_file(path: str | Path, cfg: Config, splitter: WordSplitter | None = None) -> Dataset:
    """Read one NER file in `cfg.format`; `auto` picks by extension, JSON by its first record's fields, and
    a name without an extension (a stream such as `<(...)`) is JSON when its first line opens an object,
    else columns. Texts with spans are cut into words by `splitter` (default: `default`)."""
    path = Path(path)
    fmt = cfg.format if cfg.format != "auto" else _format_of_suffix(path)
    if fmt == "conll":
        return read_conll(path, cfg.conll_tag_index)
    text = read_utf8(path)  # read once and parsed here: a FIFO or `<(...)` can be read only once
    if fmt is None:  # no extension: its first line says
        if not opens_json(text):
            return _conll_dataset(path, text, cfg.conll_tag_index)
        fmt = "json"
    if fmt == "json":
        fmt = _format_of_record(path, text, cfg)
    if fmt == "jsonl-tokens":
        return _tokens_dataset(
            path, json_records(path, text), cfg.tokens_column, cfg.tag_column, cfg.label_names
        )
    if fmt == "jsonl-spans":
        return spans_dataset(path, _jsonl_span_examples(path, text, cfg.text_column), splitter)
    from bert_tasks.data import annotation_tools  # the two tools' formats: only their files need them

    examples = {
        "label-studio": annotation_tools.label_studio_examples,
        "doccano": annotation_tools.doccano_examples,
    }
    return spans_dataset(path, examples[fmt](path, text, cfg.text_column), splitter)  # fmt: Config checked


def read_ner_records(
    source: str, records: Records, cfg: Config, splitter: WordSplitter | None = None
) -> Dataset:
    """In-memory records (`data/in_memory.py`) with tokens + tags, or text + spans, read by the checks and
    messages of the JSONL readers; the first record's fields say which."""
    first = next(records, None)
    if first is None:
        raise BertTasksError(f"{source}: no rows; give at least one annotated example")
    rows = itertools.chain([first], records)
    fields = first[1]
    if cfg.tokens_column in fields:
        return _tokens_dataset(source, rows, cfg.tokens_column, cfg.tag_column, cfg.label_names)
    if cfg.text_column in fields and "spans" in fields:
        return spans_dataset(source, _span_examples(rows, cfg.text_column), splitter)
    raise BertTasksError(
        f"{first[0]}: fields {sorted(fields)}; NER data needs {cfg.tokens_column!r} + {cfg.tag_column!r}, "
        f"or {cfg.text_column!r} + 'spans'; set tokens_column/tag_column/text_column"
    )


def is_conll_file(path: str | Path, cfg: Config) -> bool:
    """Whether `read_ner_file` reads `path` as CoNLL columns by its name or `format=` alone (a name
    without an extension, whose content decides, is not known to be)."""
    return (cfg.format if cfg.format != "auto" else _format_of_suffix(Path(path))) == "conll"


def _format_of_suffix(path: Path) -> str | None:
    """`conll` or `json` (decided by content) from the extension, None without one, or a one-line error."""
    suffix = path.suffix.lower()
    if suffix in COLUMN_SUFFIXES:
        return "conll"
    if suffix in JSON_SUFFIXES:
        return "json"
    if not suffix:
        return None
    raise BertTasksError(
        f"{path}: unknown NER file type {suffix!r}; use {', '.join(COLUMN_SUFFIXES + JSON_SUFFIXES)}, or "
        "name the format (e.g. format=conll)"
    )


def _format_of_record(path: Path, text: str, cfg: Config) -> str:
    """The JSON format the first record's fields show, when exactly one format fits them."""
    from bert_tasks.data.annotation_tools import is_doccano, is_label_studio

    _, first = next(json_records(path, text), (None, None))
    if first is None:
        raise BertTasksError(f"{path}: no records found; give at least one JSON object")
    fits = {
        "jsonl-tokens": cfg.tokens_column in first,
        "jsonl-spans": cfg.text_column in first and "spans" in first,
        "label-studio": is_label_studio(first),
        "doccano": is_doccano(first, cfg.text_column),
    }
    found = [fmt for fmt, fit in fits.items() if fit]
    if len(found) == 1:
        return found[0]
    if found:
        raise BertTasksError(
            f"{path}: the first record fits more than one NER format ({', '.join(found)}); "
            f"name it with format={found[0]} (or another)"
        )
    raise BertTasksError(
        f"{path}: first record has fields {sorted(first)}; NER JSON needs {cfg.tokens_column!r} + "
        f"{cfg.tag_column!r}, or {cfg.text_column!r} + 'spans', or a Label Studio or doccano export; "
        "set tokens_column/tag_column/text_column, or format="
    )
