#ifndef PACKSCHED_TESTS_KERNELS_EMULATED_ATTENTION_ARGS_H_
#define PACKSCHED_TESTS_KERNELS_EMULATED_ATTENTION_ARGS_H_

// The AttentionArgs of a reference Problem over its host tensors, as the front end
// (kernels/attention_api.cc) passes them to a backend: for the tests that run the CUDA attention
// kernels under the CPU emulations (attention_emulated_test.cc, attention_tc_emulated_test.cc).

#include <algorithm>
#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/internal/args.h"
#include "kernels/internal/attention_args.h"
#include "tests/kernels/attention_reference.h"

namespace packsched::kernels::testing {

template <typename T>
internal::FloatType TypeOf();
template <>
inline internal::FloatType TypeOf<Fp16>() {
  return internal::FloatType::kF16;
}
template <>
inline internal::FloatType TypeOf<Bf16>() {
  return internal::FloatType::kBf16;
}
template <>
inline internal::FloatType TypeOf<float>() {
  return internal::FloatType::kF32;
}

// Every field from `p` and `t` (outputs and gradients point into `t`), one CPU thread. A window
// side >= max_seqlen_k is already unbounded (p.WindowLeft/Right); with p.tree() the left window
// moves onto the positions (tree_window_left, window_left = -1), else tree_window_left is -1.
// max_seqlen_k is the longest key segment: the launch grid covers it (p.max_seqlen_k only moves
// the window rule).
template <typename T>
internal::AttentionArgs EmulatedArgs(const Problem& p, AttentionTensors<T>& t) {
  internal::AttentionArgs a{};
  a.dtype = TypeOf<T>();
  a.q = t.q.view().data;
  a.k = t.k.view().data;
  a.v = t.v.view().data;
  a.cu_q = a.cu_q_host = t.cu_q_values.data();
  a.cu_k = a.cu_k_host = t.cu_k_values.data();
  a.seqused_q = p.padded() ? t.seqused_q.template data<int32_t>() : nullptr;
  a.seqused_k = p.padded() ? t.seqused_k.template data<int32_t>() : nullptr;
  a.batch = p.batch();
  a.total_q = p.RowsQ();
  a.total_k = p.RowsK();
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.head_dim = p.head_dim;
  a.max_seqlen_q = t.seqlens.max_seqlen_q;
  for (size_t b = 0; b + 1 < t.cu_k_values.size(); ++b) {
    a.max_seqlen_k = std::max<int64_t>(a.max_seqlen_k, t.cu_k_values[b + 1] - t.cu_k_values[b]);
  }
  a.scale = p.Scale();
  a.softcap = p.options.softcap;
  a.causal = p.options.causal;
  a.window_left = p.WindowLeft();
  a.window_right = p.WindowRight();
  a.tree_window_left = -1;
  if (p.tree()) {
    a.subtree_end = p.subtree_end.data();
    a.positions = p.positions.data();
    a.tree_window_left = a.window_left;
    a.window_left = -1;
  }
  a.num_threads = 1;
  a.out = t.out.view().data;
  a.lse = t.lse.view().data;
  a.dout = t.dout.view().data;
  a.dq = t.dq.view().data;
  a.dk = t.dk.view().data;
  a.dv = t.dv.view().data;
  return a;
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_EMULATED_ATTENTION_ARGS_H_
