"""packsched.kernels' torch path as torch.library custom ops (packsched._torch_ops): opcheck on
every op (float32, float64, bfloat16), the public functions equal to the numpy direct path bit for
bit, a packed transformer block under torch.compile(fullgraph=True) with no graph break and the
eager values and gradients (aot_eager, inductor), one graph per batch size under dynamic shapes,
DLPack exchange (bfloat16 on the CPU included), and dtypes the kernels refuse by name."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch._dynamo.testing

import packsched
from packsched import _ops_attention, _ops_loss, kernels

OPS = torch.ops.packsched

OP_NAMES = [
    "varlen_attention_forward",
    "varlen_attention_backward",
    "tree_attention_forward",
    "tree_attention_backward",
    "packed_cross_entropy",
    "packed_cross_entropy_backward",
    "multi_target_cross_entropy",
    "multi_target_cross_entropy_backward",
    "unpad",
    "pad",
    "pack_aligned",
    "unpack_aligned",
    "position_ids",
    "shift_labels",
    "tree_position_ids",
]

FLOATS = [torch.float32, torch.float64, torch.bfloat16]

# Four sequences, one empty; host offsets as the plan gives them.
LENGTHS = [5, 0, 9, 3]
HOST = [0, 5, 5, 14, 17]

# A tree-packed micro-batch of two pieces: piece 0 is a prompt (rows 0-1) with two branches (rows
# 2-3 and 4-5), in depth-first preorder; piece 1 is a flat sequence (rows 6-9).
TREE_HOST = [0, 6, 10]
TREE_SUBTREE_END = [6, 6, 4, 4, 6, 6, 10, 10, 10, 10]
TREE_DEPTHS = [0, 1, 2, 3, 2, 3, 0, 1, 2, 3]


def cu_tensor(host):
    return torch.tensor(host, dtype=torch.int32)


def randn(*shape, dtype, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return x.requires_grad_() if grad else x


def varlen_layout(host=HOST, total=None, window=(-1, -1), softcap=0.0, seqused=None):
    """The layout arguments of packsched::varlen_attention_* in schema order."""
    cu = cu_tensor(host)
    left, right = window
    max_len = max(b - a for a, b in zip(host, host[1:]))
    return (
        cu,
        cu,
        max_len,
        max_len,
        None,
        True,
        left,
        right,
        softcap,
        seqused,
        seqused,
        host,
        host,
        total,
        total,
    )


def tree_layout():
    return (
        cu_tensor(TREE_HOST),
        6,
        torch.tensor(TREE_SUBTREE_END, dtype=torch.int32),
        torch.tensor(TREE_DEPTHS, dtype=torch.int32),
        None,
        2,
        0.0,
        None,
        TREE_HOST,
        None,
    )


def op_cases(dtype):
    """(op name, args) for opcheck: every op, differentiable inputs requiring grad."""
    cases = []
    qkv = [randn(17, h, 16, dtype=dtype, seed=i, grad=True) for i, h in enumerate((4, 2, 2))]
    for layout in (
        varlen_layout(),
        varlen_layout(window=(3, 0), softcap=2.0),
        varlen_layout(total=20),  # a tail of 3 rows
    ):
        rows = 17 if layout[-1] is None else layout[-1]
        q, k, v = (
            randn(rows, x.shape[1], 16, dtype=dtype, seed=7 + i, grad=True)
            for i, x in enumerate(qkv)
        )
        cases.append(("varlen_attention_forward", (q, k, v, *layout)))
        out, lse = OPS.varlen_attention_forward(q.detach(), k.detach(), v.detach(), *layout)
        dout = randn(*out.shape, dtype=dtype, seed=3)
        q, k, v = q.detach(), k.detach(), v.detach()  # the backward ops have no gradient
        cases.append(("varlen_attention_backward", (dout, q, k, v, out, lse, *layout)))
    no_host = list(varlen_layout())
    no_host[11] = no_host[12] = None  # the implementation reads the offsets tensor
    cases.append(("varlen_attention_forward", (*qkv, *no_host)))
    # Aligned layout: padded offsets with the real lengths in seqused.
    padded = kernels.aligned_cu_seqlens(HOST, 4)
    seqused = torch.tensor(LENGTHS, dtype=torch.int32)
    aligned = varlen_layout(host=padded, seqused=seqused)
    q, k, v = (randn(padded[-1], h, 16, dtype=dtype, seed=11, grad=True) for h in (4, 2, 2))
    cases.append(("varlen_attention_forward", (q, k, v, *aligned)))

    tq, tk, tv = (randn(10, h, 16, dtype=dtype, seed=20 + h, grad=True) for h in (4, 2, 2))
    cases.append(("tree_attention_forward", (tq, tk, tv, *tree_layout())))
    out, lse = OPS.tree_attention_forward(tq.detach(), tk.detach(), tv.detach(), *tree_layout())
    dout = randn(*out.shape, dtype=dtype, seed=4)
    tq, tk, tv = tq.detach(), tk.detach(), tv.detach()
    cases.append(("tree_attention_backward", (dout, tq, tk, tv, out, lse, *tree_layout())))

    logits = randn(17, 11, dtype=dtype, seed=5, grad=True)
    ids = torch.randint(0, 11, (17,), generator=torch.Generator().manual_seed(6))
    labels = kernels.shift_labels(ids, cu_tensor(HOST))
    cases.append(("packed_cross_entropy", (logits, labels, cu_tensor(HOST), -100, HOST, None)))
    cases.append(("packed_cross_entropy", (logits, labels, cu_tensor(HOST), -100, None, None)))
    tail_logits = randn(20, 11, dtype=dtype, seed=8, grad=True)
    tail_labels = torch.cat([labels, torch.full((3,), -100)])
    cases.append(
        ("packed_cross_entropy", (tail_logits, tail_labels, cu_tensor(HOST), -100, HOST, 20))
    )
    d_loss, d_sums = randn(17, dtype=dtype, seed=9), randn(4, dtype=dtype, seed=10)
    cases.append(
        (
            "packed_cross_entropy_backward",
            (logits.detach(), labels, cu_tensor(HOST), -100, HOST, d_loss, d_sums),
        )
    )

    rows = torch.tensor([0, 0, 2, 5, 5, 5, 9])
    targets = torch.tensor([1, 3, 0, 10, 2, 7, 4])
    mt_logits = randn(10, 11, dtype=dtype, seed=12, grad=True)
    cases.append(("multi_target_cross_entropy", (mt_logits, rows, targets)))
    _, row_lse = OPS.multi_target_cross_entropy(mt_logits.detach(), rows, targets)
    d_loss = randn(7, dtype=torch.float32, seed=13)
    cases.append(
        (
            "multi_target_cross_entropy_backward",
            (mt_logits.detach(), row_lse, rows, targets, d_loss),
        )
    )

    x = randn(4, 6, 3, dtype=dtype, seed=14)
    mask = torch.tensor(
        [[1, 1, 0, 1, 0, 0], [0] * 6, [1] * 6, [0, 0, 0, 0, 1, 1]], dtype=torch.bool
    )
    mask_host = [0, 3, 3, 9, 11]
    cases.append(("unpad", (x, mask, cu_tensor(mask_host), mask_host)))
    packed = randn(11, 3, dtype=dtype, seed=15)
    indices = torch.nonzero(mask.flatten()).squeeze(1)
    cases.append(("pad", (packed, indices, 4, 6)))
    x_packed = randn(17, 3, dtype=dtype, seed=16)
    cases.append(("pack_aligned", (x_packed, cu_tensor(HOST), HOST, 4, 0.5, None)))
    cases.append(("pack_aligned", (x_packed, cu_tensor(HOST), HOST, 4, -1.0, padded[-1] + 5)))
    x_aligned = randn(padded[-1], 3, dtype=dtype, seed=17)
    cases.append(
        ("unpack_aligned", (x_aligned, cu_tensor(HOST), cu_tensor(padded), HOST, padded, None))
    )
    cases.append(("position_ids", (cu_tensor(HOST), HOST, None)))
    cases.append(("position_ids", (cu_tensor(HOST), None, 21)))
    cases.append(("shift_labels", (ids, cu_tensor(HOST), -100, None, HOST, None, None)))
    ids_aligned = torch.arange(padded[-1])
    cases.append(
        ("shift_labels", (ids_aligned, cu_tensor(HOST), -1, cu_tensor(padded), HOST, padded, None))
    )
    subtree_end = torch.tensor(TREE_SUBTREE_END, dtype=torch.int32)
    cases.append(("tree_position_ids", (cu_tensor(TREE_HOST), subtree_end, TREE_HOST, None)))
    cases.append(("tree_position_ids", (cu_tensor(TREE_HOST), subtree_end, None, 10)))
    return cases


def test_the_namespace_holds_exactly_the_ops():
    defined = {name for name in dir(OPS) if hasattr(getattr(OPS, name), "default")}
    assert defined == set(OP_NAMES)
    covered = {name for name, _ in op_cases(torch.float32)}
    assert covered == set(OP_NAMES)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_opcheck_every_op(dtype):
    """Schema (no aliasing, no mutation), autograd registration, the fake against the real
    outputs, and AOTAutograd with dynamic shapes (values and gradients)."""
    for name, args in op_cases(dtype):
        result = torch.library.opcheck(getattr(OPS, name).default, args)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


# ---- The public functions on torch tensors equal the numpy direct path, bit for bit ----


def both(fn, *arrays, **kw):
    """(fn on the numpy arrays, fn on torch tensors of them)."""
    want = fn(*arrays, **kw)
    got = fn(*(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in arrays), **kw)
    return want, got


def assert_same(want, got):
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        if isinstance(w, np.ndarray):
            assert isinstance(g, torch.Tensor) and not g.requires_grad
            np.testing.assert_array_equal(g.numpy(), w)
            assert g.numpy().dtype == w.dtype
        else:
            assert g == w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_public_functions_equal_the_numpy_path(dtype):
    rng = np.random.default_rng(0)
    cu = np.array(HOST, np.int32)
    q = rng.standard_normal((17, 4, 16)).astype(dtype)
    k, v = (rng.standard_normal((17, 2, 16)).astype(dtype) for _ in range(2))
    kw = dict(causal=True, window_size=(4, -1), softcap=1.5, cu_seqlens_q_host=HOST)
    fwd_want, fwd_got = both(kernels.varlen_attention_forward, q, k, v, cu, cu, 9, 9, **kw)
    assert_same(fwd_want, fwd_got)
    dout = rng.standard_normal(q.shape).astype(dtype)
    out, lse = fwd_want
    assert_same(*both(kernels.varlen_attention_backward, dout, q, k, v, out, lse, cu, cu, 9, 9))
    assert_same(*both(kernels.varlen_attention, q, k, v, cu, cu, 9, 9, causal=True))

    tree_cu = np.array(TREE_HOST, np.int32)
    subtree_end = np.array(TREE_SUBTREE_END, np.int32)
    depths = np.array(TREE_DEPTHS, np.int32)
    tq, tk, tv = (x[:10] for x in (q, k, v))
    tree_kw = dict(window_left=2, return_lse=True)
    assert_same(
        *both(kernels.tree_attention, tq, tk, tv, tree_cu, 6, subtree_end, depths, **tree_kw)
    )
    assert_same(*both(kernels.tree_position_ids, tree_cu, subtree_end))

    logits = rng.standard_normal((17, 11)).astype(dtype)
    ids = rng.integers(0, 11, 17)
    labels = kernels.shift_labels(ids, cu)
    assert_same(*both(kernels.shift_labels, np.concatenate([ids, [7, 7, 7]]), cu, total=20))
    assert_same(*both(kernels.packed_cross_entropy, logits, labels, cu))
    rows, targets = np.array([0, 0, 2, 5, 9]), np.array([1, 3, 0, 10, 4])
    assert_same(*both(kernels.multi_target_cross_entropy, logits, rows, targets))

    x = rng.standard_normal((4, 6, 3)).astype(dtype)
    mask = rng.random((4, 6)) < 0.5
    unpadded = kernels.unpad(x, mask)
    assert_same(*both(kernels.unpad, x, mask))
    assert_same(*both(kernels.pad, unpadded[0], unpadded[1], 4, 6))
    x_packed = logits[:, :3]
    aligned = kernels.pack_aligned(x_packed, cu, 4, 0.25, total=32)
    assert_same(*both(kernels.pack_aligned, np.ascontiguousarray(x_packed), cu, 4, 0.25, total=32))
    assert_same(*both(kernels.unpack_aligned, aligned[0], cu, aligned[1], total=32))
    assert_same(*both(kernels.position_ids, cu))
    assert_same(*both(kernels.position_ids, aligned[1], total=32))


def test_gradients_equal_the_numpy_backward():
    """varlen_attention's gradient (through packsched::varlen_attention_backward) is what the
    numpy varlen_attention_backward gives, bitwise."""
    rng = np.random.default_rng(1)
    cu = np.array(HOST, np.int32)
    q, k, v = (rng.standard_normal((17, h, 16)).astype(np.float32) for h in (4, 2, 2))
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = kernels.varlen_attention_forward(q, k, v, cu, cu, 9, 9, causal=True)
    want = kernels.varlen_attention_backward(dout, q, k, v, out, lse, cu, cu, 9, 9, causal=True)
    tensors = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    got = kernels.varlen_attention(*tensors, torch.from_numpy(cu), cu, 9, 9, causal=True)
    got.backward(torch.from_numpy(dout))
    for w, t in zip(want, tensors):
        np.testing.assert_array_equal(t.grad.numpy(), w)


DIFFERENTIABLE = [name for name in OP_NAMES[:8] if not name.endswith("_backward")]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_eager_and_registered_autograd_agree(dtype):
    """Eager calls with a gradient run the ops' setup_context and backward in an
    autograd.Function (_torch_args.differentiable), traced ones the registered autograd (which
    opcheck checks): the same gradients, bitwise."""
    eager = {
        "varlen_attention_forward": _ops_attention._varlen_forward,
        "tree_attention_forward": _ops_attention._tree_forward,
        "packed_cross_entropy": _ops_loss._packed_cross_entropy_call,
        "multi_target_cross_entropy": _ops_loss._multi_target_call,
    }
    assert sorted(eager) == sorted(DIFFERENTIABLE)
    for name, args in op_cases(dtype):
        if name not in eager:
            continue
        grads = []
        for registered in (False, True):
            call = getattr(OPS, name) if registered else eager[name]
            inputs = [
                a.detach().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a
                for a in args
            ]
            outputs = call(*inputs)
            grad_fn = type(outputs[0].grad_fn).__name__
            assert grad_fn.startswith("GeneratedBackward") == registered, grad_fn
            assert not outputs[-1].requires_grad  # lse, counts, row_lse
            weight = randn(*outputs[0].shape, dtype=outputs[0].dtype, seed=1)
            leaves = [a for a in inputs if torch.is_tensor(a) and a.requires_grad]
            grads.append(torch.autograd.grad((outputs[0].float() * weight.float()).sum(), leaves))
        assert all(torch.equal(a, b) for a, b in zip(*grads)), name


# ---- torch.compile of a model that uses the kernels ----

EMBED, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4, 2, 8, 50


class PackedBlock(torch.nn.Module):
    """A tiny causal LM on packed rows: unpad of a padded batch of ids, token and position
    embeddings, GQA varlen attention, an MLP, the head, shifted labels and the packed cross
    entropy (mean over counted tokens); also returns the hidden states padded back."""

    def __init__(self, dtype):
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def w(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=dtype) / shape[0])

        self.tok, self.pos = w(VOCAB, EMBED), w(64, EMBED)
        self.wq, self.wk = w(EMBED, HEADS * HEAD_DIM), w(EMBED, KV_HEADS * HEAD_DIM)
        self.wv, self.wo = w(EMBED, KV_HEADS * HEAD_DIM), w(HEADS * HEAD_DIM, EMBED)
        self.w1, self.w2, self.head = w(EMBED, 64), w(64, EMBED), w(EMBED, VOCAB)

    def forward(self, ids_padded, mask, cu, host):
        ids, indices, cu, max_len, _ = kernels.unpad(ids_padded, mask, cu, host)
        t = ids.shape[0]
        x = self.tok[ids] + self.pos[kernels.position_ids(cu, cu_seqlens_host=host)]
        q = (x @ self.wq).view(t, HEADS, HEAD_DIM)
        k = (x @ self.wk).view(t, KV_HEADS, HEAD_DIM)
        v = (x @ self.wv).view(t, KV_HEADS, HEAD_DIM)
        attn = kernels.varlen_attention(
            q, k, v, cu, cu, max_len, max_len, causal=True, cu_seqlens_q_host=host
        )
        h = x + attn.reshape(t, HEADS * HEAD_DIM) @ self.wo
        h = h + torch.nn.functional.gelu(h @ self.w1) @ self.w2
        labels = kernels.shift_labels(ids, cu, cu_seqlens_host=host)
        _, sums, counts = kernels.packed_cross_entropy(h @ self.head, labels, cu)
        loss = sums.sum() / counts.sum()
        return loss, kernels.pad(h, indices, *ids_padded.shape)


def packed_batch(lengths, seqlen, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (len(lengths), seqlen), generator=g)
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    host = [0]
    for n in lengths:
        host.append(host[-1] + n)
    return ids, mask, cu_tensor(host), host


def run_block(model, fn, batch):
    model.zero_grad()
    loss, padded = fn(*batch)
    loss.backward()
    return loss.detach(), padded, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_block_compiles_with_no_graph_break():
    model = PackedBlock(torch.float64)
    batch = packed_batch([7, 1, 0, 12, 4], 15, seed=0)
    explained = torch._dynamo.explain(model)(*batch)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    # Without host offsets the attention and the loss read the offsets tensor inside their ops,
    # so they still make one graph (unlike unpad and position_ids, whose output lengths are
    # offsets: they read the tensor before the op).
    torch._dynamo.reset()

    def no_host_attention(q, k, v, cu, labels, logits):
        out = kernels.varlen_attention(q, k, v, cu, cu, 12, 12, causal=True)
        return out, kernels.packed_cross_entropy(logits, labels, cu)

    q, k, v = (randn(24, h, HEAD_DIM, dtype=torch.float32, seed=h) for h in (4, 2, 2))
    labels = torch.randint(0, 5, (24,))
    explained = torch._dynamo.explain(no_host_attention)(
        q, k, v, batch[2], labels, randn(24, 5, dtype=torch.float32, seed=1)
    )
    assert explained.graph_break_count == 0 and explained.graph_count == 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_compiled_block_equals_eager(backend):
    """fullgraph=True fails on any graph break. aot_eager runs the same ops as eager (bitwise
    equal); inductor (C++ code generated and built with g++ on the CPU) may reorder the
    arithmetic of the matmuls and the MLP around the kernels, so float64 agrees to 1e-12."""
    model = PackedBlock(torch.float64)
    batch = packed_batch([7, 1, 0, 12, 4], 15, seed=0)
    want_loss, want_padded, want_grads = run_block(model, model, batch)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    loss, padded, grads = run_block(model, compiled, batch)
    tol = dict(rtol=0, atol=0) if backend == "aot_eager" else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, want_loss, **tol)
    torch.testing.assert_close(padded, want_padded, **tol)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], **tol, msg=name)
    assert all(g.abs().sum() > 0 for g in grads.values())


@pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 5),
    reason="torch 2.4's dynamo compiles a second graph for the second layout",
)
def test_one_graph_serves_every_layout_with_the_same_batch_size():
    """dynamic=True: host offsets, lengths and max_seqlen are symbolic, so new layouts of B
    sequences reuse the graph; a new B (the list's length) compiles once more. (The first
    compile may call the backend twice: dynamo restarts its analysis once to specialize the
    float defaults, such as softcap = 0.0, that it first made symbolic.)"""
    model = PackedBlock(torch.float64)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    compiles = None
    for seed, lengths in enumerate(([7, 1, 0, 12, 4], [3, 9, 2, 5, 14], [15, 15, 6, 2, 8])):
        batch = packed_batch(lengths, 15, seed)
        loss, padded = compiled(*batch)
        want_loss, want_padded = model(*batch)
        assert torch.equal(loss, want_loss) and torch.equal(padded, want_padded)
        compiles = compiles or counter.frame_count
        assert counter.frame_count == compiles
    compiled(*packed_batch([4, 2, 6], 15, seed=9))
    assert counter.frame_count > compiles


class TreeBlock(torch.nn.Module):
    """Tree attention over the depths' embeddings and the multi-target loss of one target per
    row (the next row's token), summed with weights."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.pos = torch.nn.Parameter(torch.randn(8, HEADS * HEAD_DIM, generator=g))
        self.head = torch.nn.Parameter(torch.randn(HEADS * HEAD_DIM, VOCAB, generator=g))

    def forward(self, x, cu, subtree_end, rows, targets, weights):
        t = x.shape[0]
        depth = kernels.tree_position_ids(cu, subtree_end, cu_seqlens_host=TREE_HOST)
        h = (x + self.pos[depth]).view(t, HEADS, HEAD_DIM)
        out = kernels.tree_attention(
            h, h, h, cu, 6, subtree_end, depth.int(), window_left=2, cu_seqlens_host=TREE_HOST
        )
        loss = kernels.multi_target_cross_entropy(out.reshape(t, -1) @ self.head, rows, targets)
        return (loss * weights).sum()


def test_a_compiled_tree_block_equals_eager():
    model = TreeBlock()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(10, HEADS * HEAD_DIM, generator=g, requires_grad=True)
    rows = torch.tensor([0, 1, 1, 2, 4, 6, 7, 8])
    args = (
        cu_tensor(TREE_HOST),
        torch.tensor(TREE_SUBTREE_END, dtype=torch.int32),
        rows,
        torch.randint(0, VOCAB, (8,), generator=g),
        torch.rand(8, generator=g),
    )
    want = model(x, *args)
    want_grads = torch.autograd.grad(want, [x, *model.parameters()])
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(x, *args)
    got_grads = torch.autograd.grad(got, [x, *model.parameters()])
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))


