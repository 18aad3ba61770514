#!/usr/bin/env python3
"""Checks the dependency direction of docs/design.md §5 from the #include lines of the sources.

base <- planner <- service <- sidecar <- main; base <- collective <- group <- service; proto <-
service, client; base <- security (TLS credentials, bearer tokens: gRPC, no proto) <- service,
client/cpp;
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
    "kernels": (("absl/", "dlpack/", "server/base/", "kernels/", "packsched/kernels/"),
                ("grpc", "grpcpp", "google/protobuf", "nccl", "proto/", "server/planner",
                 "server/service", "server/collective", "server/group")),
    "client/python": (("absl/", "dlpack/", "packsched/kernels/", "server/base/", "server/planner/"),
                      ("grpc", "grpcpp", "google/protobuf", "nccl", "cuda", "server/service",
                       "server/collective", "server/group")),
    # The Collective interface and its backends: nothing of the rank group above them.
    "server/collective": (("absl/", "spdlog/", "server/base/", "server/collective/", "gloo/",
                           "nccl", "cuda"),
                          ("server/planner", "server/group", "server/service", "grpc", "grpcpp",
                           "google/protobuf", "proto/", "packsched/")),
    # The rank group: over the Collective interface, never a backend's own library.
    "server/group": (("absl/", "spdlog/", "server/base/", "server/collective/", "server/group/"),
                     HEAVY + ("gloo", "server/planner", "server/service")),
    "tests/collective": (("absl/", "gmock/", "gtest/", "server/base/", "server/collective/",
                          "tests/collective/", "tests/testing/", "gloo/"),
                         ("server/planner", "server/group", "server/service")),
    "tests/group": (("absl/", "gmock/", "gtest/", "server/base/", "server/collective/",
                     "server/group/", "tests/collective/", "tests/group/", "tests/testing/",
                     "gloo/"),
                    ("server/planner", "server/service")),
    "server/security": (("absl/", "grpcpp/", "server/base/", "server/security/"),
                        ("nccl", "cuda", "gloo", "google/protobuf", "proto/", "packsched/v1",
                         "spdlog", "server/planner", "server/collective", "server/group",
                         "server/service", "server/sidecar")),
    "server/service": (("absl/", "spdlog/", "grpcpp/", "google/protobuf/", "packsched/v1/",
                        "server/base/", "server/planner/", "server/collective/", "server/group/",
                        "server/security/", "server/service/"),
                       ("nccl", "cuda", "gloo", "server/sidecar")),
    # packsched-server's pieces: flags, rank-group wiring, probe, process; no gRPC of their own.
    "server/sidecar": (("absl/", "spdlog/", "server/base/", "server/planner/", "server/collective/",
                        "server/group/", "server/security/", "server/service/", "server/sidecar/"),
                       ("nccl", "cuda", "gloo", "grpc", "grpcpp", "google/protobuf", "proto/",
                        "packsched/v1")),
    "client/cpp": (("absl/", "grpcpp/", "google/protobuf/", "packsched/v1/", "server/base/",
                    "server/planner/", "server/security/", "client/cpp/"),
                   ("nccl", "cuda", "server/service", "server/collective", "server/group",
                    "server/sidecar")),
    # The client's public headers include no gRPC and no generated code (files, not directories).
    "client/cpp/scheduler_client.h": (("absl/", "server/planner/"), HEAVY + ("packsched/v1",)),
    "client/cpp/plan_apply.h": (("absl/", "server/planner/"), HEAVY + ("packsched/v1",)),
    "tests/service": (("absl/", "gmock/", "google/protobuf/", "gtest/", "packsched/v1/", "server/",
                       "tests/collective/", "tests/service/", "tests/testing/"), ("nccl", "cuda")),
    "tests/sidecar": (("absl/", "gmock/", "gtest/", "server/base/", "server/service/",
                       "server/sidecar/", "tests/testing/"),
                      ("nccl", "cuda", "gloo", "grpc", "grpcpp", "google/protobuf", "proto/",
                       "packsched/v1")),
    "tests/security": (("absl/", "gmock/", "gtest/", "grpcpp/", "server/base/", "server/security/",
                        "tests/testing/"),
                       ("nccl", "cuda", "gloo", "google/protobuf", "proto/", "packsched/v1",
                        "server/planner", "server/collective", "server/group", "server/service",
                        "server/sidecar")),
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
