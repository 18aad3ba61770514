#!/usr/bin/env python3
"""packsched's tree attention against FlexAttention with the equivalent block mask, on the same
tree-packed batches (the GPU kit's step ``tree_vs_flex``).

    tree_vs_flex.py --out FILE [--budget-s S] [--seed N]
    tree_vs_flex.py --out FILE --cpu-self-test       (tiny, on the CPU: the plumbing only)

Contract: writes one JSON object to FILE (tests/gpu/README.md, "tree_vs_flex") and exits 0 once
it is written, whatever it holds: judging is report.py's job. It needs torch and packsched.kernels
on PYTHONPATH (the kit's module); without them, or without CUDA outside the self-test, the JSON
says "unavailable" and why. It stops measuring when --budget-s runs out (what is left is listed as
skipped), and rewrites FILE after every batch.

Batches (bf16, H = 16, Hk = 4, D = 128 on CUDA; float32, D = 16 in the self-test), each a
micro-batch of whole trees (pieces) packed to about 32k and 64k tokens:
  - GRPO groups of n = 8 and n = 16: a prompt node (lognormal, median 600, sigma 0.6, 200-2,000
    tokens, as the realistic RL mix) with n completion nodes (lognormal, median 1,000, sigma 0.8,
    50-4,000 tokens); a group past the batch's room keeps the completions that fit;
  - multi-turn trees of depth 3: a prompt node, then per node 1-3 child turns (lognormal, median
    300, sigma 0.8, 20-2,000 tokens).
Per batch:
  - error, FlashAttention's rule: max |x - ref| of out, dq, dk, dv against float64 from the same
    inputs, for packsched (tree_attention, backend="packsched") and FlexAttention
    (tree_attention, backend="flex": the package's own FlexAttention path, its block mask built
    from the layout); report.py passes packsched when within 2x of FlexAttention's;
  - time (median of CUDA-event timings after a warm-up that compiles) of forward and backward:
    packsched; FlexAttention (flex_attention compiled, the block mask prebuilt); the block mask's
    build alone ("mask"); "flex_with_mask" = its forward + backward + one build (a model's layers
    share one build per micro-batch: the per-layer cost lies between the two columns); and
    packsched's causal varlen kernels over the same pieces as flat sequences ("packsched_causal");
  - TFLOP/s per useful FLOP: 4 D H per visible (query, key) pair forward, 2.5x that backward; the
    tree's pairs are each row's path length, the causal run's L(L+1)/2 per piece;
  - "rows": the line for docs/benchmarks.md "GPU results"; "table_entries": entries for
    client/python/packsched/attention_backends.json (device, dtype, head_dim, mask "tree",
    tokens_bucket; backends fastest first by forward + backward including one mask build).
"""

import argparse
import json
import math
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from attention_vs_torch import Budget, max_abs_error, time_ms  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 128
TARGETS = (32768, 65536)
KINDS = (("grpo", 8), ("grpo", 16), ("multiturn", 3))


def lognormal(rng, median, sigma, low, high):
    return int(min(high, max(low, round(rng.lognormvariate(math.log(median), sigma)))))


def grpo_tree(rng, n, scale=1.0):
    """(node lengths, parents) of one group: a prompt and n completions."""
    prompt = max(1, int(lognormal(rng, 600, 0.6, 200, 2000) * scale))
    completions = [max(1, int(lognormal(rng, 1000, 0.8, 50, 4000) * scale)) for _ in range(n)]
    return [prompt] + completions, [-1] + [0] * n


def multiturn_tree(rng, depth, scale=1.0):
    """(node lengths, parents) of a tree of turns, nodes in depth-first preorder."""
    lengths, parents = [max(1, int(lognormal(rng, 600, 0.6, 200, 2000) * scale))], [-1]

    def grow(node, level):
        for _ in range(rng.randint(1, 3) if level < depth else 0):
            lengths.append(max(1, int(lognormal(rng, 300, 0.8, 20, 2000) * scale)))
            parents.append(node)
            grow(len(lengths) - 1, level + 1)

    grow(0, 1)
    return lengths, parents


