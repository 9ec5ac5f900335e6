"""`bert-tasks serve`: a fine-tuned model dir behind HTTP, with dynamic micro-batching.

Why FastAPI on uvicorn: both are widely deployed and actively kept (FastAPI on Starlette, uvicorn by
the same Encode ecosystem); ASGI lets one event loop hold many open requests while the model runs in its
thread (`inference/batcher.py`); pydantic models give the request checks and the OpenAPI schema
(`/openapi.json`, `/docs`) from one definition; uvicorn brings graceful shutdown on SIGTERM/SIGINT and
`--workers N` processes. They are an optional extra (`pip install 'bert-tasks[serve]'`): training and
prediction never need them.

The body is read and parsed here rather than by FastAPI, so that each client mistake gets its own status
and one line: not JSON 400, a wrong shape 422, too large 413, an empty text 422 (the command line's
message). A failure of the model is a 500 whose request id is also in the server log, and the next
request is served as usual. The server holds no state between requests (only counters for `/info`), so
replicas scale it: `--workers N` processes, or containers behind a load balancer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import platform
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastapi
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, model_validator

from bert_tasks import __version__
from bert_tasks.data import echoed_json
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.batcher import BatcherClosed, MicroBatcher
from bert_tasks.inference.serve_settings import ServeSettings, threads_per_worker
from bert_tasks.inference.stream import input_chars
from bert_tasks.model_dir import read_policy

if TYPE_CHECKING:
    from bert_tasks.inference.predictor import Predictor

logger = logging.getLogger(__name__)

#: The deepest body served: a record's fields come back in the answer, which pydantic writes to a
#: depth of about 250 levels (a deeper field failed as a 500 after the model ran).
MAX_NESTING = 128
#: How `--workers N` hands the settings to its worker processes (each builds its own app and model).
SETTINGS_VARIABLE = "BERT_TASKS_SERVE_SETTINGS"
_USAGE = 'send {"texts": ["..."]} or {"records": [{"id": ..., "text": "..."}]}'
#: What a pair model's request gives instead (its pair field named as the model was trained).
_PAIR_USAGE = (
    'send {{"texts": [["...", "..."]]}} or {{"records": [{{"id": ..., "text": "...", "{}": "..."}}]}}'
)


class TextRecord(BaseModel):
    """A text with its own fields: `id` and any other field come back with the prediction. A NER model
    also takes `tokens` (a list of strings: the user's own words, tagged one by one) instead of the text
    or with it; the task checks the fields it reads."""

    model_config = ConfigDict(extra="allow")
    id: Any = Field(default=None, description="any JSON value, passed back as given")
    text: StrictStr | None = None


class PredictRequest(BaseModel):
    """Texts to predict: a list of strings, or records with a `text` (and an `id`, and other fields)."""

    model_config = ConfigDict(extra="forbid")
    texts: list[StrictStr] | None = None
    records: list[TextRecord] | None = None

    @model_validator(mode="after")
    def _one_of_them(self) -> PredictRequest:
        if (self.texts is None) == (self.records is None):
            raise ValueError("give exactly one of 'texts' and 'records'")
        return self


class PairPredictRequest(PredictRequest):
    """A pair model's texts: [text, second text] pairs, or records with the pair field (`/info`'s
    `pair_field`, as the model was trained)."""

    texts: list[tuple[StrictStr, StrictStr]] | None = None  # type: ignore[assignment]


def _request_schema(request: type[PredictRequest]) -> tuple[dict[str, Any], dict[str, Any]]:
    """/predict's body in the OpenAPI schema, and the models it refers to (they join its components)."""
    schema = request.model_json_schema(ref_template="#/components/schemas/{model}")
    return schema, schema.pop("$defs", {})


class PredictResponse(BaseModel):
    """One record per text, in request order: what `bert-tasks predict --json` prints (records: their
    own fields first)."""

    records: list[dict[str, Any]]


