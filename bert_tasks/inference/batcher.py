"""Dynamic micro-batching: concurrent requests gathered into one model call, run off the event loop.

One request of one text makes a batch of one, which wastes most of what a forward pass costs; a server
answering many clients gathers their texts into one call instead. The first request to arrive opens a
batch; it closes when it holds `max_batch` texts, or `max_wait_ms` after the later of that request's
arrival and the end of the last batch, whichever comes first, and runs in the one worker thread (one
model per process; torch releases the GIL, so the event loop keeps accepting and answering meanwhile).
Requests that arrive while a batch runs wait for the next one. Counting the wait from when the model
became free lets the clients of the batch just answered join the next one: counted from arrival, a
request that waited out a batch left at once, and closed-loop clients split into two cohorts taking
turns at half the batch size (32 one-text clients: 16 texts a call, against 24-29 and 1.1-1.5x the
texts/s counted this way; BENCHMARKS.md, "Serving over HTTP"). That company is known: once as many
requests as the last batch answered have come since it ended, the batch goes without waiting out the
rest (a lone client's next request runs at once instead of after `max_wait_ms`; 32 clients' batch starts
when the 32nd is back). This holds only for a batch opened soon after the last one ended (within that
batch's own run time, or `max_wait_ms` if longer): a client that sends again when answered is back by
then; a request after the model idled longer is new traffic, and a burst waits for company as before.

Requests are never split: a request of more than `max_batch` texts is a batch of its own. Inside a batch
the Predictor runs its windows in length order (least padding) and puts them back; each request gets
exactly its own results, in order. A batch that fails is run again request by request, so only the
request that broke it fails.

Plain asyncio and one thread, no third-party queue: a batch is a few lines of bookkeeping here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

#: Runs one batch: a list of inputs (texts, or the server's checked records) in, one result each, in order.
RunBatch = Callable[[list[Any]], Sequence[Any]]


@dataclass
class BatchCounters:
    """What the batcher has done since it started (shown by the server's /info)."""

    requests: int = 0
    texts: int = 0
    batches: int = 0
    failed_batches: int = 0
    #: Wall seconds the model thread spent in batches: over a span of time, how busy the model was.
    model_seconds: float = 0.0


@dataclass
class _Pending:
    texts: list[str]
    arrived: float
    future: asyncio.Future[list[Any]] = field(repr=False)


class BatcherClosed(RuntimeError):
    """A request came after `close` began: the server is shutting down."""


class MicroBatcher:
    """Gather concurrent `submit(texts)` calls into batches of at most `max_batch` texts for `run`.

    `start()` and `close()` are called on the event loop that serves the requests; `close` lets every
    request already submitted finish (the batches run to the end), then stops the worker thread.
    """

    def __init__(self, run: RunBatch, max_batch: int, max_wait_ms: float) -> None:
        self.run, self.max_batch, self.max_wait = run, max_batch, max_wait_ms / 1000
        self.counters = BatchCounters()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bert-tasks-model")
        self._collector: asyncio.Task[None] | None = None
        self._closing = False
        self._held: _Pending | None = None  # taken from the queue but too big for the batch being made
        self._free_since = 0.0  # monotonic time the last batch ended: when the model became free
        self._last_answered = 0  # requests in the last batch: the clients that may send again at once
        self._last_run = 0.0  # seconds the last batch took

    def start(self) -> None:
        self._collector = asyncio.get_running_loop().create_task(self._collect())

    async def submit(self, texts: list[Any]) -> list[Any]:
        """The results of `texts`, once the batch holding them has run; its exception if it failed."""
        if self._closing or self._collector is None:
            raise BatcherClosed("the server is shutting down")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.counters.requests += 1
        self.counters.texts += len(texts)
        await self._queue.put(_Pending(texts, time.monotonic(), future))
        return await future

    async def close(self) -> None:
        """Refuse new requests, run every one already submitted, then stop the worker thread."""
        self._closing = True
        await self._queue.join()
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
        self._worker.shutdown(wait=True)

    async def _collect(self) -> None:
        while True:
            batch = await self._gather()
            started = time.monotonic()
            await self._run(batch)
            self._free_since = time.monotonic()
            self._last_answered, self._last_run = len(batch), self._free_since - started
            for _ in batch:
                self._queue.task_done()

    async def _gather(self) -> list[_Pending]:
        """The next batch: the oldest request, then whatever joins before it is full or its time is up."""
        first = self._held or await self._queue.get()
        self._held = None
        batch, size = [first], len(first.texts)
        deadline = max(first.arrived, self._free_since) + self.max_wait
        # Opened while the last batch's answers were fresh: its clients are the company to wait for.
        fresh = first.arrived <= self._free_since + max(self.max_wait, self._last_run)
        company = self._last_answered if fresh else None
        while size < self.max_batch:
            try:
                if self._queue.empty():
                    if company is not None and self._returned(batch) >= company:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    following = await asyncio.wait_for(self._queue.get(), left)
                else:
                    following = self._queue.get_nowait()
            except asyncio.TimeoutError:
                break
            if size + len(following.texts) > self.max_batch:
                self._held = following  # opens the next batch
                break
            batch.append(following)
            size += len(following.texts)
        return batch

    def _returned(self, batch: list[_Pending]) -> int:
        """How many of the batch's requests came after the last batch ended (its clients, sending again)."""
        return sum(pending.arrived >= self._free_since for pending in batch)

    async def _run(self, batch: list[_Pending]) -> None:
        """Run the batch; if it fails, run each of its requests alone, so one request that breaks the
        model fails alone and its neighbours still get their results."""
        loop = asyncio.get_running_loop()
        texts = [text for pending in batch for text in pending.texts]
        self.counters.batches += 1
        try:
            results = await loop.run_in_executor(self._worker, self._timed_run, texts)
        except Exception as error:
            self.counters.failed_batches += 1
            if len(batch) == 1:
                _settle(batch[0].future, error)
                return
            for pending in batch:
                await self._run([pending])
            return
        start = 0
        for pending in batch:
            end = start + len(pending.texts)
            _settle(pending.future, list(results[start:end]))
            start = end

    def _timed_run(self, texts: list[Any]) -> Sequence[Any]:
        """`run`, in the worker thread, its time added to `model_seconds` whether it succeeds or not."""
        start = time.perf_counter()
        try:
            return self.run(texts)
        finally:
            self.counters.model_seconds += time.perf_counter() - start


def _settle(future: asyncio.Future[list[Any]], outcome: list[Any] | Exception) -> None:
    """Hand a request its results or the error, unless its client hung up (its future was cancelled)."""
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