def cut_to(lengths, parents, room):
    """The tree's nodes in preorder while they fit in `room` tokens (a child needs its parent)."""
    kept, index, used = [], {}, 0
    for node, (n, p) in enumerate(zip(lengths, parents)):
        if used + n > room or (p >= 0 and p not in index):
            continue
        index[node] = len(kept)
        kept.append((n, index[p] if p >= 0 else -1))
        used += n
    return [n for n, _ in kept], [p for _, p in kept]


def layout_of(trees):
    """Rows of whole trees one after another (nodes in preorder, as given): piece offsets,
    subtree_end and depth per row."""
    cu, subtree_end, depth = [0], [], []
    for lengths, parents in trees:
        base = cu[-1]
        starts, node_depth = [], []
        row = base
        for n, p in zip(lengths, parents):
            starts.append(row)
            node_depth.append(0 if p < 0 else node_depth[p] + lengths[p])
            row += n
        ends = [starts[i] + lengths[i] for i in range(len(lengths))]
        for i in reversed(range(len(lengths))):  # a node's subtree ends where its last child's
            if parents[i] >= 0:
                ends[parents[i]] = max(ends[parents[i]], ends[i])
        for i, n in enumerate(lengths):
            subtree_end += [ends[i]] * n
            depth += list(range(node_depth[i], node_depth[i] + n))
        cu.append(row)
    return cu, subtree_end, depth


def make_batch(kind, n, target, seed, scale=1.0):
    """(name, trees) packed to about `target` tokens."""
    rng = random.Random(seed)
    trees, used = [], 0
    while target - used > 64 * scale:
        lengths, parents = (
            grpo_tree(rng, n, scale) if kind == "grpo" else multiturn_tree(rng, n, scale)
        )
        lengths, parents = cut_to(lengths, parents, target - used)
        if not lengths:
            break
        trees.append((lengths, parents))
        used += sum(lengths)
    name = f"GRPO n = {n}" if kind == "grpo" else f"multi-turn, depth {n}"
    return name, trees


