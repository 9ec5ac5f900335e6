"""INT8 dynamic quantization: predictions agree with fp32, the right layers stay float, weights shrink,
and an export reloads as the same quantized model (and as a plain fp32 checkpoint in vanilla transformers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from transformers import AutoModelForSequenceClassification

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import EntityTagger, SentimentClassifier
from bert_tasks.inference.quantize import export_quantized, quantize_model, weight_bytes
from bert_tasks.model_dir import check_method
from bert_tasks.training import train
from tests.helpers import DATA, read_conll, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")


def sentiment_texts() -> list[str]:
    """Every text of the sentiment fixtures (train + validation): the agreement set."""
    lines = [line for path in DATA["sentiment"] for line in path.read_text(encoding="utf-8").splitlines()]
    return [json.loads(line)["text"] for line in lines if line.strip()]


def ner_texts() -> list[str]:
    return [" ".join(word for word, _ in sentence) for path in DATA["ner"] for sentence in read_conll(path)]


#: A high learning rate and ten short epochs: a tiny model that predicts both classes and finds entities
#: of both types (~1 s each), so agreement with fp32 is not the trivial agreement of constant predictions.
LEARN = {"lr": "1e-2", "epochs": "10", "early_stopping_patience": "0"}  # all ten: the first sit at one class


@pytest.fixture(scope="module")
def sentiment_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("run") / "sentiment", **LEARN))


@pytest.fixture(scope="module")
def ner_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(tiny_config("ner", tiny_model, tmp_path_factory.mktemp("run") / "ner", **LEARN))


@pytest.fixture(scope="module")
def exported(sentiment_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "int8"
    export_quantized(sentiment_dir, out)
    return out


@pytest.mark.slow
def test_sentiment_predictions_agree_with_fp32(sentiment_dir: Path) -> None:
    texts = sentiment_texts()
    fp32 = SentimentClassifier(sentiment_dir, mixed_precision="no")(texts)
    int8 = SentimentClassifier(sentiment_dir, quantize="int8")(texts)
    assert {p["label"] for p in fp32} == {"negative", "positive"}
    agree = sum(a["label"] == b["label"] for a, b in zip(fp32, int8, strict=True))
    assert len(texts) >= 50 and agree / len(texts) >= 0.95
    differences = [abs(a["score"] - b["score"]) for a, b in zip(fp32, int8, strict=True)]
    assert 0 < max(differences) < 0.05  # int8 really ran, and stayed close


@pytest.mark.slow
def test_ner_entities_agree_with_fp32(ner_dir: Path) -> None:
    """The same entities (text, label, offsets) in >= 95% of the fixture sentences."""
    texts = ner_texts()
    fp32 = EntityTagger(ner_dir, mixed_precision="no")(texts)
    int8 = EntityTagger(ner_dir, quantize="int8")(texts)
    same = sum(
        [(e["start"], e["end"], e["label"]) for e in a] == [(e["start"], e["end"], e["label"]) for e in b]
        for a, b in zip(fp32, int8, strict=True)
    )
    assert {e["label"] for entities in fp32 for e in entities} == {"Chemical", "Disease"}
    assert len(texts) >= 20 and same / len(texts) >= 0.95


@pytest.mark.slow
def test_encoder_linears_are_int8_and_the_rest_stays_float(sentiment_dir: Path) -> None:
    """fused qkv, attention output and feed-forward are int8; embeddings, LayerNorm, pooler, head float."""
    classifier = SentimentClassifier(sentiment_dir, quantize="int8")
    model = classifier.model
    quantized = [name for name, m in model.named_modules() if isinstance(m, DynamicQuantizedLinear)]
    assert len(quantized) == 2 * 4  # per layer: qkv, attention output, intermediate, output
    assert all(name.startswith("bert.encoder.layer.") for name in quantized)
    assert any(name.endswith("attention.self.qkv") for name in quantized)
    assert type(model.classifier) is nn.Linear and type(model.bert.pooler.dense) is nn.Linear
    assert model.bert.embeddings.word_embeddings.weight.dtype == torch.float32
    assert classifier.backend.device.type == "cpu" and not classifier.backend.bf16
    assert classifier.quantized.after < classifier.quantized.before
    assert " MiB -> " in str(classifier.quantized)


def test_weight_bytes_counts_int8_weights(tiny_model: Path) -> None:
    """Each quantized [out, in] weight drops from 4 bytes to 1 per element (+ 16 bytes of scale per row)."""
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    linear = [m for m in model.bert.encoder.modules() if isinstance(m, nn.Linear)]
    weights = sum(m.weight.numel() for m in linear)
    rows = sum(m.weight.shape[0] for m in linear)
    fp32 = weight_bytes(model)
    sizes = quantize_model(model)
    assert sizes.before == fp32
    assert sizes.before - sizes.after == 3 * weights - 16 * rows


@pytest.mark.slow
def test_export_reloads_as_the_same_quantized_model(sentiment_dir: Path, exported: Path) -> None:
    """config.json carries the marker; loading re-applies the same quantization; recipe travels along."""
    config = json.loads((exported / "config.json").read_text())
    assert config["bert_tasks"]["quantize"] == "int8"
    assert config["bert_tasks"]["max_length"] == 32  # the windowing policy is kept
    assert (exported / "model.safetensors").is_file() and (exported / "recipe.yaml").is_file()
    reloaded = SentimentClassifier(exported)
    assert reloaded.quantized is not None
    texts = sentiment_texts()[:8]
    direct = SentimentClassifier(sentiment_dir, quantize="int8")(texts)
    assert reloaded(texts) == direct


@pytest.mark.slow
def test_export_loads_in_vanilla_transformers(sentiment_dir: Path, exported: Path) -> None:
    """The export is a plain fp32 HF checkpoint: identical weights to the source model."""
    source = AutoModelForSequenceClassification.from_pretrained(sentiment_dir).state_dict()
    copy = AutoModelForSequenceClassification.from_pretrained(exported).state_dict()
    assert source.keys() == copy.keys()
    for name, tensor in source.items():
        torch.testing.assert_close(copy[name], tensor, rtol=0, atol=0)


@pytest.mark.slow
def test_export_refuses_a_non_empty_dir_and_bad_models(sentiment_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(BertTasksError, match="already exists and is not empty"):
        export_quantized(sentiment_dir, tmp_path / "taken")
    with pytest.raises(BertTasksError, match="no such directory"):
        export_quantized(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(BertTasksError, match="unknown method 'int4'"):
        check_method("int4")
    with pytest.raises(BertTasksError, match="fp32 activations"):
        SentimentClassifier(sentiment_dir, quantize="int8", mixed_precision="bf16")


@pytest.mark.slow
def test_cli_export_predict_evaluate(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "int8"
    assert main(["export", "--quantize", "int8", str(out), "--model", str(sentiment_dir)]) == 0
    assert "MiB -> " in capsys.readouterr().out
    assert main(["predict", "sentiment", "--model", str(out), "--json", "Loved it."]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in {"negative", "positive"}
    _, validation = DATA["sentiment"]
    args = [
        "--model",
        str(sentiment_dir),
        "--data",
        str(validation),
        "--out",
        str(tmp_path / "eval"),
        "--json",
    ]
    assert main(["evaluate", "sentiment", *args, "--quantize", "int8"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1.0


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "sentiment", "--quantize", "int8", "--model", "{missing}", "hi"],
        ["evaluate", "sentiment", "--quantize", "int8", "--model", "{missing}", "--data", "x.jsonl"],
        ["export", "--quantize", "int8", "--model", "{missing}", "{out}"],
    ],
)
def test_cli_bad_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    values = {"missing": tmp_path / "missing", "out": tmp_path / "out"}
    assert main([arg.format(**values) for arg in argv]) == 1
    assert "no such directory" in error_line(capsys)


@pytest.mark.parametrize("fmt", ["onnx", "torch"])
def test_an_int8_export_is_no_source_to_export_again(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """An ONNX export of a torch int8 dir would drop its int8 without a word: one line, no OUT written."""
    int8 = shutil.copytree(sentiment_run, tmp_path / "int8")
    config = json.loads((int8 / "config.json").read_text(encoding="utf-8"))
    config["bert_tasks"]["quantize"] = "int8"
    (int8 / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out = tmp_path / "again"
    assert main(["export", "--model", str(int8), "--format", fmt, "--quantize", "int8", str(out)]) == 1
    assert "holds a int8 export; export the fp32 model dir it was exported from" in error_line(capsys)
    assert not out.exists()


def test_cli_empty_text_and_missing_out(
    sentiment_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["predict", "sentiment", "--quantize", "int8", "--model", str(sentiment_dir), "  "]) == 1
    assert "text 1 is empty" in error_line(capsys)
    assert main(["export", "--quantize", "int8", "--model", str(sentiment_dir)]) == 1
    assert "export needs one OUT directory, got 0" in error_line(capsys)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a user error, without a traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bert-tasks: error: "), err
    return err[0]
