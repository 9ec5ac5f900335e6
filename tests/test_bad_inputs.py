"""Bad input, case by case, through the command line and through the library: the same one line.

Each case is run twice: `bert-tasks ...` (through `cli.main`: exit status 1, exactly one line on stderr,
no traceback) and the same request through the Python API (a BertTasksError whose message is that line).
A finetune that fails on its input leaves no output dir behind. The cases that must work (a stray I- tag,
a 100,000-character text, control characters, emoji and right-to-left text) run on a tiny model trained
here to tag four words, so "every entity found" is checked, not just "no crash".
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertForTokenClassification

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import evaluate_file
from bert_tasks.inference.predictor import EntityTagger, SentimentClassifier
from bert_tasks.training import train
from tests.helpers import DATA, fast_overrides, tiny_bert_config, tiny_config, write_conll, write_file

ENTITIES = {"aspirin": "Chemical", "cisplatin": "Chemical", "headache": "Disease", "nausea": "Disease"}
#: Everything else the texts below hold, so the tagger has seen each kind of character as O.
FILLER = ["the", "patient", "was", "given", "and", "later", "developed", "a", "mild", "case", "of"]
FILLER += ["after", "with", ",", ".", ";", "🤒", "مريض", "يعاني"]
#: ~80 characters with every entity, odd spacing, a tab, an RTL mark, emoji and Arabic.
UNIT = "After  aspirin the patient had a headache ,\tthen cisplatin caused nausea .\u200f مريض 🤒 "
PREDICTORS = {"sentiment": SentimentClassifier, "ner": EntityTagger}


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tagger_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny NER model that tags the four ENTITIES words and nothing else (~2 s of training)."""
    folder = tmp_path_factory.mktemp("tagger")
    rng = random.Random(0)
    sentences = []
    for _ in range(48):
        words = [(rng.choice(FILLER), "O") for _ in range(rng.randint(4, 10))]
        for word, label in rng.sample(sorted(ENTITIES.items()), 2):
            words.insert(rng.randint(0, len(words)), (word, f"B-{label}"))
        sentences.append(words)
    train_file = write_conll(folder / "train.conll", sentences)
    settings = {"train_file": train_file, "validation_file": None, "lr": 3e-3, "epochs": 12}
    return train(tiny_config("ner", tiny_model, folder / "model", **settings, logging_steps=50))


@dataclass(frozen=True)
class Case:
    """One bad request: its command line, the same request through the library, and the message."""

    argv: list[str]
    library: Callable[[], Any]
    expected: str


@dataclass(frozen=True)
class Place:
    """Where a case writes its files, and the models it may use."""

    tmp: Path
    tiny_model: Path
    sentiment: Path
    ner: Path

    def write(self, name: str, content: str | bytes) -> Path:
        return write_file(self.tmp, name, content)

    def copy_of_ner(self, name: str) -> Path:
        return shutil.copytree(self.ner, self.tmp / name)


def finetune(place: Place, task: str, expected: str, recipe: Path | None = None, **overrides: Any) -> Case:
    args = fast_overrides(task, place.tiny_model, place.tmp / "out", **overrides)
    argv = ["finetune", task, *(["--recipe", str(recipe)] if recipe else []), *args]
    return Case(argv, lambda: train(load_recipe(recipe, args, task)), expected)


def predict(task: str, model: Path, texts: list[str], expected: str) -> Case:
    argv = ["predict", task, "--model", str(model), "--", *texts]
    return Case(argv, lambda: PREDICTORS[task](model)(texts), expected)


def evaluate(place: Place, task: str, model: Path, data: Path, expected: str) -> Case:
    out = place.tmp / "report"
    argv = ["evaluate", task, "--model", str(model), "--data", str(data), "--out", str(out)]
    return Case(argv, lambda: evaluate_file(task, model, str(data), [], out), expected)


