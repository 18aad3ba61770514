// Varlen attention validates every argument on the host and names the offending one; nothing is
// written when a call fails.

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packsched/kernels/attention.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::CuTensor;
using testing::DTypeOf;
using testing::HostTensor;

MATCHER_P(InvalidArgumentWith, text, "") {
  *result_listener << "status: " << arg;
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(text) != std::string::npos;
}

// A valid call: B = 2 (lengths 3, 2 for q; 4, 1 for k), H = 4, Hk = 2, D = 16, float32.
struct Call {
  HostTensor q = HostTensor({5, 4, 16}, DTypeOf<float>());
  HostTensor k = HostTensor({5, 2, 16}, DTypeOf<float>());
  HostTensor v = HostTensor({5, 2, 16}, DTypeOf<float>());
  HostTensor out = HostTensor({5, 4, 16}, DTypeOf<float>());
  HostTensor lse = HostTensor({4, 5}, DTypeOf<float>());
  HostTensor dout = HostTensor({5, 4, 16}, DTypeOf<float>());
  HostTensor dq = HostTensor({5, 4, 16}, DTypeOf<float>());
  HostTensor dk = HostTensor({5, 2, 16}, DTypeOf<float>());
  HostTensor dv = HostTensor({5, 2, 16}, DTypeOf<float>());
  HostTensor cu_q = CuTensor({0, 3, 5});
  HostTensor cu_k = CuTensor({0, 4, 5});
  HostTensor seqused_q = HostTensor::Of<int32_t>({2}, {3, 2});
  HostTensor seqused_k = HostTensor::Of<int32_t>({2}, {4, 0});
  AttentionOptions options;
  int64_t max_q = 3, max_k = 4;
  bool use_seqused = false;

  AttentionSeqlens Seqlens() const {
    AttentionSeqlens s;
    s.q = {&cu_q.view(), {}};
    s.k = {&cu_k.view(), {}};
    s.max_seqlen_q = max_q;
    s.max_seqlen_k = max_k;
    if (use_seqused) {
      s.seqused_q = &seqused_q.view();
      s.seqused_k = &seqused_k.view();
    }
    return s;
  }
  absl::Status Forward() {
    return VarlenAttentionForward(q.view(), k.view(), v.view(), Seqlens(), options, out.view(),
                                  lse.view(), nullptr);
  }
  absl::Status Backward() {
    return VarlenAttentionBackward(dout.view(), q.view(), k.view(), v.view(), out.view(),
                                   lse.view(), Seqlens(), options, dq.view(), dk.view(), dv.view(),
                                   nullptr);
  }
};

TEST(AttentionValidationTest, TheBaselineCallsAreValid) {
  Call c;
  EXPECT_TRUE(c.Forward().ok()) << c.Forward();
  EXPECT_TRUE(c.Backward().ok()) << c.Backward();
  c.use_seqused = true;
  EXPECT_TRUE(c.Forward().ok()) << c.Forward();
}

TEST(AttentionValidationTest, QMustBeAFloatType) {
  Call c;
  c.q = HostTensor({5, 4, 16}, DTypeOf<int32_t>());
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("unsupported dtype for q: int32"));
}

TEST(AttentionValidationTest, KAndVMustHaveQsDtype) {
  Call c;
  c.k = HostTensor({5, 2, 16}, DTypeOf<Bf16>());
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("k must have q's dtype float32, got bfloat16"));
  Call d;
  d.v = HostTensor({5, 2, 16}, DTypeOf<double>());
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("v must have q's dtype"));
}

TEST(AttentionValidationTest, QAndKMustBeThreeDimensional) {
  Call c;
  c.q = HostTensor({5, 64}, DTypeOf<float>());
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("q must be [tq, H, D], got [5, 64]"));
  Call d;
  d.k = HostTensor({5, 32}, DTypeOf<float>());
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("k must be [tk, Hk, D]"));
}

