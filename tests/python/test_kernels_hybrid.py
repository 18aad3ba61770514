"""The recurrent kernels of hybrid layers (packsched.kernels.causal_conv1d, gated_delta_rule,
selective_scan) against their per-sequence definitions (helpers/hybrid_reference.py), forward and
gradients in float64 within 1e-10: flat rows of several sequences, and trees (GRPO groups,
branching multi-turn) against each rollout run on its own. A child that starts from zero state and
a sequence that inherits its predecessor's state are both caught."""

import numpy as np
import pytest
import torch

from helpers.hybrid_reference import conv_ref, gated_delta_ref, rollout_paths, selective_scan_ref
from packsched import kernels

F64 = torch.float64
TOL = 1e-10


def _rand(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


def _inputs(gen, rows, kind):
    """Leaf tensors of one kernel over `rows` packed rows."""
    if kind == "conv":
        return dict(x=_rand(gen, rows, 5), weight=_rand(gen, 5, 4), bias=_rand(gen, 5))
    if kind == "gdn":
        q = torch.nn.functional.normalize(_rand(gen, rows, 2, 4), dim=-1) * 0.5
        k = torch.nn.functional.normalize(_rand(gen, rows, 2, 4), dim=-1)
        g = -torch.rand(rows, 2, generator=gen, dtype=F64)
        beta = torch.rand(rows, 2, generator=gen, dtype=F64)
        return dict(q=q, k=k, v=_rand(gen, rows, 2, 3), g=g, beta=beta)
    return dict(
        x=_rand(gen, rows, 4, 3),
        dt=torch.rand(rows, 4, generator=gen, dtype=F64) * 0.5,
        A=-torch.rand(4, generator=gen, dtype=F64) - 0.1,
        B=_rand(gen, rows, 2, 5),
        C=_rand(gen, rows, 2, 5),
        D=_rand(gen, 4),
    )


PER_ROW = {"conv": ("x",), "gdn": ("q", "k", "v", "g", "beta"), "scan": ("x", "dt", "B", "C")}


def _packed(kind, t, prev):
    if kind == "conv":
        return kernels.causal_conv1d(t["x"], t["weight"], t["bias"], prev, silu=True)
    if kind == "gdn":
        return kernels.gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], prev)
    return kernels.selective_scan(t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], prev)


def _reference(kind, t, rows):
    s = {n: (t[n][rows] if n in PER_ROW[kind] else t[n]) for n in t}
    if kind == "conv":
        return conv_ref(s["x"], s["weight"], s["bias"], silu=True)
    if kind == "gdn":
        return gated_delta_ref(s["q"], s["k"], s["v"], s["g"], s["beta"])
    return selective_scan_ref(s["x"], s["dt"], s["A"], s["B"], s["C"], s["D"])


def _leaves(t):
    return {n: v.clone().requires_grad_(True) for n, v in t.items()}


def _compare(kind, seed, rows, prev, paths):
    """Largest difference between the packed kernel and the reference run on each path (rows of
    one sequence or rollout): outputs at every path's rows, then every gradient of
    sum_paths <c_path, out[path]> with random cotangents."""
    gen = torch.Generator().manual_seed(seed)
    base = _inputs(gen, rows, kind)
    packed_in, ref_in = _leaves(base), _leaves(base)
    out = _packed(kind, packed_in, prev)
    worst, loss_p, loss_r = 0.0, 0.0, 0.0
    for rows_of in paths:
        ref = _reference(kind, ref_in, rows_of)
        got = out[rows_of]
        worst = max(worst, float((got - ref).detach().abs().max()))
        c = _rand(gen, *ref.shape)
        loss_p = loss_p + (c * got).sum()
        loss_r = loss_r + (c * ref).sum()
    loss_p.backward()
    loss_r.backward()
    for n in base:
        worst = max(worst, float((packed_in[n].grad - ref_in[n].grad).abs().max()))
    return worst


def _flat(lengths):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    paths = [torch.arange(cu[b], cu[b + 1]) for b in range(len(lengths)) if lengths[b] > 0]
    return cu, paths


def _forest(gen, trees, shape):
    """Node rows (preorder, trees one after another), parents and leaves of random trees: "grpo"
    (a prompt and 8 completions), "turns" (3 levels, 2-3 branches each)."""
    begin, end, parent = [], [], []

    def node(p, lo, hi):
        n = len(begin)
        length = int(torch.randint(lo, hi, (1,), generator=gen))
        start = end[-1] if end else 0
        begin.append(start)
        end.append(start + length)
        parent.append(p)
        return n

    def grow(p, depth):
        for _ in range(int(torch.randint(2, 4, (1,), generator=gen))):
            c = node(p, 1, 6)
            if depth < 2:
                grow(c, depth + 1)

    for _ in range(trees):
        root = node(-1, 2, 9)
        if shape == "grpo":
            for _ in range(8):
                node(root, 1, 7)
        else:
            grow(root, 0)
    children = set(parent)
    leaves = [n for n in range(len(begin)) if n not in children]
    return begin, end, parent, leaves


KINDS = ["conv", "gdn", "scan"]


