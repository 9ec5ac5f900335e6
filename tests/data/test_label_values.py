"""Label shapes as the sentiment readers read them: sets (JSON lists, `a|b`, escapes), numbers, inference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_tasks.config import load_recipe
from bert_tasks.data.label_values import label_set, number_label, split_classes
from bert_tasks.data.splits import read_splits
from bert_tasks.data.text_classification import read_text_classification
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.sentiment import SentimentTask
from bert_tasks.tasks.sentiment_shapes import MultiLabel, Regression, SingleLabel


def write(tmp_path: Path, name: str, content: str) -> str:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return str(path)


def jsonl(tmp_path: Path, name: str, rows: list[dict[str, object]]) -> str:
    return write(tmp_path, name, "".join(json.dumps(row) + "\n" for row in rows))


def refusal(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(BertTasksError) as error:
        call()
    return str(error.value)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("joy|fear", ["joy", "fear"]),
        ("joy | fear ", ["joy", "fear"]),
        (r"C\|C++|rust", ["C|C++", "rust"]),
        (r"back\\slash|x", ["back\\slash", "x"]),
        (r"kept\n|x", [r"kept\n", "x"]),
        ("1|2", ["1", "2"]),
    ],
)
def test_a_label_set_string_splits_on_unescaped_pipes(text: str, names: list[str]) -> None:
    assert label_set(text, "f:1", "label") == names


def test_label_set_forms_and_mistakes() -> None:
    assert label_set(["joy", 2, True], "f:1", "label") == ["joy", "2", "true"]
    assert label_set([], "f:1", "label") == []
    assert refusal(lambda: label_set("joy||fear", "f:3", "labels")) == (
        "f:3: an empty label in \"joy||fear\" in column 'labels'; drop it"
    )
    assert refusal(lambda: label_set(["joy", "joy"], "f:3", "labels")) == (
        "f:3: label 'joy' is given twice in column 'labels'; give it once"
    )
    assert refusal(lambda: label_set(None, "f:3", "labels")).startswith(
        "f:3: missing labels in column 'labels'"
    )
    assert split_classes("a") == ["a"]


def test_a_csv_file_s_escapes_and_json_lists_read_as_its_sets(tmp_path: Path) -> None:
    """`C\\|C++` alone in a cell was the class `C\\|C++` (the escape honoured only beside a bare `|`), and
    the `[]` the messages suggest for "no label" became a class named "[]"."""
    path = write(
        tmp_path,
        "s.csv",
        'text,label\nlang one,C\\|C++\nlang two,C\\|C++|rust\nnone,[]\nboth,"[""rust"", ""go""]"\n'
        "odd,[sic]\n",
    )
    assert read_text_classification(path, labels="auto")["label"] == [
        ["C|C++"],
        ["C|C++", "rust"],
        [],
        ["rust", "go"],
        ["[sic]"],  # not JSON: a class name in brackets
    ]
    single = write(tmp_path, "c.csv", "text,label\nlang one,C\\|C++\nlang two,go\n")
    assert read_text_classification(single, labels="auto")["label"] == ["C|C++", "go"]


def test_a_json_list_cell_spells_each_of_its_classes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The merged-spellings warning compares each class's spelling: a list cell's are its items."""
    path = write(
        tmp_path, "s.csv", 'text,label\none,"[""rust"", ""go""]"\ntwo,rust\nthree,"[""1""]"\nfour,1.0\n'
    )
    with caplog.at_level("WARNING"):
        assert read_text_classification(path, labels="auto")["label"][:2] == [["rust", "go"], ["rust"]]
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}: label spellings read as one label: 1 (1) and 1.0 (1) as '1'; if they are different "
        "classes, name them apart"
    ]


@pytest.mark.parametrize(("value", "number"), [(4, 4.0), (3.5, 3.5), (" 2e1 ", 20.0), ("-1", -1.0)])
def test_numbers_are_read_from_json_numbers_and_numeric_strings(value: object, number: float) -> None:
    assert number_label(value, "f:1", "stars") == number


