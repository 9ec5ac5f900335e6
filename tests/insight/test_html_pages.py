"""The HTML pages in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
selenium, which is told where both are and so downloads nothing) opens each page from file://, with no
console error; the tests drive its controls and check what it then shows against the model's numbers.

The browser is part of the test set-up (README, "Set up"): when it is missing the tests fail, never skip.
Each test leaves a screenshot of its page in its tmp dir.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select
from transformers import AutoTokenizer, BertModel

from bert_tasks.cli import main
from bert_tasks.insight.attention_maps import attention_maps
from tests.helpers import FIXTURES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

TEXT = "The patient suffers from severe headaches"
#: Debian's names for the browser and its driver, found on PATH (/usr/bin).
CHROMIUM = "chromium"
CHROMEDRIVER = "chromedriver"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module's tests, at a fixed window size (for the screenshots)."""
    found = {name: shutil.which(name) for name in (CHROMIUM, CHROMEDRIVER)}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the browser tests need Debian's chromium and "
            "chromium-driver (apt-get install -y chromium chromium-driver, README 'Set up')"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = found[CHROMIUM]
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(found[CHROMEDRIVER]))
    try:
        yield driver
    finally:
        driver.quit()


def open_page(browser: WebDriver, page: Path) -> None:
    browser.get(page.resolve().as_uri())
    browser.get_log("browser")  # what an earlier page logged is not this page's


def console_errors(browser: WebDriver) -> list[dict]:
    return [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def hover(browser: WebDriver, element: WebElement) -> None:
    ActionChains(browser).move_to_element(element).perform()


def tokens(browser: WebDriver, column: str) -> list[WebElement]:
    return browser.find_elements(By.CSS_SELECTOR, f"#{column} .token")


def shown_weights(column: list[WebElement]) -> list[float]:
    return [float(token.get_attribute("data-weight")) for token in column]


def marked_text(browser: WebDriver, mark: WebElement) -> str:
    """An entity mark's own text, without the type tag the page sets after it."""
    return browser.execute_script("return arguments[0].firstChild.textContent", mark)


def page_text(browser: WebDriver, element: WebElement) -> str:
    """An element's text as the user wrote it: the entities' type tags left out."""
    script = (
        "const copy = arguments[0].cloneNode(true);"
        "copy.querySelectorAll('.entity-type').forEach((tag) => tag.remove());"
        "return copy.textContent;"
    )
    return browser.execute_script(script, element)


def attention_page(tmp_path: Path, model: Path, *options: str) -> Path:
    page = tmp_path / "pages" / "attention.html"
    assert main(["attention", "--model", str(model), "--html", str(page), *options, TEXT]) == 0
    return page


def test_attention_page_shows_the_models_weights_for_the_chosen_layer_head_and_piece(
    browser: WebDriver, tiny_model: Path, tmp_path: Path
) -> None:
    page = attention_page(tmp_path, tiny_model, "--layer", "1", "--head", "2")
    probs = attention_maps(TEXT, tiny_model).probs  # [L, H, T, T]
    open_page(browser, page)
    layer, head = Select(browser.find_element(By.ID, "layer")), Select(browser.find_element(By.ID, "head"))
    assert (layer.first_selected_option.text, head.first_selected_option.text) == ("1", "2")
    queries, keys = tokens(browser, "queries"), tokens(browser, "keys")
    assert [q.text for q in queries][:3] == ["[CLS]", "the", "patient"]

    hover(browser, queries[2])  # "patient": what it attends to
    torch.testing.assert_close(torch.tensor(shown_weights(keys)), probs[1, 2, 2], atol=5.1e-5, rtol=0)
    shown = [float(k.find_element(By.CLASS_NAME, "value").text) for k in keys]
    torch.testing.assert_close(torch.tensor(shown), probs[1, 2, 2], atol=5.1e-4, rtol=0)  # 3 decimals

    layer.select_by_value("0")
    head.select_by_value("3")
    hover(browser, keys[4])  # what attends to word piece 4, in layer 0, head 3
    torch.testing.assert_close(torch.tensor(shown_weights(queries)), probs[0, 3, :, 4], atol=5.1e-5, rtol=0)
    assert "layer 0 | head 3: attention to “from” (piece 4)" in browser.find_element(By.ID, "status").text

    head.select_by_value("all")  # every head of the layer: one weight per head on each piece
    hover(browser, queries[1])
    per_head = [[float(w) for w in k.get_attribute("data-weights").split(",")] for k in keys]
    torch.testing.assert_close(torch.tensor(per_head), probs[0, :, 1].T, atol=5.1e-5, rtol=0)

    browser.find_element(By.CSS_SELECTOR, '#overview canvas[data-layer="1"][data-head="0"]').click()
    assert (layer.first_selected_option.text, head.first_selected_option.text) == ("1", "0")
    queries[3].click()  # pinned: moving away keeps "suffers" in focus
    hover(browser, keys[0])
    torch.testing.assert_close(torch.tensor(shown_weights(keys)), probs[1, 0, 3], atol=5.1e-5, rtol=0)
    assert "pinned" in queries[3].get_attribute("class")
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "attention.png"))


