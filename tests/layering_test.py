#!/usr/bin/env python3
"""Checks the dependency direction of DESIGN.md §5 from the #include lines of the sources.

base <- planner <- service <- main; base <- collective <- service; proto <- service, client;
base <- kernels <- client/python. Each rule lists the project directories (and outside
libraries) a directory may include; system headers in <...> are always allowed, except the
forbidden prefixes listed per rule (the planner must not see gRPC, protobuf, NCCL or CUDA).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("grpc", "grpcpp", "google/protobuf", "nccl", "cuda", "proto/")

# directory -> (allowed project prefixes for "..." includes, forbidden prefixes anywhere)
RULES = {
    "server/base": (("absl/", "spdlog/", "server/base/"), HEAVY),
    "server/planner": (("absl/", "server/base/", "server/planner/"), HEAVY + ("spdlog",)),
    "server/cli": (("absl/", "spdlog/", "server/base/", "server/planner/", "server/cli/"), HEAVY),
    "kernels": (
        ("absl/", "dlpack/", "server/base/", "kernels/", "packsched/kernels/"),
        (
            "grpc",
            "grpcpp",
            "google/protobuf",
            "nccl",
            "proto/",
            "server/planner",
            "server/service",
            "server/collective",
        ),
    ),
    "client/python": (
        ("absl/", "dlpack/", "packsched/kernels/", "server/base/", "server/planner/"),
        (
            "grpc",
            "grpcpp",
            "google/protobuf",
            "nccl",
            "cuda",
            "server/service",
            "server/collective",
        ),
    ),
    "server/collective": (
        (
            "absl/",
            "spdlog/",
            "server/base/",
            "server/collective/",
            "gloo/",
            "nccl",
            "cuda",
            "grpcpp/",
            "proto/",
            "packsched/",
        ),
        ("server/planner",),
    ),
    "tests/collective": (
        (
            "absl/",
            "gmock/",
            "gtest/",
            "server/base/",
            "server/collective/",
            "tests/collective/",
            "tests/testing/",
            "gloo/",
        ),
        ("server/planner", "server/service"),
    ),
    "server/service": (
        (
            "absl/",
            "spdlog/",
            "grpcpp/",
            "google/protobuf/",
            "packsched/v1/",
            "server/base/",
            "server/planner/",
            "server/collective/",
            "server/service/",
        ),
        ("nccl", "cuda", "gloo"),
    ),
    "client/cpp": (
        (
            "absl/",
            "grpcpp/",
            "google/protobuf/",
            "packsched/v1/",
            "server/base/",
            "server/planner/",
            "client/cpp/",
        ),
        ("nccl", "cuda", "server/service", "server/collective"),
    ),
    # The client's public headers include no gRPC and no generated code (files, not directories).
    "client/cpp/scheduler_client.h": (("absl/", "server/planner/"), HEAVY + ("packsched/v1",)),
    "client/cpp/plan_apply.h": (("absl/", "server/planner/"), HEAVY + ("packsched/v1",)),
    "tests/service": (
        (
            "absl/",
            "gmock/",
            "google/protobuf/",
            "gtest/",
            "packsched/v1/",
            "server/",
            "tests/service/",
            "tests/testing/",
        ),
        ("nccl", "cuda"),
    ),
}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def check(directory, allowed, forbidden):
    errors = []
    root = ROOT / directory
    for path in [root] if root.is_file() else sorted(root.rglob("*")):
        if path.suffix not in (".h", ".cc", ".cu", ".cuh"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            kind, header = match.groups()
            where = f"{path.relative_to(ROOT)}:{number}: {header}"
            if any(header.startswith(f) for f in forbidden):
                errors.append(f"{where} is forbidden in {directory}")
            elif kind == '"' and not header.startswith(allowed):
                errors.append(f"{where} is outside what {directory} may include")
    return errors


def main():
    errors = []
    checked = 0
    for directory, (allowed, forbidden) in RULES.items():
        if (ROOT / directory).exists():
            checked += 1
            errors += check(directory, allowed, forbidden)
    for error in errors:
        print(error)
    print(f"layering: {checked} directories checked, {len(errors)} violations")
    return 1 if errors or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
