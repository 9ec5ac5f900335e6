"""Model dirs whose parts disagree, and checkpoints that are not what bert-tasks wrote: one line each.

Every bad dir is a copy of a fixture run (or of the tiny base model) with one part edited: config.json
says other layers or sizes than model.safetensors holds, the weights lose or rename a layer, the tokenizer
files are damaged, id2label names one label twice, a checkpoint's state file is truncated or garbage.
Each is tried through the library and through the CLI (exit 1, exactly one stderr line, no traceback).
A fine-tuned model as the base of a run on other labels is no error: its encoder is kept, its head starts
fresh, and the run says so.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import EntityTagger, Predictor
from bert_tasks.model_dir import load_finetuned, read_policy
from bert_tasks.modeling.load import load_model
from bert_tasks.training import train
from tests.helpers import DATA, cli_error_line, fast_overrides, read_conll, tiny_config, write_conll

pytestmark = pytest.mark.usefixtures("single_thread")

TEXT = "Aspirin helped."


def edit_config(model_dir: Path, **changes: Any) -> Path:
    config_file = model_dir / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **changes}))
    return model_dir


def edit_weights(model_dir: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> Path:
    weights = model_dir / "model.safetensors"
    save_file(edit(load_file(weights)), weights, metadata={"format": "pt"})
    return model_dir


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `bert-tasks ARGV` prints before it exits 1, without its prefix."""
    return cli_error_line(argv, capsys).removeprefix("bert-tasks: error: ")


def assert_refused(
    library: Callable[[], Any], argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> str:
    """The library raises, and the CLI prints, the same one line holding `expected`."""
    with pytest.raises(BertTasksError) as error:
        library()
    message = str(error.value)
    assert expected in message and "\n" not in message
    assert cli_error(argv, capsys) == message
    return message


# 1. Weights that do not match their config.json.

#: name -> (edit of a copied dir, what the line must say: the first misfit and its shapes)
MISFITS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "config says more layers": (
        lambda d: edit_config(d, num_hidden_layers=3),
        "bert.encoder.layer.2.attention.output.LayerNorm.bias [32] is not in the weights (and 15 more)",
    ),
    "config says fewer layers": (
        lambda d: edit_config(d, num_hidden_layers=1),
        "the weights hold bert.encoder.layer.1.attention.output.LayerNorm.bias [32], for which config.json",
    ),
    "a layer missing from the file": (
        lambda d: edit_weights(d, lambda w: {k: v for k, v in w.items() if ".layer.1." not in k}),
        "bert.encoder.layer.1.attention.output.LayerNorm.bias [32] is not in the weights",
    ),
    "renamed encoder keys": (
        lambda d: edit_weights(d, lambda w: {k.replace(".self.query.", ".self.q."): v for k, v in w.items()}),
        "the weights hold bert.encoder.layer.0.attention.self.q.bias [32], for which config.json has no",
    ),
    "another hidden size": (
        lambda d: edit_config(d, hidden_size=64),
        "bert.embeddings.LayerNorm.bias is [32] in the weights but [64] in config.json",
    ),
    "another vocab size": (
        lambda d: edit_config(d, vocab_size=30000),
        "bert.embeddings.word_embeddings.weight is [30522, 32] in the weights but [30000, 32] in config.json",
    ),
    "another intermediate size": (
        lambda d: edit_config(d, intermediate_size=40),
        "bert.encoder.layer.0.intermediate.dense.bias is [37] in the weights but [40] in config.json",
    ),
    "a tensor of the wrong shape": (
        lambda d: edit_weights(
            d, lambda w: {**w, "bert.encoder.layer.1.output.dense.weight": torch.zeros(32, 40)}
        ),
        "bert.encoder.layer.1.output.dense.weight is [32, 40] in the weights but [32, 37] in config.json",
    ),
}


