"""Progress lines for long in-process plans, as ``packsched plan`` prints them on stderr.

A plan of 10^7 sequences takes minutes; one of a training step's batch takes milliseconds. So
nothing is printed unless a call passes ``FIRST_S`` seconds; then one line every ``EVERY_S``
seconds while it runs, and one when it ends. The planner runs with the GIL released, so a
thread can report while it works.

Only a call on at least ``MIN_SIZE`` items is watched (a reporter thread for the call). A
smaller one costs nothing: no thread, no event, no clock read. The drop-ins call the planner many
times a step on batches of tens to thousands of sequences, where starting and joining a thread
per call cost more than the plan itself.
"""

import sys
import threading
import time

FIRST_S = 3.0
EVERY_S = 10.0

# The fewest items (sequences, or a forest's nodes) a call must plan to be watched. Estimated
# from the input size, the only measure known before the call: on the 2-core development VM the
# slowest planner call below 2^16 sequences (balance with sync="micro_batch" over 8,192 ranks,
# partition into 65,000 parts) took 0.53 s, plan_local 0.24 s and local_bound 0.04 s, so no call
# below it comes near FIRST_S even on a machine several times slower; 2 x 10^5 sequences took
# 1.3 s. At or above it a thread per call costs under 0.1 ms against tens of milliseconds of work.
MIN_SIZE = 1 << 16


class Progress:
    """Context manager around one planner call. ``report``: True (lines on stderr), False
    (nothing) or a callable taking each line (e.g. a logger's ``info``); anything else raises
    TypeError, whatever the size. ``what`` says what runs ("plan_local: 10000000 sequences").
    ``size``: the number of items the call plans; below ``MIN_SIZE`` the call is not watched
    (nothing is started and nothing is reported). None: watched whatever its size. ``first`` and
    ``every`` (seconds) default to ``FIRST_S`` and ``EVERY_S`` as they are when the call starts."""

    def __init__(self, what, report=True, *, size=None, first=None, every=None):
        emit = _emitter(report)
        self._emit = emit if size is None or size >= MIN_SIZE else None
        self._what = what
        self._first = FIRST_S if first is None else first
        self._every = EVERY_S if every is None else every
        self._done = None
        self._reported = False
        self._start = 0.0
        self._thread = None

    def __enter__(self):
        if self._emit is not None:
            self._start = time.monotonic()
            self._done = threading.Event()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc):
        if self._thread is not None:
            self._done.set()
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