# ---- DLPack and dtypes ----


def test_cpu_kernels_take_every_float_dtype_torch_has_for_them():
    """float16, bfloat16, float32 and float64 run on the CPU (attention, both losses), against
    float64 within the dtype's rounding; the lse and the multi-target loss stay float32."""
    q64, k64, v64 = (randn(17, h, 16, dtype=torch.float64, seed=h) for h in (4, 2, 2))
    cu = cu_tensor(HOST)
    want, _ = kernels.varlen_attention(q64, k64, v64, cu, cu, 9, 9, causal=True, return_lse=True)
    logits64 = randn(17, 11, dtype=torch.float64, seed=3)
    labels = kernels.shift_labels(torch.arange(17) % 11, cu)
    want_ce = kernels.packed_cross_entropy(logits64, labels, cu)[1]
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 5e-2), (torch.float32, 1e-5)):
        q, k, v = (x.to(dtype).requires_grad_() for x in (q64, k64, v64))
        out, lse = kernels.varlen_attention(q, k, v, cu, cu, 9, 9, causal=True, return_lse=True)
        assert out.dtype == dtype and lse.dtype == torch.float32
        torch.testing.assert_close(out.double(), want, rtol=0, atol=tol)
        out.sum().backward()
        assert all(x.grad.dtype == dtype for x in (q, k, v))
        sums = kernels.packed_cross_entropy(logits64.to(dtype), labels, cu)[1]
        assert sums.dtype == dtype
        torch.testing.assert_close(sums.double(), want_ce, rtol=tol, atol=tol)
        rows = torch.arange(17)
        mt = kernels.multi_target_cross_entropy(logits64.to(dtype), rows, rows % 11)
        want_mt = kernels.multi_target_cross_entropy(logits64, rows, rows % 11)
        assert mt.dtype == torch.float32
        torch.testing.assert_close(mt.double(), want_mt, rtol=tol, atol=tol)