def test_compare_shows_both_models_and_where_attention_changed(
    browser: WebDriver, tiny_model: Path, tmp_path: Path
) -> None:
    """B is the tiny model with layer 1's queries scaled: layer 0 attends alike, layer 1 differs."""
    changed = tmp_path / "changed"
    model = BertModel.from_pretrained(tiny_model)
    with torch.no_grad():
        model.encoder.layer[1].attention.self.query.weight.mul_(4.0)
    model.save_pretrained(changed)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(changed)
    page = attention_page(tmp_path, tiny_model, "--compare", str(changed), "--layer", "1", "--head", "1")
    difference = attention_maps(TEXT, changed).probs - attention_maps(TEXT, tiny_model).probs
    open_page(browser, page)
    views = browser.find_elements(By.CSS_SELECTOR, "#views input")
    assert len(views) == 3 and views[0].is_selected()
    views[2].click()
    hover(browser, tokens(browser, "queries")[2])
    torch.testing.assert_close(
        torch.tensor(shown_weights(tokens(browser, "keys"))), difference[1, 1, 2], atol=1.1e-4, rtol=0
    )
    note = browser.find_element(By.ID, "overview-note").text
    assert "the largest mean change is layer 1" in note
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "attention-compare.png"))


def test_a_long_text_is_capped_with_a_note_on_the_page(
    browser: WebDriver, tiny_model: Path, tmp_path: Path
) -> None:
    """The tiny model reads 128 positions: a 300-piece text shows its first 128, and the page says so."""
    long_text = " ".join(["headaches"] * 300)  # "headache", "##s": 600 pieces + [CLS] and [SEP]
    page = tmp_path / "long.html"
    assert main(["attention", "--model", str(tiny_model), "--html", str(page), long_text]) == 0
    open_page(browser, page)
    assert len(tokens(browser, "queries")) == 128 and tokens(browser, "keys")[-1].text == "[SEP]"
    note = browser.find_element(By.ID, "note")
    assert note.is_displayed()
    assert note.text.startswith("The text is 602 word pieces; this page shows the first 128")
    assert console_errors(browser) == []