def missing_file(p: Place) -> Case:
    path = p.tmp / "missing.jsonl"
    return finetune(p, "sentiment", f"{path}: file not found", train_file=path)


def empty_file(p: Place) -> Case:
    path = p.write("empty.jsonl", "\n  \n")
    return finetune(p, "sentiment", f"{path}: the file is empty", train_file=path)


def misnamed_columns(p: Place) -> Case:
    path = p.write("reviews.csv", "review,stars\nGreat,positive\n")
    expected = (
        f"{path}:1: header has columns review, stars, expected text_column='text' and label_column='label'"
    )
    return finetune(p, "sentiment", expected, train_file=path)


def missing_column(p: Place) -> Case:
    path = p.write("validation.jsonl", '{"text": "Great.", "label": "positive"}\n{"text": "Awful."}\n')
    expected = f"{path}:2: expected columns text_column='text' and label_column='label', found text;"
    return finetune(p, "sentiment", expected, validation_file=path)


def malformed_conll_line(p: Place) -> Case:
    path = p.write("train.conll", "Aspirin\tB-Chemical\ncaused\n")
    return finetune(
        p, "ner", f"{path}:2: expected at least 2 columns (token ... tag), found 1", train_file=path
    )


def label_unseen_in_train(p: Place) -> Case:
    path = p.write("validation.jsonl", '{"text": "It was fine.", "label": "neutral"}\n')
    expected = f"{path}: label 'neutral' never occurs in the training data ({DATA['sentiment'][0]})"
    return finetune(p, "sentiment", expected, validation_file=path)


def entity_type_unseen_in_train(p: Place) -> Case:
    path = p.write("test.conll", "BRCA1\tB-Gene\nmutation\tO\n")
    return finetune(p, "ner", f"{path}: entity type 'Gene' never occurs in the training data", test_file=path)


def tags_that_are_not_bio(p: Place) -> Case:
    path = p.write("train.conll", "Aspirin\tChemical\nhelped\tO\n")
    return finetune(p, "ner", f"{path}:1: tag 'Chemical' is not BIO (O, B-TYPE, I-TYPE;", train_file=path)


def label_names_not_bio(p: Place) -> Case:
    names = "[O,B-Disease,I-Disease,B-Chemical,I-Chemical,Disease]"
    return finetune(p, "ner", "names ['Disease'] are not BIO; give O plus B-TYPE", label_names=names)


def max_length_past_positions(p: Place) -> Case:
    expected = f"max_length=512: model {p.tiny_model} has only 128 position embeddings; set max_length=128"
    return finetune(p, "ner", expected, max_length=512)


def non_utf8_bytes(p: Place) -> Case:
    path = p.write("latin1.jsonl", '{"text": "Caf\xe9 cr\xe8me", "label": "positive"}\n'.encode("latin-1"))
    return finetune(p, "sentiment", f"{path}:1: byte 0xe9 at offset 13 is not UTF-8", train_file=path)


def recipe_unknown_key(p: Place) -> Case:
    recipe = p.write("recipe.yaml", "batchsize: 8\n")
    expected = f"unknown config key 'batchsize' in recipe {recipe}; did you mean 'batch_size'?"
    return finetune(p, "sentiment", expected, recipe=recipe)


def recipe_wrong_type(p: Place) -> Case:
    recipe = p.write("recipe.yaml", "epochs: three\n")
    return finetune(p, "sentiment", f"epochs='three' in recipe {recipe}: expected a number", recipe=recipe)


def batch_size_zero(p: Place) -> Case:
    return finetune(p, "sentiment", "bad config: batch_size=0, must be >= 1", batch_size=0)


def negative_lr(p: Place) -> Case:
    return finetune(p, "sentiment", "bad config: lr=-0.0001, must be > 0", lr=-1e-4)


def base_model_not_an_encoder(p: Place) -> Case:
    folder = p.tmp / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    expected = f"model {folder}: model_type 'gpt2' is not a BERT-family encoder"
    return finetune(p, "sentiment", expected, model=folder)