TEST(AttentionValidationTest, HeadDimMustBeAMultipleOfEightUpTo256) {
  for (int64_t d : {12, 0, 264}) {
    Call c;
    c.q = HostTensor({5, 4, d}, DTypeOf<float>());
    EXPECT_THAT(c.Forward(), InvalidArgumentWith("must be a multiple of 8 in [8, 256]")) << d;
  }
}

TEST(AttentionValidationTest, KMustHaveQsHeadDimAndVKsShape) {
  Call c;
  c.k = HostTensor({5, 2, 24}, DTypeOf<float>());
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("k has head dim 24 but q has 16"));
  Call d;
  d.v = HostTensor({5, 1, 16}, DTypeOf<float>());
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("v must have shape k's shape = [5, 2, 16]"));
}

TEST(AttentionValidationTest, QueryHeadsMustBeAMultipleOfKvHeads) {
  Call c;
  c.k = HostTensor({5, 3, 16}, DTypeOf<float>());
  c.v = HostTensor({5, 3, 16}, DTypeOf<float>());
  EXPECT_THAT(c.Forward(),
              InvalidArgumentWith("H = 4 must be a positive multiple of the kv heads"));
  c.k = HostTensor({5, 0, 16}, DTypeOf<float>());
  c.v = HostTensor({5, 0, 16}, DTypeOf<float>());
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("Hk = 0"));
}

TEST(AttentionValidationTest, CuSeqlensAreChecked) {
  Call c;
  c.cu_q = CuTensor({0, 4, 3});
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("cu_seqlens_q must be non-decreasing"));
  Call d;
  d.cu_k = HostTensor::Of<int64_t>({3}, {0, 4, 5});
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("cu_seqlens_k must be int32"));
}

TEST(AttentionValidationTest, BatchSizesMustAgree) {
  Call c;
  c.cu_k = CuTensor({0, 5});
  c.max_k = 5;
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("cu_seqlens_q has B = 2 sequences but "
                                               "cu_seqlens_k has B = 1"));
}

TEST(AttentionValidationTest, TotalsMustMatchTheRows) {
  Call c;
  c.cu_q = CuTensor({0, 3, 4});
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("total mismatch: q has shape [5, 4, 16]"));
  Call d;
  d.cu_k = CuTensor({0, 4, 6});
  d.max_k = 4;
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("total mismatch: k has shape"));
}

TEST(AttentionValidationTest, MaxSeqlenMustCoverTheLongestSegment) {
  Call c;
  c.max_q = 2;
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("max_seqlen_q = 2 is less than the longest "
                                               "segment of cu_seqlens_q (3)"));
  Call d;
  d.max_k = -1;
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("max_seqlen_k = -1"));
}

TEST(AttentionValidationTest, SequsedMustBeInt32OfShapeB) {
  Call c;
  c.use_seqused = true;
  c.seqused_q = HostTensor::Of<int64_t>({2}, {3, 2});
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("seqused_q must be int32"));
  Call d;
  d.use_seqused = true;
  d.seqused_k = HostTensor::Of<int32_t>({3}, {1, 1, 1});
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("seqused_k must have shape [B] = [2]"));
}

TEST(AttentionValidationTest, SequsedMustFitItsSegmentAndNothingIsWritten) {
  Call c;
  c.use_seqused = true;
  c.seqused_q = HostTensor::Of<int32_t>({2}, {4, 2});
  c.out.FillRandomBytes(5);
  const std::vector<uint8_t> before = c.out.bytes();
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("seqused_q[0] = 4 is outside [0, 3]"));
  EXPECT_TRUE(c.out.bytes() == before);
  Call d;
  d.use_seqused = true;
  d.seqused_k = HostTensor::Of<int32_t>({2}, {4, -1});
  EXPECT_THAT(d.Backward(), InvalidArgumentWith("seqused_k[1] = -1 is outside [0, 1]"));
}

