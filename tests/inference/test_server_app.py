"""The server's app in-process (FastAPI's TestClient, lifespan and batcher included) on tiny trained
models: every endpoint, every client mistake with its status and message, a model failure as a 500 that
the server survives, and a fuzz of /predict bodies that never gets a 500.

The same endpoints and mistakes are checked against a real server process in test_server_process.py.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import Predictor
from bert_tasks.inference.serve_settings import ServeSettings
from bert_tasks.inference.server import create_app
from tests.inference.server_cases import ERROR_CASES, MAX_CHARS, MAX_TEXTS

pytestmark = pytest.mark.usefixtures("single_thread")

TEXTS = ["Loved it.", "The battery died after a day, which was a shame.", "Fine."]


@pytest.fixture(scope="module")
def predictor(sentiment_run: Path) -> Predictor:
    return Predictor(sentiment_run, batch_size=8, progress=False)


@pytest.fixture(scope="module")
def client(sentiment_run: Path, predictor: Predictor) -> Iterator[TestClient]:
    settings = ServeSettings(
        str(sentiment_run), "sentiment", max_batch=8, max_texts=MAX_TEXTS, max_chars=MAX_CHARS
    )
    with TestClient(create_app(settings, predictor)) as test_client:
        yield test_client


def post(client: TestClient, body: bytes) -> Any:
    return client.post("/predict", content=body, headers={"content-type": "application/json"})


def test_health_info_and_openapi(client: TestClient, sentiment_run: Path) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    info = client.get("/info").json()
    assert info["task"] == "sentiment" and info["labels"] == ["negative", "positive"]
    single = {"multi_label": False, "regression": False, "text_pair_column": None, "thresholds": None}
    single |= {"round_to": None, "ordinal": False}
    assert info["policy"] == {"task": "sentiment", "max_length": 32, "stride": 8, **single}
    assert info["pair_field"] is None
    assert info["model_dir"] == str(sentiment_run.resolve())
    assert set(info["versions"]) == {"bert_tasks", "python", "torch", "transformers", "fastapi", "uvicorn"}
    assert info["limits"]["max_texts"] == MAX_TEXTS and info["batching"]["max_batch"] == 8
    assert set(info["counters"]) == {"requests", "texts", "batches", "failed_batches", "model_seconds"}
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"texts", "records"}
    assert {"400", "413", "422", "500"} <= set(schema["paths"]["/predict"]["post"]["responses"])
    refs = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(schema))
    assert "TextRecord" in refs and set(refs) <= set(schema["components"]["schemas"])  # every $ref resolves


def test_predict_answers_what_predict_json_prints(client: TestClient, predictor: Predictor) -> None:
    answer = client.post("/predict", json={"texts": TEXTS})
    assert answer.status_code == 200
    expected = json.loads(json.dumps(predictor.records(TEXTS)))
    assert answer.json()["records"] == expected  # JSON round-trips floats exactly
    assert client.post("/predict", json={"texts": []}).json() == {"records": []}


def test_records_keep_their_id_and_every_other_field(client: TestClient, predictor: Predictor) -> None:
    records = [
        {"id": "a-1", "text": TEXTS[0], "source": {"page": 3}},
        {"text": TEXTS[1], "id": 7},
        {"text": "x"},
    ]
    answer = client.post("/predict", json={"records": records}).json()["records"]
    for sent, got, plain in zip(
        records, answer, predictor.records([r["text"] for r in records]), strict=True
    ):
        assert list(got)[: len(sent)] == list(sent)  # the record's own fields first, in its order
        assert {key: got[key] for key in sent} == sent
        assert got["label"] == plain["label"]


@pytest.mark.slow
def test_a_ner_server_answers_entities(ner_run: Path) -> None:
    text = "Cisplatin nephrotoxicity was seen ."
    with TestClient(create_app(ServeSettings(str(ner_run), "ner"))) as ner_client:
        [record] = ner_client.post("/predict", json={"records": [{"id": 1, "text": text}]}).json()["records"]
        assert ner_client.get("/info").json()["labels"][0] == "O"
    assert record["id"] == 1 and record["text"] == text
    assert all(text[e["start"] : e["end"]] == e["text"] for e in record["entities"])


@pytest.mark.parametrize(
    ("body", "status", "message"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_each_client_mistake_gets_its_status_and_one_line(
    client: TestClient, body: bytes, status: int, message: str
) -> None:
    answer = post(client, body)
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(message) and "\n" not in detail, detail


@pytest.mark.slow
def test_a_model_dir_of_the_other_task_is_one_line(ner_run: Path) -> None:
    with pytest.raises(BertTasksError, match="holds a ner model, not a sentiment model"):
        create_app(ServeSettings(str(ner_run), "sentiment"))


def test_a_model_failure_is_a_500_with_a_logged_request_id_and_the_server_goes_on(
    sentiment_run: Path,
    predictor: Predictor,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request that breaks the model (here: a fault injected into the real predictor for one text)
    fails alone, with its request id in the answer and the log; the next request is served."""
    records = predictor.located_records  # what the batcher runs: the requests' checked inputs

    def breaks_on_boom(located: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        if any(record["text"] == "boom" for _, record in located):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return records(located)

    monkeypatch.setattr(predictor, "located_records", breaks_on_boom)
    settings = ServeSettings(str(sentiment_run), "sentiment", max_wait_ms=200)
    with (
        caplog.at_level(logging.ERROR, logger="bert_tasks"),
        TestClient(create_app(settings, predictor)) as client,
    ):
        answer = client.post("/predict", json={"texts": ["boom"]})
        assert answer.status_code == 500
        request_id = re.search(r"request id ([0-9a-f]{16})", answer.json()["detail"]).group(1)
        assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records)
        assert client.post("/predict", json={"texts": ["fine"]}).status_code == 200
        assert client.get("/info").json()["counters"]["failed_batches"] == 1


def json_values() -> st.SearchStrategy[Any]:
    texts = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=30)
    leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts
    return st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4)
    )


def request_bodies() -> st.SearchStrategy[bytes]:
    """Bodies near the schema (right keys, odd values), any JSON at all, and bytes that are no JSON."""
    texts = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
    record = st.fixed_dictionaries(
        {"text": texts | json_values()}, optional={"id": json_values(), "label": texts}
    )
    shaped = st.fixed_dictionaries(
        {},
        optional={
            "texts": st.lists(texts | json_values(), max_size=10),
            "records": st.lists(record, max_size=10),
        },
    )
    as_json = (shaped | json_values()).map(lambda value: json.dumps(value).encode())
    return as_json | st.binary(max_size=200)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=request_bodies())
@pytest.mark.slow
def test_no_request_body_gets_a_500(client: TestClient, body: bytes) -> None:
    answer = post(client, body)
    assert answer.status_code in (200, 400, 413, 422), (answer.status_code, answer.text)
    payload = answer.json()
    if answer.status_code == 200:
        assert isinstance(payload["records"], list)
    else:
        assert isinstance(payload["detail"], str) and "\n" not in payload["detail"]


def test_a_field_name_holding_a_newline_is_quoted_in_the_one_line_answer(client: TestClient) -> None:
    """Found by the fuzz test above: the name of an unknown field is the client's text."""
    answer = post(client, json.dumps({"\n": None}).encode())
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith('"\\n": ') and "\n" not in answer.json()["detail"]
