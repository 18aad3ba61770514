#!/usr/bin/env python3
"""Assembles the GPU kit (tests/gpu/README.md) from a CMake build tree, or verifies one.

    assemble_kit.py assemble --source . --build BUILD --kit KIT [--require-all]
    assemble_kit.py verify --kit KIT

assemble: (re)creates the folder KIT from the build tree BUILD and the source tree: the CUDA test
and benchmark binaries (stripped copies), every shared library they load that a bare GPU machine
lacks (found with ldd; glibc, libstdc++ and libgcc_s stay the host's, and libnccl.so.2 comes from
the GPU machine's nvidia-nccl wheel: 200 MiB is too large to carry), the kernels-only CMake path
for the Python module (module/: sources, headers, libpacksched_kernels.a and Abseil's shared
libraries), the scripts run.sh needs, and manifest.json (what is in the kit and what it needs).
Binaries the build lacks are listed as missing; with --require-all a missing binary is an error
(prepare.sh's kit must be complete; the CI test's kit from a CPU build may lack some).

verify: checks that every binary of KIT's manifest resolves each library it needs inside KIT/lib,
from the host's glibc/libstdc++/libgcc_s, or as a named external (libnccl), with LD_LIBRARY_PATH
set to KIT/lib as run.sh sets it. Prints one line per problem.

Exit status: 0 on success, 1 on an error or a failed verification.
"""

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

# (name, folder in the build tree): the programs run.sh runs.
BINARIES = [
    ("kernels_cuda_test", "tests"),
    ("kernels_attention_cuda_test", "tests"),
    ("collective_nccl_test", "tests"),
    ("kernels_bench", "bin"),
    ("attention_bench", "bin"),
    ("nccl_probe", "bin"),
]

# Libraries every Linux host has (glibc, the C++ runtime): never carried, so that tools that run
# our binaries with their own injected libraries (compute-sanitizer) see one C++ runtime.
HOST_LIBRARIES = re.compile(
    r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|"
    r"libgcc_s\.so|libstdc\+\+\.so)"
)
# Needed but never carried: the driver's libraries and NCCL (from the GPU machine).
EXTERNAL_LIBRARIES = re.compile(r"^(libcuda\.so|libnvidia-|libnccl\.so)")

# The Python modules of packsched.kernels: its face and the modules it imports (the torch path
# included: _torch_ops and what it imports, the attention backend choice).
KERNELS_MODULES = [
    "kernels",
    "_arrays",
    "_packing",
    "_cross_entropy",
    "_attention",
    "_context_parallel",
    "tree_kernels",
    "_tree_cp",
    "_cp_layout",
    "_recurrent",
    "_ops_recurrent",
    "_torch_ops",
    "_torch_args",
    "_ops_attention",
    "_ops_loss",
    "_ops_packing",
    "_attention_backends",
    "_attention_dispatch",
]

# Scripts copied to the kit: (source relative to the repository, destination relative to KIT).
SCRIPTS = [
    ("tests/gpu/run.sh", "run.sh"),
    ("tests/gpu/README.md", "README.md"),
    ("tests/gpu/report.py", "scripts/report.py"),
    ("tests/gpu/attention_vs_torch.py", "scripts/attention_vs_torch.py"),
    ("tests/gpu/tree_vs_flex.py", "scripts/tree_vs_flex.py"),
    ("tests/gpu/tree_vs_flat.py", "scripts/tree_vs_flat.py"),
    ("client/python/packsched/attention_backends.json", "module/packsched/attention_backends.json"),
    ("tests/gpu/build_module.sh", "scripts/build_module.sh"),
    ("tests/gpu/preflight.sh", "scripts/preflight.sh"),
    ("deploy/gen_lengths.py", "scripts/gen_lengths.py"),
    ("tests/gpu/kit/CMakeLists.txt", "module/CMakeLists.txt"),
    ("client/python/src/kernels_module.cc", "module/src/kernels_module.cc"),
] + [
    # packsched.kernels and the modules it re-exports (build_module.sh imports it).
    (f"client/python/packsched/{name}.py", f"module/packsched/{name}.py")
    for name in KERNELS_MODULES
]

