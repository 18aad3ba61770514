#!/usr/bin/env python3
"""Tree-packed against flat bf16 runs of the same rollouts through a tiny random-weight decoder
(the GPU kit's step ``tree_vs_flat``): the bf16 counterpart on the GPU of the float64 CPU proof
that tree packing changes no log-probability and no gradient (tests/python/test_tree_gradient.py).

    tree_vs_flat.py --out FILE [--seed N]                    (bf16 on CUDA)
    tree_vs_flat.py --out FILE --device cpu [--mask broken]  (bf16 on the CPU: the test command)

Contract: writes one JSON object to FILE (tests/gpu/README.md, "tree_vs_flat") and exits 0 once
it is written, whatever it holds: judging is report.py's (judge_tree_vs_flat). It needs torch and
packsched.kernels on PYTHONPATH (the kit's module); without them, or without CUDA on CUDA, the
JSON says "unavailable" and why.

Model: a decoder built here from the seed (torch.manual_seed, nothing downloaded): token
embedding, RMSNorm, grouped-query attention (H = 4, Hk = 2, D = 32) with rotary positions, a SiLU
MLP, 2 layers, hidden 128, vocabulary 257. Rollouts: GRPO groups (a prompt, 4 completions) and
multi-turn trees of depth 3 (tree_vs_flex.py's shapes, scaled down), random tokens; every leaf
is a rollout (its root path). Three runs of the same weights (the bf16 weights; the reference
takes them to float64) and rollouts:
  - tree (bf16, the device): each tree one piece, shared prefixes once, positions = depths,
    packsched's tree_attention (backend "packsched") with the trees' subtree_end;
  - flat (bf16, the device): every rollout a sequence of its own, positions 0.., packsched's
    varlen_attention (causal, backend "packsched");
  - reference: the flat run in float64 on the CPU.
Per run: every rollout's log-probability of each next token along its path (log_softmax of the
logits in float32, float64 for the reference), and the gradient of the loss
sum_r w_r * mean log-probability of rollout r (random weights w_r) with respect to every weight.
Errors against the reference: the log-probabilities' max |x - ref|; the gradients' max over the
weight tensors of max |g - ref| / max |ref|. report.py passes the step when, for both, the tree
run's error is at most FACTOR x the flat run's plus FLOOR x the reference's scale: the flat run's
error is this model's bf16 noise (the same weights, inputs and kernels family), the tree run may
round differently (shared rows computed once, sums in another order) but must not be worse by
more than FlashAttention's factor 2; FLOOR = 2^-8, bf16's unit roundoff, allows one rounding of
the value itself. ``--mask broken`` (the negative control) gives the tree run plain causal
attention over each piece (every subtree ends at the piece's end: later branches see their
siblings), which the judgement must fail.
"""

import argparse
import json
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tree_vs_flex import grpo_tree, layout_of, multiturn_tree  # noqa: E402

FACTOR = 2.0  # the tree run's error at most this times the flat run's (FlashAttention's rule)
FLOOR = 2.0**-8  # plus one bf16 rounding (unit roundoff) of the reference's scale
CONFIG = dict(vocab=257, hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32)
# (kind, n, trees, scale) of the rollout mix; scale shrinks tree_vs_flex.py's node lengths.
MIX = {
    "cuda": (("grpo", 4, 6, 0.1), ("multiturn", 3, 3, 0.1)),
    "cpu": (("grpo", 4, 3, 0.03), ("multiturn", 3, 2, 0.03)),
}


def make_model(torch, seed, vocab, hidden, layers, heads, kv_heads, head_dim):
    """The decoder (a torch.nn.Module, float32 on the CPU) with weights drawn from ``seed``.
    forward(ids, positions, attend) -> logits; attend(q, k, v) runs the attention of a layer."""
    nn = torch.nn

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

        def forward(self, x):
            x32 = x.float() if x.dtype != torch.float64 else x
            y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * y.to(x.dtype)

    def rotate(x, positions):
        """Rotary embedding on the last dimension of x [T, heads, D] at ``positions``."""
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        half = head_dim // 2
        freq = 10000.0 ** (-torch.arange(half, dtype=acc, device=x.device) / half)
        angle = positions.to(acc)[:, None, None] * freq
        a, b = x.to(acc)[..., :half], x.to(acc)[..., half:]
        cos, sin = torch.cos(angle), torch.sin(angle)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(hidden, heads * head_dim, bias=False)
            self.kv = nn.Linear(hidden, 2 * kv_heads * head_dim, bias=False)
            self.o = nn.Linear(heads * head_dim, hidden, bias=False)
            self.up = nn.Linear(hidden, 4 * hidden, bias=False)
            self.down = nn.Linear(2 * hidden, hidden, bias=False)

        def forward(self, x, positions, attend):
            h = self.norm1(x)
            q = rotate(self.q(h).view(len(x), heads, head_dim), positions)
            k, v = self.kv(h).view(len(x), 2, kv_heads, head_dim).unbind(1)
            x = x + self.o(attend(q, rotate(k, positions), v.contiguous()).reshape(len(x), -1))
            gate, up = self.up(self.norm2(x)).chunk(2, -1)
            return x + self.down(nn.functional.silu(gate) * up)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids, positions, attend):
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x, positions, attend)
            return self.head(self.norm(x))

    torch.manual_seed(seed)
    return Decoder()


