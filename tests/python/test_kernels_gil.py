"""The kernel bindings release the GIL while the C++ call runs, so other Python threads progress
during a long kernel (a data loader, a second stream's work)."""

import sys
import threading

import numpy as np

from packsched import kernels as k


def test_other_threads_run_during_a_kernel_call():
    # With a switch interval far beyond the test's length the interpreter never takes the GIL
    # from the main thread by itself: the waiting thread can only run if the call releases it.
    # Held across the call, the thread cannot run before `ran` is read, so this cannot pass by
    # chance; released, it runs as soon as the OS wakes it (each attempt's call lasts tens of ms).
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1024, 2, 64)).astype(np.float32)
    cu = np.array([0, 1024], np.int32)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        for _ in range(3):
            ran = []
            go = threading.Event()
            thread = threading.Thread(target=lambda: (go.wait(), ran.append(True)))
            thread.start()
            go.set()  # the thread now only waits for the GIL
            k.varlen_attention_forward(q, q, q, cu, cu, 1024, 1024, causal=True)
            seen = bool(ran)
            thread.join()
            if seen:
                break
    finally:
        sys.setswitchinterval(previous)
    assert seen, "no other thread ran while the kernel held the GIL"
