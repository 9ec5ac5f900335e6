"""load_recipe: layer precedence, typed values, unknown keys, range checks, the save/reload round trip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bert_tasks.config import Config, load_recipe, save_config
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks import NerTask


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_precedence_defaults_task_recipe_overrides(tmp_path: Path) -> None:
    recipe = write(tmp_path, "task: ner\nlr: 2.0e-4\nbatch_size: 8\nmax_length: 200\n")
    cfg = load_recipe(recipe, ["lr=3e-5"])
    assert cfg.lr == 3e-5  # override beats recipe
    assert cfg.batch_size == 8  # recipe beats task default (16)
    assert cfg.max_length == 200  # recipe beats task default (256)
    assert cfg.weight_decay == Config(task="ner").weight_decay  # dataclass default
    assert load_recipe(None, task="ner").max_length == NerTask.config_defaults["max_length"]


def test_task_defaults_point_sentiment_at_packaged_demo_data() -> None:
    cfg = load_recipe(None, task="sentiment")
    assert cfg.lr == 1e-4
    assert Path(cfg.train_file).is_file() and Path(cfg.validation_file).is_file()


@pytest.mark.parametrize("override", ["train_file=mine.csv", "dataset=glue/sst2"])
def test_demo_files_only_apply_when_no_data_is_named(override: str) -> None:
    cfg = load_recipe(None, [override], task="sentiment")
    assert cfg.validation_file is None
    assert "demo" not in str(cfg.train_file)


def test_values_are_typed_from_annotations(tmp_path: Path) -> None:
    recipe = write(
        tmp_path, "task: sentiment\nlr: 1e-4\nmixed_precision: no\nresume: yes\nlabel_names: [neg, pos]\n"
    )
    cfg = load_recipe(recipe, ["epochs=2", "max_train_samples=100", "metric_for_best=null", "overwrite=1"])
    assert cfg.lr == 1e-4 and isinstance(cfg.lr, float)  # YAML 1.1 reads 1e-4 as a string
    assert cfg.epochs == 2.0 and isinstance(cfg.epochs, float)
    assert cfg.max_train_samples == 100
    assert cfg.mixed_precision == "no"  # not the YAML 1.1 boolean False
    assert cfg.resume is True and cfg.overwrite is True
    assert cfg.label_names == ["neg", "pos"]
    assert cfg.metric_for_best is None


@pytest.mark.parametrize("text", ["[negative, positive]", "negative,positive", "['negative', 'positive']"])
def test_list_overrides(text: str) -> None:
    cfg = load_recipe(None, [f"label_names={text}"], task="sentiment")
    assert cfg.label_names == ["negative", "positive"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("auto", "auto"), ("[1,3]", [1.0, 3.0]), ("1, 2.5", [1.0, 2.5]), ("none", None)],
)
def test_class_weights_overrides(text: str, expected: object) -> None:
    assert load_recipe(None, [f"class_weights={text}"], task="ner").class_weights == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("auto", "auto"), ("[1, 3]", [1.0, 3.0]), ("[0.5, 2]", [0.5, 2.0])]
)
def test_class_weights_in_a_recipe_round_trip_as_given(tmp_path: Path, text: str, expected: object) -> None:
    cfg = load_recipe(write(tmp_path, f"class_weights: {text}\n"), task="sentiment")
    assert cfg.class_weights == expected
    assert load_recipe(save_config(cfg, tmp_path / "saved.yaml")) == cfg


@pytest.mark.parametrize(
    "text", ["balanced", "[1,-3]", "[0,1]", "[1,inf]", "[1,nan]", "[]", "[a,1]", "[true, 1]"]
)
def test_class_weights_refuses_all_but_auto_and_positive_finite_numbers(tmp_path: Path, text: str) -> None:
    rule = (
        "must be none, auto or a list of positive finite numbers, one per label in label order (e.g. [1,3])"
    )
    with pytest.raises(BertTasksError, match=re.escape(rule)) as error:
        load_recipe(None, [f"class_weights={text}"], task="sentiment")
    assert str(error.value).startswith("bad config: class_weights=")
    assert str(error.value).endswith("(on the command line)")


def test_class_weights_of_another_type_in_a_recipe(tmp_path: Path) -> None:
    recipe = write(tmp_path, "class_weights: 3\n")
    expected = "class_weights=3 in recipe"
    with pytest.raises(BertTasksError, match=re.escape(expected)) as error:
        load_recipe(recipe, task="sentiment")
    assert str(error.value).endswith(
        "expected a list of numbers like [1,3] or a string or none; fix the value"
    )


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("no", False), ("0", False), ("YES", True)])
def test_bool_overrides(text: str, expected: bool) -> None:
    assert load_recipe(None, [f"resume={text}"], task="ner").resume is expected


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("lr=abc", "lr='abc' on the command line: expected a number"),
        ("batch_size=2.5", "batch_size='2.5' on the command line: expected an integer"),
        ("resume=maybe", "expected true/false"),
        ("max_length=none", "max_length='none' on the command line: expected an integer"),
        ("label_names=", "expected a list like [a,b]"),
    ],
)
def test_bad_values_name_key_value_and_type(override: str, expected: str) -> None:
    with pytest.raises(BertTasksError, match=re.escape(expected)):
        load_recipe(None, [override], task="sentiment")


def test_required_key_cannot_be_null_in_recipe(tmp_path: Path) -> None:
    recipe = write(tmp_path, "task: ner\nmax_length: null\n")
    expected = f"max_length=None in recipe {recipe}: expected an integer"
    with pytest.raises(BertTasksError, match=re.escape(expected)):
        load_recipe(recipe)


def test_unknown_key_in_recipe_suggests_closest(tmp_path: Path) -> None:
    recipe = write(tmp_path, "task: sentiment\nbatchsize: 8\n")
    with pytest.raises(BertTasksError) as err:
        load_recipe(recipe)
    assert "'batchsize'" in str(err.value) and str(recipe) in str(err.value)
    assert "did you mean 'batch_size'?" in str(err.value)


def test_unknown_key_on_command_line_suggests_our_name_for_transformers_name() -> None:
    with pytest.raises(BertTasksError, match="'learning_rate' on the command line; did you mean 'lr'"):
        load_recipe(None, ["learning_rate=1e-4"], task="sentiment")


@pytest.mark.parametrize(
    ("key", "meant"),
    [("EPOCHS", "epochs"), ("LR", "lr"), ("Learning_Rate", "lr"), ("batch-size", "batch_size")],
)
def test_a_key_in_another_case_or_with_dashes_suggests_the_key(key: str, meant: str) -> None:
    """`EPOCHS` and `LR` were too far from `epochs` and `lr` for difflib: they got the list of every key."""
    with pytest.raises(BertTasksError, match=f"'{key}' on the command line; did you mean '{meant}'\\?$"):
        load_recipe(None, [f"{key}=1"], task="sentiment")


def test_unknown_key_without_close_match_lists_valid_keys() -> None:
    with pytest.raises(BertTasksError, match="valid keys: task, model"):
        load_recipe(None, ["zzz=1"], task="sentiment")


def test_override_must_be_key_value() -> None:
    with pytest.raises(BertTasksError, match="not key=value"):
        load_recipe(None, ["lr"], task="sentiment")


def test_recipe_task_must_match_command(tmp_path: Path) -> None:
    recipe = write(tmp_path, "task: ner\n")
    with pytest.raises(BertTasksError, match="task conflict: the command says 'sentiment'"):
        load_recipe(recipe, task="sentiment")
    assert load_recipe(recipe, task="ner").task == "ner"


@pytest.mark.parametrize(
    ("task", "match"), [(None, "no task given"), ("translation", "unknown task 'translation'")]
)
def test_task_required_and_known(task: str | None, match: str) -> None:
    with pytest.raises(BertTasksError, match=match):
        load_recipe(None, task=task)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("batch_size=0", "batch_size"),
        ("lr=0", "lr"),
        ("grad_accum=0", "grad_accum"),
        ("warmup_ratio=1", "warmup_ratio"),
        ("epochs=0", "epochs"),
        ("stride=64", "stride"),
        ("max_length=1024", "max_length"),
        ("mixed_precision=fp8", "mixed_precision"),
        ("label_names=[a,a]", "label_names"),
    ],
)
def test_range_checks(override: str, key: str) -> None:
    with pytest.raises(BertTasksError, match=f"bad config: {key}="):
        load_recipe(None, [override], task="sentiment")


def test_zero_epochs_allowed_with_max_steps() -> None:
    assert load_recipe(None, ["epochs=0", "max_steps=10"], task="sentiment").max_steps == 10


def test_dataset_and_files_combine_split_by_split() -> None:
    """One rule for splits (data/splits.py): a file given for a split wins over the hub dataset's."""
    cfg = load_recipe(None, ["dataset=glue/sst2", "validation_file=dev.tsv"], task="sentiment")
    assert cfg.dataset == "glue/sst2" and cfg.validation_file.endswith("dev.tsv")
    assert cfg.train_file is None  # the demo default does not apply once a dataset is named


