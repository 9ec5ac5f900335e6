"""MicroBatcher on its own: concurrent requests share batches, each gets exactly its results, a failing
request fails alone, and `close` finishes what was submitted.

The batch function is a plain one that records what it was given (the batcher's contract is about texts
in and results out; the server tests run it with the real model).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from bert_tasks.inference.batcher import BatcherClosed, MicroBatcher


class Upper:
    """A batch function: upper-cases each text, remembering every batch; fails on texts holding 'boom'."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.delay = delay

    def __call__(self, texts: list[str]) -> list[str]:
        self.batches.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if self.delay:
            threading.Event().wait(self.delay)
        if any("boom" in text for text in texts):
            raise RuntimeError("the model broke")
        return [text.upper() for text in texts]


def test_concurrent_requests_share_batches_and_get_their_own_results() -> None:
    async def scenario() -> tuple[Upper, list[list[str]], MicroBatcher]:
        model = Upper()
        batcher = MicroBatcher(model, max_batch=64, max_wait_ms=200)
        batcher.start()
        requests = [[f"r{n}-a", f"r{n}-b"] for n in range(20)]
        results = await asyncio.gather(*(batcher.submit(texts) for texts in requests))
        await batcher.close()
        return model, results, batcher

    model, results, batcher = asyncio.run(scenario())
    assert results == [[f"R{n}-A", f"R{n}-B"] for n in range(20)]
    assert len(model.batches) < 20  # gathered, not one call per request
    assert sorted(text for batch in model.batches for text in batch) == sorted(
        f"r{n}-{x}" for n in range(20) for x in "ab"
    )
    assert (batcher.counters.requests, batcher.counters.texts) == (20, 40)
    assert batcher.counters.batches == len(model.batches)
    # the model ran in the worker thread, off the event loop's thread
    assert [name.startswith("bert-tasks-model") for name in model.threads] == [True]


def test_a_batch_never_exceeds_max_batch_and_a_big_request_runs_alone() -> None:
    async def scenario() -> tuple[Upper, list[list[str]]]:
        model = Upper()
        batcher = MicroBatcher(model, max_batch=5, max_wait_ms=100)
        batcher.start()
        sizes = [2, 2, 2, 9, 1, 3, 3]
        requests = [[f"{n}.{i}" for i in range(size)] for n, size in enumerate(sizes)]
        results = await asyncio.gather(*(batcher.submit(texts) for texts in requests))
        await batcher.close()
        assert results == [[text.upper() for text in texts] for texts in requests]
        return model, requests

    model, requests = asyncio.run(scenario())
    assert [len(batch) for batch in model.batches if len(batch) > 5] == [9]
    assert [batch for batch in model.batches if len(batch) > 5] == [requests[3]]
    assert all(len(batch) <= 5 for batch in model.batches if batch != requests[3])
    # requests are whole and in arrival order across the batches
    assert [text for batch in model.batches for text in batch] == [t for texts in requests for t in texts]


def test_a_failing_request_fails_alone_and_the_batcher_keeps_serving() -> None:
    async def scenario() -> tuple[list[object], list[str], MicroBatcher]:
        batcher = MicroBatcher(Upper(), max_batch=64, max_wait_ms=100)
        batcher.start()
        outcomes = await asyncio.gather(
            batcher.submit(["fine"]),
            batcher.submit(["boom"]),
            batcher.submit(["also fine"]),
            return_exceptions=True,
        )
        after = await batcher.submit(["later"])
        await batcher.close()
        return outcomes, after, batcher

    outcomes, after, batcher = asyncio.run(scenario())
    assert outcomes[0] == ["FINE"] and outcomes[2] == ["ALSO FINE"]
    assert isinstance(outcomes[1], RuntimeError)
    assert after == ["LATER"]
    assert batcher.counters.failed_batches == 2  # the shared batch, then the request alone