def base_model_half_written(p: Place) -> Case:
    folder = p.tmp / "half-base"
    shutil.copytree(p.tiny_model, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return finetune(p, "sentiment", f"model {folder}: could not load weights", model=folder)


def predict_empty_text(p: Place) -> Case:
    return predict("sentiment", p.sentiment, [""], "text 1 is empty; give at least one word to predict on")


def predict_whitespace_text(p: Place) -> Case:
    return predict("ner", p.ner, ["Aspirin helped.", " \t\n"], "text 2 is empty")


def model_dir_not_a_model(p: Place) -> Case:
    return predict("ner", p.tmp, ["Aspirin helped."], f"model dir {p.tmp}: no config.json")


def model_dir_not_fine_tuned(p: Place) -> Case:
    expected = (
        f"model dir {p.tiny_model}: not a fine-tuned model of a bert-tasks task (architectures ['BertModel'])"
    )
    return predict("ner", p.tiny_model, ["Aspirin helped."], expected)


def model_dir_without_labels(p: Place) -> Case:
    model = p.copy_of_ner("no-labels")
    config = json.loads((model / "config.json").read_text())
    del config["id2label"], config["label2id"]
    (model / "config.json").write_text(json.dumps(config))
    expected = f"model dir {model}: config.json has no label names (id2label is missing)"
    return predict("ner", model, ["Aspirin helped."], expected)


def stock_model_with_placeholder_labels(p: Place) -> Case:
    model = p.tmp / "stock"
    BertForTokenClassification(tiny_bert_config(num_labels=3)).save_pretrained(model)
    expected = f"model dir {model}: config.json has no label names (id2label is LABEL_0, LABEL_1, LABEL_2)"
    return predict("ner", model, ["Aspirin helped."], expected)


def model_dir_half_written(p: Place) -> Case:
    model = p.copy_of_ner("half")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return predict("ner", model, ["Aspirin helped."], f"model dir {model}: model.safetensors is damaged")


def model_dir_without_weights(p: Place) -> Case:
    model = p.copy_of_ner("no-weights")
    (model / "model.safetensors").unlink()
    return predict("ner", model, ["Aspirin helped."], f"model {model}: could not load weights")


def evaluate_label_the_model_lacks(p: Place) -> Case:
    data = p.write("test.jsonl", '{"text": "It was fine.", "label": "neutral"}\n')
    expected = f"{data}: label 'neutral' (first in example 1) is not one the model knows (negative, positive)"
    return evaluate(p, "sentiment", p.sentiment, data, expected)


def evaluate_entity_type_the_model_lacks(p: Place) -> Case:
    data = p.write("test.conll", "BRCA1\tB-Gene\nmutation\tO\n")
    expected = f"{data}: label 'B-Gene' (first in example 1) is not one the model knows"
    return evaluate(p, "ner", p.ner, data, expected)


CASES: dict[str, Callable[[Place], Case]] = {
    case.__name__: case
    for case in (
        missing_file,
        empty_file,
        misnamed_columns,
        missing_column,
        malformed_conll_line,
        label_unseen_in_train,
        entity_type_unseen_in_train,
        tags_that_are_not_bio,
        label_names_not_bio,
        max_length_past_positions,
        non_utf8_bytes,
        recipe_unknown_key,
        recipe_wrong_type,
        batch_size_zero,
        negative_lr,
        base_model_not_an_encoder,
        base_model_half_written,
        predict_empty_text,
        predict_whitespace_text,
        model_dir_not_a_model,
        model_dir_not_fine_tuned,
        model_dir_without_labels,
        stock_model_with_placeholder_labels,
        model_dir_half_written,
        model_dir_without_weights,
        evaluate_label_the_model_lacks,
        evaluate_entity_type_the_model_lacks,
    )
}


@pytest.fixture
def place(tmp_path: Path, tiny_model: Path, sentiment_run: Path, tagger_dir: Path) -> Place:
    return Place(tmp_path, tiny_model, sentiment_run, tagger_dir)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.slow
def test_bad_input_is_one_line_from_cli_and_library(
    name: str, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit status 1 and one stderr line (what, where, what to do); the library raises the same message."""
    case = CASES[name](place)
    capsys.readouterr()
    assert main(case.argv) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    [line] = captured.err.strip().splitlines()
    assert case.expected in line
    with pytest.raises(BertTasksError) as error:
        case.library()
    assert line == f"bert-tasks: error: {error.value}"
    assert not (place.tmp / "out").exists(), "a finetune that failed on its input left an output dir"


@pytest.mark.slow
def test_overwrite_with_bad_input_keeps_the_previous_run(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """--overwrite deletes the previous run only once the new run's data and model have loaded."""
    previous = place.tmp / "out"
    previous.mkdir()
    (previous / "recipe.yaml").write_text("# Resolved bert-tasks config\ntask: sentiment\n")
    (previous / "model.safetensors").write_bytes(b"weights")
    case = missing_file(place)
    assert main([*case.argv, "--overwrite"]) == 1
    assert case.expected in capsys.readouterr().err
    assert sorted(path.name for path in previous.iterdir()) == ["model.safetensors", "recipe.yaml"]


@pytest.mark.slow
def test_debug_shows_the_traceback_of_a_bad_input(place: Place) -> None:
    """--debug re-raises the same error, for a traceback."""
    case = missing_file(place)
    with pytest.raises(BertTasksError, match="file not found"):
        main(["--debug", *case.argv])


@pytest.mark.slow
def test_stray_inside_tags_are_repaired_with_a_warning(
    place: Place, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gold `I-X` after O (or first) is read as `B-X`, as conlleval does: scored, with one warning naming
    the file and the first line, from the command line and the library alike."""
    data = write_conll(place.tmp / "gold.conll", [[("aspirin", "I-Chemical"), ("helped", "O")]])
    out = place.tmp / "report"
    with caplog.at_level(logging.WARNING):
        argv = ["evaluate", "ner", "--model", str(place.ner), "--data", str(data), "--out", str(out)]
        assert main(argv) == 0
        metrics = evaluate_file("ner", place.ner, str(data), [], out)
    warning = f"{data}: repaired 1 invalid BIO tag(s) (I-X not continuing an X entity -> B-X, as seqeval "
    warning += f"and conlleval read them); first at {data}:1"
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == [
        warning
    ] * 2
    assert metrics["per_type"]["Chemical"]["support"] == 1
    assert metrics["f1"] == 1.0


class Planted:
    """Unpickling this creates `marker`: proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.marker), "w")


def plant_pickle_weights(model: Path, marker: Path) -> str | None:
    """Swap model.safetensors for a pytorch_model.bin that runs code when unpickled; loading must refuse."""
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(Planted(marker)))
    return f"model {model}: could not load weights"


