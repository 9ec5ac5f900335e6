"""Attention heatmaps: the probabilities are stock eager BERT's, the PNGs are real and sized as designed,
and every mistake (bad model dir, empty text, layer or head out of range) is one clear line."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertModel

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.insight.attention_maps import attention_maps, draw_attention
from bert_tasks.insight.plots import attention_figure_size, plot_attention_head
from tests.helpers import cli_error_line

TEXT = "The patient suffers from severe headaches"
PNG = b"\x89PNG\r\n\x1a\n"
DPI = 120  # viz saves every figure at 120 dots per inch

pytestmark = pytest.mark.usefixtures("single_thread")


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data.startswith(PNG) and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def expected_pixels(*figure_size_args: int) -> tuple[int, int]:
    width, height = attention_figure_size(*figure_size_args)
    return round(width * DPI), round(height * DPI)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a user error, without a traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bert-tasks: error: "), err
    return err[0]


def test_probabilities_are_stock_eager_attention(tiny_model: Path) -> None:
    """The patched model's math path gives HF eager's probabilities exactly; every row sums to 1."""
    maps = attention_maps(TEXT, tiny_model)
    inputs = AutoTokenizer.from_pretrained(tiny_model)(TEXT, return_tensors="pt")
    stock = BertModel.from_pretrained(tiny_model, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = torch.cat(stock(**inputs, output_attentions=True).attentions)  # [L, H, T, T]
    tokens = maps.tokens
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "patient" in tokens
    assert maps.probs.shape == (2, 4, len(tokens), len(tokens))
    torch.testing.assert_close(maps.probs, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(maps.probs.sum(-1), torch.ones(2, 4, len(tokens)))


def test_one_head_is_a_labelled_heatmap_of_the_expected_size(tiny_model: Path, tmp_path: Path) -> None:
    path, maps = draw_attention(TEXT, tiny_model, layer=1, head=2, out=tmp_path / "head.png")
    n_tokens = len(maps.tokens)
    assert png_size(path) == expected_pixels(n_tokens) == (744, 600)  # 9 word pieces: the 5-inch minimum
    torch.testing.assert_close(maps.probs[1, 2].sum(-1), torch.ones(n_tokens))


@pytest.mark.slow
def test_grid_of_heads_and_overview_of_layers(tiny_model: Path, tmp_path: Path) -> None:
    """No head: the layer's 4 heads in one row; layer "all": 2 layers x 4 heads; one head: a column."""
    heads, maps = draw_attention(TEXT, tiny_model, layer=0, out=tmp_path / "heads.png")
    n_tokens = len(maps.tokens)
    assert png_size(heads) == expected_pixels(n_tokens, 4, 4)
    overview, _ = draw_attention(TEXT, tiny_model, layer="all", out=tmp_path / "all.png")
    assert png_size(overview) == expected_pixels(n_tokens, 8, 4)
    column, _ = draw_attention(TEXT, tiny_model, layer="all", head=3, out=tmp_path / "column.png")
    assert png_size(column) == expected_pixels(n_tokens, 2, 1)


def test_cli_writes_the_default_file_name(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unquoted words are joined into one text; without --layer the last layer is drawn."""
    monkeypatch.chdir(tmp_path)
    assert main(["attention", *TEXT.split(), "--model", str(tiny_model), "--head", "0"]) == 0
    assert "attention_layer1_head0.png" in capsys.readouterr().out
    assert png_size(tmp_path / "attention_layer1_head0.png")[0] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "2"], r"layer 2 is out of range: the model has 2 layers \(0-1\)"),
        (["--layer", "-1"], "layer -1 is out of range"),
        (["--layer", "last"], "layer must be a layer number or 'all', got 'last'"),
        (["--head", "4"], r"head 4 is out of range: each layer has 4 heads \(0-3\)"),
        (["--layer", "all", "--head", "-1"], "head -1 is out of range"),
    ],
)
@pytest.mark.slow
def test_layer_and_head_out_of_range(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "map.png"
    assert main(["attention", TEXT, "--model", str(tiny_model), "--out", str(out), *args]) == 1
    assert re.search(message, error_line(capsys))
    assert not out.exists()


def test_empty_text_and_bad_model_dir(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["attention", "--model", str(tiny_model)]) == 1
    assert "nothing to draw: give a text" in error_line(capsys)
    assert main(["attention", "   ", "--model", str(tiny_model)]) == 1
    assert "nothing to draw" in error_line(capsys)
    assert main(["attention", TEXT, "--model", str(tmp_path / "missing")]) == 1
    assert "no such directory" in error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["attention", TEXT, "--model", str(tmp_path / "empty")]) == 1
    assert "no config.json" in error_line(capsys)
    with pytest.raises(BertTasksError, match="the text is empty"):
        attention_maps("\n", tiny_model)


def unloadable(run: Path, copy: Path, kind: str) -> Path:
    """A copy of a fine-tuned dir that torch cannot run as it is: heads pruned in its config.json (weights
    of that smaller shape, as `prune` writes them), an ONNX export, or a half-written model.safetensors."""
    shutil.copytree(run, copy)
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    weights = copy / "model.safetensors"
    if kind == "pruned":
        config["pruned_heads"] = {"0": [0, 1]}  # the weights' shapes no longer match: never loaded
    elif kind == "onnx":
        config["bert_tasks"]["backend"] = "onnx"
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return copy


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("pruned", "has pruned heads;"),
        ("onnx", "holds a onnx export, which only predict and evaluate run; pass the model dir it was"),
        ("damaged", "model.safetensors is damaged"),
    ],
)
@pytest.mark.parametrize("command", ["attention", "memory"])
def test_a_dir_torch_cannot_run_is_named_for_what_it_is(
    sentiment_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    message: str,
    command: str,
) -> None:
    """Not "weights do not match config.json" nor --allow-pickle advice: what the dir is, as predict says."""
    model = str(unloadable(sentiment_run, tmp_path / kind, kind))
    argv = ["attention", "a text", "--model", model, "--out", str(tmp_path / "a.png")]
    memory = ["memory", "--model", model, "--seq-len", "8"]
    line = cli_error_line(argv if command == "attention" else memory, capsys)
    assert message in line and "pickle" not in line
    assert not (tmp_path / "a.png").exists()


def test_text_longer_than_the_model_is_refused(tiny_model: Path) -> None:
    """The tiny model has 128 positions: a longer text is an error, never silently cut."""
    with pytest.raises(BertTasksError, match=r"the text is \d+ word pieces; model .* reads at most 128"):
        attention_maps("word " * 200, tiny_model)


def test_heatmap_needs_one_label_per_token(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError, match="there are 2 tokens"):
        plot_attention_head(torch.eye(3).numpy(), ["a", "b"], "title", tmp_path / "x.png")
