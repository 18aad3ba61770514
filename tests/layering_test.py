#!/usr/bin/env python3
"""Checks the dependency direction of docs/design.md §5 from the #include lines of the C++
sources and the import lines of the packsched Python package, against ONE description: LAYERS
below.

Each layer owns paths (directories or files; a file belongs to the layer with the longest path
that contains it), lists the layers it uses (the arrows) and the outside libraries it may use
(names from LIBRARIES). A layer may include its own headers, those of every layer it reaches
through the arrows (transitively), and its own outside libraries (not those of the layers it
reaches). The standard library and POSIX headers are always allowed; every library named in
LIBRARIES (gRPC, protobuf, NCCL, CUDA, Gloo, and the light ones) is forbidden unless listed.
A layer none of whose paths exist yet is skipped; a source file in no layer is a violation, so
a new directory has to be placed in the description.

Python layers own module names ("packsched.planner") and are checked the same way from every
import in the module (function-level imports included); the Python standard library is allowed.

Adding a layer: one line in LAYERS (and its tests/ mirror in TESTS); give it the arrows it uses
and name it in the `uses` of the layers above it.
"""
import ast
import pathlib
import re
import sys
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Layer(NamedTuple):
    paths: tuple  # directories or files (C++), or module names (Python, names with a dot)
    uses: tuple = ()  # arrows: the layers this one may include/import
    libs: tuple = ()  # outside libraries (keys of LIBRARIES)


# Outside libraries: C++ include prefixes (a "dir/" or a file-name prefix) and Python modules.
LIBRARIES = {
    "absl": (("absl/",), ()),
    "spdlog": (("spdlog/",), ()),
    "grpc": (("grpc/", "grpcpp/", "grpc++/"), ("grpc",)),
    "protobuf": (("google/protobuf/",), ("google.protobuf",)),
    "gloo": (("gloo/",), ()),
    "nccl": (("nccl",), ()),
    "cuda": (("cuda", "cub/", "thrust/", "cooperative_groups", "mma.h", "nv"), ("cupy",)),
    "dlpack": (("dlpack/",), ()),
    "pybind11": (("pybind11/",), ()),
    "gtest": (("gtest/", "gmock/"), ()),
    "benchmark": (("benchmark/",), ()),
    "prometheus": (("prometheus/",), ()),
    "nlohmann": (("nlohmann/",), ()),
    "openssl": (("openssl/",), ()),
    "numpy": ((), ("numpy",)),
    "torch": ((), ("torch",)),
    "transformers": ((), ("transformers",)),
    "tensordict": ((), ("tensordict",)),
    "flash_attn": ((), ("flash_attn",)),  # FlashAttention's Python package, when installed
    "datasets": ((), ("datasets", "pyarrow")),
}

# Where include paths that are not repository paths live: the generated protobuf/gRPC headers
# and the kernels' public headers (installed as packsched/kernels/...).
INCLUDE_ALIASES = {
    "packsched/v1/": "proto/packsched/v1/",
    "packsched/kernels/": "kernels/include/packsched/kernels/",
}

