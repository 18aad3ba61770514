#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_TC_LAUNCH_H_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_TC_LAUNCH_H_

// The tensor-core attention's entry points (attention_tc_fwd.cu, attention_tc_bwd.cu) and when
// the CUDA backend uses them instead of the scalar kernels (attention_fwd.cu, attention_bwd.cu).
// Plain C++ types only, like launch.h.

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/internal/attention_args.h"

namespace packsched::kernels::internal::cuda {

// The tensor-core kernels' parameters: the checked arguments, plus the tree of a tree-packed
// micro-batch (optional, on the device; both index packed rows, self-attention only):
//   subtree_end [total_k]: one past the last packed row of the subtree of key row j's node;
//   positions [total_q]: each row's token depth (read only with a left window).
// With a tree, query i sees key j iff the varlen rule allows it (causal, so j <= i) and
// i < subtree_end[j], and with a left window w >= 0, positions[i] - positions[j] <= w (the
// window counts tokens along the root path, not packed rows: the row window is not applied).
// The backward kernels also read `dout_dot_out` [total_q, heads] (float32, on the device): D =
// dO · O of each packed row and head, which the backward's launchers compute first
// (AttentionTcDotOutKernel) into a workspace of their own; the forward ignores it.
struct TcAttnParams {
  AttentionArgs args;
  const int32_t* subtree_end = nullptr;
  const int32_t* positions = nullptr;
  const float* dout_dot_out = nullptr;
};

// True when the tensor-core kernels run this call: bf16 or fp16, head dim 64, 96 or 128, every
// tensor 16-byte aligned, a device of compute capability 8.0 or newer whose opt-in shared memory
// per block holds every tensor-core kernel of the head dim (TcFitsSharedMemory: at head dims 96
// and 128 sm_80 and sm_90, not the 99 KiB parts such as sm_86 and sm_89), and the environment
// variable PACKSCHED_ATTENTION_SCALAR unset or "0" (set, it forces the scalar kernels, so that
// both can be timed and compared).
bool AttentionTcApplies(const AttentionArgs& a);

// Enqueue the forward (one kernel) or the backward (D = dO · O, dq, then dk/dv) on `stream`; the
// backward takes its D buffer (total_q x heads floats) stream-ordered from a memory pool of the
// device's own and hands it back on the same stream (attention_tc_workspace.cuh). The forward
// at head dim 128 runs 128-row query tiles unless the environment variable
// PACKSCHED_ATTENTION_TC_FWD_TILE is "64" (64-row tiles; read per call, so that both can be
// timed in one process); other values, and head dim 64, keep 128-row tiles.
LaunchResult LaunchAttentionTcForward(const TcAttnParams& p, void* stream);
LaunchResult LaunchAttentionTcBackward(const TcAttnParams& p, void* stream);

// The one-pass backward (attention_tc_bwd_onepass.cu): dk and dv as the two-pass one, dq summed
// into a float32 accumulator with atomics (not bitwise reproducible). LaunchAttentionTcBackward
// runs it instead of the two passes when AttentionTcOnePassRequested(): the environment variable
// PACKSCHED_ATTENTION_TC_BWD is "onepass" (read per call, so that both can be timed in one
// process). Its accumulator (total_q x heads x head_dim floats) is taken, with the D buffer,
// from the backward's workspace (attention_tc_workspace.cuh).
bool AttentionTcOnePassRequested();
LaunchResult LaunchAttentionTcBackwardOnePass(const TcAttnParams& p, void* stream);

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_TC_LAUNCH_H_