@pytest.mark.parametrize(
    ("value", "found"), [("four", 'a string ("four")'), (True, "a boolean (true)"), (None, "missing")]
)
def test_what_is_not_a_number_says_what_was_found(value: object, found: str) -> None:
    assert refusal(lambda: number_label(value, "f:2", "stars")) == (
        f"f:2: label in column 'stars' is {found}, not a number; give every row a number (regression=true "
        "reads labels as numbers)"
    )
    assert "is not finite" in refusal(lambda: number_label("inf", "f:2", "stars"))


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (10**400, "(an integer of about 401 digits)"),  # float() of it raises OverflowError
        (-(2**128), "-340282366920938463463374607431768211456"),
        (1e39, "1e+39"),
        ("1e400", '"1e400"'),  # float("1e400") is inf, but the file wrote a finite number
    ],
)
def test_numbers_beyond_float32_are_refused_not_trained_into_nan(value: object, shown: str) -> None:
    """The head computes in float32: 1e39 or 1e300 trained a model that predicted NaN, and exited 0."""
    assert refusal(lambda: number_label(value, "f:4", "stars")) == (
        f"f:4: label {shown} in column 'stars' is beyond float32's range (±3.4e38), in which the model "
        "computes; rescale the labels (e.g. divide them by a power of ten)"
    )


def test_a_huge_integer_in_a_jsonl_file_is_one_line(tmp_path: Path) -> None:
    huge = "1" + "0" * 400
    path = write(tmp_path, "r.jsonl", f'{{"text": "a", "label": 2}}\n{{"text": "b", "label": {huge}}}\n')
    cfg = load_recipe(None, [f"train_file={path}", "regression=true"], task="sentiment")
    assert refusal(lambda: read_splits(SentimentTask(regression=True), cfg)).startswith(
        f"{path}:2: label (an integer of about 401 digits) in column 'label' is beyond float32's range"
    )


def test_lists_or_pipes_make_a_file_multi_label_and_plain_labels_sets_of_one(tmp_path: Path) -> None:
    """multi_label left unset: the form of the labels decides; one set-form label is enough."""
    path = write(tmp_path, "e.csv", "text,label\nI was thrilled,joy\nThrilled and scared,joy|fear\n")
    data = read_text_classification(path, labels="auto")
    assert data["label"] == [["joy"], ["joy", "fear"]]
    plain = write(tmp_path, "p.csv", "text,label\nfine,pos\nbad,neg\n")
    assert read_text_classification(plain, labels="auto")["label"] == ["pos", "neg"]


def test_the_task_settles_multi_label_from_any_split(tmp_path: Path) -> None:
    """Train written plainly, validation with lists: every split becomes sets, the task multi-label."""
    train = jsonl(tmp_path, "t.jsonl", [{"text": "a", "label": "joy"}, {"text": "b", "label": "fear"}])
    validation = jsonl(tmp_path, "v.jsonl", [{"text": "c", "label": ["joy", "fear"]}])
    cfg = load_recipe(None, [f"train_file={train}", f"validation_file={validation}"], task="sentiment")
    task = SentimentTask()
    splits = read_splits(task, cfg)
    assert isinstance(task.shape, MultiLabel) and task.option_values["multi_label"] is True
    assert splits["train"]["label"] == [["joy"], ["fear"]] and splits["validation"]["label"] == [
        ["joy", "fear"]
    ]
    assert task.default_metric == "macro_f1" and task.stratify_by is None
    plain = SentimentTask()
    read_splits(plain, load_recipe(None, [f"train_file={train}"], task="sentiment"))
    assert isinstance(plain.shape, SingleLabel) and plain.option_values["multi_label"] is False