@pytest.mark.parametrize("kind", KINDS)
def test_flat_rows_equal_each_sequence_on_its_own(kind):
    cu, paths = _flat([7, 1, 0, 12, 5, 3])
    prev = kernels.flat_prev_rows(cu)
    assert _compare(kind, 1, int(cu[-1]), prev, paths) < TOL


@pytest.mark.parametrize("kind", KINDS)
def test_flat_row_that_inherits_its_predecessors_state_is_caught(kind):
    cu, paths = _flat([6, 9, 4])
    prev = kernels.flat_prev_rows(cu)
    prev[cu[1]] = cu[1] - 1  # the second sequence continues the first one's state
    assert _compare(kind, 2, int(cu[-1]), prev, paths) > 1e-3


@pytest.mark.parametrize("shape", ["grpo", "turns"])
@pytest.mark.parametrize("kind", KINDS)
def test_trees_equal_each_rollout_on_its_own(kind, shape):
    gen = torch.Generator().manual_seed(3)
    begin, end, parent, leaves = _forest(gen, 2, shape)
    prev = kernels.tree_prev_rows(begin, end, parent, end[-1])
    paths = rollout_paths(begin, end, parent, leaves)
    assert _compare(kind, 4, end[-1], prev, paths) < TOL


@pytest.mark.parametrize("kind", KINDS)
def test_child_starting_from_zero_state_is_caught(kind):
    gen = torch.Generator().manual_seed(5)
    begin, end, parent, leaves = _forest(gen, 1, "turns")
    prev = kernels.tree_prev_rows(begin, end, parent, end[-1])
    paths = rollout_paths(begin, end, parent, leaves)
    broken = prev.copy()
    broken[[b for b, p in zip(begin, parent) if p >= 0]] = -1
    assert _compare(kind, 6, end[-1], broken, paths) > 1e-3
    flat_shared_prefix = np.arange(-1, end[-1] - 1, dtype=np.int32)  # rows in order, one sequence
    flat_shared_prefix[0] = -1
    assert _compare(kind, 6, end[-1], flat_shared_prefix, paths) > 1e-3


def test_float32_follows_float64():
    gen = torch.Generator().manual_seed(7)
    begin, end, parent, _ = _forest(gen, 1, "grpo")
    prev = kernels.tree_prev_rows(begin, end, parent, end[-1])
    t = _inputs(gen, end[-1], "gdn")
    f64 = kernels.gated_delta_rule(*(t[n] for n in PER_ROW["gdn"]), prev)
    f32 = kernels.gated_delta_rule(*(t[n].float() for n in PER_ROW["gdn"]), prev)
    assert f32.dtype == torch.float32
    assert float((f32.double() - f64).abs().max()) < 1e-5


def test_prev_rows_layouts():
    assert kernels.flat_prev_rows([0, 2, 2, 5], total=7).tolist() == [-1, 0, -1, 2, 3, -1, 5]
    # root [0, 3), children [3, 5) and [5, 6) of the root, grandchild [6, 8) of the first child
    prev = kernels.tree_prev_rows([0, 3, 6, 5], [3, 5, 8, 6], [-1, 0, 1, 0], 9)
    assert prev.tolist() == [-1, 0, 1, 2, 3, 2, 4, 6, -1]
    # the root's end (row 2) waits for row 5, the first child's end (row 4) for row 6: both are
    # held at row 5; in depth-first preorder (grandchild right after its parent) only the root's
    assert kernels.states_alive(prev) == 2
    preorder = kernels.tree_prev_rows([0, 3, 5, 7], [3, 5, 7, 8], [-1, 0, 1, 0], 8)
    assert preorder.tolist() == [-1, 0, 1, 2, 3, 4, 5, 2]
    assert kernels.states_alive(preorder) == 1
    assert kernels.states_alive(kernels.flat_prev_rows([0, 4, 9])) == 0
    with pytest.raises(ValueError, match="node 1"):
        kernels.tree_prev_rows([0, 2], [3, 4], [-1, 0], 4)


def test_bad_prev_row_names_the_row():
    x = torch.zeros(4, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"prev_row\[2\] = 2"):
        kernels.causal_conv1d(x, torch.zeros(2, 3, dtype=F64), None, [-1, 0, 2, 1])
    q = torch.zeros(3, 1, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"prev_row\[0\] = -2"):
        kernels.gated_delta_rule(q, q, q, torch.zeros(3, 1, dtype=F64), None, [-2, 0, 1])
    with pytest.raises(ValueError, match="weight"):
        kernels.causal_conv1d(x, torch.zeros(2, 9, dtype=F64), None, [-1, 0, 1, 2])