def test_close_finishes_every_request_already_submitted_then_refuses() -> None:
    async def scenario() -> tuple[list[list[str]], MicroBatcher]:
        batcher = MicroBatcher(Upper(delay=0.05), max_batch=2, max_wait_ms=50)
        batcher.start()
        pending = [asyncio.ensure_future(batcher.submit([f"t{n}"])) for n in range(7)]
        await asyncio.sleep(0)  # every request is in the queue
        await batcher.close()
        with pytest.raises(BatcherClosed):
            await batcher.submit(["too late"])
        return [future.result() for future in pending], batcher

    results, batcher = asyncio.run(scenario())
    assert results == [[f"T{n}"] for n in range(7)]
    assert batcher.counters.batches == 4
    # four batches of 0.05 s each in the model thread, and not much more (the thread did nothing else)
    assert 4 * 0.05 <= batcher.counters.model_seconds < 4 * 0.05 + 1.0


def test_model_seconds_count_a_failing_batch_too() -> None:
    async def scenario() -> MicroBatcher:
        batcher = MicroBatcher(Upper(delay=0.05), max_batch=64, max_wait_ms=1)
        batcher.start()
        with pytest.raises(RuntimeError):
            await batcher.submit(["boom"])
        await batcher.close()
        return batcher

    batcher = asyncio.run(scenario())
    assert batcher.counters.failed_batches == 1
    assert batcher.counters.model_seconds >= 0.05


def test_a_lone_request_waits_no_longer_than_max_wait() -> None:
    async def scenario() -> float:
        batcher = MicroBatcher(Upper(), max_batch=64, max_wait_ms=30)
        batcher.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await batcher.submit(["alone"]) == ["ALONE"]
        elapsed = loop.time() - start
        await batcher.close()
        return elapsed

    assert 0.025 <= asyncio.run(scenario()) < 5  # it waited for company, and was not forgotten


def test_the_wait_for_company_counts_from_when_the_model_became_free() -> None:
    """A request that waited out a running batch still waits up to max_wait for company once the model
    is free: the clients just answered send again at once and join it, instead of splitting into two
    half-size cohorts that take turns (32 one-text clients: 16 texts a call against 24-29)."""

    async def scenario() -> Upper:
        model = Upper(delay=0.2)
        batcher = MicroBatcher(model, max_batch=64, max_wait_ms=100)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["a"]))
        await asyncio.sleep(0.15)  # the batch of "a" is running (from ~0.1 s to ~0.3 s)
        waiting = asyncio.ensure_future(batcher.submit(["b"]))  # its own 0.1 s run out during the batch
        await first
        joining = await batcher.submit(["c"])  # sent as soon as "a" was answered, as a client does
        assert (await waiting, joining) == (["B"], ["C"])
        await batcher.close()
        return model

    assert asyncio.run(scenario()).batches == [["a"], ["b", "c"]]


def test_once_the_clients_just_answered_are_back_the_batch_goes_without_waiting() -> None:
    """A lone client's next request, sent as soon as its answer came, runs at once: the one client the
    last batch answered is back, so no company is left to wait for. Its first request (the model idle
    since the start) waited out max_wait."""

    async def scenario() -> tuple[float, float]:
        batcher = MicroBatcher(Upper(), max_batch=64, max_wait_ms=500)
        batcher.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await batcher.submit(["first"]) == ["FIRST"]
        answered = loop.time()
        assert await batcher.submit(["next"]) == ["NEXT"]
        elapsed = loop.time() - answered, answered - start
        await batcher.close()
        return elapsed

    again, first = asyncio.run(scenario())
    assert first >= 0.45
    assert again < 0.25


def test_a_burst_after_the_model_idled_still_waits_for_company() -> None:
    """Nobody was just answered once the model has idled longer than max_wait, so a request then opens a
    batch that waits for the burst behind it, even though the last batch held one request."""

    async def scenario() -> Upper:
        model = Upper()
        batcher = MicroBatcher(model, max_batch=64, max_wait_ms=200)
        batcher.start()
        await batcher.submit(["a"])
        await asyncio.sleep(0.3)  # the model idles past max_wait
        opening = asyncio.ensure_future(batcher.submit(["b"]))
        await asyncio.sleep(0.05)
        assert await asyncio.gather(opening, batcher.submit(["c"])) == [["B"], ["C"]]
        await batcher.close()
        return model

    assert asyncio.run(scenario()).batches == [["a"], ["b", "c"]]
