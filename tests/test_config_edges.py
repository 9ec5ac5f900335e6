"""load_recipe at the edges: non-finite and out-of-bound numbers, empty values, duplicate keys, YAML aliases,
nested values and booleans posing as numbers, each refused in one line naming the key and where it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.config import (
    _FLOAT_KEYS,
    _INT_KEYS,
    _STR_KEYS,
    MAX_RECIPE_BYTES,
    Config,
    load_recipe,
)
from bert_tasks.errors import BertTasksError

CLI = "(on the command line)"


def refusal(recipe: Path | None, overrides: Sequence[str] = ()) -> str:
    """The one-line message load_recipe refuses with."""
    with pytest.raises(BertTasksError) as error:
        load_recipe(recipe, overrides, task="sentiment")
    message = str(error.value)
    assert "\n" not in message and "\r" not in message
    return message


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- 1. Numbers at their edges ---------------------------------------------------------------------


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "Infinity", "-1e400", "1e999"])
@pytest.mark.parametrize("key", _FLOAT_KEYS)
def test_every_float_key_must_be_finite_on_the_command_line(key: str, text: str) -> None:
    shown = repr(float(text))
    expected = f"bad config: {key}={shown}, must be a finite number {CLI}"
    assert refusal(None, [f"{key}={text}"]) == expected


@pytest.mark.parametrize("text", [".inf", "-.Inf", ".NaN", "1e999", "9" * 400])
@pytest.mark.parametrize("key", ["lr", "epochs", "warmup_ratio", "attention_dropout"])
def test_every_float_key_must_be_finite_in_a_recipe(tmp_path: Path, key: str, text: str) -> None:
    recipe = write(tmp_path, f"{key}: {text}\n")
    shown = "nan" if "nan" in text.lower() else "-inf" if text.startswith("-") else "inf"
    assert refusal(recipe) == f"bad config: {key}={shown}, must be a finite number (in recipe {recipe})"


@pytest.mark.parametrize("value", [2**63, -(2**63), 10**30])
@pytest.mark.parametrize("key", _INT_KEYS)
def test_every_int_key_is_bounded(key: str, value: int) -> None:
    """The general rule: no int key takes an unbounded value (each one is in _validate's table)."""
    message = refusal(None, [f"{key}={value}"])
    assert message.startswith(f"bad config: {key}={value}, must be ") and message.endswith(CLI)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("epochs=inf", "bad config: epochs=inf, must be a finite number"),
        ("lr=nan", "bad config: lr=nan, must be a finite number"),
        ("warmup_ratio=-inf", "bad config: warmup_ratio=-inf, must be a finite number"),
        (
            "epochs=1e7",
            "bad config: epochs=10000000.0, must be > 0 unless max_steps > 0, and <= 1000000",
        ),
        ("seed=-1", "bad config: seed=-1, must be >= 0 and <= 4294967295 (numpy's seed range)"),
        (
            "seed=4294967296",
            "bad config: seed=4294967296, must be >= 0 and <= 4294967295 (numpy's seed range)",
        ),
        ("seed=2**32", "seed='2**32' on the command line: expected an integer; fix the value"),
        ("batch_size=1e20", "bad config: batch_size=100000000000000000000, must be >= 1 and <= 1048576"),
        (
            "batch_size=99999999999999999999999",  # exact: not rounded through a float
            "bad config: batch_size=99999999999999999999999, must be >= 1 and <= 1048576",
        ),
        ("eval_batch_size=1048577", "bad config: eval_batch_size=1048577, must be >= 1 and <= 1048576"),
        ("grad_accum=2e6", "bad config: grad_accum=2000000, must be >= 1 and <= 1048576"),
        ("logging_steps=3e10", "bad config: logging_steps=30000000000, must be >= 1 and <= 2147483647"),
        (
            "max_steps=2147483648",
            "bad config: max_steps=2147483648, must be >= 0 and <= 2147483647 (0 = train for `epochs`)",
        ),
        (
            "eval_every=1e12",
            "bad config: eval_every=1000000000000, must be >= 0 and <= 2147483647 (0 = end of each epoch)",
        ),
        ("save_every=-1", "bad config: save_every=-1, must be >= 0 and <= 2147483647 (0 = off)"),
        (
            "max_train_samples=1e300",
            "bad config: max_train_samples=10000000000000000525047602552044202487044685811081591549158541"
            "155118024579889..., must be >= 1 and <= 2147483647 (or none)",
        ),
        (
            "conll_tag_index=1e9",
            "bad config: conll_tag_index=1000000000, must be >= -1024 and <= 1024 (-1 = last)",
        ),
        ("max_length=1e400", "max_length='1e400' on the command line: expected an integer; fix the value"),
        ("batch_size=nan", "batch_size='nan' on the command line: expected an integer; fix the value"),
    ],
)
def test_numbers_at_their_edges_on_the_command_line(override: str, expected: str) -> None:
    if expected.startswith("bad config:"):
        expected = f"{expected} {CLI}"
    assert refusal(None, [override]) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seed: -1\n", "bad config: seed=-1, must be >= 0 and <= 4294967295 (numpy's seed range)"),
        (
            "seed: 4294967296\n",
            "bad config: seed=4294967296, must be >= 0 and <= 4294967295 (numpy's seed range)",
        ),
        (
            "batch_size: 1.0e+20\n",
            "bad config: batch_size=100000000000000000000, must be >= 1 and <= 1048576",
        ),
        ("max_steps: 0x80000000\n", "bad config: max_steps=2147483648, must be >= 0 and <= 2147483647"),
    ],
)
def test_numbers_at_their_edges_in_a_recipe(tmp_path: Path, text: str, expected: str) -> None:
    recipe = write(tmp_path, text)
    assert refusal(recipe).startswith(expected)
    assert refusal(recipe).endswith(f"(in recipe {recipe})")


