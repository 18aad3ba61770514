"""Progress lines of long in-process plans (packsched._progress): silent for a short call, one
line per period and a closing line for a long one; progress=False silences, a callable gets the
lines."""

import threading

import pytest

from packsched import planner
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
