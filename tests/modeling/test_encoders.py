"""Encoders that are not BERT (RoBERTa, DeBERTa-v2, DistilBERT) run the toolkit through transformers' own
attention, and BERT keeps the fused path: tiny random models and tokenizers built in the tests, no download.

Each family trains sentiment and NER, saves a plain Hugging Face dir that vanilla `AutoModelFor...` loads
to the same logits, and predicts through the CLI and the library alike; windows keep every token under the
family's own special tokens; a resumed RoBERTa run ends where an uninterrupted one does; what only the
fused path offers is refused in one line that names the path.
"""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, pipeline

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import Predictor
from bert_tasks.insight.attention_maps import attention_maps
from bert_tasks.insight.memory import attention_memory
from bert_tasks.model_dir import load_finetuned
from bert_tasks.modeling.encoders import attention_path
from bert_tasks.modeling.load import load_model, load_tokenizer
from bert_tasks.modeling.patch import is_patched
from bert_tasks.tasks import NerTask, SentimentTask
from bert_tasks.tasks.ner import bio_transitions
from bert_tasks.training import train
from tests.helpers import LABELS, LONG_NER_TEXT, LONG_REVIEW, one_thread, tiny_config
from tests.tiny_encoders import FAMILIES, build_tiny_encoder

#: Every test here trains, saves or exports tiny RoBERTa / DeBERTa-v2 / DistilBERT runs (seconds each).
pytestmark = pytest.mark.slow

TASKS = ("sentiment", "ner")
#: The tiny runs: 3 updates each, enough to move every weight away from its initial value.
SHORT = {"max_steps": 3}
AUTO = {"sentiment": AutoModelForSequenceClassification, "ner": AutoModelForTokenClassification}
TEXTS = [
    "The patient developed hepatotoxicity after taking valproate.",
    LONG_REVIEW,
    LONG_NER_TEXT,
]


