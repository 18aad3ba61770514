"""The attention backend choice of packsched.kernels (packsched._attention_backends): table
lookups, the override (argument and environment), fallback from backends that are missing or
cannot run a call, flat-only backends never given a tree, one log line per distinct choice; and
every backend that runs on the CPU against torch's SDPA with a dense mask built independently
(from the sequences, or from each rollout's path in a tree): forward and gradients, float64 and
float32, flat and tree masks, GQA, windows."""

import logging
import pathlib
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packsched import _attention_backends as backends
from packsched import _attention_dispatch, kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "helpers"))

import tree_layout  # noqa: E402

EVERYTHING = lambda backend: None  # noqa: E731 - every library importable


def call(**kw):
    base = dict(device="cuda:sm_90", dtype="bfloat16", head_dim=128, mask="causal", tokens=32755)
    return backends.Call(**{**base, **kw})


# --- the choice ------------------------------------------------------------------------------


def test_tokens_bucket_is_the_next_power_of_two():
    assert [backends.tokens_bucket(n) for n in (0, 1, 2, 3, 32755, 32768, 32769)] == [
        1,
        1,
        2,
        4,
        32768,
        32768,
        65536,
    ]


def test_shipped_table_cpu_runs_packsched():
    for mask in backends.MASKS:
        name, why = backends.choose(
            call(device="cpu", dtype="float32", mask=mask), environ={}, is_available=EVERYTHING
        )
        assert name == "packsched" and why.startswith("table entry 0")


def test_shipped_table_cuda_flat_takes_varlen_attn_and_trees_packsched():
    for mask in ("full", "causal", "window"):
        name, why = backends.choose(call(mask=mask), environ={}, is_available=EVERYTHING)
        assert name == "varlen_attn" and "H200" in why
    name, _ = backends.choose(call(mask="tree"), environ={}, is_available=EVERYTHING)
    assert name == "packsched"


def test_missing_backends_fall_back_in_the_entrys_order():
    def without(*missing):
        return lambda b: f"{b} is not installed" if b in missing else None

    name, why = backends.choose(call(), environ={}, is_available=without("varlen_attn"))
    assert name == "flash_attn" and "varlen_attn is not installed" in why
    name, why = backends.choose(
        call(), environ={}, is_available=without("varlen_attn", "flash_attn")
    )
    assert name == "packsched" and why.endswith(
        "skipped varlen_attn is not installed; flash_attn is not installed"
    )
    table = {"entries": [{"backends": ["flex"]}]}
    name, why = backends.choose(call(), table=table, environ={}, is_available=without("flex"))
    assert name == "packsched" and why == "table entry 0; none could run (flex is not installed)"


def test_call_features_rule_backends_out():
    cases = [
        (dict(softcap=True), "flash_attn"),  # varlen_attn has no softcap
        (dict(cross=True), "flash_attn"),
        (dict(seqused=True), "packsched"),
        (dict(tail=True), "packsched"),
        (dict(lse=True), "packsched"),
        (dict(dtype="float32"), "packsched"),
        (dict(head_dim=512), "packsched"),
        (dict(device="cpu"), "packsched"),
    ]
    table = {"entries": [{"backends": ["varlen_attn", "flash_attn"]}]}
    for features, expected in cases:
        got, _ = backends.choose(call(**features), table=table, environ={}, is_available=EVERYTHING)
        assert got == expected, features


def test_flat_only_backends_never_run_a_tree():
    tree = call(mask="tree")
    table = {"entries": [{"device": "cuda", "backends": ["varlen_attn", "flash_attn", "flex"]}]}
    assert backends.choose(tree, table=table, environ={}, is_available=EVERYTHING)[0] == "flex"
    table = {"entries": [{"backends": ["varlen_attn", "flash_attn"]}]}
    name, why = backends.choose(tree, table=table, environ={}, is_available=EVERYTHING)
    assert name == "packsched" and "flat masks only" in why
    for flat_only in backends.FLAT_ONLY:
        env = {backends.ENVIRONMENT: flat_only}
        name, why = backends.choose(tree, environ=env, is_available=EVERYTHING)
        assert name == "packsched" and "flat masks only" in why
        with pytest.raises(ValueError, match="flat masks only"):
            backends.choose(tree, backend=flat_only, environ={}, is_available=EVERYTHING)


