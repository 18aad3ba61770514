#!/usr/bin/env python3
"""packsched's varlen attention against torch on the same packed batches (the GPU kit's step).

    attention_vs_torch.py --out FILE [--budget-s S] [--seed N]
    attention_vs_torch.py --out FILE --cpu-self-test      (small, on the CPU: the plumbing only)

Contract: writes one JSON object to FILE (schema: tests/gpu/README.md, "attention_vs_torch") and
exits 0 once it is written, whatever it holds: judging is report.py's job. It needs torch with
CUDA and packsched.kernels on PYTHONPATH (the kit's module); without them the JSON says
"unavailable" and why. It stops measuring when --budget-s runs out (what was left is marked
skipped), so a slow kernel cannot make the kit overrun.

Batches: the realistic RL length mix (gen_lengths.py) packed to about 32k and 64k tokens, bf16,
H = 16, Hk = 4, D = 128, causal (q and k share cu_seqlens). For each batch:
  - error, FlashAttention's rule: max |x - ref| of out, dq, dk, dv for packsched and for torch's
    own bf16 computation (torch.nn.attention.varlen.varlen_attn; SDPA per sequence when varlen_attn
    is missing), ref computed in float64 from the same bf16 inputs; packsched passes when its error
    is at most 2x torch's (report.py applies the rule);
  - time and TFLOP/s of forward and backward for packsched, varlen_attn and SDPA per sequence
    (flash backend, enable_gqa), medians of CUDA-event timings after a warm-up; FLOPs count visible
    (query, key) pairs: forward 4*D per pair and head, backward 2.5x the forward. "packsched" is
    the path the CUDA backend picks (the tensor-core kernels for this bf16, D = 128 case);
    "packsched_scalar" the scalar kernels forced by PACKSCHED_ATTENTION_SCALAR=1, timed last
    with what is left of the budget;
  - both D = 128 tensor-core forwards: "packsched_fwd_tile128" and "packsched_fwd_tile64" (query
    tiles of 128 or 64 rows, PACKSCHED_ATTENTION_TC_FWD_TILE), their out errors beside
    packsched's (report.py judges them by the same rule), their forward times right after
    packsched's, and "fwd_tile_speed_vs_varlen_attn" (varlen_attn's forward time over each's);
  - "packsched_onepass": the one-pass tensor-core backward (PACKSCHED_ATTENTION_TC_BWD=onepass;
    dq by atomics), errors of dq, dk, dv and its backward time, right after the default
    backward's ("bwd_onepass" in "speed_vs_varlen_attn");
  - "table_entries" (top level): entries for client/python/packsched/attention_backends.json,
    per token bucket packsched and varlen_attn ordered by forward + backward time;
  - "kernel_ms": for one call each of packsched's forward, backward and one-pass backward and
    varlen_attn's forward and backward, the GPU milliseconds of every kernel the call ran (torch's
    profiler, CUDA activity only; a kernel launched more than once summed), so that a run shows
    which pass costs what.
"""

import argparse
import inspect
import json
import os
import re
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "deploy")]  # gen_lengths.py: kit, or tree

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 128
TARGETS = (32768, 65536)
MAX_REPS = 5
SCALAR_VARIABLE = "PACKSCHED_ATTENTION_SCALAR"  # "1": the scalar kernels
TILE_VARIABLE = "PACKSCHED_ATTENTION_TC_FWD_TILE"  # query rows per tile of the D = 128 forward
TILES = (128, 64)
BACKWARD_VARIABLE = "PACKSCHED_ATTENTION_TC_BWD"  # "onepass": dq by atomics, in one pass


def forced(variable, value, fn):
    """fn called with the environment variable set (packsched reads it per call), then unset."""

    def call():
        os.environ[variable] = value
        try:
            return fn()
        finally:
            os.environ.pop(variable, None)

    return call


def short_kernel_name(name):
    """A profiler's kernel name without its return type, namespaces and parameters
    ("AttentionTcBackwardDqKernel<Bf16, 128>"), at most 80 characters."""
    name = re.sub(r"^void\s+", "", name).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameters: the first "(" outside template brackets
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            cut = i
            break
    name = re.sub(r"\b[A-Za-z_]\w*::", "", name[:cut]).strip()
    return name if len(name) <= 80 else name[:77] + "..."