@pytest.mark.parametrize("case", MISFITS)
@pytest.mark.slow
def test_a_fine_tuned_dir_whose_weights_do_not_match_is_refused(
    case: str, ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Predict, evaluate and export would run the missing parts on random values: refused, by key."""
    edit, expected = MISFITS[case]
    model = edit(shutil.copytree(ner_run, tmp_path / "model"))
    expected = f"model {model}: its weights do not match its config.json: {expected}"
    argv = ["predict", "ner", "--model", str(model), TEXT]
    assert_refused(lambda: EntityTagger(model)(TEXT), argv, expected, capsys)
    with pytest.raises(BertTasksError, match=r"put back the config\.json saved with these weights"):
        load_finetuned(model)


@pytest.mark.parametrize("case", ["config says more layers", "renamed encoder keys", "another hidden size"])
@pytest.mark.slow
def test_a_base_model_whose_weights_do_not_match_is_refused(
    case: str, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """finetune would train from random layers: refused before anything is written."""
    edit, _ = MISFITS[case]
    base = edit(shutil.copytree(tiny_model, tmp_path / "base"))
    out = tmp_path / "out"
    args = fast_overrides("sentiment", base, out)
    expected = f"model {base}: its weights do not match its config.json: "
    assert_refused(
        lambda: train(tiny_config("sentiment", base, out)), ["finetune", "sentiment", *args], expected, capsys
    )
    assert not out.exists()


def test_a_token_head_may_lack_the_pooler_and_a_base_the_whole_head(tiny_model: Path, ner_run: Path) -> None:
    """What transformers reports missing or unused for a new head is no misfit: the head starts fresh."""
    for task, labels in [("ner", ["O", "B-X", "I-X"]), ("sentiment", ["bad", "good"])]:
        assert load_model(tiny_model, task, labels).classifier.out_features == len(labels)
    assert load_model(ner_run, "base") is not None  # a classifier the head has no place for: unused


@pytest.mark.parametrize("task", ["ner", "sentiment"])
def test_the_bundled_default_still_loads_as_each_head(task: str) -> None:
    model = load_model("all-MiniLM-L6-v2", task, ["a", "b", "c"])
    assert model.classifier.out_features == 3


# 2. A fine-tuned model as the base of a run on other labels.


def other_entity_types(folder: Path) -> tuple[Path, Path]:
    """The NER fixtures with Chemical renamed Drug and Disease dropped (O): labels O, B-Drug, I-Drug."""
    rename = {"B-Chemical": "B-Drug", "I-Chemical": "I-Drug", "B-Disease": "O", "I-Disease": "O"}
    files = []
    for source in DATA["ner"]:
        sentences = [[(word, rename.get(tag, tag)) for word, tag in s] for s in read_conll(source)]
        files.append(write_conll(folder / source.name, sentences))
    return files[0], files[1]


def encoder_of(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in weights.items() if k.startswith(("bert.embeddings.", "bert.encoder."))}


def assert_fresh_head_line(caplog: pytest.LogCaptureFixture, base: Path, saved: int, new: int) -> None:
    """Exactly one INFO line says that the base's classifier is replaced."""
    [line] = [r.getMessage() for r in caplog.records if "the head starts fresh" in r.getMessage()]
    assert line.startswith(f"model {base}: its classifier has {saved} labels (")
    assert f"), this run has {new} (" in line
    assert line.endswith("): the encoder is kept, the head starts fresh")


@pytest.mark.parametrize("task", ["sentiment", "ner"])
@pytest.mark.slow
def test_a_ner_model_is_the_base_of_a_run_on_other_labels(
    task: str, ner_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NER -> sentiment and NER -> other entity types: the run finishes with a head of the new size, its
    encoder starting from the base's weights, and one INFO line saying so."""
    data = {}
    if task == "ner":
        train_file, validation_file = other_entity_types(tmp_path)
        data = {"train_file": train_file, "validation_file": validation_file}
    labels = ["negative", "positive"] if task == "sentiment" else ["O", "B-Drug", "I-Drug"]
    start = encoder_of(load_model(ner_run, task, labels).state_dict())
    base = encoder_of(load_file(ner_run / "model.safetensors"))
    assert start.keys() == base.keys()
    for key, tensor in start.items():
        assert torch.equal(tensor, base[key]), key
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        out = train(tiny_config(task, ner_run, tmp_path / "out", **data))
    assert_fresh_head_line(caplog, ner_run, 5, len(labels))
    config = json.loads((out / "config.json").read_text())
    assert list(config["id2label"].values()) == labels
    assert load_file(out / "model.safetensors")["classifier.weight"].shape == (len(labels), 32)
    assert read_policy(out, task).task == task


def test_a_sentiment_model_with_other_classes_of_the_same_count_starts_its_head_fresh(
    sentiment_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Same shape, other classes: loading the old rows would make the new head believe it knows them."""
    saved = load_file(sentiment_run / "model.safetensors")
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        relabelled = load_model(sentiment_run, "sentiment", ["bad", "good"]).state_dict()
        same = load_model(sentiment_run, "sentiment", ["negative", "positive"]).state_dict()
    assert not torch.equal(relabelled["classifier.weight"], saved["classifier.weight"])
    assert torch.equal(same["classifier.weight"], saved["classifier.weight"])  # continuing: the head is kept
    for key, tensor in encoder_of(relabelled).items():
        assert torch.equal(tensor, saved[key]), key
    assert_fresh_head_line(caplog, sentiment_run, 2, 2)


@pytest.mark.slow
def test_the_cli_finetunes_from_a_ner_dir_and_says_the_head_starts_fresh(
    ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["finetune", "sentiment", *fast_overrides("sentiment", ner_run, out)]) == 0
    err = capsys.readouterr().err
    assert (
        f"model {ner_run}: its classifier has 5 labels (O, B-Chemical, I-Chemical, B-Disease, ...), " in err
    )
    assert "this run has 2 (negative, positive): the encoder is kept, the head starts fresh" in err
    assert (out / "metrics.json").is_file()


# 3. Damaged tokenizer files.


def rewrite_tokenizer_json(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Path]:
    def rewrite(model: Path) -> Path:
        file = model / "tokenizer.json"
        file.write_text(json.dumps(edit(json.loads(file.read_text()))))
        return file

    return rewrite


def vocab_txt_only(content: bytes) -> Callable[[Path], Path]:
    def rewrite(model: Path) -> Path:
        (model / "tokenizer.json").unlink()
        (model / "vocab.txt").write_bytes(content)
        return model / "vocab.txt"

    return rewrite


def truncated(model: Path) -> Path:
    file = model / "tokenizer.json"
    file.write_bytes(file.read_bytes()[:1000])
    return file


def garbage(model: Path) -> Path:
    (model / "tokenizer.json").write_bytes(b"\x00\xff" * 100)
    return model / "tokenizer.json"


def without_unk(data: dict[str, Any]) -> dict[str, Any]:
    data["model"]["vocab"] = {k: v for k, v in data["model"]["vocab"].items() if k != "[UNK]"}
    return data


#: name -> edit of a copied model dir, returning the file the line must name
BAD_TOKENIZERS: dict[str, Callable[[Path], Path]] = {
    "truncated tokenizer.json": truncated,
    "garbage tokenizer.json": garbage,
    "tokenizer.json of another schema": rewrite_tokenizer_json(lambda _: {"model": {"type": "Nope"}}),
    "tokenizer.json that is a list": rewrite_tokenizer_json(lambda _: []),
    "vocab without [UNK]": rewrite_tokenizer_json(without_unk),
    "vocab.txt of garbage bytes": vocab_txt_only(b"\xff\xfe\x00garbage"),
    "empty vocab.txt": vocab_txt_only(b""),
}


@pytest.mark.parametrize("case", BAD_TOKENIZERS)
@pytest.mark.slow
def test_a_damaged_tokenizer_file_is_named(
    case: str, ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = shutil.copytree(ner_run, tmp_path / "model")
    file = BAD_TOKENIZERS[case](model)
    expected = f"{file}: could not load the tokenizer ("
    assert_refused(
        lambda: EntityTagger(model), ["predict", "ner", "--model", str(model), TEXT], expected, capsys
    )


def test_a_base_model_with_a_damaged_tokenizer_is_named(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = shutil.copytree(tiny_model, tmp_path / "base")
    file = truncated(base)
    out = tmp_path / "out"
    argv = ["finetune", "sentiment", *fast_overrides("sentiment", base, out)]
    expected = f"{file}: could not load the tokenizer ("
    assert_refused(lambda: train(tiny_config("sentiment", base, out)), argv, expected, capsys)


def test_a_dir_without_tokenizer_files_is_refused(
    ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers would build a tokenizer of five special tokens, and every word would be [UNK]."""
    model = shutil.copytree(ner_run, tmp_path / "model")
    (model / "tokenizer.json").unlink()
    expected = f"model dir {model}: no tokenizer.json or vocab.txt"
    assert_refused(
        lambda: EntityTagger(model), ["predict", "ner", "--model", str(model), TEXT], expected, capsys
    )


def test_a_tokenizer_larger_than_the_embeddings_is_refused(
    ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its extra ids would fail inside the embedding lookup, mid-prediction."""
    model = shutil.copytree(ner_run, tmp_path / "model")

    def more_tokens(data: dict[str, Any]) -> dict[str, Any]:
        vocab = data["model"]["vocab"]
        vocab.update({f"zz{i}": len(vocab) + i for i in range(10)})
        return data

    rewrite_tokenizer_json(more_tokens)(model)
    expected = f"model {model}: its tokenizer has 30532 tokens but the model's embeddings only 30522"
    assert_refused(
        lambda: EntityTagger(model), ["predict", "ner", "--model", str(model), TEXT], expected, capsys
    )


# 4. id2label naming one label twice, or labels the task cannot read; windows the model cannot take.


@pytest.mark.parametrize(
    ("id2label", "expected"),
    [
        (
            {"0": "O", "1": "B-Chemical", "2": "I-Chemical", "3": "B-Chemical", "4": "I-Disease"},
            "'id2label' gives ids 1 and 3 the same name 'B-Chemical'",
        ),
        ({"0": "O", "x": "B-Chemical"}, "'id2label' is not an object of ids"),
    ],
)
def test_an_id2label_naming_a_label_twice_is_refused(
    id2label: dict[str, str], expected: str, ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = edit_config(shutil.copytree(ner_run, tmp_path / "model"), id2label=id2label)
    expected = f"{model / 'config.json'}: {expected}"
    assert_refused(
        lambda: Predictor(model), ["predict", "ner", "--model", str(model), TEXT], expected, capsys
    )
    data = str(DATA["ner"][1])
    argv = ["evaluate", "ner", "--model", str(model), "--data", data, "--out", str(tmp_path / "report")]
    assert expected in cli_error(argv, capsys)
    with pytest.raises(BertTasksError, match=r"fix config\.json"):
        read_policy(model)


@pytest.mark.parametrize(
    ("id2label", "expected"),
    [
        ({"0": "O", "1": "Chemical", "2": "I-Chemical"}, "'id2label' names ['Chemical'] are not BIO"),
        (
            {"0": "O", "1": "S-Chemical", "2": "E-Chemical"},
            "'id2label' names ['S-Chemical', 'E-Chemical'] are not BIO",
        ),
    ],
)
def test_an_id2label_that_is_not_bio_is_refused_before_the_model_loads(
    id2label: dict[str, str], expected: str, ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Entity types are read off B-/I- prefixes: a `Chemical` label was predicted as type `emical`."""
    model = edit_config(
        shutil.copytree(ner_run, tmp_path / "model"),
        id2label=id2label,
        label2id={name: int(i) for i, name in id2label.items()},
    )
    expected = f"{model / 'config.json'}: {expected}"
    assert_refused(
        lambda: EntityTagger(model), ["predict", "ner", "--model", str(model), TEXT], expected, capsys
    )
    assert expected in cli_error(["serve", "ner", "--model", str(model)], capsys)
    data = str(DATA["ner"][1])
    argv = ["evaluate", "ner", "--model", str(model), "--data", data, "--out", str(tmp_path / "report")]
    assert expected in cli_error(argv, capsys)
    assert not (tmp_path / "report").exists()


def test_a_saved_max_length_past_the_position_embeddings_is_refused_by_predict_and_serve(
    ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """predict and serve run the saved windows: a long text failed mid-run (a traceback, a 500)."""
    model = shutil.copytree(ner_run, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    positions = config["max_position_embeddings"]
    edit_config(model, bert_tasks={**config["bert_tasks"], "max_length": positions * 2})
    expected = (
        f"bert_tasks.max_length={positions * 2}: model {model} has only {positions} position embeddings"
    )
    long_text = " ".join(["word"] * positions * 3)
    assert_refused(
        lambda: EntityTagger(model), ["predict", "ner", "--model", str(model), long_text], expected, capsys
    )
    assert expected in cli_error(["serve", "ner", "--model", str(model)], capsys)


# 5. Checkpoints whose files are not what bert-tasks wrote.

STEP_4, STEP_5 = "checkpoints/step-00000004", "checkpoints/step-00000005"


class Planted:
    """A pickled object torch's weights_only loader refuses."""


@pytest.fixture(scope="module")
def checkpointed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 5 updates with checkpoints at 4 and 5 and no metrics.json: resumable."""
    run = train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("ckpt") / "run", **RESUMABLE))
    (run / "metrics.json").unlink()
    return run


RESUMABLE = {"save_every": 1, "validation_file": None}

#: name -> how a state file is damaged
DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
    "garbage": lambda f: f.write_bytes(b"garbage" * 100),
    "a pickle weights_only refuses": lambda f: torch.save(Planted(), f),
    "a raw pickle": lambda f: f.write_bytes(pickle.dumps(Planted())),
}


def resume(tiny_model: Path, run: Path) -> tuple[Callable[[], Any], list[str]]:
    """The same resume through the library and through the CLI."""
    args = fast_overrides("sentiment", tiny_model, run, **RESUMABLE)
    return (
        lambda: train(tiny_config("sentiment", tiny_model, run, resume=True, **RESUMABLE)),
        ["finetune", "sentiment", *args, "--resume"],
    )


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize(
    "name", ["model.safetensors", "optimizer.bin", "scheduler.bin", "run_state.json", "random_states_0.pkl"]
)
@pytest.mark.slow
def test_a_damaged_checkpoint_file_is_named_with_the_checkpoint_to_fall_back_to(
    name: str,
    damage: str,
    checkpointed: Path,
    tiny_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = shutil.copytree(checkpointed, tmp_path / "run")
    DAMAGE[damage](run / STEP_5 / name)
    expected = f"checkpoint {run / STEP_5} is damaged: {name} is not what bert-tasks wrote ("
    library, argv = resume(tiny_model, run)
    message = assert_refused(library, argv, expected, capsys)
    assert message.endswith(f"; delete {run / STEP_5} and --resume again to continue from step-00000004")


@pytest.mark.slow
def test_a_missing_random_state_file_is_named_too(
    checkpointed: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Accelerate would resume without it, silently not exact."""
    run = shutil.copytree(checkpointed, tmp_path / "run")
    (run / STEP_5 / "random_states_0.pkl").unlink()
    library, argv = resume(tiny_model, run)
    expected = f"checkpoint {run / STEP_5} is damaged: random_states_0.pkl is missing; delete {run / STEP_5}"
    assert_refused(library, argv, expected, capsys)


@pytest.mark.slow
def test_following_the_advice_resumes_from_the_earlier_checkpoint(
    checkpointed: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shutil.copytree(checkpointed, tmp_path / "run")
    DAMAGE["garbage"](run / STEP_5 / "optimizer.bin")
    _, argv = resume(tiny_model, run)
    cli_error(argv, capsys)
    shutil.rmtree(run / STEP_5)
    assert main(argv) == 0
    assert "resuming from" in capsys.readouterr().err and (run / "metrics.json").is_file()


@pytest.mark.slow
def test_another_runs_state_and_the_only_checkpoint(
    checkpointed: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state file that reads but is not this run's; no earlier checkpoint to fall back to."""
    run = shutil.copytree(checkpointed, tmp_path / "run")
    shutil.rmtree(run / STEP_4)
    torch.save({"state": {}}, run / STEP_5 / "optimizer.bin")
    library, argv = resume(tiny_model, run)
    expected = (
        f"checkpoint {run / STEP_5} is damaged: its state does not fit this run (KeyError: 'param_groups'); "
        "no earlier checkpoint is kept: train again with --overwrite"
    )
    assert_refused(library, argv, expected, capsys)


@pytest.mark.slow
def test_damaged_best_weights_are_one_line(
    checkpointed: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed run restores best/ at its end: removed or damaged, it says so."""
    run = shutil.copytree(checkpointed, tmp_path / "run")
    for step in (STEP_4, STEP_5):  # the checkpoints say an evaluation at step 4 was the best
        state_file = run / step / "run_state.json"
        state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "best_step": 4}))
    (run / "best").mkdir()
    (run / "best" / "model.safetensors").write_bytes(b"garbage")
    library, argv = resume(tiny_model, run)
    expected = f"{run / 'best' / 'model.safetensors'}: the run's best weights cannot be restored ("
    with pytest.raises(BertTasksError) as error:
        library()
    assert expected in str(error.value)
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    # The run got as far as its end (progress and INFO lines come first): the error is the last line.
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"bert-tasks: error: {error.value}"


def test_a_checkpoint_is_resumed_on_as_many_processes_as_wrote_it(checkpointed: Path) -> None:
    """Process 1 of a two-process launch finds no RNG state in a one-process checkpoint: say why."""
    from bert_tasks.training.checkpoints import _check_random_states

    with pytest.raises(BertTasksError) as refused:
        _check_random_states(checkpointed / STEP_5, process=1, processes=2)
    assert str(refused.value) == (
        f"checkpoint {checkpointed / STEP_5} was written by 1 process(es) and this launch has 2; resume it "
        "with 1 (the data order and random states are per process)"
    )
