"""packsched: micro-batch planning and packing kernels for padding-free LLM training.

Submodules: ``packsched.kernels`` (packing kernels over DLPack tensors). The sidecar client and
the in-process planner join this package as they land; each is imported only if present, so the
package stays importable from a partial build.
"""

import importlib as _importlib

__version__ = "0.1.0"

from . import kernels  # noqa: F401  (always built with the package)

for _name in ("client", "planner"):
    try:
        globals()[_name] = _importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_name}":
            raise  # the submodule exists but one of its own imports failed: say so
del _name
