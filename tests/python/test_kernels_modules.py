"""packsched.kernels is the face of one private module per job: its public names are the API
callers use, each defined by exactly one job module, and the modules import without a cycle (each
one also when it is the first of them imported)."""

import ast
import pathlib
import subprocess
import sys

import pytest

import packsched
from packsched import kernels

JOB_MODULES = (
    "_arrays",
    "_packing",
    "_cross_entropy",
    "_attention",
    "_context_parallel",
    "tree_kernels",
    "_recurrent",
)

# tree_kernels is also a public module of its own (its targets builder and restore belong to the
# tree's loss, not to packsched.kernels): kernels re-exports its kernels only.
REEXPORTED_ONLY_IN_PART = {
    "tree_kernels": {"tree_attention", "tree_position_ids", "multi_target_cross_entropy"}
}

# The public API of packsched.kernels. Adding a name means adding it here; removing or renaming
# one breaks callers.
PUBLIC_API = [
    "unpad",
    "pad",
    "pack_aligned",
    "unpack_aligned",
    "aligned_cu_seqlens",
    "position_ids",
    "shift_labels",
    "packed_cross_entropy",
    "built_with_cuda",
    "varlen_attention",
    "varlen_attention_forward",
    "varlen_attention_backward",
    "cp_layout",
    "cp_shard",
    "cp_unshard",
    "cp_position_ids",
    "cp_shift_labels",
    "cp_attention",
    "cp_cross_entropy",
    "mrope_position_ids",
    "tree_attention",
    "tree_position_ids",
    "multi_target_cross_entropy",
    "causal_conv1d",
    "gated_delta_rule",
    "selective_scan",
    "flat_prev_rows",
    "tree_prev_rows",
    "micro_batch_prev_rows",
    "states_alive",
]

PACKAGE_DIR = pathlib.Path(packsched.__file__).resolve().parent


def job_module(name):
    return sys.modules[f"packsched.{name}"]


def public_names_of(name):
    """The public callables job module `name` provides: defined there, or taken from a module
    outside the job modules (cp_layout from _cp_layout); not those of another job module."""
    module = job_module(name)
    others = {f"packsched.{m}" for m in JOB_MODULES if m != name}
    names = set()
    for attr, value in vars(module).items():
        origin = getattr(value, "__module__", None) or ""
        if attr.startswith("_") or not callable(value) or not origin.startswith("packsched."):
            continue
        if origin not in others:
            names.add(attr)
    return names


def test_all_is_the_public_api():
    assert kernels.__all__ == PUBLIC_API
    assert all(callable(getattr(kernels, name)) for name in PUBLIC_API)


def test_every_public_name_comes_from_exactly_one_job_module():
    owners = {}
    for name in JOB_MODULES:
        names = public_names_of(name)
        if name in REEXPORTED_ONLY_IN_PART:
            assert REEXPORTED_ONLY_IN_PART[name] <= names
            names = REEXPORTED_ONLY_IN_PART[name]
        for attr in names:
            assert attr not in owners, f"{attr} in both {owners.get(attr)} and {name}"
            owners[attr] = name
    assert sorted(owners) == sorted(kernels.__all__)
    for attr, name in owners.items():
        assert getattr(kernels, attr) is getattr(job_module(name), attr), attr


def relative_imports(path):
    """The packsched modules that the file at `path` imports (relative imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module)
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_the_kernels_modules_import_no_cycle():
    family = set(JOB_MODULES) | {"kernels"}
    graph = {m: relative_imports(PACKAGE_DIR / f"{m}.py") & family for m in family}
    assert not any("kernels" in graph[m] for m in JOB_MODULES), graph
    done, path = set(), []

    def visit(module):
        assert module not in path, f"import cycle: {' -> '.join(path + [module])}"
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(family):
        visit(module)


# Imports packsched.<name> first, in a fresh interpreter, without packsched/__init__.py (which
# imports packsched.kernels before anything else), then packsched.kernels.
_IMPORT_FIRST = r"""
import importlib, sys, types
package = types.ModuleType("packsched")
package.__path__ = [sys.argv[2]]
sys.modules["packsched"] = package
importlib.import_module("packsched." + sys.argv[1])
kernels = importlib.import_module("packsched.kernels")
print(len(kernels.__all__))
"""


@pytest.mark.parametrize("name", JOB_MODULES + ("kernels",))
def test_each_module_imports_first_on_its_own(name):
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_FIRST, name, str(PACKAGE_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(PUBLIC_API)
