#ifndef PACKSCHED_KERNELS_INTERNAL_RECURRENT_ARGS_H_
#define PACKSCHED_KERNELS_INTERNAL_RECURRENT_ARGS_H_

// Checked, plain-pointer arguments of the recurrent kernels (recurrent.h) and the backends' entry
// points. On the host the front end checks the prev_row values before these run.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal {

struct ConvArgs {
  FloatType dtype;  // kF32 or kF64
  int64_t rows, channels;
  int width;
  const void* x;            // [rows, channels]
  const void* weight;       // [channels, width]
  const void* bias;         // [channels] or null
  const int32_t* prev_row;  // [rows]
  bool silu;
  void* out;  // forward: [rows, channels]
  // Backward only.
  const void* d_out;
  void* dx;
  void* d_weight;
  void* d_bias;  // null without bias
};

struct RecurrenceArgs {
  FloatType dtype;  // kF32 or kF64
  int64_t rows, heads;
  int kd, vd;
  const void *q, *k;        // [rows, heads, kd]
  const void* v;            // [rows, heads, vd]
  const void* g;            // [rows, heads]
  const void* beta;         // [rows, heads] or null
  const int32_t* prev_row;  // [rows]
  void* out;                // forward: [rows, heads, vd]
  // Backward only.
  const void* d_out;
  void *dq, *dk, *dv, *dg, *d_beta;  // d_beta null without beta
};

namespace cpu {
// Cannot fail.
absl::Status CausalConv1dForward(const ConvArgs& a);
absl::Status CausalConv1dBackward(const ConvArgs& a);
absl::Status GatedRecurrenceForward(const RecurrenceArgs& a);
absl::Status GatedRecurrenceBackward(const RecurrenceArgs& a);
}  // namespace cpu

namespace cuda {
// As the CPU's, enqueued on `stream` on `device` (backend.h's CUDA conventions); the prev_row
// values are trusted (not read on the host).
absl::Status CausalConv1dForward(const ConvArgs& a, int device, void* stream);
absl::Status CausalConv1dBackward(const ConvArgs& a, int device, void* stream);
absl::Status GatedRecurrenceForward(const RecurrenceArgs& a, int device, void* stream);
absl::Status GatedRecurrenceBackward(const RecurrenceArgs& a, int device, void* stream);
}  // namespace cuda

}  // namespace packsched::kernels::internal

#endif  // PACKSCHED_KERNELS_INTERNAL_RECURRENT_ARGS_H_