PACKAGE_INIT = '''"""packsched, as the GPU kit carries it: the kernels only (packsched.kernels)."""

from . import kernels  # noqa: F401
'''


def fail(message):
    sys.stderr.write(f"assemble_kit: {message}\n")
    sys.exit(1)


def cmake_cache(build):
    """The CMakeCache.txt entries of `build` as a dict of name -> value."""
    cache = {}
    path = build / "CMakeCache.txt"
    if not path.is_file():
        fail(f"{path} not found: configure the build first")
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+):[A-Z_]+=(.*)$", line)
        if match:
            cache[match.group(1)] = match.group(2)
    return cache


def ldd(binary, library_path=None):
    """[(soname, resolved path or None)] of what `binary` loads, as ldd reports it."""
    env = dict(os.environ)
    if library_path:
        env["LD_LIBRARY_PATH"] = library_path
    out = subprocess.run(
        ["ldd", str(binary)], capture_output=True, text=True, env=env, check=False
    ).stdout
    found = []
    for line in out.splitlines():
        line = line.strip()
        match = re.match(r"^(\S+) => (not found|\S+)", line)
        if match:
            path = None if match.group(2) == "not found" else match.group(2)
            found.append((match.group(1), path))
        elif line:
            found.append((os.path.basename(line.split()[0]), line.split()[0]))
    return found


def highest_versions(files, prefix):
    """The highest symbol version named `prefix`N.N... that any of `files` needs, or None."""
    best = None
    for f in files:
        out = subprocess.run(
            ["objdump", "-T", str(f)], capture_output=True, text=True, check=False
        ).stdout
        for version in re.findall(re.escape(prefix) + r"([0-9.]+)", out):
            key = tuple(int(x) for x in version.split(".") if x)
            if best is None or key > best:
                best = key
    return None if best is None else ".".join(str(x) for x in best)


def soname_of(library):
    """The SONAME of a shared library (its file name when it has none)."""
    out = subprocess.run(
        ["objdump", "-p", str(library)], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"^\s*SONAME\s+(\S+)", out, re.MULTILINE)
    return match.group(1) if match else library.name


def git_describe(source):
    def run(*args):
        result = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=False
        )
        return result.stdout.strip() if result.returncode == 0 else None

    return run("rev-parse", "HEAD"), bool(run("status", "--porcelain", "--untracked-files=no"))


def copy_tree(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))


