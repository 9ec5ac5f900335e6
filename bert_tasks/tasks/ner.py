"""Named-entity recognition: word-level BIO tags predicted from BERT's sub-token logits.

The pieces that are NER-only live here: aligning word tags with sub-tokens, merging overlapping windows
back into words, BIO-constrained Viterbi decoding, and mapping entities back onto character offsets.

Alignment policy (training and scoring agree on it):
- The first sub-token of a word carries the word's label, the others -100 (or, with
  `label_all_subtokens`, the continuation pieces carry the label with B- turned into I-).
- Long sentences are split into overlapping windows by the fast tokenizer; a word in the overlap is
  labelled in every window whose slice holds its first sub-token (training sees it in both contexts).
- A word the tokenizer turns into no sub-token at all (zero-width or control characters) is fed as the
  tokenizer's unknown token, so every word gets exactly one prediction and gold lengths always match.
- With `document_context`, a sentence of a file that marks documents is encoded between the nearest
  words of its neighbours that fit one window beside it (`data/document_context.py`); those words are
  read, never labelled or scored.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bert_tasks.data.document_context import AFTER, BEFORE, MAX_CONTEXT_WORDS
from bert_tasks.data.ner_files import (
    FILE_FORMATS,
    inputs_to_columns,
    is_conll_file,
    read_hub_ner,
    read_ner_file,
    read_ner_records,
    texts_to_columns,
    token_input,
)
from bert_tasks.data.word_splitters import DEFAULT as DEFAULT_SPLITTER
from bert_tasks.data.word_splitters import word_splitter as splitter_named
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.base import SplitProfile, Task, TaskCard, score_table

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from transformers import BatchEncoding, PreTrainedTokenizerBase

    from bert_tasks.config import Config
    from bert_tasks.data.in_memory import Records
    from bert_tasks.data.table import Table
    from bert_tasks.model_dir import ModelPolicy

logger = logging.getLogger(__name__)

METRIC_DIR = Path(__file__).resolve().parents[1] / "metrics" / "ner"
_DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "ner"
IGNORE = -100
#: `document_context=auto` on a training file that marks documents: words on each side of a sentence.
#: FLERT used 64 sub-tokens (~45 CoNLL words); 16 words (~20 sub-tokens) triples the tokens of a CoNLL
#: sentence instead of multiplying them by 6 (BENCHMARKS.md, "Document context").
DEFAULT_DOCUMENT_CONTEXT = 16
AUTO = "auto"


@lru_cache(maxsize=1)
def load_ner_metric() -> Any:
    """The local seqeval-based `evaluate` module (works offline, unlike `evaluate.load("seqeval")`)."""
    import evaluate  # deferred: its import takes seconds and only scoring needs it

    return evaluate.load(str(METRIC_DIR))


def bio_label_names(tags: Sequence[Sequence[str]]) -> list[str]:
    """`O` first, then `B-X`, `I-X` for every entity type X in `tags`, types sorted by name."""
    types = sorted({tag[2:] for row in tags for tag in row if tag != "O"})
    return ["O"] + [f"{prefix}-{name}" for name in types for prefix in ("B", "I")]


def bio_problem(names: Sequence[str]) -> str | None:
    """What keeps label names from being BIO (O, B-X, I-X, both prefixes per type), or None: the scorer,
    the Viterbi transitions and the entity spans read every name as BIO, so a stray `Disease` would only
    fail at the first eval, and a model dir's `S-X` would be predicted as an entity of type `X`'s tail."""
    bad = [name for name in names if name != "O" and not (name[:2] in ("B-", "I-") and len(name) > 2)]
    types = {name[2:] for name in names if name != "O"} - set(bad)
    half = [
        f"{prefix}-{kind}" for kind in sorted(types) for prefix in "BI" if f"{prefix}-{kind}" not in names
    ]
    if bad or half:
        return f"names {bad} are not BIO" if bad else f"lacks {half}"
    return None


def _check_bio_names(names: Sequence[str]) -> None:
    """Refuse `label_names` that are not BIO (`bio_problem`), before anything is trained."""
    problem = bio_problem(names)
    if problem:
        raise BertTasksError(
            f"label_names={list(names)}: {problem}; give O plus B-TYPE and I-TYPE for every entity type"
        )


def align_labels(
    word_ids: Sequence[int | None],
    first_piece: Sequence[bool],
    word_label_ids: Sequence[int],
    id2label: dict[int, str],
    label2id: dict[str, int],
    label_all_subtokens: bool = False,
) -> list[int]:
    """Per-token label ids for one window: word label on first pieces, -100 (or I-X) on the rest.

    Args:
        word_ids: The window's word index per token, None for special tokens.
        first_piece: Whether each token is its word's first sub-token.
        word_label_ids: Label id per word of the whole example.
    """
    labels = []
    for word, first in zip(word_ids, first_piece, strict=True):
        if word is None or word_label_ids[word] == IGNORE:  # special token, or context: read, not learnt
            labels.append(IGNORE)
        elif first:
            labels.append(word_label_ids[word])
        elif label_all_subtokens:
            tag = id2label[word_label_ids[word]]
            labels.append(label2id["I-" + tag[2:]] if tag.startswith("B-") else word_label_ids[word])
        else:
            labels.append(IGNORE)
    return labels


def first_pieces(encoding: BatchEncoding) -> list[list[bool]]:
    """Per window and token: is it its word's first sub-token (not a continuation piece)?

    Offsets are relative to the word (`is_split_into_words`), so the first piece has the smallest start
    of the word's pieces across all windows; this also flags a window that starts inside a word. Only the
    first token of a window at that start counts: SentencePiece and byte-level tokenizers (DeBERTa, XLM-R,
    RoBERTa) may split a word into a lone space marker (`▁`, `Ġ`) and its text, both starting at 0.
    """
    samples = encoding["overflow_to_sample_mapping"]
    word_start: dict[tuple[int, int], int] = {}
    for i, sample in enumerate(samples):
        for word, (start, _) in zip(encoding.word_ids(i), encoding["offset_mapping"][i], strict=True):
            if word is not None:
                word_start[sample, word] = min(start, word_start.get((sample, word), start))
    flags = []
    for i, sample in enumerate(samples):
        seen: set[int] = set()
        window = []
        for word, (start, _) in zip(encoding.word_ids(i), encoding["offset_mapping"][i], strict=True):
            first = word is not None and word not in seen and start == word_start[sample, word]
            if first:
                seen.add(word)
            window.append(first)
        flags.append(window)
    return flags


def merge_windows(
    example_ids: Sequence[int],
    window_word_ids: Sequence[Sequence[int]],
    window_logits: Sequence[np.ndarray],
    num_words: Sequence[int],
) -> list[np.ndarray]:
    """Per example, a [num_words, num_labels] array: each word's first-sub-token logits from one window.

    The window chosen for a word is the one where its first sub-token has the most context, i.e. the
    largest distance to the nearer window edge (the max-context rule of BERT's SQuAD code). Ties go to the
    earlier window; windows must be in encoding order. A window that starts in the middle of a word has
    distance 0 there, so it never beats the earlier window holding the word's real first sub-token.
    """
    num_labels = np.asarray(window_logits[0]).shape[-1] if len(window_logits) else 0
    merged = [np.zeros((n, num_labels), dtype=np.float32) for n in num_words]
    best = [np.full(n, -1) for n in num_words]
    for example, word_ids, logits in zip(example_ids, window_word_ids, window_logits, strict=True):
        logits = np.asarray(logits, dtype=np.float32)  # [seq_len (maybe padded), num_labels]
        content = [p for p, w in enumerate(word_ids) if w >= 0]
        if not content:
            continue
        first, last = content[0], content[-1]
        previous = -1
        for p in content:
            word = word_ids[p]
            if word != previous:
                context = min(p - first, last - p)
                if context > best[example][word]:
                    best[example][word] = context
                    merged[example][word] = logits[p]
            previous = word
    return merged


def _sentence_word_ids(word_ids: Sequence[int | None], offset: int, words: int) -> list[int]:
    """A window's word index per token within its sentence: -1 for special tokens and context words
    (the sentence's words start at `offset` in the encoded words)."""
    return [-1 if w is None or not offset <= w < offset + words else w - offset for w in word_ids]


def _framed(before: list[list[str]], sentences: list[list[str]], after: list[list[str]]) -> list[list[str]]:
    """Each sentence's words between its context words: what is encoded."""
    return [b + sentence + a for b, sentence, a in zip(before, sentences, after, strict=True)]


def _fit_context(
    before: list[list[str]],
    sentences: list[list[str]],
    after: list[list[str]],
    tokenizer: PreTrainedTokenizerBase,
    room: int,
    spilled: list[int],
) -> tuple[list[list[str]], list[list[str]]]:
    """The context of the `spilled` rows (more than one window with it) cut, farthest words first, to what
    fits one window beside its sentence: context must never push a sentence that fits a window into a
    second one (FLERT keeps the sentence whole and cuts its context). A sentence longer than a window
    keeps no context; its own windows overlap. Only those rows are counted: most rows never spill."""
    before, after = list(before), list(after)
    rows = [before[i] + sentences[i] + after[i] for i in spilled]
    # untruncated, to count: no "longer than the model's maximum" warning, the windows come after
    pieces = tokenizer(rows, is_split_into_words=True, add_special_tokens=False, verbose=False)
    for j, i in enumerate(spilled):
        b, sentence, a = before[i], sentences[i], after[i]
        counts = [0] * len(rows[j])  # sub-tokens per word
        for word in pieces.word_ids(j):
            if word is not None:
                counts[word] += 1
        budget = room - sum(counts[len(b) : len(b) + len(sentence)])
        left, right = _nearest_that_fit(counts[: len(b)][::-1], counts[len(b) + len(sentence) :], budget)
        before[i], after[i] = b[len(b) - left :], a[:right]
    return before, after


def _nearest_that_fit(left: list[int], right: list[int], budget: int) -> tuple[int, int]:
    """How many context words each side keeps (sub-token counts given nearest first): the sides take a
    word in turn while it fits the sub-tokens left, so the sentence stays near the middle."""
    sides, taken, open_sides = (left, right), [0, 0], [True, True]
    while any(open_sides):
        side = 0 if open_sides[0] and (taken[0] <= taken[1] or not open_sides[1]) else 1
        counts = sides[side]
        if taken[side] < len(counts) and counts[taken[side]] <= budget:
            budget -= counts[taken[side]]
            taken[side] += 1
        else:
            open_sides[side] = False
    return taken[0], taken[1]


def entity_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of each entity in BIO tags, read as seqeval and conlleval read them.

    An entity opens at B-X, or at an I-X that does not continue an X entity (a stray I-X after O or
    another type), and runs over the I-X that follow. Hand-written because seqeval's own `get_entities`
    imports scikit-learn, about 1.3 s of every `bert-tasks predict ner`; tests pin it to seqeval's.
    """
    spans: list[tuple[str, int, int]] = []
    for i, tag in enumerate(tags):
        if tag == "O":
            continue
        kind = tag[2:]
        if tag.startswith("I-") and spans and spans[-1][0] == kind and spans[-1][2] == i - 1:
            spans[-1] = (kind, spans[-1][1], i)
        else:
            spans.append((kind, i, i))
    return spans


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, stable for large logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def bio_transitions(labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Allowed start tags [C] and transitions [C_prev, C_next]: I-X only after B-X or I-X."""
    start = np.array([not label.startswith("I-") for label in labels])
    allowed = np.ones((len(labels), len(labels)), dtype=bool)
    for j, label in enumerate(labels):
        if label.startswith("I-"):
            allowed[:, j] = [prev[2:] == label[2:] and prev != "O" for prev in labels]
    return start, allowed


def viterbi_decode(log_probs: np.ndarray, labels: Sequence[str]) -> list[int]:
    """The highest-scoring label sequence that is valid BIO, for one sentence's [n_words, C] scores.

    Hand-written (a dozen numpy lines) because the constraint is the whole point and no installed
    library decodes BIO-constrained sequences from independent per-token scores.
    """
    if len(log_probs) == 0:
        return []
    start, allowed = bio_transitions(labels)
    transition = np.where(allowed, 0.0, -np.inf)  # [C_prev, C_next]
    score = log_probs[0] + np.where(start, 0.0, -np.inf)  # [C]
    backpointers = np.zeros(log_probs.shape, dtype=np.int64)  # [n_words, C]
    for t in range(1, len(log_probs)):
        candidates = score[:, None] + transition  # [C_prev, C_next]
        backpointers[t] = candidates.argmax(axis=0)
        score = candidates.max(axis=0) + log_probs[t]
    path = [int(score.argmax())]
    for t in range(len(log_probs) - 1, 0, -1):
        path.append(int(backpointers[t, path[-1]]))
    return path[::-1]


def _entities(
    tags: list[str], probs: np.ndarray, text: str | None, offsets: list | None, given_tokens: bool
) -> list[dict[str, Any]]:
    """The entities of one row's tags: character offsets where the row has them, token indices where the
    user gave the tokens; the score is the mean probability of the entity's tags."""
    entities = []
    for label, first, last in entity_spans(tags):
        entity: dict[str, Any] = {"label": label}
        if offsets is not None:
            start, end = offsets[first][0], offsets[last][1]
            entity = {"text": text[start:end], "label": label, "start": start, "end": end}
        if given_tokens:
            entity |= {"token_start": first, "token_end": last + 1}
        entities.append({**entity, "score": float(probs[first : last + 1].mean())})
    return entities


def _shown(text: str | None, prediction: Any) -> tuple[str, list[dict[str, Any]], list[str]]:
    """What people are shown of a prediction: the text, its entities with offsets into it, and each
    entity's position (`start-end` in characters, or `#start-end` in tokens for tokens without a text,
    which are shown joined by spaces)."""
    if not isinstance(prediction, dict):
        return text or "", prediction, [f"{e['start']:>5}-{e['end']:<5}" for e in prediction]
    entities = prediction["entities"]
    if "text" in prediction:
        return prediction["text"], entities, [f"{e['start']:>5}-{e['end']:<5}" for e in entities]
    tokens = prediction["tokens"]
    starts = list(itertools.accumulate((len(token) + 1 for token in tokens), initial=0))
    joined = " ".join(tokens)
    placed = [
        {**e, "text": joined[starts[e["token_start"]] : starts[e["token_end"]] - 1]}
        | {"start": starts[e["token_start"]], "end": starts[e["token_end"]] - 1}
        for e in entities
    ]
    return joined, placed, [f"#{e['token_start']:>4}-{e['token_end']:<5}" for e in entities]


class NerTask(Task):
    """Token classification with BIO tags (BC5CDR-style Disease/Chemical, CoNLL-2003, NCBI-disease)."""

    name = "ner"
    head = "AutoModelForTokenClassification"
    # epochs chosen (and lr kept) on BC5CDR's and NCBI-disease's dev sets by bench/defaults_sweep.py's
    # protocol (BENCHMARKS.md, "Defaults chosen by a protocol"); an upper bound under early stopping.
    config_defaults: ClassVar[dict[str, Any]] = {
        "lr": 1e-4,
        "epochs": 5.0,
        "max_length": 256,
        "batch_size": 16,
        "train_file": str(_DEMO / "train.conll"),
        "validation_file": str(_DEMO / "validation.conll"),
    }
    options = ("label_all_subtokens", "viterbi", "word_splitter", "document_context")
    reader_keys = ("tokens_column", "tag_column", "conll_tag_index")
    #: It only says which sub-tokens carry a training label: prediction reads each word's first piece.
    trained_options = ("label_all_subtokens",)
    input_fields = ("text", "tokens")
    #: Words are encoded pre-split (`is_split_into_words`): byte-level BPE tokenizers (RoBERTa, GPT-2's)
    #: must then encode each word as running text does, after a space ("Ġword"), not as a text's first
    #: word. Saved with the tokenizer, so prediction and vanilla pipelines encode words the same way;
    #: WordPiece and SentencePiece tokenizers ignore it (they mark words on their own).
    tokenizer_options: ClassVar[dict[str, Any]] = {"add_prefix_space": True}
    default_metric = "f1"
    metric_names = ("f1", "precision", "recall", "accuracy", "strict_f1", "strict_precision", "strict_recall")
    file_formats = FILE_FORMATS
    pad_to_multiple_of = 8  # tensor cores

    def __init__(
        self,
        label_all_subtokens: bool = False,
        viterbi: bool = True,
        word_splitter: str | None = None,
        document_context: int | str = 0,
    ) -> None:
        """`word_splitter=None`: not chosen yet (`infer_options` chooses it); texts are cut by `default`.
        `document_context`: words each side (0 = none, the value of dirs saved before it); `auto` until
        `infer_options` settles it reads as `DEFAULT_DOCUMENT_CONTEXT`."""
        super().__init__(
            label_all_subtokens=label_all_subtokens,
            viterbi=viterbi,
            word_splitter=word_splitter,
            document_context=document_context,
        )
        if document_context != AUTO and not (  # a bool is an int to Python, not a count to a user
            type(document_context) is int and 0 <= document_context <= MAX_CONTEXT_WORDS
        ):
            raise BertTasksError(
                f"document_context={document_context!r} must be a word count in [0, {MAX_CONTEXT_WORDS}] "
                f"or {AUTO}"
            )
        self.label_all_subtokens = label_all_subtokens
        self.viterbi = viterbi
        self.splitter = splitter_named(word_splitter or DEFAULT_SPLITTER)
        self.context_words = DEFAULT_DOCUMENT_CONTEXT if document_context == AUTO else int(document_context)

    def read_file(self, path: str, cfg: Config) -> Dataset:
        """CoNLL, JSONL tokens + tags, JSONL text + spans, or a Label Studio/doccano export (BIO repaired)."""
        return read_ner_file(path, cfg, self.splitter)

    def read_hub(self, dataset: str, split: str, cfg: Config) -> Dataset:
        """A hub split with ClassLabel tag ids turned into names."""
        return read_hub_ner(dataset, split, cfg.tokens_column, cfg.tag_column)

    def read_memory(self, records: Records, source: str, cfg: Config) -> Dataset:
        """Records of tokens + tags, or text + spans, checked as the JSONL readers check them."""
        return read_ner_records(source, records, cfg, self.splitter)

    def check_splits(self, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config) -> None:
        """Every entity type of validation/test must occur in the training data."""
        known = {tag[2:] for row in splits["train"]["tags"] for tag in row if tag != "O"}
        for split, data in splits.items():
            unseen = sorted({tag[2:] for row in data["tags"] for tag in row if tag != "O"} - known)
            if unseen:
                raise BertTasksError(
                    f"{sources[split]}: entity type {unseen[0]!r} never occurs in the training data "
                    f"({sources['train']}); add training examples of it (or raise max_train_samples)"
                )

    @classmethod
    def label_problem(cls, labels: Sequence[str]) -> str | None:
        """A model dir's labels must be BIO: entity types are read off their `B-`/`I-` prefixes."""
        problem = bio_problem(labels)
        return problem and f"{problem} (a NER model's labels are O plus B-TYPE and I-TYPE per entity type)"

    def unused_options(self, raw: Dataset, cfg: Config) -> dict[str, str]:
        """`word_splitter` and `text_column` read texts: a file of tokens (CoNLL, JSONL tokens) has none;
        `document_context` reads the neighbours of a file that marks documents; a CoNLL file's columns are
        read by position, its tags by name (`tokens_column`, `tag_column`, `label_names` name JSON's)."""
        unused = {}
        if "text" not in raw.column_names:
            unused |= dict.fromkeys(("word_splitter", "text_column"), "gives its own tokens, no text to cut")
        if BEFORE not in raw.column_names:
            unused["document_context"] = "marks no documents (-DOCSTART- lines): no sentence has neighbours"
        if cfg.test_file is not None and is_conll_file(cfg.test_file, cfg):
            why = "is a CoNLL file: its columns are read by position and its tags by name"
            unused |= dict.fromkeys(("tokens_column", "tag_column", "label_names"), why)
        return unused

    def profile_split(self, raw: Dataset) -> SplitProfile:
        """Each example is its words joined by spaces with its tags; the distribution counts entities per
        type (as seqeval reads them), beside the tag counts and the stray I- tags the reader repaired."""
        words, tags = raw["tokens"][:], raw["tags"][:]
        entities = Counter(kind for row in tags for kind, _, _ in entity_spans(row))
        counts: dict[str, int | dict[str, int]] = {"tags": dict(Counter(tag for row in tags for tag in row))}
        warnings = []
        if "repaired_tags" in raw.column_names:  # the file readers count them; other sources cannot
            repaired = raw["repaired_tags"][:]
            counts["repaired_tags"] = total = sum(repaired)
            if total:
                warnings.append(
                    f"the reader repaired {total} stray I- tag(s) (I-X not continuing an X entity -> B-X, "
                    f"as seqeval reads them) in {sum(1 for n in repaired if n)} sentence(s)"
                )
        return SplitProfile(
            keys=[" ".join(row) for row in words],
            golds=[tuple(row) for row in tags],
            labels=dict(entities),
            unit="entities",
            counts=counts,
            warnings=warnings,
        )

    def infer_options(self, train: Dataset, cfg: Config) -> dict[str, Any]:
        """The word splitter, unless the user named one: for a corpus of tokens, the candidate that gives
        them back best from their raw text (one INFO line with the agreement, `data/splitter_choice.py`);
        texts with spans were cut into words by the splitter they were read with, which stays. And the
        document context: `auto` is `DEFAULT_DOCUMENT_CONTEXT` words where the training file marks its
        documents, else none; a count given for data that marks none is said to apply nowhere."""
        return self._infer_context(train, cfg) | self._infer_splitter(train, cfg)

    def _infer_context(self, train: Dataset, cfg: Config) -> dict[str, Any]:
        marked = BEFORE in train.column_names
        if cfg.document_context == AUTO:
            if marked:
                logger.info(
                    "document_context=%d: the training file marks its documents, so each sentence is read "
                    "between up to %d words of its neighbours on each side; set document_context=0 to "
                    "read sentences alone",
                    DEFAULT_DOCUMENT_CONTEXT,
                    DEFAULT_DOCUMENT_CONTEXT,
                )
            return {"document_context": DEFAULT_DOCUMENT_CONTEXT if marked else 0}
        if cfg.document_context and not marked:  # a warning, not an error: a CoNLL teacher's count
            # reaches its student through distill's policy layer, and raw texts to distil on mark nothing
            logger.warning(
                "document_context=%s: the training data marks no documents (CoNLL -DOCSTART- lines), so "
                "its sentences are read alone; set document_context=0 to say so",
                cfg.document_context,
            )
        return {}

    def _infer_splitter(self, train: Dataset, cfg: Config) -> dict[str, Any]:
        if cfg.word_splitter is not None:
            return {}
        if "word_offsets" in train.column_names:
            return {"word_splitter": self.splitter.spec}
        from bert_tasks.data.splitter_choice import choose_splitter

        choice = choose_splitter(train["tokens"][:])
        logger.info(choice.describe())
        return {"word_splitter": choice.splitter}

    def label_names(self, train: Dataset, cfg: Config) -> list[str]:
        """`cfg.label_names` when given (checked against train), else O + B-/I- of every train type."""
        found = bio_label_names(train["tags"])
        if cfg.label_names is None:
            return found
        _check_bio_names(cfg.label_names)
        missing = sorted(set(found) - set(cfg.label_names))
        if missing or "O" not in cfg.label_names:
            raise BertTasksError(
                f"label_names={cfg.label_names} lacks {missing or ['O']} used by the training data; "
                "add them or drop label_names"
            )
        return list(cfg.label_names)

    def encode_batch(
        self,
        batch: Mapping[str, list[Any]],
        indices: Sequence[int],
        tokenizer: PreTrainedTokenizerBase,
        label2id: dict[str, int] | None,
        max_length: int,
        stride: int,
    ) -> dict[str, list[Any]]:
        """Split each sentence into overlapping windows of sub-tokens with aligned word labels."""
        room = max_length - tokenizer.num_special_tokens_to_add()
        if not 0 <= stride < room:
            raise BertTasksError(
                f"stride={stride} must be >= 0 and < max_length - special tokens ({room}); lower stride"
            )
        id2label = {i: label for label, i in label2id.items()} if label2id is not None else {}

        def tokenize(words: list[list[str]]) -> Any:
            return tokenizer(
                words,
                is_split_into_words=True,
                truncation=True,
                max_length=max_length,
                stride=stride,
                return_overflowing_tokens=True,
                return_offsets_mapping=label2id is not None,  # only label alignment reads them
            )

        before, after = self._context(batch)
        words = _framed(before, batch["tokens"], after)
        encoding = tokenize(words)
        windows = Counter(encoding["overflow_to_sample_mapping"])
        spilled = [i for i, n in sorted(windows.items()) if n > 1 and (before[i] or after[i])]
        if spilled:
            before, after = _fit_context(before, batch["tokens"], after, tokenizer, room, spilled)
            words = _framed(before, batch["tokens"], after)
            encoding = tokenize(words)
        covered = [set() for _ in words]
        for i, sample in enumerate(encoding["overflow_to_sample_mapping"]):
            covered[sample].update(w for w in encoding.word_ids(i) if w is not None)
        if any(len(seen) < len(row) for seen, row in zip(covered, words, strict=True)):
            words = [
                [w if j in seen else tokenizer.unk_token for j, w in enumerate(row)]
                for seen, row in zip(covered, words, strict=True)
            ]
            encoding = tokenize(words)
        samples = encoding["overflow_to_sample_mapping"]
        out = {
            key: encoding[key] for key in ("input_ids", "token_type_ids", "attention_mask") if key in encoding
        }
        out["example_id"] = [indices[sample] for sample in samples]
        out["word_ids"] = [
            _sentence_word_ids(encoding.word_ids(i), len(before[s]), len(batch["tokens"][s]))
            for i, s in enumerate(samples)
        ]
        if label2id is not None:
            word_labels = [
                [IGNORE] * len(b) + self._label_ids(row, label2id) + [IGNORE] * len(a)
                for b, row, a in zip(before, batch["tags"], after, strict=True)
            ]
            out["labels"] = [
                align_labels(
                    encoding.word_ids(i),
                    first,
                    word_labels[samples[i]],
                    id2label,
                    label2id,
                    self.label_all_subtokens,
                )
                for i, first in enumerate(first_pieces(encoding))
            ]
        return out

    def _context(self, batch: Mapping[str, list[Any]]) -> tuple[list[list[str]], list[list[str]]]:
        """Per row, the context words encoded before and after its sentence: the nearest
        `context_words` of each side where the rows have them (files that mark documents), else none."""
        k = self.context_words
        if not k or BEFORE not in batch:
            empty: list[list[str]] = [[] for _ in batch["tokens"]]
            return empty, empty
        return [row[-k:] for row in batch[BEFORE]], [row[:k] for row in batch[AFTER]]

    @staticmethod
    def _label_ids(tags: list[str], label2id: dict[str, int]) -> list[int]:
        unknown = [tag for tag in tags if tag not in label2id]
        if unknown:
            raise BertTasksError(
                f"tag {unknown[0]!r} is not one of the model's labels {list(label2id)}; "
                "train a model that knows it or fix the data"
            )
        return [label2id[tag] for tag in tags]

    def collator(
        self, tokenizer: PreTrainedTokenizerBase, return_tensors: str = "pt"
    ) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor | np.ndarray]]:
        """Pad to the batch's longest window (multiple of 8 for tensor cores); labels padded with -100."""
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(
            tokenizer,
            pad_to_multiple_of=self.pad_to_multiple_of,
            label_pad_token_id=IGNORE,
            return_tensors=return_tensors,
        )

    def predict_tags(
        self,
        raw: Dataset | Table,
        encoded: Dataset | Table,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> list[tuple[list[str], np.ndarray]]:
        """Per raw example: word tags and each tag's probability (windows merged, then decoded)."""
        labels = [id2label[i] for i in sorted(id2label)]  # id order; keys are ints (HF config)
        merged = merge_windows(
            encoded["example_id"], encoded["word_ids"], window_logits, [len(t) for t in raw["tokens"]]
        )
        results = []
        for logits in merged:
            log_probs = log_softmax(logits) if len(logits) else logits  # [n_words, C]
            if self.viterbi:
                ids = viterbi_decode(log_probs, labels)
            else:
                ids = [int(i) for i in log_probs.argmax(axis=-1)] if len(log_probs) else []
            probs = np.exp(log_probs[np.arange(len(ids)), ids]) if ids else np.zeros(0)
            results.append(([labels[i] for i in ids], probs))
        return results

    def metrics(
        self, raw: Dataset, encoded: Dataset, window_logits: Sequence[np.ndarray], id2label: dict[int, str]
    ) -> dict[str, Any]:
        """Entity-level seqeval scores of the merged word predictions against the untruncated gold."""
        predictions = [tags for tags, _ in self.predict_tags(raw, encoded, window_logits, id2label)]
        return load_ner_metric().compute(
            predictions=predictions, references=raw["tags"], tokens=raw["tokens"]
        )

    def decode(
        self,
        raw: Dataset | Table,
        encoded: Dataset | Table,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
    ) -> list[Any]:
        """Per row: for a text cut into words, its entities with character offsets; for words the user
        gave (`given_tokens`, or rows without offsets), `{"tokens", "tags", "entities"}`: one tag per
        token, entities with `token_start`/`token_end` (a slice of the tokens) and, when the row has its
        text, character offsets too (with "text" first in the record).

        An entity's score is the mean probability of the tags chosen for its words.
        """
        predicted = self.predict_tags(raw, encoded, window_logits, id2label)
        columns, rows = raw.column_names, len(raw)
        texts = raw["text"] if "text" in columns else [None] * rows
        offsets = raw["word_offsets"] if "word_offsets" in columns else [None] * rows
        given = raw["given_tokens"] if "given_tokens" in columns else [o is None for o in offsets]
        tokens = raw["tokens"]
        results = []
        for i, (tags, probs) in enumerate(predicted):
            entities = _entities(tags, probs, texts[i], offsets[i], given[i])
            if not given[i]:
                results.append(entities)
                continue
            text = {} if texts[i] is None else {"text": texts[i]}
            results.append({**text, "tokens": tokens[i], "tags": tags, "entities": entities})
        return results

    def prediction_columns(self, texts: list[str]) -> dict[str, list[Any]]:
        """Raw texts -> the columns `encode_batch`/`decode` take for prediction (words split with offsets
        by the model's word splitter)."""
        return texts_to_columns(texts, self.splitter)

    def check_input(self, where: str, record: dict[str, Any]) -> dict[str, Any]:
        """A 'text', or the user's own 'tokens' (a list of strings; with a 'text', found in it in order)."""
        if "tokens" not in record:
            return super().check_input(where, record)
        token_input(where, record)
        return record

    def transfer_rows(self, records: list[dict[str, Any]], labels: Sequence[str]) -> Dataset:
        """The records' words as prediction takes them (a text split by the word splitter, or the user's
        tokens), every word tagged `O` as a placeholder: `encode` then marks each word's first sub-token
        (all of them with `label_all_subtokens`)."""
        from datasets import Dataset

        raw = Dataset.from_dict(self.input_columns(records))
        return raw.add_column("tags", [["O"] * len(words) for words in raw["tokens"]])

    def input_columns(self, records: list[dict[str, Any]]) -> dict[str, list[Any]]:
        """Records with 'tokens' keep them as their words; a 'text' alone is cut by the word splitter."""
        return inputs_to_columns(records, self.splitter)

    def warn_unread(self, wheres: Sequence[str], columns: Mapping[str, list[Any]]) -> None:
        """One warning per text in which the model's word splitter finds no word: it gets no entities."""
        for where, words in zip(wheres, columns["tokens"], strict=True):
            if not words:
                logger.warning(
                    "%s: the model's word_splitter %r finds no words in this text, so no entity can be found "
                    "in it; give it as 'tokens', or use a model whose splitter cuts such text",
                    where,
                    self.splitter.spec,
                )

    def record(self, text: str | None, prediction: Any) -> dict[str, Any]:
        """`{"text", "entities": [{"text", "label", "start", "end", "score"}, ...]}` for a text; for the
        user's tokens the prediction is the record already: `{["text",] "tokens", "tags", "entities"}`."""
        return prediction if isinstance(prediction, dict) else {"text": text, "entities": prediction}

    def label_studio_results(self, text: str, prediction: Any) -> tuple[list[dict[str, Any]], float | None]:
        """Each entity as a `labels` result; the task's score is the mean entity score (none: no entities)."""
        from bert_tasks.data.annotation_tools import LABELS_CONTROL, NO_TEXT_TO_MARK, TEXT_OBJECT

        if isinstance(prediction, dict):
            if "text" not in prediction:
                raise BertTasksError(NO_TEXT_TO_MARK)
            prediction = prediction["entities"]
        results = [
            {
                "from_name": LABELS_CONTROL,
                "to_name": TEXT_OBJECT,
                "type": "labels",
                "value": {"start": e["start"], "end": e["end"], "text": e["text"], "labels": [e["label"]]},
                "score": e["score"],
            }
            for e in prediction
        ]
        score = sum(e["score"] for e in prediction) / len(prediction) if prediction else None
        return results, score

    def render_predictions(self, texts: Sequence[str | None], predictions: Sequence[Any]) -> str:
        """Each text with its entities marked in place, then one line per entity (tokens without a text:
        joined by spaces, positions as token ranges `#start-end`)."""
        blocks = []
        for text, entities, positions in map(_shown, texts, predictions):
            marked, cursor = [], 0
            for entity in entities:
                marked += [text[cursor : entity["start"]], f"[{entity['text']}]({entity['label']})"]
                cursor = entity["end"]
            lines = ["".join([*marked, text[cursor:]])]
            lines += [
                f"  {e['label']:<10} {where} {e['score']:.3f}  {e['text']}"
                for e, where in zip(entities, positions, strict=True)
            ]
            blocks.append("\n".join(lines if entities else [*lines, "  (no entities)"]))
        return "\n\n".join(blocks)

    def predictions_page(self, texts: Sequence[str | None], predictions: Sequence[Any]) -> str:
        """The texts with their entities marked in place, a colour per type, the score on hover."""
        from bert_tasks.insight.entity_pages import predictions_page

        shown = [_shown(text, prediction)[:2] for text, prediction in zip(texts, predictions, strict=True)]
        return predictions_page([text for text, _ in shown], [entities for _, entities in shown])

    def evaluation_page(
        self,
        raw: Dataset,
        encoded: Dataset,
        window_logits: Sequence[np.ndarray],
        id2label: dict[int, str],
        metrics: dict[str, Any],
    ) -> str:
        """Gold beside predicted per sentence, each error with its kind, filterable by kind and type."""
        from bert_tasks.insight.entity_pages import evaluation_page

        predicted = self.predict_tags(raw, encoded, window_logits, id2label)
        return evaluation_page(raw["tokens"], raw["tags"], predicted, metrics)

    def save_plots(self, metrics: dict[str, Any], out_dir: Path) -> list[Path]:
        """Per-type precision/recall/F1 bars and the error breakdown as one PNG (bounded for many types)."""
        from bert_tasks.insight.plots import plot_ner_scores  # matplotlib: only evaluation needs it

        return [plot_ner_scores(metrics["per_type"], metrics["errors"], out_dir / "ner_scores.png")]

    def render_metrics(self, metrics: dict[str, Any]) -> str:
        """Overall and per-type scores (default and strict IOB2) and the error breakdown with examples."""
        overall = f"entity F1 {metrics['f1']:.4f} (precision {metrics['precision']:.4f}, "
        overall += f"recall {metrics['recall']:.4f}) | strict IOB2 F1 {metrics['strict_f1']:.4f}"
        lines = [
            f"{overall} | token accuracy {metrics['accuracy']:.4f}",
            "",
            *score_table(metrics["per_type"], "type"),
        ]
        errors = metrics["errors"]
        kinds = [kind for kind in errors if kind != "examples"]
        lines += ["", "errors: " + ", ".join(f"{kind} {errors[kind]}" for kind in kinds)]
        for kind in kinds:
            for example in errors["examples"].get(kind, [])[:3]:
                lines.append(f"  {kind:<24} gold {example['gold']} | predicted {example['pred']}")
        return "\n".join(lines)

    def card(self, labels: Sequence[str], policy: ModelPolicy) -> TaskCard:
        """Token classification; `first` is the pipeline aggregation that reads words as bert-tasks does.

        bert-tasks trains and decodes each word on its first sub-token, which is what the pipeline's
        `aggregation_strategy="first"` takes; "simple" would group sub-tokens whose labels training never saw.
        """
        types = sorted({label[2:] for label in labels if label != "O"})
        decoding = "BIO-constrained Viterbi decoding" if self.viterbi else "argmax decoding"
        viterbi_differs = (
            "A vanilla `pipeline` decodes each word by argmax (no Viterbi), so its entities can differ "
            "slightly from bert-tasks' predictions.",
        )
        return TaskCard(
            summary=f"Named-entity recognition: BIO tags per word for the entity types {', '.join(types)}; "
            "predictions are entity spans with character offsets into the text.",
            long_inputs="each word takes its prediction from the window where it has the most context, "
            f"then {decoding} turns the words' scores into tags",
            pipeline_tag="token-classification",
            pipeline_options={"aggregation_strategy": "first", "stride": policy.stride},
            example="The patient developed hepatotoxicity after taking valproate.",
            limits=(
                f"It finds the entity types above only ({', '.join(types)}), as annotated in its training "
                "data; other kinds of mention are not found.",
                *(viterbi_differs if self.viterbi else ()),
                "A tagger trained on biomedical corpora (BC5CDR, NCBI-disease: PubMed abstracts) is a "
                "research tool: it is not validated for clinical use or decisions about patients.",
            ),
        )