def make_rollouts(kind_mix, seed, vocab):
    """(trees, tokens, rollouts): trees as tree_vs_flex.layout_of takes them, every tree's tokens
    (a list per tree, in its row order), and per rollout (tree, [node ids on its root path])."""
    rng = random.Random(seed)
    trees, tokens, rollouts = [], [], []
    for kind, n, count, scale in kind_mix:
        for _ in range(count):
            grow = grpo_tree if kind == "grpo" else multiturn_tree
            lengths, parents = grow(rng, n, scale)
            trees.append((lengths, parents))
            tokens.append([rng.randrange(vocab) for _ in range(sum(lengths))])
            children = {p for p in parents if p >= 0}
            for leaf in (i for i in range(len(lengths)) if i not in children):
                path, node = [], leaf
                while node >= 0:
                    path.append(node)
                    node = parents[node]
                rollouts.append((len(trees) - 1, path[::-1]))
    return trees, tokens, rollouts


def rollout_rows(trees, rollouts):
    """Per rollout its rows in the tree layout (layout_of's row order), along its root path."""
    starts, base = [], 0
    for lengths, _ in trees:
        node_start = [base + sum(lengths[:i]) for i in range(len(lengths))]
        starts.append(node_start)
        base += sum(lengths)
    return [
        [r for node in path for r in range(starts[t][node], starts[t][node] + trees[t][0][node])]
        for t, path in rollouts
    ]


def log_probs(torch, logits, rows, ids):
    """Each rollout's log-probability of its next tokens: logits[rows[i]] predicts ids[rows[i+1]],
    concatenated over the rollouts (a list of tensors per rollout)."""
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out = []
    for path in rows:
        index = torch.as_tensor(path, device=logits.device)
        lp = torch.log_softmax(logits.index_select(0, index[:-1]).to(acc), -1)
        out.append(lp.gather(1, ids.index_select(0, index[1:])[:, None])[:, 0])
    return out


def run(torch, kernels, model, layout, device, weights):
    """(log-probabilities [sum of rollout lengths - 1], {weight name: gradient}) of one run."""
    ids = torch.as_tensor(layout["ids"], device=device)
    positions = torch.as_tensor(layout["positions"], device=device)
    cu_host = layout["cu"]
    cu = torch.tensor(cu_host, dtype=torch.int32, device=device)
    max_seqlen = max(b - a for a, b in zip(cu_host, cu_host[1:]))
    if layout["subtree_end"] is None:

        def attend(q, k, v):
            return kernels.varlen_attention(
                q,
                k,
                v,
                cu,
                cu,
                max_seqlen,
                max_seqlen,
                causal=True,
                cu_seqlens_q_host=cu_host,
                cu_seqlens_k_host=cu_host,
                backend="packsched",
            )

    else:
        subtree_end = torch.tensor(layout["subtree_end"], dtype=torch.int32, device=device)

        def attend(q, k, v):
            return kernels.tree_attention(
                q, k, v, cu, max_seqlen, subtree_end, cu_seqlens_host=cu_host, backend="packsched"
            )

    model.zero_grad(set_to_none=True)
    per_rollout = log_probs(torch, model(ids, positions, attend), layout["rollout_rows"], ids)
    w = torch.as_tensor(weights, dtype=per_rollout[0].dtype, device=device)
    loss = sum(w[i] * lp.mean() for i, lp in enumerate(per_rollout))
    loss.backward()
    lp = torch.cat(per_rollout).detach().to("cpu", torch.float64)
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters()}
    return lp, grads