# The description. Arrows (uses) point from a layer to what it depends on.
LAYERS = {
    # The .proto files; their generated code is included as packsched/v1/*.pb.h.
    "proto": Layer(("proto",), (), ("protobuf", "grpc")),
    "base": Layer(("server/base",), (), ("absl", "spdlog")),
    # Pure algorithms: no logging, no RPC, no device.
    "planner": Layer(("server/planner",), ("base",), ("absl",)),
    "cli": Layer(("server/cli",), ("planner",), ("absl", "spdlog", "nlohmann")),
    # The Collective interface and its local/Gloo/NCCL backends.
    "collective": Layer(
        ("server/collective",), ("base",), ("absl", "spdlog", "gloo", "nccl", "cuda")
    ),
    # The agreement port: what the service agrees its rounds through (the records a round takes
    # and gives, and the RoundAgreements interface). The only part of group the service sees.
    "group/port": Layer(
        ("server/group/round_agreement.h", "server/group/round_record.h"), (), ("absl",)
    ),
    # Rank groups behind the port (Group, StreamGroup, arrival, readiness, keys, the round over a
    # Collective, the port's implementations), wired by the sidecar (server/sidecar/).
    "group": Layer(("server/group",), ("group/port", "collective"), ("absl", "spdlog")),
    # What the service layer records metrics through (no Prometheus), and the metrics: the
    # Prometheus series and the process collector (prometheus-cpp), the /metrics endpoint.
    "metrics/sink": Layer(("server/metrics/sink.h",), (), ("absl",)),
    "metrics": Layer(("server/metrics",), ("metrics/sink", "base"), ("absl", "prometheus")),
    "service": Layer(
        ("server/service",),
        ("planner", "collective", "group/port", "credentials", "proto", "metrics/sink"),
        ("absl", "spdlog", "grpc", "protobuf"),
    ),
    # TLS credentials and bearer-token rules (one library, used by every gRPC endpoint).
    "credentials": Layer(("server/security",), ("base",), ("absl", "grpc", "openssl")),
    # The packsched-server binary: main.cc and what it is split into (flags, wiring, probe).
    "main": Layer(
        ("server/main.cc", "server/sidecar"),
        ("service", "group", "credentials", "metrics"),
        ("absl", "spdlog", "grpc"),
    ),
    # Kernels. common/ is host-device code: nothing heavy, nothing outside itself.
    "kernels/common": Layer(("kernels/common",)),
    "kernels/api": Layer(("kernels/include",), (), ("absl", "dlpack")),
    "kernels/internal": Layer(
        ("kernels/internal",), ("kernels/api", "kernels/common", "base"), ("absl", "dlpack")
    ),
    "kernels/cpu": Layer(("kernels/cpu",), ("kernels/internal",), ("absl",)),
    "kernels/cuda": Layer(("kernels/cuda",), ("kernels/internal",), ("absl", "cuda")),
    # The dispatching entry points.
    "kernels": Layer(
        (
            "kernels/kernels.cc",
            "kernels/attention_api.cc",
            "kernels/context_parallel_api.cc",
            "kernels/tree_api.cc",
            "kernels/recurrent_api.cc",
        ),
        ("kernels/cpu", "kernels/cuda"),
        ("absl", "dlpack"),
    ),
    # C++ client: its public headers include no gRPC and no generated code.
    "client/cpp/api": Layer(
        ("client/cpp/scheduler_client.h", "client/cpp/plan_apply.h"), ("planner",), ("absl",)
    ),
    "client/cpp": Layer(
        ("client/cpp",), ("client/cpp/api", "proto", "credentials"), ("absl", "grpc", "protobuf")
    ),
    # The Python extension modules (pybind11): the in-process planner and the kernels' API.
    "client/python": Layer(
        ("client/python/src",), ("planner", "kernels/api"), ("absl", "dlpack", "pybind11")
    ),
    # The Python package. planner and kernels work without a sidecar: no gRPC, no stubs.
    # The option defaults and the plan's fields come from the schema table (packsched._planner).
    "py/options": Layer(("packsched._options",), ("py/ext",)),
    "py/cp_layout": Layer(("packsched._cp_layout",)),
    "py/plan": Layer(("packsched.plan",), ("py/options",), ("numpy", "torch")),
    "py/ext": Layer(("packsched._planner", "packsched._kernels"), ("client/python",)),
    # Forests of rollouts and the tree plan's value types (tree packing).
    "py/tree": Layer(("packsched.tree",), ("py/plan", "py/inputs"), ("numpy", "torch")),
    "py/model_cost": Layer(("packsched.model_cost",), ("py/ext",)),
    # Dynamic context parallelism in-process (server/planner/dynamic_cp.h through the extension).
    "py/dynamic_cp": Layer(("packsched.dynamic_cp",), ("py/ext", "py/model_cost")),
    # The checks of request data and the progress lines, shared by the planner and the client.
    "py/inputs": Layer(("packsched._inputs", "packsched._progress"), (), ("numpy",)),
    "py/planner": Layer(
        ("packsched.planner",),
        ("py/options", "py/plan", "py/ext", "py/model_cost", "py/inputs", "py/tree"),
        ("numpy",),
    ),
    "py/kernels": Layer(
        (
            "packsched.kernels",
            "packsched._arrays",
            "packsched._packing",
            "packsched._cross_entropy",
            "packsched._attention",
            "packsched._context_parallel",
            "packsched.tree_kernels",
            "packsched._tree_cp",
            "packsched._recurrent",
            # The torch path: custom ops over the modules above (imported with torch only).
            "packsched._torch_ops",
            "packsched._torch_args",
            "packsched._ops_attention",
            "packsched._ops_loss",
            "packsched._ops_packing",
            "packsched._ops_recurrent",
            # Which backend runs a torch attention call, and the calls to the others.
            "packsched._attention_backends",
            "packsched._attention_dispatch",
        ),
        ("py/ext", "py/cp_layout"),
        ("numpy", "torch", "cuda", "flash_attn"),
    ),
    "py/stubs": Layer(("packsched.v1",), ("proto",), ("grpc", "protobuf")),
    "py/client": Layer(
        ("packsched.client",),
        ("py/planner", "py/model_cost", "py/stubs", "py/inputs", "py/tree"),
        ("grpc", "protobuf"),
    ),
    "py/compat": Layer(
        ("packsched.compat",),
        ("py/planner", "py/kernels", "py/client", "py/tree"),
        ("numpy", "torch", "tensordict"),
    ),
    # packsched in other libraries' extension points: the kernels in Hugging Face transformers'
    # attention registry, the planner as TRL's dataset packing (datasets' tables, pyarrow);
    # nothing in the package imports them.
    "py/integrations": Layer(
        ("packsched.integrations",),
        ("py/kernels", "py/planner"),
        ("numpy", "torch", "transformers", "datasets"),
    ),
    # packsched/__init__.py (its own name, so that a new module is in no layer until placed).
    "py/package": Layer(("packsched.__init__",), ("py/client", "py/kernels", "py/planner")),
    # Shared test helpers.
    "tests/testing": Layer(("tests/testing",), (), ("absl", "gtest")),
}

