"""Two processes under `accelerate launch` (gloo on CPU) train like one: the multi-GPU path, tested on CPU.

Each launch starts two interpreters (several seconds of imports on two cores), so the module launches
five runs and checks everything against them: a sentiment run with gradient accumulation, mid-run
checkpoints, uneven evaluation shards and a weight average; its resumption; an NER run through
`-m bert_tasks`, as users type it; the same NER run under recipes/accelerate/fsdp.yaml (FSDP2, every
weight sharded over the two processes), which must save whole Hugging Face weights and end where the DDP
run did; and that FSDP run resumed from its mid-run checkpoint. The tiny model has no dropout here, so
one process with the same global batch (twice the per-device batch) must reach the same numbers.
Accelerate's example configs in recipes/accelerate/ are checked with Accelerate's own loader.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import launch_command_parser
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoModelForTokenClassification

from bert_tasks.data.batching import train_loader
from bert_tasks.training import train
from bert_tasks.training.weight_average import SAVED_AVERAGE
from tests.helpers import (
    DATA,
    build_tiny_model,
    fast_overrides,
    one_thread,
    read_conll,
    read_log,
    tiny_config,
    train_steps,
)

#: Every test here launches real processes with `accelerate launch`.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("distributed_train.py")
ACCELERATE_CONFIGS = sorted((ROOT / "recipes" / "accelerate").glob("*.yaml"))
TWO_PROCESSES = ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
#: `--multi_gpu` is Accelerate's "several local processes"; without GPUs they join a gloo group on CPU.
DDP = ["--multi_gpu", *TWO_PROCESSES, "--dynamo_backend", "no"]
#: The shipped FSDP config on two CPU processes (tests/distributed_train.py makes Accelerate shard there).
FSDP = ["--config_file", ROOT / "recipes" / "accelerate" / "fsdp.yaml", *TWO_PROCESSES]
#: 40 rows, per-device batch 2 x 2 processes x accum 2 = 8 rows per update (5 per epoch); 7 updates cross
#: an epoch, checkpoints land at 3 and 6, and eval batches of 5 split the 12 validation rows unevenly.
#: With a weight average (ema_decay), which DDP keeps on every process and the main one checkpoints.
SENTIMENT = {"max_steps": 7, "save_every": 3, "grad_accum": 2, "eval_batch_size": 5, "ema_decay": 0.5}
#: 30 sentences in batches of 3 per device: 5 updates of 6 sentences, no shard padded with repeats.
#: Evaluated at every update, so the best step comes before the last and restoring it changes the weights.
NER = {"eval_batch_size": 3, "eval_every": 1}


def launch(*args: object, setup: list[object] = DDP) -> str:
    """Run `accelerate launch` with two CPU processes and return its log (the CLI's progress and summary
    lines, on stderr); fail with its output."""
    result = launch_result(*args, setup=setup)
    assert result.returncode == 0, (
        f"{' '.join(result.args)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result.stderr


def launch_result(*args: object, setup: list[object] = DDP) -> subprocess.CompletedProcess[str]:
    """Run `accelerate launch` with two CPU processes, whatever its exit status."""
    command = [sys.executable, "-m", "accelerate.commands.launch", *map(str, setup)]
    command += ["--main_process_port", str(_free_port()), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def model_dir(runs: Path) -> Path:
    """The tiny BERT without dropout: each process would draw different masks from the one process."""
    return build_tiny_model(runs / "tiny-bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def sentiment_two(model_dir: Path, runs: Path) -> tuple[Path, str]:
    """Two processes, per-device batch 2: (output dir, log)."""
    out = runs / "sentiment-two"
    overrides = fast_overrides("sentiment", model_dir, out, batch_size=2, **SENTIMENT)
    return out, launch(SCRIPT, "finetune", "sentiment", *overrides)


@pytest.fixture(scope="module")
def sentiment_one(model_dir: Path, runs: Path) -> Path:
    """One process over the same data with the same global batch (4 x accum 2)."""
    with one_thread():
        return train(tiny_config("sentiment", model_dir, runs / "sentiment-one", batch_size=4, **SENTIMENT))


@pytest.fixture(scope="module")
def sentiment_resumed(sentiment_two: tuple[Path, str], model_dir: Path, runs: Path) -> tuple[Path, str]:
    """The two-process run cut back to its step-3 checkpoint and resumed on two processes."""
    out = shutil.copytree(sentiment_two[0], runs / "sentiment-resumed")
    shutil.rmtree(out / "checkpoints" / "step-00000006")
    for name in ("model.safetensors", "metrics.json", "rank0.safetensors", "rank1.safetensors"):
        (out / name).unlink()
    overrides = fast_overrides("sentiment", model_dir, out, batch_size=2, **SENTIMENT)
    return out, launch(SCRIPT, "finetune", "sentiment", "--resume", *overrides)


@pytest.fixture(scope="module")
def ner_two(model_dir: Path, runs: Path) -> Path:
    """`accelerate launch -m bert_tasks finetune ner`, exactly as users run it."""
    out = runs / "ner-two"
    launch("-m", "bert_tasks", "finetune", "ner", *fast_overrides("ner", model_dir, out, batch_size=3, **NER))
    return out


@pytest.fixture(scope="module")
def ner_fsdp(model_dir: Path, runs: Path) -> Path:
    """`ner_two` under fsdp.yaml, scoring the validation file again as its test split after the restore."""
    out = runs / "ner-fsdp"
    launch(SCRIPT, "finetune", "ner", *_fsdp_overrides(model_dir, out), setup=FSDP)
    return out


def _fsdp_overrides(model_dir: Path, out: Path) -> list[str]:
    """`ner_two`'s settings, the validation file again as test split, checkpoints at updates 2 and 4."""
    test_file = DATA["ner"][1]
    return fast_overrides("ner", model_dir, out, batch_size=3, test_file=test_file, save_every=2, **NER)