def test_reference_is_transformers_gated_delta_rule():
    """The definition equals Qwen3-Next's recurrent and chunked pure-torch functions on single
    sequences (they compute in float32, hence 1e-6)."""
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    gen = torch.Generator().manual_seed(8)
    length, heads, kd, vd = 45, 2, 8, 6
    q, k, v = (
        _rand(gen, length, heads, kd),
        _rand(gen, length, heads, kd),
        _rand(gen, length, heads, vd),
    )
    g = -torch.rand(length, heads, generator=gen, dtype=F64)
    beta = torch.rand(length, heads, generator=gen, dtype=F64)
    ours = gated_delta_ref(qwen3_next.l2norm(q) * kd**-0.5, qwen3_next.l2norm(k), v, g, beta)
    args = (q[None], k[None], v[None], g[None], beta[None])
    recurrent, _ = qwen3_next.torch_recurrent_gated_delta_rule(
        *args, None, False, use_qk_l2norm_in_kernel=True
    )
    chunked, _ = qwen3_next.torch_chunk_gated_delta_rule(
        *args, chunk_size=16, use_qk_l2norm_in_kernel=True
    )
    for theirs in (recurrent, chunked):
        assert float((theirs[0].double() - ours).abs().max()) < 1e-6
    packed = kernels.gated_delta_rule(
        qwen3_next.l2norm(q) * kd**-0.5, qwen3_next.l2norm(k), v, g, beta, [-1] + list(range(44))
    )
    assert float((packed - ours).abs().max()) < TOL


def test_selective_scan_and_conv_are_transformers_mamba2_mixer():
    """Mamba-2's mixer built from causal_conv1d and selective_scan equals transformers'
    Mamba2Mixer.torch_forward (its chunked SSD in float32, hence 1e-5) on one sequence."""
    mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    from transformers import Mamba2Config

    cfg = Mamba2Config(
        hidden_size=16, num_heads=4, head_dim=8, n_groups=2, state_size=5, conv_kernel=4,
        chunk_size=8, use_conv_bias=True, expand=2,
    )  # fmt: skip
    torch.manual_seed(9)
    mixer = mamba2.Mamba2Mixer(cfg, layer_idx=0).double()
    with torch.no_grad():
        for p in (mixer.D, mixer.dt_bias, mixer.conv1d.bias):
            p.normal_()
    x = torch.randn(1, 21, 16, dtype=F64)
    theirs = mixer.torch_forward(x)[0]

    heads, hd, gn = 4, 8, 2 * 5
    gate, xbc, dt = mixer.in_proj(x[0]).split([heads * hd, mixer.conv_dim, heads], dim=-1)
    prev = kernels.flat_prev_rows([0, 21])
    xbc = kernels.causal_conv1d(xbc, mixer.conv1d.weight[:, 0], mixer.conv1d.bias, prev)
    xs, B, C = xbc.split([heads * hd, gn, gn], dim=-1)
    y = kernels.selective_scan(
        xs.reshape(21, heads, hd),
        torch.nn.functional.softplus(dt + mixer.dt_bias),
        -mixer.A_log.exp(),
        B.reshape(21, 2, 5),
        C.reshape(21, 2, 5),
        mixer.D,
        prev,
    )
    ours = mixer.out_proj(mixer.norm(y.reshape(21, heads * hd), gate))
    error = float((ours - theirs).detach().abs().max())
    assert error < 1e-5 * max(1.0, float(theirs.detach().abs().max()))


@pytest.mark.skipif(
    not (torch.cuda.is_available() and kernels.built_with_cuda()),
    reason="needs a GPU and the CUDA backend",
)
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_equals_cpu(kind):
    gen = torch.Generator().manual_seed(10)
    begin, end, parent, leaves = _forest(gen, 2, "turns")
    prev = kernels.tree_prev_rows(begin, end, parent, end[-1])
    base = _inputs(gen, end[-1], kind)
    results = []
    for device in ("cpu", "cuda"):
        leaves_ = {n: v.to(device).requires_grad_(True) for n, v in base.items()}
        out = _packed(kind, leaves_, prev)
        out.backward(torch.ones_like(out))
        results.append([out.detach().cpu()] + [leaves_[n].grad.cpu() for n in base])
    for cpu, gpu in zip(*results):
        assert float((cpu - gpu).abs().max()) < 1e-12


def test_micro_batch_prev_rows_follow_every_planned_rollout():
    """Over a real forest plan (split trees included), each rollout's rows chain through
    prev_row: its first row starts from zero and every later row continues the row before it in
    the rollout."""
    from packsched import planner
    from packsched.tree import build_forest

    gen = np.random.default_rng(12)
    rollouts, groups = [], []
    for g in range(3):
        prompt = list(gen.integers(0, 50, 40))
        for _ in range(6):
            turn = list(gen.integers(0, 50, int(gen.integers(5, 30))))
            rollouts.append(prompt + turn + list(gen.integers(0, 50, int(gen.integers(1, 20)))))
            groups.append(g)
    forest = build_forest(rollouts, groups)
    plan = planner.plan_local(forest, 160, progress=False)
    checked = 0
    for mb in plan.micro_batches:
        prev = kernels.micro_batch_prev_rows(mb, forest)
        for i in range(len(mb.rollouts)):
            rows = mb.rollout_rows(forest, i)
            assert prev[rows[0]] == -1
            assert prev[rows[1:]].tolist() == rows[:-1].tolist()
            checked += 1
    assert checked >= len(rollouts) and len(plan.micro_batches) >= 2
