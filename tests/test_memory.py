"""Attention memory: the estimate is the B x H x T^2 formula, and at seq 512 the measurement confirms it:
eager attention's peak is the formula's two T x T matrices above the fused SDPA path's, which has none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from transformers import BertModel

from bert_tasks.cli import main
from bert_tasks.insight.memory import MemoryReport, attention_matrix_bytes, attention_memory, render_memory
from tests.helpers import tiny_bert_config

BATCH, SEQ_LEN, HEADS, WIDTH = 2, 512, 4, 32

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def model_512(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with 512 positions (no tokenizer needed: the measurement feeds random ids)."""
    directory = tmp_path_factory.mktemp("tiny-512")
    BertModel(tiny_bert_config(max_position_embeddings=512)).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def report(model_512: Path) -> MemoryReport:
    return attention_memory(model_512, batch=BATCH, seq_len=SEQ_LEN)


def test_formula() -> None:
    assert (
        attention_matrix_bytes(batch=32, heads=12, seq_len=512, bytes_per_element=4) == 32 * 12 * 512**2 * 4
    )


def test_estimates_are_the_formula(report: MemoryReport) -> None:
    """Eager: scores + probabilities, 2 x B x H x T^2 x 4 bytes; both: q, k, v, output, 4 x B x T x C x 4."""
    assert [lm.layer for lm in report.layers] == [0, 1]
    for lm in report.layers:
        assert lm.heads == HEADS
        assert lm.scores_probs == 2 * BATCH * HEADS * SEQ_LEN**2 * 4
        assert lm.qkv_out == 4 * BATCH * SEQ_LEN * WIDTH * 4
        assert lm.eager_estimate == lm.scores_probs + lm.qkv_out
        assert lm.fused_estimate == lm.qkv_out


def test_measured_peaks_confirm_the_formula_at_seq_512(report: MemoryReport) -> None:
    """Eager holds the two T x T matrices (within 10% of the formula), the fused path a small fraction."""
    for lm in report.layers:
        assert lm.eager_peak >= lm.scores_probs
        assert lm.fused_peak < lm.scores_probs / 8
        assert lm.eager_peak > 8 * lm.fused_peak
        assert (lm.eager_peak - lm.fused_peak) == pytest.approx(lm.scores_probs, rel=0.1)
    assert report.formula_check == pytest.approx(1.0, abs=0.1)
    # A whole inference forward frees each layer's matrices before the next: about one layer's worth.
    assert report.fused_forward_peak < report.layers[0].scores_probs / 8 < report.eager_forward_peak
    assert report.eager_forward_peak < 1.5 * report.layers[0].eager_peak


def test_bf16_counts_two_bytes(model_512: Path) -> None:
    bf16 = attention_memory(model_512, batch=1, seq_len=128, dtype="bf16")
    assert bf16.layers[0].scores_probs == 2 * 1 * HEADS * 128**2 * 2
    assert bf16.layers[0].eager_peak > bf16.layers[0].fused_peak


def test_report_shows_layers_totals_and_check(report: MemoryReport) -> None:
    text = render_memory(report)
    assert "batch 2 | seq_len 512 | fp32 | cpu" in text
    assert "2 x B x H x T^2 x bytes" in text
    total_line = next(line for line in text.splitlines() if line.lstrip().startswith("total"))
    assert f"{2 * report.layers[0].scores_probs / 2**20:.1f} MiB" in total_line  # two layers summed
    assert "check: measured (eager - fused)" in text


def test_cli_prints_the_report(model_512: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--model", str(model_512), "--batch", "1", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "seq_len 64" in out and "forward" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq-len", "1024"], "seq_len 1024 is longer than model .*'s 512 positions"),
        (["--batch", "0"], "batch and seq_len must be at least 1, got batch 0"),
        (["stray"], "memory takes no positional arguments, got: stray"),
    ],
)
def test_cli_errors(
    model_512: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["memory", "--model", str(model_512), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("bert-tasks: error: ")
    assert re.search(message, err[0])


def test_cli_bad_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--model", str(tmp_path / "missing")]) == 1
    assert "no such directory" in capsys.readouterr().err