# tests/ mirrors: each test directory tests the layers listed; it may include what they may
# include (their arrows and libraries), tests/testing, gtest/gmock, and the extra libraries.
TESTS = {
    "tests/base": (("base",), ()),
    "tests/planner": (("planner",), ()),
    "tests/cli": (("cli",), ()),
    "tests/collective": (("collective",), ()),
    "tests/group": (("group", "tests/collective"), ("gloo",)),  # Gloo groups on loopback
    "tests/security": (("credentials",), ()),
    # The in-process collective, and the port's implementations the sidecar would choose.
    "tests/service": (("service", "group", "tests/collective"), ()),
    "tests/sidecar": (("main",), ()),
    "tests/metrics": (("metrics",), ()),
    "tests/kernels": (("kernels", "planner"), ("cuda",)),  # device tests include the runtime
    "tests/client": (("client/cpp",), ()),
    "tests/e2e": (("client/cpp",), ()),
    # The GPU kit's own probe (tests/gpu/nccl_probe.cc): a round over the NCCL backend.
    "tests/gpu": (("collective", "group"), ("cuda", "nccl")),
    "tests/bench": (
        (
            "client/cpp",
            "kernels",
            "collective",
            "group",
            "planner",
            "cli",
            "tests/e2e",
            "tests/kernels",
        ),
        ("benchmark", "nlohmann"),
    ),
}


def build_layers():
    """LAYERS plus one layer per existing tests/ mirror, each with its libraries merged in."""
    layers = dict(LAYERS)
    for directory, (tested, extra) in TESTS.items():
        libs = {"gtest", *extra}
        for name in tested:
            libs.update(layers[name].libs if name in layers else ())
        layers[directory] = Layer((directory,), (*tested, "tests/testing"), tuple(sorted(libs)))
    return layers


def check_description(layers):
    errors = []
    for name, layer in layers.items():
        errors += [
            f"description: {name} uses unknown layer {u}" for u in layer.uses if u not in layers
        ]
        errors += [
            f"description: {name} uses unknown library {b}"
            for b in layer.libs
            if b not in LIBRARIES
        ]

    def visit(name, stack):
        if name in stack:
            errors.append("description: cycle " + " -> ".join(stack[stack.index(name) :] + [name]))
            return
        for used in layers.get(name, Layer(())).uses:
            visit(used, stack + [name])

    for name in layers:
        visit(name, [])
    return sorted(set(errors))


