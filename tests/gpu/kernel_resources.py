#!/usr/bin/env python3
"""What the tensor-core attention kernels cost, read from the compiler on a machine without a GPU.

For each kernel of the tensor-core translation units (kernels/cuda/attention_tc_*.cu) and each
architecture:
  - registers, spill stores and loads, and stack frame, as ptxas reports them (-Xptxas -v);
  - with a disassembler (nvdisasm), the kernel's inner loops in SASS: every innermost loop that
    holds tensor-core products (HMMA), as the instructions of its basic blocks (from nvdisasm's
    control-flow graph: every path, those a tile branches around included), split into HMMA,
    ldmatrix (LDSM), special-function (MUFU: ex2, tanh), local-memory (LDL, STL: spilled values)
    and branch (BRA) instructions, and its "full tile": the instructions of the shortest way once
    around that passes every HMMA and cp.async (the partial tiles' mask code left out). These are
    the figures a change to a kernel's inner loop moves for certain; nothing here is timed.
With --base REV the same figures for the kernels of git revision REV, compiled in the same run.

The CUDA toolkit of the build may come without a disassembler (nvcc and ptxas only). An older
nvdisasm reads the sm_80 and sm_90 code of today's ptxas once the cubin's ELF header is written
the way it expects (ABI version 7, the architecture in the low byte of e_flags): the script does
that to a copy when the disassembler refuses the original. Debian's non-free
nvidia-cuda-toolkit package (11.8) carries one:
    apt-get download nvidia-cuda-toolkit && dpkg -x nvidia-cuda-toolkit_*.deb /tmp/cuda-tools
    /usr/bin/python3 tests/gpu/kernel_resources.py --nvdisasm /tmp/cuda-tools/usr/bin/nvdisasm

    /usr/bin/python3 tests/gpu/kernel_resources.py [--arch 80 --arch 90] [--base HEAD]
        [--unit attention_tc_fwd.cu] [--nvdisasm PATH] [--json FILE]
"""

import argparse
import collections
import concurrent.futures
import graphlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = [
    "attention_tc_fwd.cu",
    "attention_tc_bwd.cu",
    "attention_tc_bwd_onepass.cu",
    "attention_tc_workspace.cu",
]


def short_name(mangled):
    """AttentionTcForwardKernel<Bf16, 128, 2> from its mangled name."""
    m = re.search(r"\d+([A-Za-z]+Kernel)I(.*?)EEv", mangled)
    if not m:
        return mangled
    args = m.group(2)
    dtype = "Bf16" if "Bf16" in args else ("Fp16" if "Fp16" in args else "?")
    ints = re.findall(r"Li(\d+)E", args)
    return "%s<%s>" % (m.group(1), ", ".join([dtype] + ints))