def test_multi_label_false_keeps_pipes_in_names_and_refuses_lists(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", "text,label\nfine,a|b\nbad,c\n")
    assert read_text_classification(path, labels="class")["label"] == ["a|b", "c"]
    lists = jsonl(tmp_path, "l.jsonl", [{"text": "a", "label": ["x"]}])
    assert refusal(lambda: read_text_classification(lists, labels="class")) == (
        f"{lists}:1: label is a list ([\"x\"]) in column 'label', not a class name; multi_label=false reads "
        "one class per row: give one, or leave multi_label unset for lists"
    )


def test_integer_labels_in_sets_take_label_names(tmp_path: Path) -> None:
    path = jsonl(tmp_path, "i.jsonl", [{"text": "a", "label": [0, 1]}, {"text": "b", "label": [1]}])
    cfg = load_recipe(None, [f"train_file={path}", "label_names=[joy,fear]"], task="sentiment")
    assert read_splits(SentimentTask(), cfg)["train"]["label"] == [["joy", "fear"], ["fear"]]


def test_regression_reads_numbers_and_settles_its_scale_and_ordinal_range(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path, "r.jsonl", [{"text": t, "stars": s} for t, s in [("a", 1), ("b", "4.5"), ("c", 5)]]
    )
    cfg = load_recipe(
        None,
        [f"train_file={path}", "label_column=stars", "regression=true", "ordinal=true"],
        task="sentiment",
    )
    task = SentimentTask(regression=True, ordinal=True)
    assert read_splits(task, cfg)["train"]["label"] == [1.0, 4.5, 5.0]
    assert isinstance(task.shape, Regression)
    assert task.shape.scale == pytest.approx((3.5, 1.7795130420052185))
    assert task.option_values["round_to"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    constant = jsonl(tmp_path, "c.jsonl", [{"text": "a", "label": 3}, {"text": "b", "label": 3}])
    cfg = load_recipe(None, [f"train_file={constant}", "regression=true"], task="sentiment")
    assert refusal(lambda: read_splits(SentimentTask(regression=True), cfg)) == (
        f"{constant}: every training label is 3, so a model would learn nothing; add texts with other "
        "values, or check label_column"
    )


def test_ordinal_over_a_wide_range_asks_for_round_to_instead_of_building_every_integer(
    tmp_path: Path,
) -> None:
    """0..10**12 once built a list of every integer: a MemoryError, or the process killed."""
    path = jsonl(tmp_path, "w.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 10**12}])
    cfg = load_recipe(None, [f"train_file={path}", "regression=true", "ordinal=true"], task="sentiment")
    assert refusal(lambda: read_splits(SentimentTask(regression=True, ordinal=True), cfg)) == (
        "ordinal=true rounds to every integer of the training labels' range, 0..1000000000000, which "
        "holds 1,000,000,000,001 (more than 1,000, no rating scale); give round_to=[...] with the classes, "
        "or drop ordinal"
    )
    percent = jsonl(tmp_path, "p.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 100}])
    cfg = load_recipe(None, [f"train_file={percent}", "regression=true", "ordinal=true"], task="sentiment")
    task = SentimentTask(regression=True, ordinal=True)
    read_splits(task, cfg)
    assert len(task.option_values["round_to"]) == 101


def test_pairs_read_their_second_text_from_every_layout(tmp_path: Path) -> None:
    """Header name, JSON key, headerless index; the pair is checked as a text is."""
    csv = write(tmp_path, "p.csv", "text,aspect,label\nThe screen is dim,screen,neg\n")
    tsv = write(tmp_path, "p.tsv", "neg\tThe screen is dim\tscreen\n")
    records = jsonl(tmp_path, "p.jsonl", [{"text": "The screen is dim", "aspect": "screen", "label": "neg"}])
    expected = {"text": ["The screen is dim"], "text_pair": ["screen"], "label": ["neg"]}
    assert read_text_classification(csv, pair_column="aspect").to_dict() == expected
    assert read_text_classification(records, pair_column="aspect").to_dict() == expected
    headerless = read_text_classification(tsv, "1", "0", header=False, pair_column="2")
    assert headerless.to_dict() == expected
    assert refusal(lambda: read_text_classification(csv, pair_column="target")) == (
        f"{csv}:1: header has columns text, aspect, label, expected text_column='text' and "
        "label_column='label' and text_pair_column='target'; set text_column/label_column/text_pair_column "
        "to match the file (or header=false if it has no header row)"
    )
    assert "text_pair_column='aspect' with header=false" in refusal(
        lambda: read_text_classification(tsv, "1", "0", header=False, pair_column="aspect")
    )
    empty = jsonl(tmp_path, "e.jsonl", [{"text": "fine", "aspect": " ", "label": "pos"}])
    assert refusal(lambda: read_text_classification(empty, pair_column="aspect")) == (
        f"{empty}:1: empty text in column 'aspect'; fill it in or drop the row"
    )