def test_predictions_page_marks_every_entity_in_place_with_its_type_and_score(
    browser: WebDriver, ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = [
        "The patient developed hepatotoxicity after taking valproate.",
        "Cisplatin </script><script>window.injected = 1</script> caused nephrotoxicity.",
    ]
    page = tmp_path / "predictions.html"
    assert main(["predict", "ner", "--model", str(ner_run), "--html", str(page), "--json", *texts]) == 0
    entities = [json.loads(line)["entities"] for line in capsys.readouterr().out.splitlines()]
    open_page(browser, page)
    assert browser.execute_script("return window.injected") is None  # the text is shown, never run
    docs = browser.find_elements(By.CSS_SELECTOR, "article.doc")
    assert [page_text(browser, doc.find_element(By.CLASS_NAME, "text")) for doc in docs] == texts
    for doc, expected in zip(docs, entities, strict=True):
        marks = doc.find_elements(By.CSS_SELECTOR, "mark.entity")
        assert [m.get_attribute("data-type") for m in marks] == [e["label"] for e in expected]
        assert [marked_text(browser, m) for m in marks] == [e["text"] for e in expected]
    first = next(e for found in entities for e in found)
    mark = browser.find_element(By.CSS_SELECTOR, "mark.entity")
    hover(browser, mark)
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed() and tip.text == f"{first['label']} · score {first['score']:.3f}"
    legend = browser.find_element(By.CSS_SELECTOR, f'.legend-type[data-type="{first["label"]}"]')
    of_type = sum(e["label"] == first["label"] for found in entities for e in found)
    assert legend.text.split() == [first["label"], str(of_type)]
    legend.click()  # that type's colour goes, the others stay
    for other in browser.find_elements(By.CSS_SELECTOR, "mark.entity"):
        off = "off" in other.get_attribute("class")
        assert off == (other.get_attribute("data-type") == first["label"])
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "predictions.png"))


def test_evaluation_page_sets_gold_beside_predicted_and_filters_errors_by_kind_and_type(
    browser: WebDriver, ner_run: Path, tmp_path: Path
) -> None:
    out, page = tmp_path / "eval", tmp_path / "evaluation.html"
    data = FIXTURES / "ner_sample.conll"
    argv = ["evaluate", "ner", "--model", str(ner_run), "--data", str(data), "--out", str(out)]
    assert main([*argv, "--html", str(page)]) == 0
    errors = json.loads((out / "metrics.json").read_text())["errors"]
    assert (out / "ner_scores.png").stat().st_size > 0
    # The fixture's 3 sentences have at most 5 errors of a kind, so the metric's examples list them all.
    examples = errors["examples"]
    assert all(len(examples[kind]) == errors[kind] for kind in examples)
    open_page(browser, page)
    sentences = browser.find_elements(By.CSS_SELECTOR, "section.sentence")
    assert len(sentences) == 3
    for kind, found in examples.items():
        chip = browser.find_element(By.CSS_SELECTOR, f'#kind-filter [data-kind="{kind}"]')
        assert chip.find_element(By.CLASS_NAME, "count").text == str(errors[kind])
        chip.click()
        expected = sorted({example["sentence"] for example in found})
        assert [int(s.get_attribute("data-index")) for s in sentences if s.is_displayed()] == expected
        assert browser.find_element(By.ID, "shown").text == f"showing {len(expected)} of 3 sentences"

    kind = max(examples, key=lambda k: errors[k])  # a kind with errors, filtered by one entity type
    browser.find_element(By.CSS_SELECTOR, f'#kind-filter [data-kind="{kind}"]').click()
    Select(browser.find_element(By.ID, "type-filter")).select_by_value("Chemical")
    expected = sorted({e["sentence"] for e in examples[kind] if "[Chemical]" in f"{e['gold']} {e['pred']}"})
    assert [int(s.get_attribute("data-index")) for s in sentences if s.is_displayed()] == expected

    browser.find_element(By.CSS_SELECTOR, '#kind-filter [data-kind="all"]').click()
    Select(browser.find_element(By.ID, "type-filter")).select_by_value("")
    assert all(s.is_displayed() for s in sentences)
    gold = sentences[0].find_elements(By.CSS_SELECTOR, ".gold mark.entity")
    assert [marked_text(browser, m) for m in gold] == ["Lithium carbonate", "nephrogenic diabetes insipidus"]
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "evaluation.png"))