def test_an_int_past_pythons_digit_limit_is_a_bad_value_not_a_traceback(tmp_path: Path) -> None:
    recipe = write(tmp_path, f"seed: {'9' * 5000}\n")
    expected = f"seed='{'9' * 76}... in recipe {recipe}: expected an integer; fix the value"
    assert refusal(recipe) == expected
    assert refusal(None, [f"seed={'9' * 5000}"]) == expected.replace(
        f"in recipe {recipe}", "on the command line"
    )


@pytest.mark.parametrize(
    "overrides",
    [
        ["seed=0"],
        ["seed=4294967295"],
        ["batch_size=1048576", "eval_batch_size=1048576", "grad_accum=1048576"],
        ["max_steps=2147483647", "eval_every=2147483647", "save_every=2147483647"],
        ["epochs=1000000"],
        ["lr=1e300", "weight_decay=0", "max_grad_norm=1e10"],
        ["conll_tag_index=-1024"],
    ],
)
def test_the_edges_themselves_are_accepted(overrides: list[str]) -> None:
    task = "ner" if overrides[0].startswith("conll_tag_index") else "sentiment"  # the key's own task
    cfg = load_recipe(None, overrides, task=task)
    for item in overrides:
        key, _, text = item.partition("=")
        assert getattr(cfg, key) == float(text)


def test_a_config_built_directly_is_checked_too() -> None:
    with pytest.raises(BertTasksError, match=r"^bad config: epochs=inf, must be a finite number$"):
        Config(task="sentiment", epochs=float("inf"))


# --- 2. Empty values -------------------------------------------------------------------------------


#: The string keys that take `none`.
_OPTIONAL_STR = {"dataset", "train_file", "validation_file", "test_file", "metric_for_best", "output_dir"}
_OPTIONAL_STR |= {"class_weights", "text_pair_column", "word_splitter"}
_OPTIONAL_STR |= {"teacher", "student", "transfer_file", "validation_split"}


