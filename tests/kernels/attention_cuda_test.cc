// The CUDA attention against the float64 reference under the same tolerance rule as the CPU
// backend (docs/design.md §4), and against the CPU backend; deterministic backward. Skips without a
// device; without one, the last test checks that calls fail cleanly instead.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/attention.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/device_tensor.h"
#include "tests/kernels/host_tensor.h"
#include "tests/kernels/query_row_maps.h"
#include "tests/kernels/tree_forest.h"

namespace packsched::kernels {
namespace {

using testing::AttentionTensors;
using testing::DeviceTensor;
using testing::ExpectMatchesReference;
using testing::HaveDevice;
using testing::HostTensor;
using testing::Inputs;
using testing::MakeProblem;
using testing::OnlyTailProblem;
using testing::Problem;
using testing::RandomInputs;
using testing::TailProblem;

// Runs forward and backward on the device; returns the results copied into `into`'s tensors.
template <typename T>
void RunOnDevice(const Problem& p, const AttentionTensors<T>& in, AttentionTensors<T>& into) {
  DeviceTensor q(in.q), k(in.k), v(in.v), dout(in.dout), out(in.out), lse(in.lse), dq(in.dq),
      dk(in.dk), dv(in.dv), cu_q(in.cu_q), cu_k(in.cu_k), used_q(in.seqused_q),
      used_k(in.seqused_k), subtree_end(in.subtree_end), positions(in.positions);
  AttentionSeqlens s = in.seqlens;
  s.q = {&cu_q.view(), in.cu_q_values, in.seqlens.q.rows};
  s.k = {&cu_k.view(), in.cu_k_values, in.seqlens.k.rows};
  if (p.padded()) {
    s.seqused_q = &used_q.view();
    s.seqused_k = &used_k.view();
  }
  if (p.tree()) s.subtree_end = &subtree_end.view();
  if (!p.positions.empty()) s.positions = &positions.view();
  const absl::Status f = VarlenAttentionForward(q.view(), k.view(), v.view(), s, p.options,
                                                out.view(), lse.view(), nullptr);
  ASSERT_TRUE(f.ok()) << f;
  const absl::Status b =
      VarlenAttentionBackward(dout.view(), q.view(), k.view(), v.view(), out.view(), lse.view(), s,
                              p.options, dq.view(), dk.view(), dv.view(), nullptr);
  ASSERT_TRUE(b.ok()) << b;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.CopyTo(into.out);
  lse.CopyTo(into.lse);
  dq.CopyTo(into.dq);
  dk.CopyTo(into.dk);
  dv.CopyTo(into.dv);
}

template <typename T>
void CheckCuda(const Problem& p, uint32_t seed = 1,
               void (*adjust)(const Problem&, Inputs*) = nullptr) {
  Inputs in = RandomInputs<T>(p, seed);
  if (adjust != nullptr) adjust(p, &in);
  AttentionTensors<T> cpu(p, in);
  ASSERT_TRUE(cpu.Forward(p.options).ok());
  ASSERT_TRUE(cpu.Backward(p.options).ok());
  AttentionTensors<T> gpu(p, in);
  RunOnDevice(p, cpu, gpu);
  ExpectMatchesReference<T>(p, in, gpu.Results(), "cuda ");
}

class AttentionCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(AttentionCudaTest, LengthSweepsAndDtypes) {
  for (bool causal : {false, true}) {
    const Problem p =
        MakeProblem({0, 1, 97, 0, 128, 1025, 0}, {1, 97, 0, 128, 97, 1025, 0}, causal);
    CheckCuda<Fp16>(p);
    CheckCuda<Bf16>(p);
    CheckCuda<float>(p);
  }
}

TEST_F(AttentionCudaTest, HeadDimsArePaddedToTheirBucket) {
  for (int64_t d : {8, 64, 80, 128, 200, 256}) {
    SCOPED_TRACE(d);
    Problem p = MakeProblem({70, 33}, {33, 130}, true);
    p.head_dim = d;
    CheckCuda<Bf16>(p);
  }
}

TEST_F(AttentionCudaTest, GqaWindowsSoftcapAndPaddedLayout) {
  Problem p = MakeProblem({97, 0, 40}, {60, 13, 128}, true);
  p.heads = 8;
  p.kv_heads = 2;
  p.pad_q = {3, 8, 0};
  p.pad_k = {4, 3, 64};
  p.options.window_left = 30;
  p.options.softcap = 3.0;
  CheckCuda<Fp16>(p);
  p.options.causal = false;
  p.options.window_right = 5;
  CheckCuda<float>(p);
}

// The align_total_to tail: rows past cu[B], longer than every segment (the grid stretches).
TEST_F(AttentionCudaTest, TailRowsAreDefinedAndNeverKeys) {
  CheckCuda<Bf16>(TailProblem(/*tail_q=*/200));
  CheckCuda<float>(OnlyTailProblem());
}

// Tree packing: random forests (nodes across tile boundaries) with GQA, a left window on the depths
// and softcap, against the reference with the tree rule.
TEST_F(AttentionCudaTest, TreeMaskOnRandomForests) {
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    const testing::PackedForest f = testing::RandomForest(seed, 3, 12, 60);
    Problem p = testing::TreeProblem(f.cu, f.subtree_end, f.positions);
    p.heads = 8;
    p.kv_heads = 2;
    CheckCuda<Bf16>(p);
    p.options.window_left = 50;
    p.options.softcap = 2.0;
    CheckCuda<float>(p);
  }
}

// Sets an environment variable for its scope (the kernels read their switches per call).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

// The tensor-core kernels' modes at head dim d, over several tiles: causal GQA; seqused, the
// tail, a left window and softcap; a window without causal; and a tree with and without a
// position window.
void CheckTensorCoreModes(int64_t d) {
  SCOPED_TRACE(d);
  Problem p = MakeProblem({300, 0, 129, 1}, {300, 7, 200, 1}, true);
  p.heads = 8;
  p.kv_heads = 2;
  p.head_dim = d;
  CheckCuda<Bf16>(p);
  p.pad_q = {5, 3, 0, 2};
  p.pad_k = {0, 9, 64, 3};
  p.tail_q = 33;
  p.tail_k = 4;
  p.options.window_left = 50;
  p.options.softcap = 5.0;
  CheckCuda<Fp16>(p);
  p.options.causal = false;
  p.options.window_right = 17;
  CheckCuda<Bf16>(p);
  const testing::PackedForest f = testing::RandomForest(3, 3, 12, 60);
  Problem tree = testing::TreeProblem(f.cu, f.subtree_end, f.positions);
  tree.heads = 4;
  tree.kv_heads = 1;
  tree.head_dim = d;
  CheckCuda<Bf16>(tree);
  tree.options.window_left = 40;
  CheckCuda<Fp16>(tree);
}

// bf16 and fp16 at head dims 64, 96 and 128 take the tensor-core kernels on sm_80 and newer
// (kernels/cuda/attention_tc_launch.h).
TEST_F(AttentionCudaTest, TensorCoreKernelsInEveryMode) {
  for (int64_t d : {64, 96, 128}) CheckTensorCoreModes(d);
}

// Both D = 128 forwards: 128-row query tiles (the default) and 64-row tiles
// (PACKSCHED_ATTENTION_TC_FWD_TILE=64).
TEST_F(AttentionCudaTest, TensorCoreForwardTilesAtD128InEveryMode) {
  for (const char* tile : {"128", "64"}) {
    SCOPED_TRACE(tile);
    const ScopedEnv scoped("PACKSCHED_ATTENTION_TC_FWD_TILE", tile);
    CheckTensorCoreModes(128);
  }
}

// The one-pass tensor-core backward (PACKSCHED_ATTENTION_TC_BWD=onepass; dq by atomics).
TEST_F(AttentionCudaTest, OnePassTensorCoreBackwardInEveryMode) {
  const ScopedEnv scoped("PACKSCHED_ATTENTION_TC_BWD", "onepass");
  for (int64_t d : {64, 96, 128}) CheckTensorCoreModes(d);
}

// Scores that rise from key tile to key tile (RisingKeys): the tensor-core forward rescales its
// output only when a row's max grows past its slack, and here it must, after O has accumulated.
TEST_F(AttentionCudaTest, TensorCoreForwardRescalesAsScoresRise) {
  for (int64_t d : {64, 96, 128}) {
    SCOPED_TRACE(d);
    Problem p = MakeProblem({600, 90}, {600, 90}, true);
    p.heads = 4;
    p.kv_heads = 2;
    p.head_dim = d;
    CheckCuda<Bf16>(p, 3, testing::RisingKeys<Bf16>);
  }
}

TEST_F(AttentionCudaTest, BackwardIsDeterministic) {
  Problem p = MakeProblem({300, 1025}, {1025, 300}, true);
  p.heads = 4;
  p.kv_heads = 1;
  const Inputs in = RandomInputs<Bf16>(p, 2);
  AttentionTensors<Bf16> host(p, in), first(p, in), second(p, in);
  RunOnDevice(p, host, first);
  RunOnDevice(p, host, second);
  EXPECT_TRUE(first.dq.bytes() == second.dq.bytes());
  EXPECT_TRUE(first.dk.bytes() == second.dk.bytes());
  EXPECT_TRUE(first.dv.bytes() == second.dv.bytes());
}

TEST(AttentionCudaWithoutDeviceTest, CallsFailCleanly) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  Problem p = MakeProblem({3}, {3}, false);
  p.head_dim = 8;
  const Inputs in = RandomInputs<float>(p, 1);
  AttentionTensors<float> t(p, in);
  // Device tensors that are never dereferenced: the launch fails first.
  for (HostTensor* x : {&t.q, &t.k, &t.v, &t.out, &t.lse, &t.cu_q, &t.cu_k}) {
    x->mutable_view().device = {kDLCUDA, 0};
  }
  t.seqlens.q.host = t.cu_q_values;
  t.seqlens.k.host = t.cu_k_values;
  const absl::Status s = t.Forward(p.options);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no usable CUDA device"), absl::string_view::npos) << s;
}

