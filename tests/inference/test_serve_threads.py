"""How `serve --workers N` shares the CPU: each worker's torch takes every core unless told otherwise, so
N workers would run N x cores threads that preempt each other."""

from __future__ import annotations

import pytest

from bert_tasks.inference.serve_settings import threads_per_worker


@pytest.fixture
def eight_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)


@pytest.mark.usefixtures("eight_cores")
@pytest.mark.parametrize(("workers", "threads"), [(2, 4), (3, 2), (8, 1), (16, 1)])
def test_several_workers_divide_the_cores_among_them(workers: int, threads: int) -> None:
    assert threads_per_worker(workers, None) == threads


@pytest.mark.usefixtures("eight_cores")
def test_one_worker_keeps_torchs_own_choice_and_a_given_count_wins() -> None:
    assert threads_per_worker(1, None) is None
    assert threads_per_worker(4, 3) == 3


@pytest.mark.usefixtures("eight_cores")
def test_a_users_omp_num_threads_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert threads_per_worker(2, None) is None  # each worker's torch reads it


def test_a_process_held_to_fewer_cores_divides_those(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {2, 3}, raising=False)  # taskset -c 2,3
    assert threads_per_worker(2, None) == 1