def ptxas_usage(text):
    """{mangled: {registers, spill_stores, spill_loads, stack}} from ptxas -v output."""
    usage, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            usage[current] = {}
            continue
        if current is None:
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        )
        if m:
            usage[current].update(
                stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
        m = re.search(r"Used (\d+) registers", line)
        if m:
            usage[current]["registers"] = int(m.group(1))
    return usage


CLASSES = ["HMMA", "LDSM", "MUFU", "LDL", "STL", "BRA"]
DOT_NODE = re.compile(r'^"([^"]+)"\s*$')
DOT_EDGE = re.compile(r'^"([^"]+)":\w+(?::\w+)?\s*->\s*"([^"]+)"')
DOT_INSTRUCTION = re.compile(
    r"(?:^|\\l|[{|]<\w+>)([0-9a-f]{4,}):(?:\\ )+(?:@!?U?P\w+(?:\\ )+)?([A-Z][A-Z0-9_.]*)"
)


def parse_cfg(dot):
    """{function: (blocks {name: [opcode]}, successors {name: {name}})}, from the output of
    nvdisasm -bbcfg -poff."""
    functions, current, node = {}, None, None
    for line in dot.splitlines():
        m = re.match(r'^subgraph "cluster_([^"]+)"', line)
        if m:
            current = m.group(1)
            functions[current] = ({}, collections.defaultdict(set))
            continue
        if current is None:
            continue
        blocks, successors = functions[current]
        m = DOT_NODE.match(line)
        if m:
            node = m.group(1)
            blocks.setdefault(node, [])
            continue
        if line.startswith("[label=") and node is not None:
            blocks[node].extend(op for _, op in DOT_INSTRUCTION.findall(line))
            continue
        m = DOT_EDGE.match(line)
        if m:
            successors[m.group(1)].add(m.group(2))
    return functions


def strongly_connected(nodes, successors):
    """Tarjan's strongly connected components of the graph restricted to `nodes`."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(successors.get(root, set()) & nodes)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        component.add(x)
                        if x == v:
                            break
                    components.append(component)
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(successors.get(w, set()) & nodes))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return components


def innermost_loops(nodes, successors, blocks):
    """The innermost loops among `nodes` that hold an HMMA, as (blocks, headers): a loop is a
    strongly connected component with a cycle, its headers the blocks entered from outside it,
    and its inner loops those left once the edges back to its headers are removed."""
    found = []
    for component in strongly_connected(nodes, successors):
        cyclic = len(component) > 1 or any(v in successors.get(v, set()) for v in component)
        if not cyclic or not any(op.startswith("HMMA") for v in component for op in blocks[v]):
            continue
        headers = {v for u in nodes - component for v in successors.get(u, set()) & component}
        inner_successors = {v: (successors.get(v, set()) & component) - headers for v in component}
        inner = innermost_loops(component, inner_successors, blocks)
        found.extend(inner if inner else [(component, headers)])
    return found


def product_path(loop, headers, successors, blocks):
    """The instructions of the shortest way once around the loop that passes every block holding
    an HMMA or a cp.async (LDGSTS): a full tile that is not the last, the mask code of partial
    tiles and other work a tile may branch around left out; a small loop inside (a copy, a
    search) counts once. None when no single way passes them all or the loop has more than one
    header."""
    if len(headers) != 1:
        return None
    (header,) = headers
    body = {v: (successors.get(v, set()) & loop) - headers for v in loop}
    parts = strongly_connected(loop, body)  # the small loops inside become one node each
    part_of = {v: i for i, part in enumerate(parts) for v in part}
    weight = [sum(len(blocks[v]) for v in part) for part in parts]
    dag = {i: set() for i in range(len(parts))}
    for v in loop:
        dag[part_of[v]].update(part_of[w] for w in body[v] if part_of[w] != part_of[v])
    predecessors = {j: {i for i in dag if j in dag[i]} for j in dag}
    order = list(graphlib.TopologicalSorter(predecessors).static_order())
    position = {p: n for n, p in enumerate(order)}
    required = sorted(
        {part_of[v] for v in loop if any(op.startswith(("HMMA", "LDGSTS")) for op in blocks[v])},
        key=position.get,
    )
    latches = {part_of[v] for v in loop if header in successors.get(v, set())}

    def shortest(source, targets):  # node-weighted, source counted
        best = {source: weight[source]}
        for v in order[position[source] :]:
            for w in dag[v] if v in best else ():
                best[w] = min(best.get(w, float("inf")), best[v] + weight[w])
        reached = [best[t] for t in targets if t in best]
        return min(reached) if reached else None

    at = part_of[header]
    total = weight[at]
    for target in required + [None]:
        if target == at:
            continue
        cost = shortest(at, latches if target is None else {target})
        if cost is None:
            return None
        total += cost - weight[at]  # `at` was counted by the previous segment
        if target is not None:
            at = target
    return total


def sass_inner_loops(dot):
    """{mangled: [loop, ...]}: each innermost loop holding HMMA, as counts of CLASSES over all
    its blocks, their instructions, and the instructions of its product path (product_path)."""
    result = {}
    for name, (blocks, successors) in parse_cfg(dot).items():
        rows = []
        for loop, headers in innermost_loops(set(blocks), successors, blocks):
            ops = [op.split(".")[0] for v in loop for op in blocks[v]]
            counts = collections.Counter(ops)
            row = dict({k.lower(): counts[k] for k in CLASSES}, instructions=len(ops))
            row["product_path"] = product_path(loop, headers, successors, blocks)
            rows.append(row)
        result[name] = sorted(rows, key=lambda r: (r["mufu"], r["instructions"]))
    return result


def old_style_cubin(path, arch):
    """A copy of a cubin whose ELF header an older disassembler reads (see the module comment)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[8] = 7  # e_ident[EI_ABIVERSION]
    sm = int(arch)
    struct.pack_into("<I", data, 48, (sm << 16) | 0x500 | sm)  # virtual sm, 64-bit, unified tex, sm
    out = path + ".old.cubin"
    with open(out, "wb") as f:
        f.write(data)
    return out


def disassemble(nvdisasm, cubin, arch):
    """nvdisasm's control-flow graph of the cubin's functions (DOT, basic blocks, offsets)."""
    command = [nvdisasm, "-bbcfg", "-poff"]
    run = subprocess.run(command + [cubin], capture_output=True, text=True)
    if run.returncode != 0:
        run = subprocess.run(
            command + [old_style_cubin(cubin, arch)], capture_output=True, text=True
        )
    if run.returncode != 0:
        raise RuntimeError("%s could not read %s:\n%s" % (nvdisasm, cubin, run.stderr))
    return run.stdout


def one_unit(nvcc, nvdisasm, root, tree, unit, arch, tmp):
    out = os.path.join(tmp, "%s.%s.sm%s.cubin" % (tree, unit, arch))
    command = [
        nvcc,
        "-DPACKSCHED_KERNELS_WITH_CUDA=1",
        "-I" + root,
        "-I" + os.path.join(root, "kernels", "include"),
        "-O3",
        "-DNDEBUG",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-arch=sm_%s" % arch,
        "-cubin",
        os.path.join(root, "kernels", "cuda", unit),
        "-o",
        out,
        "-Xptxas",
        "-v",
    ]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError("nvcc failed on %s (sm_%s, %s):\n%s" % (unit, arch, tree, run.stderr))
    usage = ptxas_usage(run.stdout + run.stderr)
    loops = sass_inner_loops(disassemble(nvdisasm, out, arch)) if nvdisasm else {}
    return [
        dict(
            usage[m],
            tree=tree,
            unit=unit,
            arch=arch,
            kernel=short_name(m),
            mangled=m,
            inner_loops=loops.get(m),
        )
        for m in sorted(usage)
    ]


def checkout(rev, tmp):
    """The kernels/ folder of git revision rev, under a new folder of tmp."""
    root = os.path.join(tmp, "base")
    os.makedirs(root)
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", rev, "kernels"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", root], input=archive.stdout, check=True)
    return root