def plant_remote_code(model: Path, marker: Path) -> str | None:
    """Point config.json's auto_map at a module that runs code on import; it must load as plain BERT."""
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "planted.Config", "AutoModelForTokenClassification": "planted.Model"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "planted.py").write_text(f"open({str(marker)!r}, 'w')\n")
    return None


@pytest.mark.parametrize("plant", [plant_pickle_weights, plant_remote_code])
@pytest.mark.slow
def test_code_planted_in_a_model_dir_never_runs(
    plant: Callable[[Path, Path], str | None], place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pickle weights are refused (safetensors only) and trust_remote_code stays off, in the CLI and the
    library: the planted code never runs."""
    model, marker = place.copy_of_ner("planted"), place.tmp / "code-ran"
    refusal = plant(model, marker)
    capsys.readouterr()
    status = main(["predict", "ner", "--model", str(model), "Aspirin helped."])
    if refusal is None:
        assert status == 0
        assert EntityTagger(model)("Aspirin helped.")[0]["text"] == "Aspirin"
    else:
        assert status == 1
        [line] = capsys.readouterr().err.strip().splitlines()
        assert refusal in line and "save it as safetensors" in line
        with pytest.raises(BertTasksError, match="save it as safetensors"):
            EntityTagger(model)
    assert not marker.exists()


def as_pickle_weights(model: Path) -> Path:
    """Turn a model dir's safetensors into a plain (harmless) pickle-based pytorch_model.bin."""
    weights = model / "model.safetensors"
    torch.save(load_file(weights), model / "pytorch_model.bin")
    weights.unlink()
    return model


@pytest.mark.slow
def test_pickle_weights_load_when_asked_for(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    """The opt-in exists everywhere: --allow-pickle (predict), allow_pickle=true (finetune), Python."""
    model = as_pickle_weights(place.copy_of_ner("pickled"))
    assert main(["predict", "ner", "--model", str(model), "Aspirin helped."]) == 1
    assert "--allow-pickle" in capsys.readouterr().err
    assert main(["predict", "ner", "--model", str(model), "--allow-pickle", "--json", "Aspirin helped."]) == 0
    assert json.loads(capsys.readouterr().out)["entities"][0]["text"] == "Aspirin"
    assert EntityTagger(model, allow_pickle=True)("Aspirin helped.")[0]["text"] == "Aspirin"

    base = as_pickle_weights(shutil.copytree(place.tiny_model, place.tmp / "pickled-base"))
    out = place.tmp / "from-pickle"
    assert main(["finetune", "sentiment", *fast_overrides("sentiment", base, out, allow_pickle=True)]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "pytorch_model.bin").exists()


def expected_entities(text: str) -> list[dict[str, Any]]:
    """Every occurrence of an ENTITIES word in `text`, in order, as the tagger should report it."""
    found = []
    for word, label in ENTITIES.items():
        start = text.find(word)
        while start != -1:
            found.append({"text": word, "label": label, "start": start, "end": start + len(word)})
            start = text.find(word, start + 1)
    return sorted(found, key=lambda entity: entity["start"])


def without_scores(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in entity.items() if key != "score"} for entity in entities]


@pytest.mark.slow
def test_100k_character_text_finds_every_entity_at_its_offsets(
    tagger_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """100,000 characters (~1,100 windows of 32 tokens): every one of the ~4,900 entities is found, in
    order, with text[start:end] == its text, through the command line and the library alike."""
    text = (UNIT * (100_000 // len(UNIT) + 1))[:100_000]
    expected = expected_entities(text)
    assert len(expected) > 4800
    tagger = EntityTagger(tagger_dir)
    assert without_scores(tagger(text)) == expected
    capsys.readouterr()
    assert main(["predict", "ner", "--model", str(tagger_dir), "--json", text]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["text"] == text
    assert without_scores(record["entities"]) == expected


@pytest.mark.parametrize(
    "text",
    [
        "\x07aspirin\x00 then\x1b[0m headache\x7f",  # control characters (bell, NUL, an ANSI escape, DEL)
        "🤒 aspirin 👨\u200d👩\u200d👧 nausea 🤒🏽",  # emoji, a zero-width-joined family, a skin tone
        "مريض يعاني من headache بعد cisplatin \u200f.",  # right-to-left text with an RTL mark
    ],
    ids=["control characters", "emoji", "right-to-left"],
)
@pytest.mark.slow
def test_unusual_characters_keep_entities_and_offsets(
    text: str, tagger_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Invisible and unusual characters neither hide entities nor shift their character offsets."""
    expected = expected_entities(text)
    assert without_scores(EntityTagger(tagger_dir)(text)) == expected
    capsys.readouterr()
    assert main(["predict", "ner", "--model", str(tagger_dir), "--json", "--", text]) == 0
    assert without_scores(json.loads(capsys.readouterr().out)["entities"]) == expected