def test_bfloat16_under_compile_equals_eager():
    model = PackedBlock(torch.bfloat16)
    batch = packed_batch([7, 1, 0, 12, 4], 15, seed=3)
    want = run_block(model, model, batch)
    torch._dynamo.reset()
    got = run_block(model, torch.compile(model, backend="aot_eager", fullgraph=True), batch)
    assert got[0].dtype == torch.bfloat16
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(torch.equal(got[2][n], want[2][n]) for n in want[2])


class HostProducer:
    """A DLPack producer that is neither torch nor numpy (another library's CPU array)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kw):
        return self.tensor.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def test_dlpack_exchange_both_ways():
    # numpy results taken by torch.from_dlpack without a copy, torch results by numpy.
    x = np.random.default_rng(4).standard_normal((17, 3)).astype(np.float32)
    aligned, _, _ = kernels.pack_aligned(x, np.array(HOST, np.int32), 4)
    as_torch = torch.from_dlpack(aligned)
    assert as_torch.data_ptr() == aligned.ctypes.data
    got, _, _ = kernels.pack_aligned(torch.from_dlpack(x), cu_tensor(HOST), 4)
    np.testing.assert_array_equal(np.from_dlpack(got), aligned)
    # A bfloat16 array of another library: numpy cannot take bfloat16, torch does.
    bf16 = randn(17, 4, 16, dtype=torch.bfloat16, seed=5)
    cu = cu_tensor(HOST)
    qkv = (bf16, bf16[:, :2], bf16[:, 2:])
    out = kernels.varlen_attention_forward(*map(HostProducer, qkv), cu, cu, 9, 9)[0]
    want = kernels.varlen_attention_forward(*qkv, cu, cu, 9, 9)[0]
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    # Mixed: torch q with numpy k and v (converted with torch.from_dlpack); q keeps its grad.
    q = randn(17, 4, 16, dtype=torch.float32, seed=6, grad=True)
    k, v = (
        np.random.default_rng(i).standard_normal((17, 2, 16)).astype(np.float32) for i in (7, 8)
    )
    out = kernels.varlen_attention(q, k, v, cu, cu, 9, 9, causal=True)
    want = kernels.varlen_attention(q, *map(torch.from_numpy, (k, v)), cu, cu, 9, 9, causal=True)
    assert torch.equal(out, want)
    out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


REFUSED = [torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", REFUSED, ids=str)
def test_refused_dtypes_raise_value_error_naming_them(dtype):
    name = str(dtype).removeprefix("torch.")
    x = torch.zeros(17, 4, 16).to(dtype)
    cu, ids = cu_tensor(HOST), torch.zeros(17, dtype=torch.int64)
    calls = [
        ("VarlenAttentionForward", "q", lambda: kernels.varlen_attention(x, x, x, cu, cu, 9, 9)),
        ("PackedCrossEntropy", "logits", lambda: kernels.packed_cross_entropy(x[:, 0], ids, cu)),
        ("Unpad", "x", lambda: kernels.unpad(x[None], torch.ones(1, 17, dtype=torch.bool))),
        ("PackAligned", "x_packed", lambda: kernels.pack_aligned(x, cu, 4)),
        ("PositionIds", "cu_seqlens", lambda: kernels.position_ids(cu.to(dtype), total=17)),
    ]
    for op, argument, call in calls:
        with pytest.raises(ValueError, match=f"^{op}: unsupported dtype for {argument}: {name}"):
            call()
    # While torch.compile traces, the fake raises the same error (dynamo wraps it).
    torch._dynamo.reset()
    compiled = torch.compile(kernels.varlen_attention, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as raised:
        compiled(x, x, x, cu, cu, 9, 9)
    chain, error = [], raised.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(
        isinstance(e, ValueError) and f"unsupported dtype for q: {name}" in str(e) for e in chain
    )


def test_copy_kernels_move_every_carried_dtype_bit_for_bit():
    """unpad/pad move rows as bytes: 16-bit floats and unsigned ints included."""
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(3, 5, generator=g) < 0.6
    for dtype in (torch.bfloat16, torch.float16, torch.uint16, torch.uint32, torch.bool):
        x = torch.randint(0, 2 if dtype == torch.bool else 100, (3, 5, 2), generator=g).to(dtype)
        packed, indices, _, _, _ = kernels.unpad(x, mask)
        want = _bits(x)[mask]  # as signed ints of the same width: older torch cannot index uint16
        assert packed.dtype == dtype and torch.equal(_bits(packed), want)
        assert torch.equal(_bits(kernels.pad(packed, indices, 3, 5))[mask], want)


def _bits(x):
    """``x`` viewed as a signed integer tensor of its element width (bool stays bool)."""
    if x.dtype == torch.bool:
        return x
    return x.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


# ---- Imports ----

PACKAGE_DIR = pathlib.Path(packsched.__file__).resolve().parent

_IMPORT_FIRST = r"""
import importlib, sys, types
package = types.ModuleType("packsched")
package.__path__ = [sys.argv[2]]
sys.modules["packsched"] = package
importlib.import_module("packsched." + sys.argv[1])
import torch
ops = torch.ops.packsched
print(" ".join(n for n in dir(ops) if hasattr(getattr(ops, n), "default")))
"""

OPS_OF_MODULE = {
    "_torch_ops": OP_NAMES,
    "_ops_attention": OP_NAMES[:4],
    "_ops_loss": OP_NAMES[4:8],
    "_ops_packing": OP_NAMES[8:],
}


@pytest.mark.parametrize("name", sorted(OPS_OF_MODULE))
def test_each_op_module_imports_first_on_its_own(name):
    """Without packsched/__init__.py (which imports packsched.kernels first), in a fresh
    interpreter: no import cycle, and the module registers its ops."""
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_FIRST, name, str(PACKAGE_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert set(OPS_OF_MODULE[name]) <= set(result.stdout.split())


_NUMPY_ONLY = r"""
import sys
import numpy as np
from packsched import kernels
cu = np.array([0, 3], np.int32)
q = np.ones((3, 1, 8), np.float32)
kernels.varlen_attention(q, q, q, cu, cu, 3, 3)
kernels.position_ids(cu)
print("torch" in sys.modules, "packsched._torch_ops" in sys.modules)
"""


def test_numpy_callers_never_load_torch():
    result = subprocess.run(
        [sys.executable, "-c", _NUMPY_ONLY], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
