"""The exit of a rank process of the multi-rank tests (helpers/*_rank.py).

PyPI's torch 2.15 sometimes aborts while the interpreter shuts down after a gloo process group
was used, even once it is destroyed ("terminate called without an active exception", SIGABRT:
about 1 run in 12 of a 2-rank test here), after the rank has done and written everything. A rank
therefore ends with os._exit once its output is flushed: its status is its own outcome (0, or
SystemExit's code, or 1 with the traceback for an exception), never torch's teardown.
"""

import os
import sys
import traceback


def run(main):
    """Runs ``main()`` and ends the process with its outcome, skipping interpreter teardown."""
    try:
        main()
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # a rank reports every failure in its status
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