def test_relative_paths_resolve_against_cwd_and_expand_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "recipes").mkdir()
    recipe = write(tmp_path / "recipes", "task: ner\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_recipe(recipe, ["train_file=data/train.conll", "test_file=~/test.conll", "output_dir=~/runs"])
    assert cfg.train_file == str(tmp_path.resolve() / "data" / "train.conll")  # not recipes/data/...
    assert cfg.test_file == str((tmp_path / "home" / "test.conll").resolve())
    assert cfg.output_dir == str(tmp_path / "home" / "runs")


def test_save_config_round_trips(tmp_path: Path) -> None:
    overrides = ["lr=3e-5", "label_names=[neg,pos]", "mixed_precision=no", "resume=true"]
    cfg = load_recipe(None, overrides, task="sentiment")
    path = save_config(cfg, tmp_path / "model" / "recipe.yaml")
    assert load_recipe(path) == cfg
    assert cfg.to_dict()["label_names"] == ["neg", "pos"]


@pytest.mark.parametrize(
    ("text", "match"), [("- a\n- b\n", "must be a mapping"), ("task: [unclosed\n", "not valid YAML")]
)
def test_bad_recipe_files(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(BertTasksError, match=match):
        load_recipe(write(tmp_path, text), task="sentiment")


def test_missing_recipe(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError, match="recipe not found"):
        load_recipe(tmp_path / "nope.yaml", task="sentiment")


@pytest.mark.parametrize(
    ("task", "override", "owner"),
    [
        ("ner", "regression=true", "sentiment"),
        ("ner", "text_pair_column=aspect", "sentiment"),
        ("ner", "label_column=stars", "sentiment"),
        ("ner", "header=false", "sentiment"),
        ("sentiment", "viterbi=false", "ner"),
        ("sentiment", "tag_column=labels", "ner"),
        ("sentiment", "word_splitter=whitespace", "ner"),
    ],
)
def test_a_key_only_the_other_task_reads_is_refused(task: str, override: str, owner: str) -> None:
    """Saved in recipe.yaml and then ignored, it would claim a setting the run never had."""
    key = override.partition("=")[0]
    with pytest.raises(BertTasksError) as error:
        load_recipe(None, [override], task=task)
    assert str(error.value).startswith(f"bad config: {key}=")
    assert f"is a key of the {owner} task, which {task} does not read; drop it" in str(error.value)
    assert getattr(load_recipe(None, [override], task=owner), key) is not None  # its own task takes it


def test_shared_keys_and_defaults_named_again_are_accepted_by_both_tasks() -> None:
    for task in ("sentiment", "ner"):
        load_recipe(
            None, ["text_column=body", "label_names=[O,B-X,I-X]", "regression=false", "viterbi=true"], task
        )
