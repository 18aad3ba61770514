"""packsched: micro-batch planning and packing kernels for padding-free LLM training.

Submodules: ``packsched.planner`` (the planner in-process: plan_local, local_bound, partition,
balance), ``packsched.plan`` (the ``Plan`` every entry point returns, with split/restore),
``packsched.kernels`` (packing kernels over DLPack tensors), ``packsched.compat.verl`` and
``packsched.compat.openrlhf`` (drop-ins for those trainers' dynamic batching) and
``packsched.client`` (``SchedulerClient`` and ``SchedulerError``, also importable from
``packsched`` itself). Optional submodules are imported only if present, so the package stays
importable from a partial build.
"""

import importlib as _importlib

__version__ = "0.1.0"

from . import kernels  # noqa: F401  (always built with the package)
from .plan import Plan  # noqa: F401

for _name in ("client", "planner"):
    try:
        globals()[_name] = _importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_name}":
            raise  # the submodule exists but one of its own imports failed: say so
del _name
if "client" in globals():
    from .client import SchedulerClient, SchedulerError  # noqa: F401  (packsched.SchedulerError)