def test_most_specific_entry_wins_and_the_earlier_of_equals():
    table = {
        "entries": [
            {"device": "cuda", "backends": ["flash_attn"]},
            {"device": "cuda", "backends": ["packsched"]},
            {"device": "cuda:sm_90", "backends": ["flex"]},
            {"device": "cuda", "dtype": "bfloat16", "head_dim": 128, "backends": ["varlen_attn"]},
            {
                "device": "cuda",
                "mask": "causal",
                "tokens_bucket": 65536,
                "dtype": "bfloat16",
                "backends": ["packsched"],
            },
        ]
    }
    backends.check_table(table)
    assert backends.lookup(table, call(device="cuda:sm_80", head_dim=64))[0] == 0
    assert backends.lookup(table, call(head_dim=64))[0] == 2  # the architecture counts
    assert backends.lookup(table, call())[0] == 3
    assert backends.lookup(table, call(tokens=40000))[0] == 4
    assert backends.lookup(table, call(tokens=40000, mask="window"))[0] == 3
    assert backends.lookup(table, call(device="cpu")) == (None, None)
    name, why = backends.choose(call(device="cpu"), table=table, environ={})
    assert name == "packsched" and why == "no table entry matches"


def test_override_argument_and_environment():
    cpu = call(device="cpu", dtype="float64", head_dim=16, mask="tree", tokens=40)
    env = {backends.ENVIRONMENT: "flex"}
    assert backends.choose(cpu, environ=env) == ("flex", "PACKSCHED_ATTENTION_BACKEND=flex")
    name, why = backends.choose(dataclass_replace(cpu, grad=True), environ=env)
    assert name == "packsched" and "no FlexAttention backward on the CPU" in why
    assert backends.choose(cpu, backend="packsched", environ=env)[0] == "packsched"
    assert backends.choose(cpu, backend="auto", environ=env)[0] == "flex"
    assert backends.choose(cpu, environ={backends.ENVIRONMENT: "auto"})[0] == "packsched"
    with pytest.raises(ValueError, match="PACKSCHED_ATTENTION_BACKEND must be one of"):
        backends.choose(cpu, environ={backends.ENVIRONMENT: "fa3"})
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.choose(cpu, backend="fa3", environ={})
    with pytest.raises(ValueError, match="varlen_attn: it takes flat masks only"):
        backends.choose(cpu, backend="varlen_attn", environ={}, is_available=EVERYTHING)


def dataclass_replace(c, **kw):
    import dataclasses

    return dataclasses.replace(c, **kw)


def test_bad_tables_are_named():
    bad = [
        ({"entries": [{"backends": ["fa3"]}]}, r"entries\[0\]: 'backends'"),
        ({"entries": [{"backends": []}]}, r"entries\[0\]: 'backends'"),
        (
            {"entries": [{"backends": ["flex"]}, {"backends": ["flex"], "mask": "sliding"}]},
            r"entries\[1\]: 'mask'",
        ),
        ({"entries": [{"backends": ["flex"], "arch": 90}]}, r"entries\[0\]: unknown fields"),
        ({"rows": []}, "list 'entries'"),
    ]
    for table, message in bad:
        with pytest.raises(ValueError, match=message):
            backends.check_table(table)
    assert backends.shipped_table()["entries"]  # the shipped file passes


def test_each_distinct_choice_is_logged_once(caplog, monkeypatch):
    monkeypatch.delenv(backends.ENVIRONMENT, raising=False)
    monkeypatch.setattr(backends, "_logged", set())
    q = torch.randn(12, 2, 8)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with caplog.at_level(logging.INFO, logger="packsched.attention"):
        for _ in range(3):
            kernels.varlen_attention(q, q, q, cu, cu, 7, 7, causal=True)
        with torch.no_grad():
            kernels.varlen_attention(q, q, q, cu, cu, 7, 7, causal=True, backend="flex")
    lines = [r.getMessage() for r in caplog.records if r.name == "packsched.attention"]
    assert lines == [
        "attention: packsched for causal float32 D=8 on cpu, 12 tokens (bucket 16): table entry 0 "
        f"({backends.shipped_table()['entries'][0]['evidence']})",
        "attention: flex for causal float32 D=8 on cpu, 12 tokens (bucket 16): "
        "backend='flex' argument",
    ]


def test_explicit_backends_that_cannot_run_the_call_are_refused():
    q = torch.randn(12, 2, 8, requires_grad=True)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with pytest.raises(ValueError, match="no FlexAttention backward on the CPU"):
        kernels.varlen_attention(q, q, q, cu, cu, 7, 7, causal=True, backend="flex")
    used = torch.tensor([4, 7], dtype=torch.int32)
    with torch.no_grad(), pytest.raises(ValueError, match="q and k must have the same layout"):
        kernels.varlen_attention(q, q, q, cu, cu, 7, 7, seqused_q=used, backend="flex")
    with torch.no_grad(), pytest.raises(ValueError, match="q and k must have the same layout"):
        other = torch.tensor([0, 6, 12], dtype=torch.int32)
        kernels.varlen_attention(q, q, q, cu, other, 7, 7, backend="flex")


