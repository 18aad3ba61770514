"""packsched: micro-batch planning and packing kernels for padding-free LLM training.

Submodules: ``packsched.planner`` (the planner in-process: plan_local, local_bound, partition,
balance), ``packsched.plan`` (the ``Plan`` every entry point returns, with split/restore),
``packsched.kernels`` (packing kernels over DLPack tensors), ``packsched.compat.verl`` and
``packsched.compat.openrlhf`` (drop-ins for those trainers' dynamic batching) and
``packsched.client`` (``SchedulerClient`` and ``SchedulerError``, also importable from
``packsched`` itself). The client is imported on first use: it needs grpcio and protobuf, the
rest of the package only numpy (and torch for torch tensors). ``packsched.planner`` is imported
only if built, so the package stays importable from a partial build.
"""

import importlib as _importlib

__version__ = "0.1.0"

from . import kernels  # noqa: F401  (always built with the package)
from .plan import Plan  # noqa: F401

try:
    from . import planner  # noqa: F401
except ModuleNotFoundError as _e:
    if _e.name != f"{__name__}.planner":
        raise  # the submodule exists but one of its own imports failed: say so

# The sidecar client needs grpcio and protobuf (`pip install packsched[client]`): imported on
# first use, so the planner, the kernels and packsched.compat work without them.
_LAZY = {"client": None, "SchedulerClient": "SchedulerClient", "SchedulerError": "SchedulerError"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _importlib.import_module(f"{__name__}.client")
    value = module if _LAZY[name] is None else getattr(module, _LAZY[name])
    globals()[name] = value
    return value