@contextmanager
def run_log() -> Iterator[list[str]]:
    """The messages the training run logs while the block runs."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("bert_tasks.training.run")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a base model dir (random weights, the family's tokenizer)."""
    root = tmp_path_factory.mktemp("encoders")
    return {family: build_tiny_encoder(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def runs(bases: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(family, task) -> a finished tiny run, and the log lines it wrote under `(family, task, "log")`."""
    root = tmp_path_factory.mktemp("encoder-runs")
    found: dict = {}
    with one_thread():
        for family, base in bases.items():
            for task in TASKS:
                with run_log() as lines:
                    found[family, task] = train(tiny_config(task, base, root / f"{family}-{task}", **SHORT))
                found[family, task, "log"] = lines
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_gets_its_own_head_and_transformers_attention(
    bases: dict[str, Path], family: str
) -> None:
    _, _, encoder, implementation = FAMILIES[family]
    for task, kind in (("sentiment", "ForSequenceClassification"), ("ner", "ForTokenClassification")):
        model = load_model(bases[family], task, ["a", "b", "c"])
        assert type(model).__name__ == encoder.removesuffix("Model") + kind
        assert not is_patched(model)
        assert attention_path(model) == f"transformers' own ({encoder}, {implementation})"


def test_bert_keeps_the_fused_path(tiny_model: Path, tmp_path: Path) -> None:
    model = load_model(tiny_model, "ner", ["O", "B-X", "I-X"])
    assert type(model).__name__ == "BertForTokenClassification" and is_patched(model)
    assert attention_path(model) == "bert-tasks fused (BertModel)"
    with one_thread(), run_log() as lines:
        train(tiny_config("sentiment", tiny_model, tmp_path / "bert", max_steps=1, validation_file=None))
    assert "attention: bert-tasks fused (BertModel)" in lines
    assert "word-embedding gradient: touched rows" in lines


@pytest.mark.parametrize("family", FAMILIES)
def test_the_start_line_names_the_path(runs: dict, family: str) -> None:
    _, _, encoder, implementation = FAMILIES[family]
    for task in TASKS:
        lines = runs[family, task, "log"]
        start = next(i for i, line in enumerate(lines) if line.startswith(f"bert-tasks finetune {task}:"))
        assert lines[start + 1] == f"attention: transformers' own ({encoder}, {implementation})"
        assert lines[start + 2] == "word-embedding gradient: touched rows"  # any family's plain lookup


@pytest.mark.parametrize("family", FAMILIES)
def test_sentiment_windows_keep_every_token_between_the_familys_own_specials(
    bases: dict[str, Path], family: str
) -> None:
    """Windows hold the text's tokens in order, overlapping by `stride`, each framed by the tokenizer's own
    special tokens (`<s> ... </s>`, `[CLS] ... [SEP]`)."""
    tokenizer = load_tokenizer(bases[family])
    max_length, stride = 32, 8
    raw = Dataset.from_dict({"text": [LONG_REVIEW, "Short."]})
    encoded = SentimentTask().encode(raw, tokenizer, None, max_length, stride)
    for example, text in enumerate(raw["text"]):
        windows = [
            ids
            for ids, row in zip(encoded["input_ids"], encoded["example_id"], strict=True)
            if row == example
        ]
        contents = []
        for ids in windows:
            special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
            content = [token for token, is_special in zip(ids, special, strict=True) if not is_special]
            framed = [tokenizer.cls_token_id, *content, tokenizer.sep_token_id]
            assert ids == framed and len(ids) <= max_length and special.count(1) == 2
            contents.append(content)
        joined = contents[0] + [token for content in contents[1:] for token in content[stride:]]
        assert joined == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert sum(1 for row in encoded["example_id"] if row == 0) >= 3


@pytest.mark.parametrize("family", FAMILIES)
def test_ner_windows_cover_every_word_once_labelled(bases: dict[str, Path], family: str) -> None:
    """Every word of a long sentence lands in a window, and each window labels each word it starts once."""
    tokenizer = load_tokenizer(bases[family], **NerTask.tokenizer_options)
    words = LONG_NER_TEXT.split()
    tags = ["B-Chemical" if word.endswith("ol") else "O" for word in words]
    label2id = {"O": 0, "B-Chemical": 1, "I-Chemical": 2}
    raw = Dataset.from_dict({"tokens": [words], "tags": [tags]})
    encoded = NerTask().encode(raw, tokenizer, label2id, 32, 8)
    assert len(encoded) >= 3 and all(len(ids) <= 32 for ids in encoded["input_ids"])
    assert {w for row in encoded["word_ids"] for w in row if w >= 0} == set(range(len(words)))
    for ids, word_ids, labels in zip(
        encoded["input_ids"], encoded["word_ids"], encoded["labels"], strict=True
    ):
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        labelled = [w for w, label in zip(word_ids, labels, strict=True) if label != -100]
        assert len(labelled) == len(set(labelled)), "a word labelled twice in one window"
        assert all(labels[p] == label2id[tags[w]] for p, w in enumerate(word_ids) if labels[p] != -100)
    first_window = encoded["labels"][0]
    assert sum(label != -100 for label in first_window) == len({w for w in encoded["word_ids"][0] if w >= 0})


def test_roberta_encodes_split_words_as_running_text(bases: dict[str, Path]) -> None:
    """A byte-level BPE encodes a word after a space as "Ġword": NER's pre-split words must be too."""
    tokenizer = load_tokenizer(bases["roberta"], **NerTask.tokenizer_options)
    split = tokenizer(["patient", "developed"], is_split_into_words=True, add_special_tokens=False)
    running = tokenizer(" patient developed", add_special_tokens=False)
    assert split["input_ids"] == running["input_ids"]
    assert all(piece.startswith("Ġ") for piece in tokenizer.convert_ids_to_tokens(split["input_ids"][:1]))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_saved_dir_is_plain_hugging_face_with_the_same_logits(runs: dict, family: str, task: str) -> None:
    """Vanilla `AutoModelFor...` loads the dir (real label names) and gives the logits bert-tasks predicts."""
    run = runs[family, task]
    config = json.loads((run / "config.json").read_text())
    head = FAMILIES[family][2].removesuffix("Model") + AUTO[task].__name__.removeprefix("AutoModel")
    assert config["architectures"] == [head]
    vanilla = AUTO[task].from_pretrained(run).eval()
    assert type(vanilla).__name__ == head and list(vanilla.config.id2label.values()) == LABELS[task]
    predictor = Predictor(run, mixed_precision="no", progress=False)
    raw = predictor.task.texts_to_raw(TEXTS)
    encoded, logits = predictor.window_logits(raw)
    collate = predictor.task.collator(predictor.tokenizer)
    batch = collate(
        [
            {k: row[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in row}
            for row in encoded
        ]
    )
    with torch.no_grad():
        expected = vanilla(**batch).logits  # [W, L] or [W, T, L]
    for window, found in enumerate(logits):
        want = expected[window, : len(found)] if expected.dim() == 3 else expected[window]
        torch.testing.assert_close(torch.from_numpy(np.asarray(found)).float(), want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_vanilla_pipeline_reads_the_sentiment_dir(runs: dict, family: str) -> None:
    run = runs[family, "sentiment"]
    vanilla = pipeline("text-classification", model=str(run), device="cpu")
    ours = Predictor(run, mixed_precision="no", progress=False).predict(TEXTS[:1])[0]
    found = vanilla(TEXTS[0])[0]
    assert found["label"] == ours["label"]
    assert found["score"] == pytest.approx(ours["score"], abs=1e-5)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_predict_through_the_cli_and_the_library_agree(
    runs: dict, family: str, task: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs[family, task]
    capsys.readouterr()
    assert main(["predict", task, "--model", str(run), "--json", *TEXTS]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    library = Predictor(run, progress=False).records(TEXTS)
    assert printed == json.loads(json.dumps(library))
    if task == "ner":
        for record in printed:
            assert all(record["text"][e["start"] : e["end"]] == e["text"] for e in record["entities"])


@pytest.mark.parametrize("family", FAMILIES)
def test_ner_decodes_valid_bio_by_viterbi(runs: dict, family: str) -> None:
    loaded = load_finetuned(runs[family, "ner"])
    assert loaded.task.viterbi and not is_patched(loaded.model)
    predictor = Predictor(runs[family, "ner"], progress=False)
    raw = loaded.task.texts_to_raw(TEXTS)
    labels = [loaded.id2label[i] for i in sorted(loaded.id2label)]
    start, allowed = bio_transitions(labels)
    for tags, _ in loaded.task.predict_tags(raw, *predictor.window_logits(raw), loaded.id2label):
        ids = [labels.index(tag) for tag in tags]
        assert start[ids[0]] and all(allowed[a, b] for a, b in itertools.pairwise(ids))


def test_a_resumed_roberta_run_ends_where_an_uninterrupted_one_does(
    bases: dict[str, Path], tmp_path: Path
) -> None:
    """Stop after step 3 of 6 (checkpoints every 3), resume, and compare the weights (tests/test_train.py's
    BERT check, on transformers' own RoBERTa: its dropout, its modules, its checkpoints)."""
    settings = {"max_steps": 6, "save_every": 3, "validation_file": None}
    with one_thread():
        full = train(tiny_config("sentiment", bases["roberta"], tmp_path / "full", **settings))
        interrupted = shutil.copytree(full, tmp_path / "interrupted")
        shutil.rmtree(interrupted / "checkpoints" / "step-00000006")
        for name in ("model.safetensors", "metrics.json"):
            (interrupted / name).unlink()
        resumed = train(tiny_config("sentiment", bases["roberta"], interrupted, resume=True, **settings))
    expected, actual = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_attention_maps_come_from_transformers_own_attention(bases: dict[str, Path]) -> None:
    maps = attention_maps("The patient developed hepatotoxicity.", bases["deberta-v2"])
    tokenizer = load_tokenizer(bases["deberta-v2"])
    ids = tokenizer("The patient developed hepatotoxicity.")["input_ids"]
    assert maps.tokens == tokenizer.convert_ids_to_tokens(ids)
    assert maps.probs.shape == (2, 4, len(ids), len(ids))
    torch.testing.assert_close(maps.probs.sum(-1), torch.ones(2, 4, len(ids)))


def test_what_only_the_fused_path_offers_is_refused_in_one_line(
    bases: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "model {} (RobertaModel) runs transformers' own attention"
    with pytest.raises(BertTasksError, match=r"^attention_dropout= needs bert-tasks' fused BERT attention"):
        train(tiny_config("sentiment", bases["roberta"], tmp_path / "dropout", attention_dropout=0.0))
    with pytest.raises(BertTasksError, match=r"^attention=causal needs bert-tasks' fused BERT attention"):
        load_model(bases["roberta"], "sentiment", attention="causal")
    with pytest.raises(BertTasksError, match=r"^memory needs bert-tasks' fused BERT attention") as refused:
        attention_memory(bases["roberta"], batch=1, seq_len=8)
    assert path.format(bases["roberta"]) in str(refused.value)
    pruned = shutil.copytree(bases["roberta"], tmp_path / "pruned")
    config = json.loads((pruned / "config.json").read_text())
    (pruned / "config.json").write_text(json.dumps({**config, "pruned_heads": {"0": [1]}}))
    with pytest.raises(BertTasksError, match=r"^loading a head-pruned model needs bert-tasks' fused"):
        load_model(pruned, "sentiment")
    capsys.readouterr()  # the library calls' progress bars: the CLI's stderr is what counts below
    assert main(["memory", "--model", str(bases["roberta"]), "--batch", "1", "--seq-len", "8"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("bert-tasks: error: memory needs") and "RobertaModel" in line


def test_int8_quantizes_a_distilbert_transformer(runs: dict) -> None:
    """DistilBERT keeps its blocks under `transformer`, not `encoder`: every Linear there turns int8."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    run = runs["distilbert", "sentiment"]
    quantized = Predictor(run, quantize="int8", progress=False)
    linears = dict(quantized.model.distilbert.transformer.named_modules())
    assert all(type(m) is not torch.nn.Linear for m in linears.values())
    assert sum(isinstance(m, DynamicQuantizedLinear) for m in linears.values()) == 2 * 6
    assert type(quantized.model.classifier) is torch.nn.Linear  # the head stays float
    fp32 = Predictor(run, progress=False).predict(TEXTS)
    assert [p["label"] for p in quantized.predict(TEXTS)] == [p["label"] for p in fp32]


def test_an_onnx_export_without_token_types(runs: dict, tmp_path: Path) -> None:
    """DistilBERT takes no token_type_ids: the graph has the two inputs its forward takes."""
    import onnxruntime

    from bert_tasks.inference.onnx_export import export_onnx
    from tests.helpers import DATA

    run = runs["distilbert", "ner"]
    parity = export_onnx(run, tmp_path / "onnx", check_file=str(DATA["ner"][1]))
    assert parity.passed
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    exported = Predictor(tmp_path / "onnx", progress=False).predict(TEXTS)
    assert [[e["label"] for e in p] for p in exported] == [
        [e["label"] for e in p] for p in Predictor(run, progress=False).predict(TEXTS)
    ]