def reach(layers, name):
    """The layers `name` may depend on: itself and everything its arrows reach."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen and current in layers:
            seen.add(current)
            todo += layers[current].uses
    return seen


def is_module(path):
    return "/" not in path and "." in path


def owner(layers, path, python=False):
    """The layer owning a repository path (or, with python, a module name): the longest match."""
    best, best_len = None, -1
    sep = "." if python else "/"
    for name, layer in layers.items():
        for own in layer.paths:
            if is_module(own) != python:
                continue
            if (path == own or path.startswith(own + sep)) and len(own) > best_len:
                best, best_len = name, len(own)
    return best


def library(header, python=False):
    for name, (prefixes, modules) in LIBRARIES.items():
        if python:
            if any(header == m or header.startswith(m + ".") for m in modules):
                return name
        elif any(header.startswith(p) for p in prefixes):
            return name
    return None


def project_path(header):
    for alias, path in INCLUDE_ALIASES.items():
        if header.startswith(alias):
            return path + header[len(alias) :]
    return header


INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = (".h", ".cc", ".cu", ".cuh")
CPP_ROOTS = ("server", "kernels", "client", "tests", "proto")


def check_include(layers, name, allowed, kind, header):
    """None if `name` may include `header`, else what it breaks."""
    target_path = project_path(header)
    target = owner(layers, target_path) if (ROOT / target_path.split("/")[0]).is_dir() else None
    if target_path != header or (kind == '"' and target is not None):
        if target is None:
            return f"{header} belongs to no layer"
        if target not in allowed:
            return f"arrow {name} -> {target} is not in the description"
        return None
    lib = library(header)
    if lib is not None:
        if lib not in layers[name].libs:
            return f"{name} may not use {lib} (not in its libs)"
        return None
    if kind == '"':
        return f"{header} is neither a layer's header nor a listed library"
    return None  # the standard library and POSIX


def check_cpp(layers, live):
    errors, files = [], 0
    for top in CPP_ROOTS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            relative = path.relative_to(ROOT).as_posix()
            name = owner(layers, relative)
            if name is None:
                errors.append(f"{relative}: in no layer of tests/layering_test.py (add it)")
                continue
            if name not in live:
                continue
            files += 1
            allowed = reach(layers, name)
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = INCLUDE.match(line)
                if match:
                    broken = check_include(layers, name, allowed, *match.groups())
                    if broken:
                        errors.append(f"{relative}:{number}: {match.group(2)}: {broken}")
    return errors, files


def imports(tree, module, is_package):
    """(line, absolute module name) for every import in a parsed module."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if node.module is None or node.level:
                # `from . import x` / `from .m import x`: x may itself be a module
                for alias in node.names:
                    yield node.lineno, f"{base}.{alias.name}" if node.module is None else base
            else:
                yield node.lineno, base


def check_python(layers, live):
    errors, files = [], 0
    root = ROOT / "client/python"
    for path in sorted((root / "packsched").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        # packsched/__init__.py is owned as "packsched.__init__", a subpackage by its prefix
        name = owner(layers, ".".join(parts), python=True)
        if name is None:
            errors.append(f"{relative}: module {module} in no layer of tests/layering_test.py")
            continue
        if name not in live:
            continue
        files += 1
        allowed = reach(layers, name)
        for number, imported in imports(ast.parse(path.read_text()), module, is_package):
            target = (
                owner(layers, imported, python=True) if imported.startswith("packsched") else None
            )
            if imported.startswith("packsched"):
                if target is None:
                    broken = f"{imported} belongs to no layer"
                elif target not in allowed:
                    broken = f"arrow {name} -> {target} is not in the description"
                else:
                    continue
            elif (lib := library(imported, python=True)) is not None:
                if lib in layers[name].libs:
                    continue
                broken = f"{name} may not use {lib} (not in its libs)"
            elif imported.split(".")[0] in sys.stdlib_module_names:
                continue
            else:
                broken = f"{imported} is neither a layer's module nor a listed library"
            errors.append(f"{relative}:{number}: import {imported}: {broken}")
    return errors, files


def main():
    layers = build_layers()
    errors = check_description(layers)
    live = {
        name
        for name, layer in layers.items()
        if any(is_module(p) or (ROOT / p).exists() for p in layer.paths)
    }
    cpp_errors, cpp_files = check_cpp(layers, live)
    py_errors, py_files = check_python(layers, live)
    errors += cpp_errors + py_errors
    for error in errors:
        print(error)
    skipped = sorted(set(layers) - live)
    print(
        f"layering: {len(live)} layers ({cpp_files} C++ files, {py_files} Python modules) checked, "
        f"{len(skipped)} not present yet ({', '.join(skipped) or 'none'}), {len(errors)} violations"
    )
    return 1 if errors or not cpp_files or not py_files else 0


if __name__ == "__main__":
    sys.exit(main())
