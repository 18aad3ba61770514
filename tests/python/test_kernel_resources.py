"""tests/gpu/kernel_resources.py without a compiler: its reading of nvdisasm's control-flow graph
(innermost loops holding HMMA, the full-tile path), of ptxas -v, and the cubin header rewrite."""

import pathlib
import struct
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))

import kernel_resources  # noqa: E402


def block(name, ops, exit_op=None, start=0):
    """A DOT node as nvdisasm -bbcfg -poff writes it: offsets, `\\l` between instructions, the
    block's last (branch) instruction behind an exit port."""
    lines = ["%04x:\\ \\ \\ %s\\ R0\\ ;" % (start + 16 * i, op) for i, op in enumerate(ops)]
    label = "\\l".join(lines) + "\\l"
    if exit_op:
        label += "|<exit0>%04x:\\ \\ \\ @!P0\\ %s\\ `(.L_x_0)\\ ;\\l" % (
            start + 16 * len(ops),
            exit_op,
        )
    return '"%s"\n[label="{<entry>%s}"]\n' % (name, label)


def edge(a, b):
    return '"%s":exit0:s -> "%s":entry:n [style=solid];\n' % (a, b)


def kernel_dot(name="_Z6kernelv"):
    """entry -> outer (a loop over tiles) holding a copy loop (one block looping on itself), a
    mask block that full tiles branch around, and an inner loop of two blocks with the products;
    and a second function with no loop."""
    text = 'digraph f {\nsubgraph "cluster_%s" {\n' % name
    text += block("entry", ["S2R", "IMAD"])
    text += block("head", ["ISETP", "IADD3"], "BRA")
    text += block("copy", ["LDGSTS", "IADD3", "ISETP"], "BRA")
    text += block("mask", ["FSEL"] * 40, "BRA")
    text += block("inner_head", ["LDSM", "HMMA", "HMMA"], "BRA")
    text += block("inner_body", ["MUFU", "FFMA", "HMMA"], "BRA")
    text += block("latch", ["BAR", "IADD3"], "BRA")
    text += block("exit", ["EXIT"])
    for a, b in [
        ("entry", "head"),
        ("head", "copy"),
        ("copy", "copy"),
        ("copy", "mask"),
        ("copy", "inner_head"),
        ("mask", "inner_head"),
        ("inner_head", "inner_body"),
        ("inner_body", "inner_head"),
        ("inner_body", "latch"),
        ("latch", "head"),
        ("latch", "exit"),
    ]:
        text += edge(a, b)
    text += '}\nsubgraph "cluster_$__internal_0_$__cuda_sm20_div_s64" {\n'
    text += block("div", ["IMAD", "RET.REL.NODEC"])
    return text + "}\n}\n"


def test_parse_cfg_reads_blocks_ports_and_edges():
    functions = kernel_resources.parse_cfg(kernel_dot())
    assert set(functions) == {"_Z6kernelv", "$__internal_0_$__cuda_sm20_div_s64"}
    blocks, successors = functions["_Z6kernelv"]
    assert blocks["mask"] == ["FSEL"] * 40 + ["BRA"]  # the branch behind the exit port counts
    assert successors["copy"] == {"copy", "mask", "inner_head"}
    assert successors["latch"] == {"head", "exit"}


def test_the_innermost_loop_with_products_is_found_and_counted():
    loops = kernel_resources.sass_inner_loops(kernel_dot())
    assert loops["$__internal_0_$__cuda_sm20_div_s64"] == []
    (inner,) = loops["_Z6kernelv"]
    # inner_head and inner_body: 3 + 1 and 3 + 1 instructions, the outer loop's blocks left out.
    assert inner["instructions"] == 8
    assert (inner["hmma"], inner["ldsm"], inner["mufu"], inner["bra"]) == (3, 1, 1, 2)
    assert inner["product_path"] == 8


def test_full_tile_path_leaves_out_what_a_tile_branches_around():
    blocks, successors = kernel_resources.parse_cfg(kernel_dot())["_Z6kernelv"]
    outer = {"head", "copy", "mask", "inner_head", "inner_body", "latch"}
    # The outer loop, its copy loop counted once and the inner loop as one node each: head (3),
    # copy (4), inner_head + inner_body (8), latch (3); the 41-instruction mask is skipped.
    assert kernel_resources.product_path(outer, {"head"}, successors, blocks) == 18
    # With the mask on the only way to the products, it counts.
    forced = {k: set(v) for k, v in successors.items()}
    forced["copy"].discard("inner_head")
    assert kernel_resources.product_path(outer, {"head"}, forced, blocks) == 18 + 41
    # Two headers: no single way around.
    assert kernel_resources.product_path(outer, {"head", "copy"}, successors, blocks) is None


def test_ptxas_usage_per_entry():
    text = """ptxas info    : Compiling entry function '_Z1av' for 'sm_90'
ptxas info    : Function properties for _Z1av
    40 bytes stack frame, 32 bytes spill stores, 84 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 384 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90'
ptxas info    : Function properties for _Z1bv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 31 registers, used 0 barriers, 384 bytes cmem[0]
"""
    usage = kernel_resources.ptxas_usage(text)
    assert usage["_Z1av"] == dict(stack=40, spill_stores=32, spill_loads=84, registers=255)
    assert usage["_Z1bv"]["registers"] == 31


def test_short_names():
    mangled = (
        "_ZN9packsched7kernels8internal4cuda24AttentionTcForwardKernelINS0_4Bf16ELi128ELi2EEEv"
        "NS2_12TcAttnParamsE"
    )
    assert kernel_resources.short_name(mangled) == "AttentionTcForwardKernel<Bf16, 128, 2>"
    assert kernel_resources.short_name("_Z1av") == "_Z1av"


def test_old_style_header(tmp_path):
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[8] = 8
    struct.pack_into("<I", header, 48, 0x6005004)
    path = tmp_path / "k.cubin"
    path.write_bytes(bytes(header) + b"rest")
    out = pathlib.Path(kernel_resources.old_style_cubin(str(path), "90"))
    data = out.read_bytes()
    assert data[8] == 7
    assert struct.unpack_from("<I", data, 48)[0] == (90 << 16) | 0x500 | 90
    assert data[64:] == b"rest" and path.read_bytes()[8] == 8  # a copy; the original untouched