def loops_cell(row):
    loops = row.get("inner_loops")
    if loops is None:
        return "-"
    if not loops:
        return "none found"
    return "; ".join(
        "%d, full tile %s (HMMA %d, LDSM %d, MUFU %d, LDL+STL %d, BRA %d)"
        % (
            x["instructions"],
            x["product_path"],
            x["hmma"],
            x["ldsm"],
            x["mufu"],
            x["ldl"] + x["stl"],
            x["bra"],
        )
        for x in loops
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", action="append", help="80, 90 (default: both)")
    parser.add_argument(
        "--unit", action="append", help="translation units (default: %s)" % ", ".join(UNITS)
    )
    parser.add_argument("--base", help="also measure the kernels of this git revision")
    parser.add_argument("--nvcc", default=os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc"))
    parser.add_argument(
        "--nvdisasm", default=os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    )
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not os.path.exists(args.nvcc):
        print("no nvcc at %s: set --nvcc or NVCC" % args.nvcc, file=sys.stderr)
        return 2
    if args.nvdisasm is None:
        print(
            "no nvdisasm (--nvdisasm, NVDISASM or PATH): registers and spills only", file=sys.stderr
        )
    rows = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(
        args.jobs
    ) as pool:
        trees = [("this", ROOT)] + (
            [("base " + args.base, checkout(args.base, tmp))] if args.base else []
        )
        jobs = [
            pool.submit(one_unit, args.nvcc, args.nvdisasm, root, tree, unit, arch, tmp)
            for unit in args.unit or UNITS
            for arch in args.arch or ["80", "90"]
            for tree, root in trees
        ]
        for job in jobs:
            rows.extend(job.result())
    header = ["kernel", "sm", "tree", "registers", "spill st/ld (bytes)", "inner loops (kinds)"]
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            "| %s | %s | %s | %s | %s / %s | %s |"
            % (
                r["kernel"],
                r["arch"],
                r["tree"],
                r.get("registers", "?"),
                r.get("spill_stores", "?"),
                r.get("spill_loads", "?"),
                loops_cell(r),
            )
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