def assemble(args):
    source = pathlib.Path(args.source).resolve()
    build = pathlib.Path(args.build).resolve()
    kit = pathlib.Path(args.kit).resolve()
    cache = cmake_cache(build)
    if kit.exists():
        shutil.rmtree(kit)
    for sub in ("bin", "lib", "scripts", "module/include", "module/lib", "module/src"):
        (kit / sub).mkdir(parents=True, exist_ok=True)

    binaries, missing, libraries, external = {}, [], {}, set()
    for name, folder in BINARIES:
        built = build / folder / name
        if not built.is_file():
            missing.append(name)
            continue
        copy = kit / "bin" / name
        shutil.copy2(built, copy)
        subprocess.run(["strip", "--strip-unneeded", str(copy)], check=False)
        binaries[name] = f"bin/{name}"
        for soname, path in ldd(built):
            if HOST_LIBRARIES.match(soname):
                continue
            if EXTERNAL_LIBRARIES.match(soname):
                external.add(soname)
                continue
            if path is None:
                fail(f"{name} needs {soname}, which ldd cannot find on this machine")
            libraries[soname] = path
    if missing and args.require_all:
        fail(f"the build lacks {', '.join(missing)} (build those targets first)")
    for soname, path in sorted(libraries.items()):
        shutil.copy2(os.path.realpath(path), kit / "lib" / soname)

    # The kernels-only CMake path of the Python module (module/CMakeLists.txt).
    for src, dst in SCRIPTS:
        target = kit / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / src, target)
    (kit / "module/packsched/__init__.py").write_text(PACKAGE_INIT)
    copy_tree(source / "kernels/include/packsched", kit / "module/include/packsched")
    dlpack = pathlib.Path(cache.get("DLPACK_INCLUDE_DIR", "/usr/include")) / "dlpack"
    copy_tree(dlpack, kit / "module/include/dlpack")
    absl_dir = pathlib.Path(cache.get("absl_DIR", ""))
    # absl_DIR is PREFIX/lib/<multiarch>/cmake/absl: headers in PREFIX/include/absl, libraries in
    # PREFIX/lib/<multiarch>. The shared ones travel (named by soname): Debian's static archives
    # are not position independent (initial-exec TLS), so a Python module cannot take them.
    absl_headers = absl_dir.parents[3] / "include/absl" if len(absl_dir.parents) > 3 else None
    absl_libraries = sorted(absl_dir.parents[1].glob("libabsl_*.so")) if absl_headers else []
    if absl_headers is None or not absl_headers.is_dir() or not absl_libraries:
        fail(f"Abseil headers or shared libraries not found from absl_DIR={absl_dir}")
    copy_tree(absl_headers, kit / "module/include/absl")
    for library in absl_libraries:
        shutil.copy2(os.path.realpath(library), kit / "module/lib" / soname_of(library))
    kernels_archive = build / "kernels/libpacksched_kernels.a"
    if not kernels_archive.is_file():
        fail(f"{kernels_archive} not found (build the packsched_kernels target)")
    shutil.copy2(kernels_archive, kit / "module/lib" / kernels_archive.name)
    with_cuda = cache.get("PACKSCHED_WITH_CUDA", "OFF").upper() in ("ON", "TRUE", "1")
    (kit / "module/kit_config.cmake").write_text(
        "# Written by tests/gpu/assemble_kit.py: how the kit's libpacksched_kernels.a was built.\n"
        f"set(KIT_KERNELS_WITH_CUDA {'ON' if with_cuda else 'OFF'})\n"
    )
    for script in ("run.sh", "scripts/build_module.sh", "scripts/preflight.sh"):
        os.chmod(kit / script, 0o755)

    carried = [kit / b for b in binaries.values()] + sorted((kit / "lib").iterdir())
    commit, dirty = git_describe(source)
    manifest = {
        "schema": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "build_dir": str(build),
        "with_cuda": with_cuda,
        "with_nccl": cache.get("PACKSCHED_WITH_NCCL", "OFF").upper() in ("ON", "TRUE", "1"),
        "cuda_architectures": cache.get("CMAKE_CUDA_ARCHITECTURES", ""),
        "binaries": binaries,
        "missing": missing,
        "libraries": sorted(libraries),
        "external_libraries": sorted(external),
        "glibc_required": highest_versions(carried, "GLIBC_"),
        "glibcxx_required": highest_versions(carried, "GLIBCXX_"),
    }
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    manifest["size_bytes"] = size
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(
        f"assemble_kit: {kit}: {len(binaries)} binaries, {len(libraries)} libraries, "
        f"{size / 2**20:.1f} MiB" + (f"; missing: {', '.join(missing)}" if missing else "")
    )
    return 0


def verify(args):
    kit = pathlib.Path(args.kit).resolve()
    manifest = json.loads((kit / "manifest.json").read_text())
    problems = []
    for name, rel in manifest["binaries"].items():
        for soname, path in ldd(kit / rel, library_path=str(kit / "lib")):
            if HOST_LIBRARIES.match(soname) or EXTERNAL_LIBRARIES.match(soname):
                continue
            if path is None or pathlib.Path(path).resolve().parent != kit / "lib":
                problems.append(f"{name}: {soname} resolves to {path}, not inside {kit / 'lib'}")
    for problem in problems:
        print(f"assemble_kit verify: {problem}")
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assemble", help="build KIT from a build tree")
    a.add_argument("--source", default=str(HERE.parent.parent), help="the repository root")
    a.add_argument("--build", required=True, help="the CMake build tree")
    a.add_argument("--kit", required=True, help="the kit folder to (re)create")
    a.add_argument("--require-all", action="store_true", help="every binary must be built")
    v = sub.add_parser("verify", help="check that KIT's binaries load from KIT/lib")
    v.add_argument("--kit", required=True)
    args = parser.parse_args()
    return assemble(args) if args.command == "assemble" else verify(args)


if __name__ == "__main__":
    sys.exit(main())
