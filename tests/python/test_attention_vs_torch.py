"""The GPU kit's per-kernel breakdown in tests/gpu/attention_vs_torch.py, without a GPU: kernel
names shortened as a profiler writes them, and one call's kernel times summed per kernel."""

import pathlib
import sys
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))

import attention_vs_torch  # noqa: E402

OURS = (
    "void packsched::kernels::internal::cuda::AttentionTcBackwardDqKernel<packsched::kernels::"
    "Bf16, 128>(packsched::kernels::internal::cuda::TcAttnParams)"
)


def test_short_kernel_names():
    short = attention_vs_torch.short_kernel_name
    assert short(OURS) == "AttentionTcBackwardDqKernel<Bf16, 128>"
    assert (
        short("void at::native::(anonymous namespace)::reduce_kernel<512, 1>(at::native::R)")
        == "reduce_kernel<512, 1>"
    )
    assert short("Memset (Device)") == "Memset"
    long_name = "void flash::k<" + ", ".join(["cutlass::bfloat16_t"] * 10) + ">(flash::Params)"
    assert len(short(long_name)) == 80 and short(long_name).endswith("...")


class FakeProfile:
    """torch.profiler.profile's interface as kernel_times uses it, with canned events."""

    events = []

    def __init__(self, activities):
        self.activities = activities

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def key_averages(self):
        return FakeProfile.events


def test_kernel_times_sums_per_kernel_largest_first(monkeypatch):
    ev = types.SimpleNamespace
    FakeProfile.events = [
        ev(key=OURS, self_device_time_total=1500.0),
        ev(key="Memset (Device)", self_device_time_total=20.0),
        ev(key=OURS.replace("Bf16, 128", "Bf16, 64"), self_device_time_total=0.0),  # not run
        ev(key="void other::k<1>(int)", self_cuda_time_total=3000.0),  # older torch's name
        ev(key="void other::k<1>(float)", self_device_time_total=500.0),  # same short name
    ]
    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")
    profiler.profile = FakeProfile
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)
    calls = []
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: calls.append(1)))
    ran = []
    times = attention_vs_torch.kernel_times(torch, lambda: ran.append(1))
    assert ran == [1] and len(calls) == 2
    assert list(times.items()) == [
        ("k<1>", 3.5),
        ("AttentionTcBackwardDqKernel<Bf16, 128>", 1.5),
        ("Memset", 0.02),
    ]


def test_report_names_the_largest_kernels_of_a_call():
    import report

    kernel_ms = {"bwd packsched": {"DqKernel<Bf16, 128>": 4.0, "DotOut<Bf16, 128>": 0.2}}
    kernel_ms["bwd packsched"]["DkDvKernel<Bf16, 128>"] = 5.123
    kernel_ms["bwd packsched"]["Memset"] = 0.01
    assert (
        report.kernel_text(kernel_ms, "bwd packsched")
        == "DkDvKernel 5.12, DqKernel 4, DotOut 0.2 ms"
    )
    assert report.kernel_text(kernel_ms, "fwd packsched") == ""


def test_table_entries_order_backends_per_token_bucket():
    from packsched import _attention_backends

    def batch(tokens, ours, theirs):
        return {
            "tokens": tokens,
            "time_ms": {
                "fwd": {"packsched": ours / 4, "varlen_attn": theirs / 4},
                "bwd": {"packsched": 3 * ours / 4, "varlen_attn": 3 * theirs / 4},
            },
        }

    batches = [batch(32755, 19.0, 6.0), batch(30000, 10.0, 12.0), batch(65473, 50.0, 60.0)]
    batches.append({"tokens": 1000, "time_ms": {"fwd": {"packsched": 1.0}, "bwd": {}}})
    entries = attention_vs_torch.table_entries(batches, "cuda:sm_90")
    assert [(e["tokens_bucket"], e["backends"]) for e in entries] == [
        (32768, ["varlen_attn", "packsched"]),  # 18 ms against 29
        (65536, ["packsched", "varlen_attn"]),
    ]
    table = _attention_backends.check_table({"entries": entries})
    call = _attention_backends.Call("cuda:sm_90", "bfloat16", 128, "causal", 40000)
    assert _attention_backends.lookup(table, call)[1] is entries[1]