# --- the same results from every backend -----------------------------------------------------


def sdpa_reference(q, k, v, visible, scale=None):
    """out of torch's SDPA (math) with a dense [T, T] boolean mask; GQA by enable_gqa."""
    out = F.scaled_dot_product_attention(
        *(x.transpose(0, 1)[None] for x in (q, k, v)),
        attn_mask=visible,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out[0].transpose(0, 1)


def flat_visible(cu, causal, left, right):
    """i sees j: same sequence, and the causal / window rule on in-sequence positions."""
    seq = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    i, j = np.meshgrid(np.arange(cu[-1]), np.arange(cu[-1]), indexing="ij")
    ok = seq[i] == seq[j]
    if causal:
        ok &= j <= i
    if right >= 0:
        ok &= j - i <= right
    if left >= 0:
        ok &= i - j <= left
    return torch.as_tensor(ok)


def tree_visible(layout, window):
    """i sees j iff some rollout's path holds j at or before i (within `window` tokens)."""
    rows = len(layout.ids)
    ok = np.zeros((rows, rows), dtype=bool)
    for path in layout.rows:
        path = np.asarray(path)
        for a, i in enumerate(path):
            seen = path[: a + 1] if window < 0 else path[max(0, a - window) : a + 1]
            ok[i, seen] = True
    return torch.as_tensor(ok)


TOLERANCE = {torch.float64: 1e-10, torch.float32: 3e-5}


def close(a, b, dtype):
    scale = max(1.0, float(b.detach().abs().max()))
    return (
        float((a.detach().double() - b.detach().double()).abs().max()) <= TOLERANCE[dtype] * scale
    )


def tensors(rows, heads, kv_heads, dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(rows, h, dim, generator=g, dtype=torch.float64).to(dtype)
        for h in (heads, kv_heads, kv_heads, heads)
    ]


def compare(run, reference, q, k, v, dout, dtype):
    """run(backend, q, k, v) of every backend against the reference: out for all, gradients for
    packsched (FlexAttention has no CPU backward)."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = reference(*leaves)
    want_grads = torch.autograd.grad(want, leaves, dout)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    got = run("packsched", *leaves)
    got_grads = torch.autograd.grad(got, leaves, dout)
    assert close(got, want, dtype)
    for a, b in zip(got_grads, want_grads):
        assert close(a, b, dtype)
    with torch.no_grad():
        assert torch.equal(run("auto", q, k, v), got.detach())  # the CPU's choice is packsched
        assert close(run("flex", q, k, v), want.detach(), dtype)


FLAT = [
    dict(causal=True, window_size=(-1, -1)),
    dict(causal=False, window_size=(-1, -1)),
    dict(causal=True, window_size=(6, -1)),
    dict(causal=False, window_size=(4, 3)),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("options", FLAT, ids=lambda o: f"causal{o['causal']}-{o['window_size']}")
def test_flat_backends_agree(dtype, options, monkeypatch):
    monkeypatch.delenv(backends.ENVIRONMENT, raising=False)
    cu = [0, 9, 9, 40, 41, 70]
    q, k, v, dout = tensors(cu[-1], 4, 2, 16, dtype, seed=1)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    max_len = max(np.diff(cu))
    visible = flat_visible(cu, options["causal"], *options["window_size"])

    def run(backend, q, k, v):
        return kernels.varlen_attention(
            q, k, v, cu_t, cu_t, max_len, max_len, backend=backend, **options
        )

    compare(run, lambda q, k, v: sdpa_reference(q, k, v, visible), q, k, v, dout, dtype)


def tree_layouts():
    rng = np.random.default_rng(7)
    grpo = tree_layout.grpo_forest(rng, groups=2, n=4, prompt_len=(10, 30), completion_len=(1, 12))
    turns = tree_layout.multiturn_forest(rng, trees=2, depth=3, turn_len=(1, 9))
    return [tree_layout.pack(f, f.roots()) for f in (grpo, turns)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("window", [-1, 7])
def test_tree_backends_agree(dtype, window, monkeypatch):
    monkeypatch.delenv(backends.ENVIRONMENT, raising=False)
    for layout in tree_layouts():
        q, k, v, dout = tensors(len(layout.ids), 4, 1, 8, dtype, seed=2)
        cu = torch.tensor(layout.cu, dtype=torch.int32)
        max_len = max(b - a for a, b in zip(layout.cu, layout.cu[1:]))
        subtree_end = torch.tensor(layout.subtree_end, dtype=torch.int32)
        positions = torch.tensor(layout.positions, dtype=torch.int32)

        def run(backend, q, k, v):
            return kernels.tree_attention(
                q, k, v, cu, max_len, subtree_end, positions, window_left=window, backend=backend
            )

        visible = tree_visible(layout, window)
        compare(run, lambda q, k, v: sdpa_reference(q, k, v, visible), q, k, v, dout, dtype)


def test_flex_gives_packscheds_lse_softcap_pad_slots_and_tail():
    cu = [0, 8, 16, 32]
    used = torch.tensor([5, 8, 11], dtype=torch.int32)
    q, k, v, _ = tensors(36, 4, 2, 16, torch.float64, seed=3)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    kw = dict(
        causal=True,
        softcap=2.5,
        seqused_q=used,
        seqused_k=used,
        total_q=36,
        total_k=36,
        return_lse=True,
    )
    with torch.no_grad():
        want, want_lse = kernels.varlen_attention(
            q, k, v, cu_t, cu_t, 16, 16, backend="packsched", **kw
        )
        got, got_lse = kernels.varlen_attention(q, k, v, cu_t, cu_t, 16, 16, backend="flex", **kw)
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert int(torch.isinf(want_lse).sum()) == 4 * (3 + 0 + 5 + 4)  # pad slots and the tail
    finite = torch.isfinite(want_lse)
    assert float((got_lse[finite] - want_lse[finite]).abs().max()) < 1e-12
    assert float((got - want).abs().max()) < 1e-12


def test_block_masks_are_reused_for_the_same_layout(monkeypatch):
    built = []
    real = _attention_dispatch.block_mask
    monkeypatch.setattr(_attention_dispatch, "_mask_cache", [])
    monkeypatch.setattr(_attention_dispatch, "block_mask", lambda *a: built.append(1) or real(*a))
    layout = tree_layouts()[0]
    q, k, v, _ = tensors(len(layout.ids), 2, 1, 8, torch.float32, seed=4)
    cu = torch.tensor(layout.cu, dtype=torch.int32)
    subtree_end = torch.tensor(layout.subtree_end, dtype=torch.int32)
    with torch.no_grad():
        first = kernels.tree_attention(q, k, v, cu, 99, subtree_end, backend="flex")
        for _ in range(3):  # a model's layers
            kernels.tree_attention(q, k, v, cu, 99, subtree_end, backend="flex")
        assert len(built) == 1
        subtree_end[0] = 1  # the root's subtree is now its first row: a different mask
        changed = kernels.tree_attention(q, k, v, cu, 99, subtree_end, backend="flex")
    assert len(built) == 2 and not torch.equal(first, changed)


def test_varlen_attn_adapter_passes_flash_attentions_arguments(monkeypatch):
    """The adapter's mapping to torch's varlen_attn (CUDA only), checked on the CPU against a
    stand-in that keeps varlen_attn's documented signature and computes SDPA per sequence."""
    seen = []

    def varlen_attn(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        *,
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
        **rest,
    ):
        seen.append(dict(cu=cu_q.dtype, window=window_size, gqa=enable_gqa, scale=scale))
        left, right = window_size
        visible = flat_visible(cu_q.tolist(), False, left, right)
        return sdpa_reference(q, k, v, visible, scale)

    module = types.ModuleType("torch.nn.attention.varlen")
    module.varlen_attn = varlen_attn
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", module)
    monkeypatch.setattr(_attention_dispatch, "_device_kind", lambda device: "cuda:sm_90")
    monkeypatch.setattr(_attention_dispatch, "_dtype_name", lambda dtype: "bfloat16")
    monkeypatch.setattr(backends, "available", EVERYTHING)
    monkeypatch.delenv(backends.ENVIRONMENT, raising=False)
    cu = [0, 13, 30]
    q, k, v, _ = tensors(30, 4, 2, 16, torch.float64, seed=5)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    cases = [  # (causal, window_size, what varlen_attn must get)
        (True, (-1, -1), (-1, 0)),
        (False, (-1, 100), (-1, -1)),  # a side >= max_seqlen_k is unbounded
        (True, (6, -1), (6, 0)),
        (False, (4, 3), (4, 3)),
    ]
    for causal, window, _ in cases:
        with torch.no_grad():
            got = kernels.varlen_attention(
                q, k, v, cu_t, cu_t, 17, 17, softmax_scale=0.3, causal=causal, window_size=window
            )
            want = kernels.varlen_attention(
                q,
                k,
                v,
                cu_t,
                cu_t,
                17,
                17,
                softmax_scale=0.3,
                causal=causal,
                window_size=window,
                backend="packsched",
            )
        assert float((got - want).abs().max()) < 1e-12, (causal, window)
    assert [s["window"] for s in seen] == [expected for _, _, expected in cases]
    assert all(s["cu"] == torch.int32 and s["gqa"] and s["scale"] == 0.3 for s in seen)