@pytest.mark.parametrize("text", ["", "   "])
@pytest.mark.parametrize("key", _STR_KEYS)
def test_every_string_key_refuses_an_empty_value(key: str, text: str) -> None:
    message = refusal(None, [f"{key}={text}"])
    if key == "task":
        assert message.startswith("task conflict: the command says 'sentiment'")
        return
    unset = f"{key}=none to unset it" if key in _OPTIONAL_STR else "leave the key out for the default"
    assert message == f"bad config: {key}='', must not be empty: give a value, or {unset} {CLI}"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "output_dir=",
            "bad config: output_dir='', must not be empty: give a value, or output_dir=none to unset it",
        ),
        (
            "output_dir= \t",
            "bad config: output_dir='', must not be empty: give a value, or output_dir=none to unset it",
        ),
        (
            "train_file=",
            "bad config: train_file='', must not be empty: give a value, or train_file=none to unset it",
        ),
        (
            "model=",
            "bad config: model='', must not be empty: give a value, or leave the key out for the default",
        ),
    ],
)
def test_empty_paths_on_the_command_line(override: str, expected: str) -> None:
    assert refusal(None, [override]) == f"{expected} {CLI}"


@pytest.mark.parametrize(
    ("text", "key", "shown"),
    [("output_dir: ''\n", "output_dir", "''"), ('output_dir: "  "\n', "output_dir", "'  '")],
)
def test_empty_paths_in_a_recipe(tmp_path: Path, text: str, key: str, shown: str) -> None:
    recipe = write(tmp_path, text)
    expected = (
        f"bad config: {key}={shown}, must not be empty: give a value, or {key}=none to unset it "
        f"(in recipe {recipe})"
    )
    assert refusal(recipe) == expected


def test_none_still_unsets_a_path() -> None:
    assert load_recipe(None, ["output_dir=none"], task="sentiment").output_dir is None


# --- 3. Duplicate keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "line", "first"),
    [
        ("lr: 1e-4\nbatch_size: 8\nlr: 2e-4\n", "lr", 3, 1),
        ("task: sentiment\n\n# again\ntask: sentiment\n", "task", 4, 1),
        ("{epochs: 1, epochs: 2}\n", "epochs", 1, 1),
        ("<<: {seed: 1}\nseed: 2\n", "seed", 2, 1),
        ("model: {a: 1, a: 2}\n", "a", 1, 1),
    ],
)
def test_duplicate_key_in_a_recipe(tmp_path: Path, text: str, key: str, line: int, first: int) -> None:
    recipe = write(tmp_path, text)
    expected = f"{recipe}:{line}: duplicate key '{key}' (first on line {first}); keep one of them"
    assert refusal(recipe) == expected


# --- 4. Aliases, size, nesting ---------------------------------------------------------------------

BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
)


@pytest.mark.parametrize(
    ("text", "line", "name"),
    [
        (BILLION_LAUGHS, 1, "a"),
        ("lr: &rate 1e-4\n", 1, "rate"),
        ("label_names: &names [a, b]\n", 1, "names"),
        ("epochs: 1\nlabel_names: [&x a, b]\n", 2, "x"),
        ("lr: 1e-4\nlabel_names: [*undefined]\n", 2, "undefined"),
    ],
)
def test_yaml_anchors_and_aliases_are_refused_before_expanding(
    tmp_path: Path, text: str, line: int, name: str
) -> None:
    recipe = write(tmp_path, text)
    expected = (
        f"{recipe}:{line}: YAML anchor/alias '{name}' in a recipe; write the value out "
        "(a recipe is a flat mapping of key: value)"
    )
    assert refusal(recipe) == expected


def test_oversized_recipe(tmp_path: Path) -> None:
    recipe = write(tmp_path, "lr: 1e-4\n" + "#" * MAX_RECIPE_BYTES + "\n")
    expected = f"{recipe}: recipe is over 64 KiB; a recipe is a short mapping of config keys, trim it"
    assert refusal(recipe) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model: {name: x}\n", "model={'name': 'x'} in recipe {recipe}: a nested mapping, expected a string"),
        (
            "seed:\n  value: 1\n",
            "seed={'value': 1} in recipe {recipe}: a nested mapping, expected an integer",
        ),
        ("resume: {}\n", "resume={} in recipe {recipe}: a nested mapping, expected true/false"),
        (
            "label_names: {a: 1}\n",
            "label_names={'a': 1} in recipe {recipe}: a nested mapping, expected a list like [a,b] or none",
        ),
    ],
)
def test_nested_mapping_value(tmp_path: Path, text: str, expected: str) -> None:
    recipe = write(tmp_path, text)
    key = text.partition(":")[0]
    tail = f"; config keys are flat, give {key}: VALUE"
    assert refusal(recipe) == expected.replace("{recipe}", str(recipe)) + tail