@pytest.fixture(scope="module")
def ner_fsdp_resumed(ner_fsdp: Path, model_dir: Path, runs: Path) -> Path:
    """`ner_fsdp` as if killed after its step-2 checkpoint, resumed under FSDP. best/ then held step 2,
    which stays the run's best (test_fsdp_restores_the_best_weights_before_scoring), so it is put back."""
    out = shutil.copytree(ner_fsdp, runs / "ner-fsdp-resumed")
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    (out / "best-at-finish").rename(out / "best")
    for name in ("model.safetensors", "metrics.json", "rank0.safetensors", "rank0.json", "rank1.json"):
        (out / name).unlink()
    launch(SCRIPT, "finetune", "ner", "--resume", *_fsdp_overrides(model_dir, out), setup=FSDP)
    return out


@pytest.fixture(scope="module")
def ner_one(model_dir: Path, runs: Path) -> Path:
    with one_thread():
        return train(tiny_config("ner", model_dir, runs / "ner-one", batch_size=6, **NER))


def assert_same_logs(run: Path, reference: Path, rel: float, abs_tol: float) -> None:
    """The same log records, update by update (throughput aside: it is wall-clock)."""
    ours, theirs = read_log(run), read_log(reference)
    assert [record["step"] for record in ours] == [record["step"] for record in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.keys() == other.keys()
        for key in mine.keys() - {"examples_per_s"}:
            assert mine[key] == pytest.approx(other[key], rel=rel, abs=abs_tol), (mine["step"], key)


def validation_scores(run: Path) -> dict[str, float]:
    """Every number in the run's validation metrics, flattened (pytest.approx compares flat dicts only)."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict | list):
            for key, item in value.items() if isinstance(value, dict) else enumerate(value):
                walk(f"{prefix}/{key}", item)
        elif isinstance(value, int | float):
            flat[prefix] = value

    walk("", json.loads((run / "metrics.json").read_text())["validation"])
    return flat


def test_ranks_end_with_identical_weights(sentiment_two: tuple[Path, str]) -> None:
    """DDP keeps the replicas equal: same initial head on every rank, same averaged gradients."""
    out, _ = sentiment_two
    rank0, rank1 = (load_file(out / f"rank{rank}.safetensors") for rank in range(2))
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name


def test_gradients_are_all_reduced_once_per_update(sentiment_two: tuple[Path, str]) -> None:
    """grad_accum=2: 14 micro-batches per process, but gradients cross processes only on the 7 updates."""
    out, _ = sentiment_two
    for rank in range(2):
        record = json.loads((out / f"rank{rank}.json").read_text())
        assert record == {"num_processes": 2, "step": 7, "all_reduces": 7, "sharded": False}


def test_two_processes_train_like_one_with_the_same_global_batch(
    sentiment_two: tuple[Path, str], sentiment_one: Path
) -> None:
    """Same rows in each update and the same schedule: logs, scores and final weights agree."""
    out, _ = sentiment_two
    assert_same_logs(out, sentiment_one, rel=1e-4, abs_tol=1e-6)
    assert validation_scores(out) == pytest.approx(validation_scores(sentiment_one))
    expected, actual = load_file(sentiment_one / "model.safetensors"), load_file(out / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_every_validation_row_is_scored_once(sentiment_two: tuple[Path, str]) -> None:
    """12 rows in batches of 5 over 2 ranks: Accelerate pads rank 1 with repeats; none of them counts."""
    rows = len(DATA["sentiment"][1].read_text().splitlines())
    scores = validation_scores(sentiment_two[0])
    assert sum(value for key, value in scores.items() if key.startswith("/confusion_matrix/")) == rows == 12


def test_only_the_main_process_prints_logs_and_saves(sentiment_two: tuple[Path, str]) -> None:
    """One start line (per-device, accumulation and effective batch), one log record per update, and
    checkpoints holding every process's RNG state and the weight average."""
    out, log = sentiment_two
    assert log.count("bert-tasks finetune sentiment:") == 1
    assert "2 process(es)" in log
    assert "batch 2 per device x accum 2 = effective 8" in log
    assert log.count("model saved to") == 1
    assert train_steps(out) == list(range(1, 8))
    checkpoints = sorted((out / "checkpoints").iterdir())
    assert [path.name for path in checkpoints] == ["step-00000003", "step-00000006"]
    for checkpoint in checkpoints:
        saved = {path.name for path in checkpoint.iterdir()}
        assert {"random_states_0.pkl", "random_states_1.pkl", SAVED_AVERAGE} <= saved


def test_resumed_two_process_run_ends_where_the_uninterrupted_one_did(
    sentiment_two: tuple[Path, str], sentiment_resumed: tuple[Path, str]
) -> None:
    """Resume from step 3 (mid-epoch, then across the epoch boundary): every rank reaches the same weights."""
    resumed, log = sentiment_resumed
    assert log.count("resuming from") == 1
    for rank in range(2):
        expected = load_file(sentiment_two[0] / f"rank{rank}.safetensors")
        actual = load_file(resumed / f"rank{rank}.safetensors")
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
    assert validation_scores(resumed) == pytest.approx(validation_scores(sentiment_two[0]))


def test_ner_under_accelerate_launch_counts_each_entity_once(ner_two: Path, ner_one: Path) -> None:
    """Token logits padded with -100 across ranks, gathered without repeats: the gold entity counts per
    type are exact, and scores stay close to one process (per-rank token means weight the loss a little
    differently, so only approximately)."""
    gold = Counter(
        tag[2:] for sentence in read_conll(DATA["ner"][1]) for _, tag in sentence if tag.startswith("B-")
    )
    two, one = validation_scores(ner_two), validation_scores(ner_one)
    per_type = json.loads((ner_two / "metrics.json").read_text())["validation"]["per_type"]
    assert {name: row["support"] for name, row in per_type.items()} == gold
    for key in ("/precision", "/recall", "/f1"):
        assert two[key] == pytest.approx(one[key], abs=0.05)
    losses = [[record["loss"] for record in read_log(run) if "loss" in record] for run in (ner_two, ner_one)]
    assert len(losses[0]) == len(losses[1]) == 5
    assert losses[0] == pytest.approx(losses[1], rel=0.01)


def test_fsdp_run_trains_like_ddp(ner_fsdp: Path, ner_two: Path) -> None:
    """Every weight sharded over the two processes, yet the same updates as DDP over the same shards."""
    for rank in range(2):
        record = json.loads((ner_fsdp / f"rank{rank}.json").read_text())
        assert record == {"num_processes": 2, "step": 5, "all_reduces": 0, "sharded": True}
    assert_same_logs(ner_fsdp, ner_two, rel=1e-5, abs_tol=1e-7)
    assert validation_scores(ner_fsdp) == pytest.approx(validation_scores(ner_two))
    expected, actual = load_file(ner_two / "model.safetensors"), load_file(ner_fsdp / "model.safetensors")
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_fsdp_saves_whole_weights_under_hf_names(ner_fsdp: Path, model_dir: Path) -> None:
    """best/ (as it was when the run finished) and the model dir: every tensor whole, transformers'
    query/key/value names, loadable by vanilla transformers with nothing missing or left over."""
    shapes = {name: tensor.shape for name, tensor in load_file(model_dir / "model.safetensors").items()}
    for directory in (ner_fsdp / "best-at-finish", ner_fsdp):
        weights = load_file(directory / "model.safetensors")
        assert {f"bert.{name}": shape for name, shape in shapes.items() if "pooler" not in name} == {
            name: tensor.shape for name, tensor in weights.items() if name.startswith("bert.")
        }
        _, info = AutoModelForTokenClassification.from_pretrained(directory, output_loading_info=True)
        assert not any(info.values()), info


def test_fsdp_restores_the_best_weights_before_scoring(ner_fsdp: Path) -> None:
    """Best at an earlier update than the last: the saved model is best/, not the last update, and the
    sharded model scored the test split (the validation file again) with the weights it was chosen for."""
    metrics = json.loads((ner_fsdp / "metrics.json").read_text())
    assert metrics["best_step"] < 5
    best = load_file(ner_fsdp / "best-at-finish" / "model.safetensors")
    final = load_file(ner_fsdp / "model.safetensors")
    last = load_file(ner_fsdp / "rank0.safetensors")  # the weights after the last update
    assert all(torch.equal(final[name], best[name]) for name in best)
    assert not all(torch.equal(final[name], last[name]) for name in last)
    assert metrics["test"] == metrics["validation"]


def test_fsdp_run_resumes_where_it_stopped(ner_fsdp: Path, ner_fsdp_resumed: Path) -> None:
    """Accelerate saves FSDP checkpoints through torch's distributed state dict, which places each key on a
    module attribute: checkpoints keep the fused `qkv` names, and the resumed sharded run ends with the
    uninterrupted run's weights, log and scores."""
    checkpoint = ner_fsdp / "checkpoints" / "step-00000002"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {path.name for path in checkpoint.iterdir()}
    assert json.loads((ner_fsdp_resumed / "rank0.json").read_text())["sharded"]
    assert_same_logs(ner_fsdp_resumed, ner_fsdp, rel=1e-5, abs_tol=1e-7)
    assert validation_scores(ner_fsdp_resumed) == pytest.approx(validation_scores(ner_fsdp))
    for name in ("rank0.safetensors", "model.safetensors"):
        expected, actual = load_file(ner_fsdp / name), load_file(ner_fsdp_resumed / name)
        assert actual.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(actual[key], expected[key], atol=1e-6, rtol=1e-5, msg=key)


def test_length_groups_follow_the_global_batch() -> None:
    """Per-device batches of 2 on 2 processes hold, update by update, the rows of one process's batch of 4."""
    lengths = [(7 * i) % 23 + 1 for i in range(40)]
    encoded = Dataset.from_dict({"input_ids": [[1] * length for length in lengths]})

    def rows(batch_size: int, processes: int) -> list[list[int]]:
        loader = train_loader(encoded, lambda features: {}, batch_size, seed=3, processes=processes)
        return [batch["row"].tolist() for batch in loader]

    two, one = rows(2, processes=2), rows(4, processes=1)
    assert [two[i] + two[i + 1] for i in range(0, len(two), 2)] == one


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=[path.name for path in ACCELERATE_CONFIGS])
def test_accelerate_config_loads_and_names_its_command(path: Path) -> None:
    """Accelerate's own loader reads it, every nested key is a launch option, it opens with its command."""
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    options = {action.dest for action in launch_command_parser()._actions}
    nested = [*config.deepspeed_config, *config.fsdp_config]
    assert set(nested) <= options, set(nested) - options
    header = path.read_text().split("\ncompute_environment:")[0]
    assert f"accelerate launch --config_file recipes/accelerate/{path.name} -m bert_tasks finetune" in header


def test_accelerate_configs_cover_ddp_fsdp_and_zero2_outside_the_recipe_glob() -> None:
    """The three documented set-ups exist, and test_recipes (recipes/*.yaml) does not read them as recipes."""
    kinds = {load_config_from_file(str(path)).distributed_type.value for path in ACCELERATE_CONFIGS}
    assert kinds == {"MULTI_GPU", "FSDP", "DEEPSPEED"}
    assert not set(ACCELERATE_CONFIGS) & set((ROOT / "recipes").glob("*.yaml"))