def tree_reference(torch, q, k, v, dout, cu, subtree_end, scale, chunk=512):
    """out, dq, dk, dv in float64 under the tree mask rule, per piece and per block of `chunk`
    query rows (the backward by hand, so memory stays bounded)."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dq = torch.zeros_like(out)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros_like(dk)
    ends = torch.as_tensor(subtree_end, device=q.device)
    for a, b in zip(cu, cu[1:]):
        qs = q[a:b].to(torch.float64).transpose(0, 1)
        ks = k[a:b].to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[a:b].to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)
        dos = dout[a:b].to(torch.float64).transpose(0, 1)
        dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
        for i0 in range(0, b - a, chunk):
            i1 = min(b - a, i0 + chunk)
            rows = torch.arange(a + i0, a + i1, device=q.device)[:, None]
            cols = torch.arange(a, a + i1, device=q.device)[None, :]
            visible = (cols <= rows) & (rows < ends[a : a + i1][None, :])
            s = torch.matmul(qs[:, i0:i1], ks[:, :i1].transpose(1, 2)) * scale
            s.masked_fill_(~visible, float("-inf"))
            p = torch.softmax(s, dim=-1)
            del s
            o = torch.matmul(p, vs[:, :i1])
            out[a + i0 : a + i1] = o.transpose(0, 1)
            do = dos[:, i0:i1]
            ds = p * (torch.matmul(do, vs[:, :i1].transpose(1, 2)) - (do * o).sum(-1, keepdim=True))
            dq[a + i0 : a + i1] = (torch.matmul(ds, ks[:, :i1]) * scale).transpose(0, 1)
            dks[:, :i1] += torch.matmul(ds.transpose(1, 2), qs[:, i0:i1]) * scale
            dvs[:, :i1] += torch.matmul(p.transpose(1, 2), do)
            del p, ds
        h, length, d = dks.shape
        dk[a:b] = dks.view(h // group, group, length, d).sum(1).transpose(0, 1)
        dv[a:b] = dvs.view(h // group, group, length, d).sum(1).transpose(0, 1)
    return out, dq, dk, dv


def wall_ms(torch, fn, budget, share, device):
    """time_ms on CUDA; on the CPU (the self-test) one wall-clock run."""
    if device == "cuda":
        return time_ms(torch, fn, budget, share)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run_batch(torch, kernels, dispatch, name, trees, seed, budget, device, dims):
    heads, kv_heads, dim = dims
    cu, subtree_end, depth = layout_of(trees)
    total = cu[-1]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, dout = randn(total, heads, dim), randn(total, heads, dim)
    k, v = randn(total, kv_heads, dim), randn(total, kv_heads, dim)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    ends_t = torch.tensor(subtree_end, dtype=torch.int32, device=device)
    depth_t = torch.tensor(depth, dtype=torch.int32, device=device)
    max_len = max(b - a for a, b in zip(cu, cu[1:]))
    tree_pairs = sum(d + 1 for d in depth)
    causal_pairs = sum((b - a) * (b - a + 1) // 2 for a, b in zip(cu, cu[1:]))
    result = {
        "name": name,
        "tokens": total,
        "pieces": len(trees),
        "nodes": sum(len(t[0]) for t in trees),
        "max_piece": max_len,
        "tree_pairs": tree_pairs,
        "causal_pairs": causal_pairs,
        "error": {},
        "time_ms": {"fwd": {}, "bwd": {}},
        "tflops": {"fwd": {}, "bwd": {}},
        "skipped": [],
        "exceptions": [],
    }
    layout = dict(cu_seqlens_host=cu)

    def tree_call(backend, a, b, c):
        return kernels.tree_attention(
            a, b, c, cu_t, max_len, ends_t, depth_t, backend=backend, **layout
        )

    ref = tree_reference(torch, q, k, v, dout, cu, subtree_end, dim**-0.5)
    grads, errors = {}, {}
    for backend in ("packsched", "flex"):
        if backend == "flex" and device != "cuda":
            with torch.no_grad():  # torch has no FlexAttention backward on the CPU
                o = tree_call(backend, q, k, v)
            errors[backend] = [max_abs_error(torch, o, ref[0])] + [float("nan")] * 3
            continue
        try:
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            o = tree_call(backend, *leaves)
            g = torch.autograd.grad(o, leaves, dout, retain_graph=True)
            errors[backend] = [max_abs_error(torch, x, r) for x, r in zip((o, *g), ref)]
            grads[backend] = (o, leaves)
        except Exception as e:  # noqa: BLE001 - recorded, the other backend goes on
            result["exceptions"].append(f"{backend}: {type(e).__name__}: {e}")
    del ref
    for i, tensor in enumerate(("out", "dq", "dk", "dv")):
        entry = {b: errs[i] for b, errs in errors.items()}
        entry["baseline"] = "flex" if "flex" in errors else None
        result["error"][tensor] = entry

    # The same pieces as flat causal sequences through packsched's varlen kernels.
    def causal_fwd():
        return kernels.varlen_attention_forward(
            q,
            k,
            v,
            cu_t,
            cu_t,
            max_len,
            max_len,
            causal=True,
            cu_seqlens_q_host=cu,
            cu_seqlens_k_host=cu,
        )

    causal_out, causal_lse = causal_fwd()

    def causal_bwd():
        return kernels.varlen_attention_backward(
            dout,
            q,
            k,
            v,
            causal_out,
            causal_lse,
            cu_t,
            cu_t,
            max_len,
            max_len,
            causal=True,
            cu_seqlens_q_host=cu,
            cu_seqlens_k_host=cu,
        )

    seq = dispatch._rows(cu_t, None, total)
    mask_mod = dispatch._tree_mask(seq, ends_t.to(torch.int64), depth_t, -1)

    def build_mask():
        return dispatch.block_mask(mask_mod, total, q.device)

    built = build_mask()
    flex = dispatch.flex_function(q.device)

    def flex_fwd(a=q, b=k, c=v):
        return flex(
            *(x.transpose(0, 1).unsqueeze(0) for x in (a, b, c)),
            block_mask=built,
            enable_gqa=heads != kv_heads,
        )

    def packsched_fwd():
        with torch.no_grad():
            return tree_call("packsched", q, k, v)

    def flex_no_grad():
        with torch.no_grad():
            return flex_fwd()

    def backward(o, leaves, grad_out):
        return lambda: torch.autograd.grad(o, leaves, grad_out, retain_graph=True)

    timed = [("fwd", "packsched", packsched_fwd), ("fwd", "flex", flex_no_grad)]
    if "packsched" in grads:
        timed.append(("bwd", "packsched", backward(*grads["packsched"], dout)))
    if "flex" in grads:  # FlexAttention's own graph, the mask prebuilt
        flex_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        flex_out = flex_fwd(*flex_leaves)
        flex_dout = dout.transpose(0, 1).unsqueeze(0)
        timed.append(("bwd", "flex", backward(flex_out, flex_leaves, flex_dout)))
    timed += [("fwd", "mask", build_mask)]
    timed += [("fwd", "packsched_causal", causal_fwd), ("bwd", "packsched_causal", causal_bwd)]
    for i, (direction, backend, fn) in enumerate(timed):
        try:
            ms = wall_ms(torch, fn, budget, 1.0 / (len(timed) - i + 1), device)
        except Exception as e:  # noqa: BLE001
            result["exceptions"].append(f"time {direction} {backend}: {type(e).__name__}: {e}")
            continue
        if ms is None:
            result["skipped"].append(f"time {direction} {backend}: out of budget")
            continue
        result["time_ms"][direction][backend] = ms
        if backend != "mask":
            pairs = causal_pairs if backend == "packsched_causal" else tree_pairs
            work = 4.0 * dim * heads * pairs * (2.5 if direction == "bwd" else 1.0)
            result["tflops"][direction][backend] = work / (ms / 1e3) / 1e12
    summarize(result)
    return result


def summarize(result):
    """fwd + bwd per backend, FlexAttention with one mask build, the speed ratios."""
    fwd, bwd = result["time_ms"]["fwd"], result["time_ms"]["bwd"]
    both = {b: fwd[b] + bwd[b] for b in fwd if b in bwd}
    if "flex" in both and "mask" in fwd:
        both["flex_with_mask"] = both["flex"] + fwd["mask"]
    result["fwd_bwd_ms"] = both
    ours = both.get("packsched")
    result["speed_vs_flex"] = {
        name: both[name] / ours for name in ("flex", "flex_with_mask") if ours and name in both
    }
    tflops = result["tflops"]
    if "packsched" in tflops["fwd"] and "packsched_causal" in tflops["fwd"]:
        result["tree_vs_causal_per_useful_flop"] = {
            d: tflops[d]["packsched"] / tflops[d]["packsched_causal"]
            for d in ("fwd", "bwd")
            if "packsched" in tflops[d] and "packsched_causal" in tflops[d]
        }


def doc_row(result):
    """The batch's line for docs/benchmarks.md "GPU results"."""
    both, fwd = result.get("fwd_bwd_ms", {}), result["time_ms"]["fwd"]

    def ms(name):
        return f"{both[name]:.2f}" if name in both else "-"

    speed = result.get("speed_vs_flex", {})
    ratio = result.get("tree_vs_causal_per_useful_flop", {})
    return (
        f"| {result['name']}, {result['tokens']:,} tokens ({result['pieces']} trees) "
        f"| {ms('packsched')} | {ms('flex')} | {fwd.get('mask', float('nan')):.2f} "
        f"| {ms('flex_with_mask')} | {speed.get('flex_with_mask', float('nan')):.2f}x "
        f"| {ratio.get('fwd', float('nan')):.2f} / {ratio.get('bwd', float('nan')):.2f} |"
    )