@pytest.mark.parametrize(
    ("text", "line", "where"),
    [
        ("label_names: [[a]]\n", 1, "the value of 'label_names'"),
        ("lr: 1e-4\nlabel_names: [a, {b: c}]\n", 2, "the value of 'label_names'"),
        ("model:\n  nested:\n    deeper: 1\n", 3, "the value of 'model'"),
        ("[" * 5000 + "]" * 5000 + "\n", 1, "a value"),
        ("- [[a]]\n", 1, "a value"),
    ],
)
def test_deeper_nesting_is_refused_from_the_parse_events(
    tmp_path: Path, text: str, line: int, where: str
) -> None:
    recipe = write(tmp_path, text)
    expected = (
        f"{recipe}:{line}: {where} nests a list or mapping inside a list or mapping; a recipe is a flat "
        "mapping of key: value (lists of plain values only)"
    )
    assert refusal(recipe) == expected


# --- 5. Booleans are not numbers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("batch_size: true\n", "batch_size=True in recipe {recipe}: expected an integer; fix the value"),
        ("seed: false\n", "seed=False in recipe {recipe}: expected an integer; fix the value"),
        ("lr: yes\n", "lr='yes' in recipe {recipe}: expected a number; fix the value"),
        ("epochs: True\n", "epochs=True in recipe {recipe}: expected a number; fix the value"),
        (
            "max_train_samples: on\n",
            "max_train_samples='on' in recipe {recipe}: expected an integer or none; fix the value",
        ),
    ],
)
def test_booleans_are_not_numbers_in_a_recipe(tmp_path: Path, text: str, expected: str) -> None:
    recipe = write(tmp_path, text)
    assert refusal(recipe) == expected.replace("{recipe}", str(recipe))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("batch_size=true", "batch_size='true' on the command line: expected an integer; fix the value"),
        ("lr=yes", "lr='yes' on the command line: expected a number; fix the value"),
        ("warmup_ratio=False", "warmup_ratio='False' on the command line: expected a number; fix the value"),
    ],
)
def test_booleans_are_not_numbers_on_the_command_line(override: str, expected: str) -> None:
    assert refusal(None, [override]) == expected


# --- Other keys and overrides stay one line --------------------------------------------------------


def test_a_key_with_a_newline_is_shown_on_one_line(tmp_path: Path) -> None:
    recipe = write(tmp_path, '"batch\\nsize": 8\n')
    assert refusal(recipe).startswith(f"unknown config key 'batch\\nsize' in recipe {recipe}; ")
    assert refusal(None, ["a\nb"]) == "override 'a\\nb' on the command line is not key=value; e.g. lr=3e-5"


# --- The CLI ---------------------------------------------------------------------------------------


def test_cli_refuses_infinite_epochs_in_one_line_before_any_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["finetune", "sentiment", "epochs=inf", f"output_dir={out}"]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "bert-tasks: error: bad config: epochs=inf, must be a finite number (on the command line)"
    ]
    assert not out.exists()


# --- The command line follows the recipe's rules ------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["label_names=[a,[b]]"], "label_names='[a,[b]]' on the command line: expected a list like [a,b]"),
        (["label_names=[[a, b]]"], "label_names='[[a, b]]' on the command line: expected a list like [a,b]"),
        (['output_dir=""'], "bad config: output_dir='', must not be empty"),
        (["model=' '"], "bad config: model=' ', must not be empty"),
    ],
)
def test_nested_and_quoted_empty_overrides(overrides: list[str], expected: str) -> None:
    """A list inside a list is refused as in a recipe; a value in one pair of quotes is unquoted, as list
    items are, so `output_dir=""` is empty, not a dir named `""`."""
    assert refusal(None, overrides).startswith(expected)


def test_quoted_values_are_unquoted_once() -> None:
    cfg = load_recipe(None, ["output_dir='runs/x'", 'metric_for_best="accuracy"'], task="sentiment")
    assert (cfg.output_dir, cfg.metric_for_best) == ("runs/x", "accuracy")