TEST(AttentionValidationTest, OptionsAreChecked) {
  Call c;
  c.options.window_left = -2;
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("window (-2, -1) must have entries >= -1"));
  Call d;
  d.options.softcap = -1;
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("softcap must be 0 (off) or a normal positive"));
  Call e;
  e.options.softmax_scale = std::numeric_limits<double>::infinity();
  EXPECT_THAT(e.Forward(), InvalidArgumentWith("softmax_scale must be finite"));
  Call f;
  f.options.num_threads = -1;
  EXPECT_THAT(f.Forward(), InvalidArgumentWith("num_threads must be >= 0"));
}

// The kernels compute in float: a double that is finite but not as a float (scale 1e39 gave NaN
// outputs) or a cap that rounds to 0 or a subnormal (1e-46 silently turned capping off) is an
// error; the extremes of the float range are accepted.
TEST(AttentionValidationTest, ScaleAndSoftcapMustFitFloat) {
  for (double scale : {1e39, -1e39, 3.5e38}) {
    Call c;
    c.options.softmax_scale = scale;
    EXPECT_THAT(c.Forward(), InvalidArgumentWith("softmax_scale must be finite as a float32"))
        << scale;
    EXPECT_THAT(c.Backward(), InvalidArgumentWith("softmax_scale must be finite as a float32"))
        << scale;
  }
  for (double cap : {1e-46, 1e-40, 3.5e38, std::numeric_limits<double>::quiet_NaN()}) {
    Call c;
    c.options.softcap = cap;
    EXPECT_THAT(c.Forward(), InvalidArgumentWith("softcap must be 0 (off) or a normal positive "
                                                 "float32"))
        << cap;
  }
  for (double cap : {0.0, static_cast<double>(std::numeric_limits<float>::min()),
                     static_cast<double>(std::numeric_limits<float>::max()), 30.0}) {
    Call c;
    c.options.softcap = cap;
    c.options.softmax_scale = std::numeric_limits<float>::max();
    EXPECT_TRUE(c.Forward().ok()) << cap << ": " << c.Forward();
  }
}

// Every tensor of a call moved to cuda:0 (the data stays host memory: these calls fail
// validation before anything touches it, so this runs without a GPU), with host offsets.
struct CudaCall {
  CudaCall(int64_t batch, int64_t heads, int64_t max_seqlen)
      : cu_values(batch + 1, 0),
        q({0, heads, 8}, DTypeOf<float>()),
        k({0, 1, 8}, DTypeOf<float>()),
        v({0, 1, 8}, DTypeOf<float>()),
        out({0, heads, 8}, DTypeOf<float>()),
        lse({heads, 0}, DTypeOf<float>()),
        cu(CuTensor(cu_values)) {
    for (HostTensor* t : {&q, &k, &v, &out, &lse, &cu}) t->mutable_view().device = {kDLCUDA, 0};
    seqlens.q = {&cu.view(), cu_values};
    seqlens.k = {&cu.view(), cu_values};
    seqlens.max_seqlen_q = max_seqlen;
    seqlens.max_seqlen_k = max_seqlen;
  }
  absl::Status Forward() {
    return VarlenAttentionForward(q.view(), k.view(), v.view(), seqlens, {}, out.view(), lse.view(),
                                  nullptr);
  }
  std::vector<int32_t> cu_values;
  HostTensor q, k, v, out, lse, cu;
  AttentionSeqlens seqlens;
};

// The CUDA grid's y (heads) and z (sequences) are limited to 65535: more is a clear
// InvalidArgument, not the runtime's "invalid configuration argument" as an Internal error.
TEST(AttentionValidationTest, CudaCallsBeyondTheLaunchGridAreRejected) {
  EXPECT_THAT(CudaCall(65536, 1, 0).Forward(),
              InvalidArgumentWith("B = 65536 sequences exceed the CUDA backend's limit of 65535"));
  EXPECT_THAT(
      CudaCall(1, 65536, 0).Forward(),
      InvalidArgumentWith("H = 65536 query heads exceed the CUDA backend's limit of 65535"));
  EXPECT_THAT(CudaCall(1, 1, int64_t{1} << 31).Forward(),
              InvalidArgumentWith("max_seqlen_q = 2147483648 exceeds the CUDA backend's limit"));
}

