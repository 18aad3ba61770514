#!/usr/bin/env python3
"""clang-tidy with the repository's .clang-tidy over every .cc file of the directories below,
using the build's compile_commands.json; fails on any finding (WarningsAsErrors).

    tests/lint/clang_tidy_test.py [--build build] [--jobs 2] [file.cc ...]

Files are found by directory (every C++ folder: server/, client/, kernels/), so new ones are
checked without editing this script; a .cc file missing from compile_commands.json (switched off
in this configuration, e.g. the NCCL backend or the CUDA kernels) is listed as skipped. The
generated *.pb.h headers must exist: `cmake --build build --target packsched_proto` (the full
build makes them).
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
# Directories whose .cc files are checked (recursively); those that do not exist are ignored.
# The tests are not: their gtest macros cost more clang-tidy time than all of these together.
DIRS = ("server", "client", "kernels")
# Diagnostics are reported for the project's own headers under DIRS only.
HEADER_FILTER = "^" + re.escape(str(ROOT)) + "/(" + "|".join(re.escape(d) for d in DIRS) + ")/"
# clang-tidy's progress lines, not findings.
NOISE = ("warnings generated.", "Suppressed ", "Use -header-filter=", "Use -system-headers")


def find_clang_tidy():
    for name in ("clang-tidy-14", "clang-tidy"):
        path = shutil.which(name)
        if path:
            return path
    return None


def sources(build):
    """(files to check, files skipped) as paths relative to ROOT."""
    database = json.loads((build / "compile_commands.json").read_text())
    built = {pathlib.Path(e["directory"], e["file"]).resolve() for e in database}
    wanted, skipped = [], []
    for directory in DIRS:
        if not (ROOT / directory).is_dir():
            continue
        for path in sorted((ROOT / directory).rglob("*.cc")):
            (wanted if path.resolve() in built else skipped).append(path.relative_to(ROOT))
    return wanted, skipped


def run(tidy, build, path):
    started = time.monotonic()
    result = subprocess.run(
        [tidy, "-p", str(build), "--quiet", f"--header-filter={HEADER_FILTER}", str(ROOT / path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = (result.stdout + result.stderr).splitlines()
    findings = [line for line in lines if line and not any(n in line for n in NOISE)]
    return path, result.returncode, findings, time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=str(ROOT / "build"), help="the CMake build directory")
    parser.add_argument("--jobs", type=int, default=2, help="clang-tidy processes at a time")
    parser.add_argument("files", nargs="*", help="only these files (default: every one in DIRS)")
    args = parser.parse_args()

    build = pathlib.Path(args.build).resolve()
    tidy = find_clang_tidy()
    if tidy is None:
        print("clang_tidy_test: clang-tidy not found (deploy/install-deps.sh installs it)")
        return 1
    if not (build / "compile_commands.json").is_file():
        print(f"clang_tidy_test: no {build}/compile_commands.json (configure with CMake first)")
        return 1
    if args.files:
        files = [pathlib.Path(os.path.relpath(pathlib.Path(f).resolve(), ROOT)) for f in args.files]
        skipped = []
    else:
        files, skipped = sources(build)
    for path in skipped:
        print(f"clang_tidy_test: skipped {path} (not in compile_commands.json: not built here)")
    if not files:
        print(f"clang_tidy_test: no files to check in {', '.join(DIRS)}")
        return 1

    started = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for path, code, findings, seconds in pool.map(lambda f: run(tidy, build, f), files):
            if code != 0 or findings:
                failed.append(path)
                print(f"--- {path} (exit {code}, {seconds:.1f} s)")
                print("\n".join(findings) if findings else "(no output)")
    elapsed = time.monotonic() - started
    print(
        f"clang_tidy_test: {len(files)} files, {len(failed)} with findings, "
        f"{elapsed:.0f} s with {args.jobs} jobs ({tidy})"
    )
    if failed:
        print(
            "clang_tidy_test: fix the findings (or, for a check not worth it, turn it off in "
            ".clang-tidy with the reason). A missing packsched/v1/*.pb.h means the generated "
            "headers are not built: cmake --build build --target packsched_proto"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