def create_app(settings: ServeSettings, predictor: Predictor | None = None) -> FastAPI:
    """The ASGI app of one process; loads the model dir (every mistake in it is one line) unless given."""
    settings.check()
    read_policy(settings.model_dir, settings.task)  # the task is checked before the weights load
    if settings.threads is not None:
        import torch

        torch.set_num_threads(settings.threads)
    if predictor is None:
        from bert_tasks.inference.predictor import Predictor

        predictor = Predictor(
            settings.model_dir,
            batch_size=settings.max_batch,
            allow_pickle=settings.allow_pickle,
            quantize=settings.quantize,
            progress=False,
        )
    info = _static_info(settings, predictor)
    run_batch = predictor.located_records
    pair_field = predictor.task.pair_field
    request_model = PredictRequest if pair_field is None else PairPredictRequest
    request_schema, request_models = _request_schema(request_model)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.batcher = MicroBatcher(run_batch, settings.max_batch, settings.max_wait_ms)
        app.state.batcher.start()
        yield
        await app.state.batcher.close()  # uvicorn waited for open requests; their batches finish here

    app = FastAPI(
        title="bert-tasks",
        version=__version__,
        description=f"{settings.task} predictions of {Path(settings.model_dir).name}",
        lifespan=lifespan,
    )

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Up and able to take requests."""
        return {"status": "ok"}

    @app.get("/info")
    async def show_info(request: Request) -> dict[str, Any]:
        """The model (task, labels, window policy, dir), versions, limits and this process's counters."""
        counters = dataclasses.asdict(request.app.state.batcher.counters)
        return {**info, "pid": os.getpid(), "counters": counters}

    @app.post(
        "/predict",
        response_model=PredictResponse,
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}}
        },
        responses={
            400: {"description": "the body is not JSON"},
            413: {"description": "too many texts, characters or bytes in one request"},
            422: {"description": "the JSON has the wrong shape, or a text is empty"},
            500: {"description": "the model failed; the request id is in the server log"},
        },
    )
    async def predict(request: Request) -> dict[str, Any]:
        """One record per text, as `bert-tasks predict --json` prints them."""
        body = _parsed(await _body(request, settings.max_body_bytes))
        inputs, fields = _texts(body, request_model, pair_field)
        _check_limits(inputs, settings)
        try:
            checked = predictor.checked_inputs(inputs)  # as the library checks them: texts, pairs, records
        except BertTasksError as error:
            raise HTTPException(422, str(error)) from None
        if not checked:
            return {"records": []}
        results = await _predicted(request.app.state.batcher, checked)
        if fields is None:
            return {"records": results}
        try:
            echoed = predictor.task.input_fields
            return {
                "records": [
                    _with_prediction(f"record {n}", own, result, echoed)
                    for n, (own, result) in enumerate(zip(fields, results, strict=True), start=1)
                ]
            }
        except BertTasksError as error:
            raise HTTPException(422, str(error)) from None

    openapi = app.openapi

    def openapi_with_request_models() -> dict[str, Any]:
        """FastAPI's schema, plus the models the request body refers to (the body is parsed by hand)."""
        schema = openapi()
        schema.setdefault("components", {}).setdefault("schemas", {}).update(request_models)
        return schema

    app.openapi = openapi_with_request_models  # type: ignore[method-assign]
    return app


def app_from_environment() -> FastAPI:
    """The app of one `--workers N` process, from the settings its parent put in the environment."""
    return create_app(ServeSettings(**json.loads(os.environ[SETTINGS_VARIABLE])))