// The limits are the CUDA launch grid's: the CPU backend runs such calls.
TEST(AttentionValidationTest, CpuCallsHaveNoGridLimits) {
  for (auto [batch, heads] : {std::pair<int64_t, int64_t>{65536, 1}, {1, 65536}}) {
    const std::vector<int32_t> cu_values(batch + 1, 0);
    HostTensor q({0, heads, 8}, DTypeOf<float>()), k({0, 1, 8}, DTypeOf<float>()),
        v({0, 1, 8}, DTypeOf<float>()), out({0, heads, 8}, DTypeOf<float>()),
        lse({heads, 0}, DTypeOf<float>()), cu = CuTensor(cu_values);
    AttentionSeqlens s;
    s.q = {&cu.view(), {}};
    s.k = {&cu.view(), {}};
    s.max_seqlen_q = s.max_seqlen_k = int64_t{1} << 40;
    const absl::Status st = VarlenAttentionForward(q.view(), k.view(), v.view(), s, {}, out.view(),
                                                   lse.view(), nullptr);
    EXPECT_TRUE(st.ok()) << "B=" << batch << " H=" << heads << ": " << st;
  }
}

TEST(AttentionValidationTest, OutputsMustHaveTheDocumentedShapesAndDtypes) {
  Call c;
  c.out = HostTensor({5, 4, 8}, DTypeOf<float>());
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("out must have shape [tq, H, D] = [5, 4, 16]"));
  Call d;
  d.lse = HostTensor({5, 4}, DTypeOf<float>());
  EXPECT_THAT(d.Forward(), InvalidArgumentWith("lse must have shape [H, tq] = [4, 5]"));
  Call e;
  e.lse = HostTensor({4, 5}, DTypeOf<double>());
  EXPECT_THAT(e.Forward(), InvalidArgumentWith("lse must be float32, got float64"));
  Call f;
  f.out = HostTensor({5, 4, 16}, DTypeOf<Fp16>());
  EXPECT_THAT(f.Forward(), InvalidArgumentWith("out must have q's dtype"));
}

TEST(AttentionValidationTest, BackwardChecksItsTensors) {
  Call c;
  c.dout = HostTensor({4, 4, 16}, DTypeOf<float>());
  EXPECT_THAT(c.Backward(), InvalidArgumentWith("dout must have shape [tq, H, D]"));
  Call d;
  d.dk = HostTensor({5, 4, 16}, DTypeOf<float>());
  EXPECT_THAT(d.Backward(), InvalidArgumentWith("dk must have shape [tk, Hk, D] = [5, 2, 16]"));
  Call e;
  e.dv = HostTensor({5, 2, 16}, DTypeOf<Bf16>());
  EXPECT_THAT(e.Backward(), InvalidArgumentWith("dv must have q's dtype"));
  Call f;
  f.dq = HostTensor({5, 4, 16}, DTypeOf<float>());
  f.dq.mutable_view().data = nullptr;
  EXPECT_THAT(f.Backward(), InvalidArgumentWith("dq has no data"));
}

TEST(AttentionValidationTest, Float64IsCpuOnlyAndDevicesMustMatch) {
  Call c;
  c.k.mutable_view().device = {kDLCUDA, 0};
  EXPECT_THAT(c.Forward(), InvalidArgumentWith("device mismatch: k is on cuda:0 but q is on cpu"));
  Call d;
  for (HostTensor* t : {&d.q, &d.k, &d.v, &d.out}) {
    *t = HostTensor(std::vector<int64_t>(t->view().shape, t->view().shape + 3), DTypeOf<double>());
    t->mutable_view().device = {kDLCUDA, 0};
  }
  EXPECT_THAT(d.Forward(),
              InvalidArgumentWith("float64 attention is supported on the CPU backend only"));
}

}  // namespace
}  // namespace packsched::kernels