// The query-row map (AttentionSeqlens::query_rows) is read on the host: a CUDA call whose map is
// in device memory is InvalidArgument naming it, found while validating (no device memory is
// read, so the tensors are CUDA-labelled host buffers, with or without a device).
TEST(AttentionCudaQueryRowsTest, AMapInDeviceMemoryIsRefused) {
  const testing::PackedForest f = testing::RandomForest(3, 2, 6, 9);
  Problem p = testing::TreeProblem(f.cu, f.subtree_end, f.positions);
  p.head_dim = 8;
  const Inputs in = RandomInputs<float>(p, 1);
  AttentionTensors<float> t(p, in);
  for (HostTensor* x : {&t.q, &t.k, &t.v, &t.out, &t.lse, &t.dout, &t.dq, &t.dk, &t.dv, &t.cu_q,
                        &t.cu_k, &t.subtree_end, &t.positions}) {
    x->mutable_view().device = {kDLCUDA, 0};
  }
  t.seqlens.q.host = t.cu_q_values;
  t.seqlens.k.host = t.cu_k_values;
  HostTensor rows = testing::CuTensor({0, 1});
  rows.mutable_view().device = {kDLCUDA, 0};
  t.seqlens.query_rows = &rows.view();
  for (const absl::Status& s : {t.Forward(p.options), t.Backward(p.options)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("query_rows"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("host memory"), absl::string_view::npos) << s;
  }
}

// The query-row map on the device (kernels/cuda/attention_query_runs.cuh), per rank of a tree CP
// group of `cp` (head-tail rows): the call with the map (a host tensor) against the device's call
// without it on the inputs with dout 0 outside the map (the mapped rows' out, lse and dq bitwise,
// the others a query that sees no key, dk and dv bitwise), and against the CPU backend's map.
template <typename T>
void CheckCudaQueryRowMap(const Problem& p, int cp, uint32_t seed) {
  const Inputs in = RandomInputs<T>(p, seed);
  for (int rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " rank " << rank);
    const std::vector<int32_t> rows = testing::HeadTailRows(p.CuQ(), cp, rank, seed);
    const std::vector<bool> mapped = testing::MappedRows(rows, p.RowsQ());
    const Inputs own = testing::WithDoutOnlyOn(p, in, mapped);
    const AttentionTensors<T> plain(p, own);
    AttentionTensors<T> without(p, own);
    RunOnDevice(p, plain, without);
    const testing::Outputs want = without.Results();
    ExpectMatchesReference<T>(p, own, want, "cuda ");
    AttentionTensors<T> source(p, in);
    HostTensor map = testing::CuTensor(rows);
    source.seqlens.query_rows = &map.view();
    AttentionTensors<T> with(p, in);
    RunOnDevice(p, source, with);
    const testing::Outputs got = with.Results();
    testing::ExpectMappedRun(p, mapped, want, got, "cuda map");
    testing::ExpectCpuMapAgrees<T>(p, in, own, rows, mapped, want, got);
  }
}

// bf16 and fp16 at head dims 64 and 128 run the tensor-core kernels, float the scalar ones; GQA,
// and a left window on the depths with softcap.
TEST_F(AttentionCudaTest, QueryRowMapOfTreeCpRanks) {
  const testing::PackedForest f = testing::RandomForest(5, 2, 10, 50);
  Problem p = testing::TreeProblem(f.cu, f.subtree_end, f.positions);
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  CheckCudaQueryRowMap<Bf16>(p, 2, 41);
  CheckCudaQueryRowMap<float>(p, 2, 42);
  p.head_dim = 128;
  CheckCudaQueryRowMap<Bf16>(p, 4, 43);
  p.head_dim = 64;
  p.options.window_left = 50;
  p.options.softcap = 3.0;
  CheckCudaQueryRowMap<Fp16>(p, 2, 44);
}

}  // namespace
}  // namespace packsched::kernels