def layouts(trees, tokens, rollouts, mask):
    """The tree layout (pieces = trees) and the flat one (a sequence per rollout) of the same
    rollouts. mask "broken": every row's subtree_end is its piece's end (plain causal)."""
    cu, subtree_end, depth = layout_of(trees)
    if mask == "broken":
        subtree_end = [cu[b + 1] for b in range(len(trees)) for _ in range(cu[b], cu[b + 1])]
    ids = [t for tree in tokens for t in tree]
    rows = rollout_rows(trees, rollouts)
    tree = dict(ids=ids, positions=depth, cu=cu, subtree_end=subtree_end, rollout_rows=rows)
    flat_ids, flat_pos, flat_cu, flat_rows = [], [], [0], []
    for path in rows:
        flat_rows.append(list(range(flat_cu[-1], flat_cu[-1] + len(path))))
        flat_ids += [ids[r] for r in path]
        flat_pos += list(range(len(path)))
        flat_cu.append(flat_cu[-1] + len(path))
    flat = dict(
        ids=flat_ids, positions=flat_pos, cu=flat_cu, subtree_end=None, rollout_rows=flat_rows
    )
    return tree, flat


def errors(torch, lp, grads, ref_lp, ref_grads):
    """(max |lp - ref|, max over weights of max |g - ref| / max |ref|, the weight it is at)."""
    lp_err = float((lp - ref_lp).abs().max())
    worst, at = 0.0, None
    for name, ref in ref_grads.items():
        e = float((grads[name] - ref).abs().max()) / max(float(ref.abs().max()), 1e-300)
        if e >= worst:
            worst, at = e, name
    return lp_err, worst, at


def compare(torch, kernels, device, seed, mask="tree"):
    """The step's figures (a dict) for one device: the three runs and their errors."""
    t0 = time.perf_counter()
    cfg = CONFIG
    trees, tokens, rollouts = make_rollouts(MIX[device], seed, cfg["vocab"])
    tree, flat = layouts(trees, tokens, rollouts, mask)
    rng = random.Random(seed + 1)
    weights = [rng.uniform(-1.0, 1.0) for _ in rollouts]
    base = make_model(torch, seed, **cfg).to(torch.bfloat16)
    ref_model = make_model(torch, seed, **cfg).to(torch.float64)
    ref_model.load_state_dict({n: p.to(torch.float64) for n, p in base.state_dict().items()})
    ref_lp, ref_grads = run(torch, kernels, ref_model, flat, "cpu", weights)
    model = base.to(device)
    figures = {}
    for name, layout in (("tree", tree), ("flat", flat)):
        lp, grads = run(torch, kernels, model, layout, device, weights)
        figures[name] = (lp, grads)
    scale = float(ref_lp.abs().max())
    out = {
        "status": "ok",
        "device": device,
        "dtype": "bfloat16",
        "mask": mask,
        "seed": seed,
        "config": cfg,
        "rollouts": len(rollouts),
        "rows": {"tree": len(tree["ids"]), "flat": len(flat["ids"])},
        "factor": FACTOR,
        "floor": {"logprobs": FLOOR * scale, "grads": FLOOR},
        "error": {"logprobs": {}, "grads": {}, "grads_at": {}},
    }
    for name, (lp, grads) in figures.items():
        lp_err, g_err, at = errors(torch, lp, grads, ref_lp, ref_grads)
        out["error"]["logprobs"][name] = lp_err
        out["error"]["grads"][name] = g_err
        out["error"]["grads_at"][name] = at
    (tlp, tg), (flp, fg) = figures["tree"], figures["flat"]
    out["tree_vs_flat"] = {
        "logprobs": float((tlp - flp).abs().max()),
        "grads": max(
            float((tg[n] - fg[n]).abs().max()) / max(float(fg[n].abs().max()), 1e-300) for n in fg
        ),
    }
    out["seconds"] = time.perf_counter() - t0
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--mask", default="tree", choices=("tree", "broken"))
    args = parser.parse_args()

    def write(report):
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")

    try:
        import torch

        import packsched.kernels as kernels
    except Exception as e:  # noqa: BLE001
        write({"status": "unavailable", "reason": f"import: {type(e).__name__}: {e}"})
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        write({"status": "unavailable", "reason": "torch.cuda.is_available() is False"})
        return 0
    if args.device == "cuda" and not kernels.built_with_cuda():
        write({"status": "unavailable", "reason": "packsched.kernels built without CUDA"})
        return 0
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        report = compare(torch, kernels, args.device, args.seed, args.mask)
        if args.device == "cuda":
            report["device_name"] = torch.cuda.get_device_name()
        report["torch"] = torch.__version__
    except Exception as e:  # noqa: BLE001
        report = {
            "status": "fail",
            "reason": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(limit=4),
        }
    write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
