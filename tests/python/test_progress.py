"""Progress lines of long in-process plans (packsched._progress): silent for a short call, one
line per period and a closing line for a long one; progress=False silences, a callable gets the
lines. A call on fewer than MIN_SIZE items starts no thread at all."""

import threading

import pytest

from packsched import _progress, planner
from packsched._progress import Progress


def test_a_call_longer_than_the_first_period_reports_while_it_runs_and_when_it_ends():
    lines = []
    reported = threading.Event()

    def report(line):
        lines.append(line)
        reported.set()

    with Progress("plan_local: 7 sequences", report, first=0.01, every=0.01):
        assert reported.wait(10)  # the body runs until the first line came
    assert lines[0].startswith("plan_local: 7 sequences: planning, ") and "s so far" in lines[0]
    assert lines[-1].startswith("plan_local: 7 sequences: done in ")


def test_a_failing_call_says_so():
    lines = []
    reported = threading.Event()
    with pytest.raises(RuntimeError):
        with Progress("x", lambda line: (lines.append(line), reported.set()), first=0.01):
            reported.wait(10)
            raise RuntimeError("boom")
    assert lines[-1].startswith("x: failed in ")


def test_a_short_call_prints_nothing(capsys):
    lines = []
    planner.plan_local([5, 6, 7], 100, progress=lines.append)
    planner.plan_local([5, 6, 7], 100)
    assert lines == [] and capsys.readouterr().err == ""


def test_progress_false_starts_nothing_and_a_bad_value_is_a_type_error():
    before = threading.active_count()
    with Progress("x", False, first=0.0):
        assert threading.active_count() == before
    with pytest.raises(TypeError, match="progress must be True, False or a callable, got str"):
        planner.plan_local([5], 100, progress="yes")


@pytest.fixture
def threads_started(monkeypatch):
    """Counts the threads started from here on (every threading.Thread.start call) and makes
    every watched call report at once (FIRST_S = 0)."""
    started = []
    start = threading.Thread.start

    def counting_start(thread):
        started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    monkeypatch.setattr(_progress, "FIRST_S", 0.0)
    return started


def small_and_big():
    small = [(i * 37) % 500 + 1 for i in range(1000)]
    big = [(i * 37) % 500 + 1 for i in range(_progress.MIN_SIZE)]
    return small, big


def test_a_small_call_starts_no_thread_even_when_it_would_report_at_once(threads_started):
    small, _ = small_and_big()
    lines = []
    planner.plan_local(small, 1000, progress=lines.append)
    planner.local_bound(small, 1000, progress=lines.append)
    planner.partition(small, 300, 1000, progress=lines.append)
    planner.balance(small, 4, 1000, progress=lines.append)
    assert threads_started == [] and lines == []


def test_a_big_call_is_still_watched_and_reports(threads_started):
    _, big = small_and_big()
    lines = []
    planner.local_bound(big, 1000, progress=lines.append)
    assert len(threads_started) == 1
    assert lines[0].startswith(f"local_bound: {len(big)} sequences: planning, ")
    assert lines[-1].startswith(f"local_bound: {len(big)} sequences: done in ")


def test_the_size_threshold_is_at_min_size_and_none_means_always(threads_started):
    for size, watched in ((_progress.MIN_SIZE - 1, False), (_progress.MIN_SIZE, True)):
        del threads_started[:]
        with Progress("x", lambda line: None, size=size):
            pass
        assert len(threads_started) == int(watched), size
    del threads_started[:]
    with Progress("x", lambda line: None):
        pass
    assert len(threads_started) == 1


def test_a_bad_progress_value_is_refused_for_a_small_call_too():
    with pytest.raises(TypeError, match="progress must be True, False or a callable, got int"):
        Progress("x", 3, size=1)