def kernel_times(torch, fn):
    """{kernel: milliseconds} of one call of fn on the GPU, from torch's profiler (CUDA activity
    only), largest first; a kernel launched more than once is summed."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:  # torch before the device_ names
            us = getattr(event, "self_cuda_time_total", 0)
        if us > 0:
            name = short_kernel_name(event.key)
            times[name] = times.get(name, 0.0) + us / 1e3
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def pack_lengths(lengths, target):
    """Lengths taken in order while they fit under `target` tokens (stops within 512 of it)."""
    batch, total = [], 0
    for n in lengths:
        if total + n <= target:
            batch.append(n)
            total += n
        if total > target - 512:
            break
    return batch


def fwd_flops(lengths, heads, head_dim):
    return 4.0 * head_dim * heads * sum(n * (n + 1) / 2 for n in lengths)


def max_abs_error(torch, x, ref):
    x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        return float("inf")
    return float((x - ref).abs().max())


def reference(torch, q, k, v, dout, host, scale, chunk=512):
    """out, dq, dk, dv in float64 for causal GQA attention over the packed batch, computed per
    sequence and per block of `chunk` query rows (backward by hand: memory stays bounded)."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dq = torch.zeros_like(out)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros_like(dk)
    for a, b in zip(host, host[1:]):
        if b == a:
            continue
        qs = q[a:b].to(torch.float64).transpose(0, 1)  # [H, L, D]
        ks = k[a:b].to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[a:b].to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)
        dos = dout[a:b].to(torch.float64).transpose(0, 1)
        dks = torch.zeros_like(ks)
        dvs = torch.zeros_like(vs)
        for i0 in range(0, b - a, chunk):
            i1 = min(b - a, i0 + chunk)
            s = torch.matmul(qs[:, i0:i1], ks[:, :i1].transpose(1, 2)) * scale  # [H, c, i1]
            rows = torch.arange(i0, i1, device=q.device)[:, None]
            cols = torch.arange(0, i1, device=q.device)[None, :]
            s.masked_fill_(cols > rows, float("-inf"))
            p = torch.softmax(s, dim=-1)
            del s
            o = torch.matmul(p, vs[:, :i1])  # [H, c, D]
            out[a + i0 : a + i1] = o.transpose(0, 1)
            do = dos[:, i0:i1]
            dp = torch.matmul(do, vs[:, :i1].transpose(1, 2))
            ds = p * (dp - (do * o).sum(-1, keepdim=True))
            del dp
            dq[a + i0 : a + i1] = (torch.matmul(ds, ks[:, :i1]) * scale).transpose(0, 1)
            dks[:, :i1] += torch.matmul(ds.transpose(1, 2), qs[:, i0:i1]) * scale
            dvs[:, :i1] += torch.matmul(p.transpose(1, 2), do)
            del p, ds
        h, length, d = dks.shape
        dk[a:b] = dks.view(h // group, group, length, d).sum(1).transpose(0, 1)
        dv[a:b] = dvs.view(h // group, group, length, d).sum(1).transpose(0, 1)
    return out, dq, dk, dv


class Budget:
    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds

    def left(self):
        return self.deadline - time.monotonic()


def time_ms(torch, fn, budget, share):
    """Median milliseconds of fn() (CUDA events) after one warm-up; as many runs (1..MAX_REPS) as
    fit in `share` of the budget left. None when the budget is already spent."""
    if budget.left() <= 0:
        return None
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    first = once()  # warm-up, and the estimate of one run
    if budget.left() < first / 1000:
        return first  # no room for more: the warm-up run is the measurement
    reps = max(1, min(MAX_REPS, int(budget.left() * share * 1000 / max(first, 1e-3))))
    times = sorted(once() for _ in range(reps))
    return times[len(times) // 2]


class TorchAttention:
    """torch's bf16 attention: varlen_attn when present, SDPA per sequence."""

    def __init__(self, torch):
        self.torch = torch
        self.varlen = None
        self.varlen_kwargs = {}
        self.native_gqa = False
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError as e:
            self.varlen_missing = f"torch.nn.attention.varlen.varlen_attn: {e}"
            return
        params = inspect.signature(varlen_attn).parameters
        if "is_causal" in params:
            self.varlen_kwargs["is_causal"] = True
        elif "window_size" in params:
            self.varlen_kwargs["window_size"] = (-1, 0)
        else:
            self.varlen_missing = f"varlen_attn{inspect.signature(varlen_attn)}: no causal option"
            return
        if "enable_gqa" in params:
            self.varlen_kwargs["enable_gqa"] = True
            self.native_gqa = True
        self.varlen = varlen_attn
        self.varlen_missing = None

    def describe(self):
        if self.varlen is None:
            return {"varlen_attn": None, "missing": self.varlen_missing}
        return {
            "varlen_attn": str(inspect.signature(self.varlen)),
            "causal_argument": sorted(self.varlen_kwargs),
            "gqa": "native" if self.native_gqa else "k/v heads repeated (repeat_interleave)",
        }

    def varlen_call(self, q, k, v, cu, max_len):
        if not self.native_gqa:
            group = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        return self.varlen(q, k, v, cu, cu, max_len, max_len, **self.varlen_kwargs)

    def sdpa_call(self, q, k, v, host):
        """SDPA per sequence, flash backend only: a fallback to the math backend would hold
        H x L x L scores per sequence (tens of GiB for the graphs kept for timing)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        f = self.torch.nn.functional.scaled_dot_product_attention
        outs = []
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            for a, b in zip(host, host[1:]):
                qs = q[a:b].transpose(0, 1).unsqueeze(0)
                ks = k[a:b].transpose(0, 1).unsqueeze(0)
                vs = v[a:b].transpose(0, 1).unsqueeze(0)
                outs.append(f(qs, ks, vs, is_causal=True, enable_gqa=True)[0].transpose(0, 1))
        return self.torch.cat(outs)


def run_batch(torch, kernels, impl, lengths, seed, budget, device):
    """Errors and timings of one packed batch (a dict for the JSON)."""
    host = [0]
    for n in lengths:
        host.append(host[-1] + n)
    total, max_len = host[-1], max(lengths)
    scale = HEAD_DIM**-0.5
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, dout = randn(total, HEADS, HEAD_DIM), randn(total, HEADS, HEAD_DIM)
    k, v = randn(total, KV_HEADS, HEAD_DIM), randn(total, KV_HEADS, HEAD_DIM)
    cu = torch.tensor(host, dtype=torch.int32, device=device)
    flops = fwd_flops(lengths, HEADS, HEAD_DIM)
    result = {
        "tokens": total,
        "sequences": len(lengths),
        "max_len": max_len,
        "lengths": lengths,
        "fwd_tflop": flops / 1e12,
        "error": {},
        "time_ms": {"fwd": {}, "bwd": {}},
        "tflops": {"fwd": {}, "bwd": {}},
        "skipped": [],
        "exceptions": [],
    }
    layout = dict(causal=True, cu_seqlens_q_host=host, cu_seqlens_k_host=host)

    def ours_fwd():
        return kernels.varlen_attention_forward(q, k, v, cu, cu, max_len, max_len, **layout)

    out, lse = ours_fwd()

    def ours_bwd():
        return kernels.varlen_attention_backward(
            dout, q, k, v, out, lse, cu, cu, max_len, max_len, **layout
        )

    dq, dk, dv = ours_bwd()
    tile_outs = {
        f"packsched_fwd_tile{rows}": forced(TILE_VARIABLE, str(rows), ours_fwd)()[0]
        for rows in TILES
    }
    ref = reference(torch, q, k, v, dout, host, scale)
    names = ("out", "dq", "dk", "dv")
    errors = {"packsched": [max_abs_error(torch, x, r) for x, r in zip((out, dq, dk, dv), ref)]}
    tile_errors = {name: max_abs_error(torch, o, ref[0]) for name, o in tile_outs.items()}
    del tile_outs
    ours_bwd_onepass = forced(BACKWARD_VARIABLE, "onepass", ours_bwd)
    grads_onepass = ours_bwd_onepass()
    errors["packsched_onepass"] = errors["packsched"][:1] + [
        max_abs_error(torch, x, r) for x, r in zip(grads_onepass, ref[1:])
    ]
    del grads_onepass

    def torch_grads(call):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = call(*leaves)
        grads = torch.autograd.grad(o, leaves, dout, retain_graph=True)
        return o, grads, leaves

    graphs = {}
    calls = {}
    if impl.varlen is not None:
        calls["varlen_attn"] = lambda a, b, c: impl.varlen_call(a, b, c, cu, max_len)
    if device == "cuda":
        calls["sdpa"] = lambda a, b, c: impl.sdpa_call(a, b, c, host)
    for name, call in calls.items():
        try:
            o, grads, leaves = torch_grads(call)
            errors[name] = [max_abs_error(torch, x, r) for x, r in zip((o, *grads), ref)]
            graphs[name] = (call, o, leaves)
        except Exception as e:  # noqa: BLE001 - recorded, the other baselines go on
            result["exceptions"].append(f"{name}: {type(e).__name__}: {e}")
    del ref
    baseline = "varlen_attn" if "varlen_attn" in errors else "sdpa" if "sdpa" in errors else None
    for i, name in enumerate(names):
        entry = {impl_name: errs[i] for impl_name, errs in errors.items()}
        entry["baseline"] = baseline
        result["error"][name] = entry
    result["error"]["out"].update(tile_errors)

    if device != "cuda":
        return result
    tile_fwds = {
        f"packsched_fwd_tile{rows}": forced(TILE_VARIABLE, str(rows), ours_fwd) for rows in TILES
    }
    timed = [("fwd", "packsched", ours_fwd)]
    timed += [("fwd", name, fn) for name, fn in tile_fwds.items()]
    timed += [("bwd", "packsched", ours_bwd), ("bwd", "packsched_onepass", ours_bwd_onepass)]

    for name, (call, o, leaves) in graphs.items():
        with_grad = (o, leaves)

        def fwd(call=call):
            with torch.no_grad():
                return call(q, k, v)

        def bwd(with_grad=with_grad):
            return torch.autograd.grad(with_grad[0], with_grad[1], dout, retain_graph=True)

        timed += [("fwd", name, fwd), ("bwd", name, bwd)]
    timed += [
        ("fwd", "packsched_scalar", forced(SCALAR_VARIABLE, "1", ours_fwd)),
        ("bwd", "packsched_scalar", forced(SCALAR_VARIABLE, "1", ours_bwd)),
    ]
    for i, (direction, name, fn) in enumerate(timed):
        try:
            ms = time_ms(torch, fn, budget, share=1.0 / (len(timed) - i + 1))
        except Exception as e:  # noqa: BLE001
            result["exceptions"].append(f"time {direction} {name}: {type(e).__name__}: {e}")
            continue
        if ms is None:
            result["skipped"].append(f"time {direction} {name}: out of budget")
            continue
        result["time_ms"][direction][name] = ms
        work = flops * (2.5 if direction == "bwd" else 1.0)
        result["tflops"][direction][name] = work / (ms / 1e3) / 1e12
    # Which kernels one call runs and for how long: what the next optimisation works from.
    result["kernel_ms"] = {}
    profiled = [("fwd", "packsched", ours_fwd), ("bwd", "packsched", ours_bwd)]
    profiled += [("bwd", "packsched_onepass", ours_bwd_onepass)]
    profiled += [(d, name, fn) for d, name, fn in timed if name == "varlen_attn"]
    for direction, name, fn in profiled:
        if budget.left() <= 0:
            result["skipped"].append(f"kernel times {direction} {name}: out of budget")
            continue
        try:
            result["kernel_ms"][f"{direction} {name}"] = kernel_times(torch, fn)
        except Exception as e:  # noqa: BLE001
            result["exceptions"].append(f"kernel times {direction} {name}: {type(e).__name__}: {e}")
    result["speed_vs_varlen_attn"] = {
        d: result["time_ms"][d]["varlen_attn"] / result["time_ms"][d]["packsched"]
        for d in ("fwd", "bwd")
        if "varlen_attn" in result["time_ms"][d] and "packsched" in result["time_ms"][d]
    }
    fwd_ms = result["time_ms"]["fwd"]
    result["fwd_tile_speed_vs_varlen_attn"] = {
        name: fwd_ms["varlen_attn"] / fwd_ms[name]
        for name in tile_fwds
        if "varlen_attn" in fwd_ms and name in fwd_ms
    }
    bwd_ms = result["time_ms"]["bwd"]
    if "varlen_attn" in bwd_ms and "packsched_onepass" in bwd_ms:
        result["speed_vs_varlen_attn"]["bwd_onepass"] = (
            bwd_ms["varlen_attn"] / bwd_ms["packsched_onepass"]
        )
    return result


def table_entries(batches, device_kind):
    """Entries for client/python/packsched/attention_backends.json from the timed batches: per
    token bucket, packsched and varlen_attn ordered by forward + backward time summed over the
    bucket's batches (bf16, D = 128, causal)."""
    sums = {}
    for batch in batches:
        fwd, bwd = batch["time_ms"]["fwd"], batch["time_ms"]["bwd"]
        if not all(name in fwd and name in bwd for name in ("packsched", "varlen_attn")):
            continue
        bucket = 1 << max(0, batch["tokens"] - 1).bit_length()
        acc = sums.setdefault(bucket, {"packsched": 0.0, "varlen_attn": 0.0, "tokens": []})
        for name in ("packsched", "varlen_attn"):
            acc[name] += fwd[name] + bwd[name]
        acc["tokens"].append(batch["tokens"])
    entries = []
    for bucket, acc in sorted(sums.items()):
        order = sorted(("varlen_attn", "packsched"), key=lambda name: acc[name])
        entries.append(
            {
                "device": device_kind,
                "dtype": "bfloat16",
                "head_dim": HEAD_DIM,
                "mask": "causal",
                "tokens_bucket": bucket,
                "backends": order,
                "evidence": (
                    f"attention_vs_torch {time.strftime('%Y-%m-%d')}: fwd+bwd packsched "
                    f"{acc['packsched']:.2f} ms, varlen_attn {acc['varlen_attn']:.2f} ms "
                    f"({', '.join(str(t) for t in acc['tokens'])} tokens)"
                ),
            }
        )
    return entries


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--budget-s", type=float, default=150.0, help="seconds for measuring")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cpu-self-test", action="store_true", help="small, CPU, float32")
    args = parser.parse_args()
    budget = Budget(args.budget_s)
    report = {"status": "ok", "reason": "", "batches": [], "exceptions": []}

    def write():
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")

    try:
        import torch

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
    impl = TorchAttention(torch)
    report["torch_attention"] = impl.describe()
    report["config"] = {
        "dtype": "bfloat16" if device == "cuda" else "float32",
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "causal": True,
        "reference": "float64, from the same inputs",
    }
    if device == "cuda":
        report["device"] = torch.cuda.get_device_name()
        torch.backends.cuda.matmul.allow_tf32 = False
    from gen_lengths import realistic_rl_lengths

    lengths = realistic_rl_lengths(400, args.seed)
    batches = (
        [[5, 0, 17, 1, 33]] if args.cpu_self_test else [pack_lengths(lengths, t) for t in TARGETS]
    )
    for i, batch in enumerate(batches):
        if budget.left() <= 0:
            report["exceptions"].append(f"batch {i}: skipped, out of budget")
            continue
        try:
            report["batches"].append(
                run_batch(torch, kernels, impl, batch, args.seed + i, budget, device)
            )
        except Exception as e:  # noqa: BLE001
            report["exceptions"].append(
                f"batch {i} ({sum(batch)} tokens): {type(e).__name__}: {e}\n"
                + traceback.format_exc(limit=3)
            )
        if device == "cuda":
            torch.cuda.empty_cache()
            major, minor = torch.cuda.get_device_capability()
            report["table_entries"] = table_entries(report["batches"], f"cuda:sm_{major}{minor}")
        write()  # what is measured so far survives a timeout
    if not report["batches"]:
        report.update(status="fail", reason="no batch completed")
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