def serve(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
    """Serve until SIGTERM/SIGINT: then stop accepting, finish the requests in flight, return.

    The model dir is loaded here first, so a bad one is one line before the port opens; with several
    workers each process loads its own copy afterwards (this one is dropped again), and they share the
    cores (`threads_per_worker`).
    """
    settings.check()
    if workers < 1:
        raise BertTasksError(f"--workers must be at least 1, got {workers}")
    _check_port(host, port)
    settings = dataclasses.replace(settings, threads=threads_per_worker(workers, settings.threads))
    app: FastAPI | str = create_app(settings)
    if workers > 1:
        app = f"{__name__}:app_from_environment"
        gc.collect()
        os.environ[SETTINGS_VARIABLE] = json.dumps(dataclasses.asdict(settings))
    level = logging.getLogger("bert_tasks").getEffectiveLevel()
    with _clean_exit_on_signals():
        uvicorn.run(
            app,
            host=host,
            port=port,
            workers=workers,
            factory=workers > 1,
            log_config=_log_config(level),
            log_level=level,
            timeout_graceful_shutdown=None,  # in-flight requests always finish; a second Ctrl-C forces
        )


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(f"a body of {int(declared)} bytes", limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _too_large(f"a body of more than {limit} bytes", limit)
        parts.append(part)
    return b"".join(parts)


def _too_large(what: str, limit: int) -> HTTPException:
    return HTTPException(413, f"{what}, more than the {limit} this server takes; split the request")


def _parsed(body: bytes) -> Any:
    if not body.strip():
        raise HTTPException(400, f"the body is empty; {_USAGE}")
    try:
        parsed = echoed_json.loads(body)
    except (ValueError, RecursionError) as error:  # ValueError: bad syntax or bytes that are no UTF-8/16/32
        reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8, or nested too deeply"
        reason = str(error) if isinstance(error, echoed_json.UnkeptNumber) else reason
        raise HTTPException(400, f"the body is not valid JSON ({reason}); {_USAGE}") from None
    if echoed_json.too_deep(parsed, MAX_NESTING):
        raise HTTPException(
            400,
            f"the body nests lists and objects more than {MAX_NESTING} levels deep, deeper than a record's "
            f"fields can be sent back; flatten them; {_USAGE}",
        )
    return parsed


def _field(part: str | int) -> str:
    """One step of a validation error's location: an index or plain name as is, any other name quoted."""
    return str(part) if isinstance(part, int) or part.isidentifier() else json.dumps(part)


def _texts(
    body: Any, request_model: type[PredictRequest], pair_field: str | None
) -> tuple[list[Any], list[dict[str, Any]] | None]:
    """The inputs of a request (texts, a pair model's (text, second text) pairs, or the records, which
    the task reads), and each record's own fields (None for a list of texts or pairs)."""
    usage = _USAGE if pair_field is None else _PAIR_USAGE.format(pair_field)
    try:
        parsed = request_model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        # A field name is the client's text: JSON-quoted unless plain, so the message stays one line.
        where = ".".join(_field(part) for part in first["loc"]) or "the body"
        raise HTTPException(
            422, f"{where}: {first['msg']} ({len(error.errors())} problem(s) in all); {usage}"
        ) from None
    if parsed.texts is not None:
        return parsed.texts, None
    records = [dict(record) for record in body["records"]]  # as sent: field order and values kept
    return records, records


def _check_limits(inputs: list[Any], settings: ServeSettings) -> None:
    if len(inputs) > settings.max_texts:
        raise HTTPException(
            413, f"{len(inputs)} texts in one request, more than --max-texts {settings.max_texts}; split it"
        )
    chars = sum(_input_chars(item) for item in inputs)
    if chars > settings.max_chars:
        raise HTTPException(
            413, f"{chars} characters in one request, more than --max-chars {settings.max_chars}; split it"
        )


def _input_chars(item: Any) -> int:
    """A text's characters, a pair's both texts', or a record's strings' (`stream.input_chars`)."""
    if isinstance(item, str):
        return len(item)
    return input_chars(item) if isinstance(item, dict) else sum(map(len, item))


async def _predicted(batcher: MicroBatcher, texts: list[Any]) -> list[dict[str, Any]]:
    """The batcher's records for `texts` (checked inputs); a model failure is a 500 with a request id,
    also logged."""
    try:
        return await batcher.submit(texts)
    except BatcherClosed:
        raise HTTPException(503, "the server is shutting down; retry on another replica") from None
    except Exception:
        request_id = uuid.uuid4().hex[:16]
        logger.exception("request %s: the model failed on %d text(s)", request_id, len(texts))
        raise HTTPException(
            500, f"the model failed on this request (request id {request_id}, in the server log)"
        ) from None


def _with_prediction(
    where: str, fields: dict[str, Any], record: dict[str, Any], echoed: tuple[str, ...]
) -> dict[str, Any]:
    from bert_tasks.inference.predictor import with_prediction  # loaded with the model by now

    return with_prediction(where, fields, record, echoed)


def _static_info(settings: ServeSettings, predictor: Predictor) -> dict[str, Any]:
    """What /info shows that does not change while the process runs."""
    import torch
    import transformers

    return {
        "task": predictor.task.name,
        "labels": [predictor.id2label[i] for i in sorted(predictor.id2label)],
        "pair_field": predictor.task.pair_field,
        "policy": predictor.policy.to_json(),
        "model_dir": str(Path(settings.model_dir).resolve()),
        "versions": {
            "bert_tasks": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "fastapi": fastapi.__version__,
            "uvicorn": uvicorn.__version__,
        },
        "batching": {"max_batch": settings.max_batch, "max_wait_ms": settings.max_wait_ms},
        "threads": torch.get_num_threads(),
        "limits": {
            "max_texts": settings.max_texts,
            "max_chars": settings.max_chars,
            "max_body_bytes": settings.max_body_bytes,
        },
    }


def _check_port(host: str, port: int) -> None:
    """A port that cannot be bound is one line before the model loads (uvicorn would log and exit 1)."""
    if not 0 <= port <= 65535:
        raise BertTasksError(f"--port must be in [0, 65535], got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise BertTasksError(f"--host {host}: not an address of this machine ({error}); check it") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            raise BertTasksError(
                f"--host {host} --port {port}: cannot listen there ({error.strerror}); "
                "give another --port, or stop what uses it"
            ) from None


@contextlib.contextmanager
def _clean_exit_on_signals() -> Iterator[None]:
    """Absorb the SIGTERM/SIGINT uvicorn raises again after its graceful shutdown.

    uvicorn ends a drained server by re-raising the signal it caught, so the process would die 'killed
    by SIGTERM' (143) or raise KeyboardInterrupt (130); a server that stopped cleanly on request exits
    0 here, as process managers expect of a clean stop. uvicorn installs its own handlers while it runs.
    """
    originals = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in originals.items():
            signal.signal(sig, handler)


def _log_config(level: int) -> dict[str, Any]:
    """uvicorn's logging, plus the `bert_tasks` logger on its handler (also in `--workers` processes)."""
    config = json.loads(json.dumps(uvicorn.config.LOGGING_CONFIG))  # a deep copy of plain data
    config["loggers"]["bert_tasks"] = {"handlers": ["default"], "level": level, "propagate": False}
    return config
