"""Progress lines for long in-process plans, as ``packsched plan`` prints them on stderr.

A plan of 10^7 sequences takes minutes; one of a training step's batch takes milliseconds. So
nothing is printed unless a call passes ``FIRST_S`` seconds; then one line every ``EVERY_S``
seconds while it runs, and one when it ends. The planner runs with the GIL released, so a
thread can report while it works.
"""

import sys
import threading
import time

FIRST_S = 3.0
EVERY_S = 10.0


class Progress:
    """Context manager around one planner call. ``report``: True (lines on stderr), False
    (nothing) or a callable taking each line (e.g. a logger's ``info``). ``what`` says what runs
    ("plan_local: 10000000 sequences")."""

    def __init__(self, what, report=True, *, first=FIRST_S, every=EVERY_S):
        self._what = what
        self._emit = _emitter(report)
        self._first = first
        self._every = every
        self._done = threading.Event()
        self._reported = False
        self._start = 0.0
        self._thread = None

    def __enter__(self):
        self._start = time.monotonic()
        if self._emit is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            if self._reported:
                outcome = "done" if exc_type is None else "failed"
                self._emit(f"{self._what}: {outcome} in {self._elapsed():.1f} s")
        return False

    def _elapsed(self):
        return time.monotonic() - self._start

    def _run(self):
        wait = self._first
        while not self._done.wait(wait):
            self._reported = True
            self._emit(f"{self._what}: planning, {self._elapsed():.0f} s so far")
            wait = self._every


def _emitter(report):
    if report is True:
        return lambda line: print(f"packsched.planner.{line}", file=sys.stderr, flush=True)
    if report is False or report is None:
        return None
    if callable(report):
        return report
    raise TypeError(f"progress must be True, False or a callable, got {type(report).__name__}")