def table_entries(batches, device_kind, dtype, dim):
    """attention_backends.json entries per token bucket: backends fastest first by forward +
    backward with one mask build, summed over the bucket's batches."""
    sums = {}
    for batch in batches:
        both = batch.get("fwd_bwd_ms", {})
        if "packsched" not in both or "flex_with_mask" not in both:
            continue
        bucket = 1 << max(0, batch["tokens"] - 1).bit_length()
        acc = sums.setdefault(bucket, {"packsched": 0.0, "flex": 0.0, "names": []})
        acc["packsched"] += both["packsched"]
        acc["flex"] += both["flex_with_mask"]
        acc["names"].append(batch["name"])
    entries = []
    for bucket, acc in sorted(sums.items()):
        order = sorted(("packsched", "flex"), key=lambda b: acc[b])
        entries.append(
            {
                "device": device_kind,
                "dtype": dtype,
                "head_dim": dim,
                "mask": "tree",
                "tokens_bucket": bucket,
                "backends": order,
                "evidence": (
                    f"tree_vs_flex {time.strftime('%Y-%m-%d')}: fwd+bwd packsched "
                    f"{acc['packsched']:.2f} ms, FlexAttention with its mask build "
                    f"{acc['flex']:.2f} ms ({'; '.join(acc['names'])})"
                ),
            }
        )
    return entries


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--budget-s", type=float, default=150.0, help="seconds for measuring")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--cpu-self-test", action="store_true", help="tiny, CPU, float32")
    args = parser.parse_args()
    budget = Budget(args.budget_s)
    report = {"status": "ok", "reason": "", "batches": [], "exceptions": []}

    def write():
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")

    try:
        import torch

        import packsched._attention_dispatch as dispatch
        import packsched.kernels as kernels
    except Exception as e:  # noqa: BLE001
        report.update(status="unavailable", reason=f"import: {type(e).__name__}: {e}")
        write()
        return 0
    device = "cpu" if args.cpu_self_test else "cuda"
    report["torch"] = torch.__version__
    if device == "cuda" and not torch.cuda.is_available():
        report.update(status="unavailable", reason="torch.cuda.is_available() is False")
        write()
        return 0
    if device == "cuda" and not kernels.built_with_cuda():
        report.update(status="unavailable", reason="packsched.kernels built without CUDA")
        write()
        return 0
    dims = (HEADS, KV_HEADS, HEAD_DIM) if device == "cuda" else (4, 2, 16)
    dtype = "bfloat16" if device == "cuda" else "float32"
    report["config"] = {"dtype": dtype, "heads": dims[0], "kv_heads": dims[1], "head_dim": dims[2]}
    if device == "cuda":
        report["device"] = torch.cuda.get_device_name()
        torch.backends.cuda.matmul.allow_tf32 = False
        major, minor = torch.cuda.get_device_capability()
        device_kind = f"cuda:sm_{major}{minor}"
    else:
        device_kind = "cpu"
    targets, scale = (TARGETS, 1.0) if device == "cuda" else ((300,), 0.02)
    seed = args.seed
    for target in targets:
        for kind, n in KINDS:
            seed += 1
            name, trees = make_batch(kind, n, target, seed, scale)
            if budget.left() <= 0:
                report["exceptions"].append(f"{name} @ {target}: skipped, out of budget")
                continue
            try:
                report["batches"].append(
                    run_batch(torch, kernels, dispatch, name, trees, seed, budget, device, dims)
                )
            except Exception as e:  # noqa: BLE001
                report["exceptions"].append(
                    f"{name} @ {target}: {type(e).__name__}: {e}\n" + traceback.format_exc(limit=3)
                )
            if device == "cuda":
                torch.cuda.empty_cache()
            report["rows"] = [doc_row(b) for b in report["batches"]]
            report["table_entries"] = table_entries(report["batches"], device_kind, dtype, dims[2])
            write()  # what is measured so far survives a timeout
    if not report["batches"]:
        report.update(status="fail", reason="no batch completed")
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
