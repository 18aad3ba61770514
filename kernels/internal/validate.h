#ifndef PACKSCHED_KERNELS_INTERNAL_VALIDATE_H_
#define PACKSCHED_KERNELS_INTERNAL_VALIDATE_H_

// Argument checks shared by the front ends of the kernel API (kernels.cc, attention_api.cc). Each
// returns InvalidArgument prefixed with the operation's name and naming the offending argument.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dlpack/dlpack.h"
#include "kernels/internal/args.h"
#include "packsched/kernels/kernels.h"

namespace packsched::kernels::internal {

// DLPack 0.6 has no bool code; torch and numpy's newer exporters use 6 for it.
inline constexpr uint8_t kDLBoolCode = 6;

enum class Backend { kHost, kCuda };

absl::Status Invalid(absl::string_view op, absl::string_view what);
std::string DTypeName(DLDataType t);
std::string ShapeString(const DLTensor& t);
std::string DeviceString(DLDevice d);
bool Is(DLDataType t, uint8_t code, uint8_t bits);
int64_t ElementBytes(DLDataType t);
// The first element, byte_offset applied.
void* Data(const DLTensor& t);
int64_t NumElements(const DLTensor& t, int first_dim = 0);
// Bytes of one row when dimensions 0..dims-1 index rows.
int64_t RowBytes(const DLTensor& t, int dims);

// The call's device: every tensor must be on it.
struct CallDevice {
  DLDevice device;
  absl::string_view first_name;
};

// Non-null, a shape, on the call's device, compact row-major, data unless empty.
absl::Status CheckTensor(absl::string_view op, absl::string_view name, const DLTensor* t,
                         const CallDevice& call);
absl::StatusOr<Backend> BackendOf(absl::string_view op, absl::string_view name, const DLTensor* t);
// Elements that the copy kernels move as bytes.
absl::Status CheckCopyableDType(absl::string_view op, absl::string_view name, const DLTensor& t);
absl::Status CheckDType(absl::string_view op, absl::string_view name, const DLTensor& t,
                        uint8_t code, uint8_t bits);
absl::Status CheckSameDType(absl::string_view op, absl::string_view name, const DLTensor& t,
                            absl::string_view ref_name, const DLTensor& ref);
// Checks that `t` has shape `expected`; `meaning` names the dimensions ("[total, H, D]").
absl::Status CheckShape(absl::string_view op, absl::string_view name, const DLTensor& t,
                        absl::Span<const int64_t> expected, absl::string_view meaning);
// `lead` followed by the dimensions of `ref` from `from_dim` on.
std::vector<int64_t> WithTrailing(std::initializer_list<int64_t> lead, const DLTensor& ref,
                                  int from_dim);

// A validated cu_seqlens: device pointer, host values, B and total.
struct CheckedSeqlens {
  const int32_t* device = nullptr;
  const int32_t* host = nullptr;
  int64_t batch = 0;
  int64_t total = 0;  // cu[B]
  // Rows of the tensors laid out by the offsets: Seqlens::rows, or `total` when not given.
  // Rows [total, rows) are the tail (kernels.h).
  int64_t rows = 0;
  int64_t max_len = 0;
};

// Validates host cu_seqlens values: B + 1 >= 1 entries, [0] = 0, non-decreasing.
absl::Status CheckCuValues(absl::string_view op, absl::string_view name,
                           absl::Span<const int32_t> cu);
absl::StatusOr<CheckedSeqlens> CheckSeqlens(absl::string_view op, absl::string_view name,
                                            const Seqlens& s, const CallDevice& call,
                                            Backend backend);
// InvalidArgument when `cu` declares a tail (rows > total) in a call that takes none.
absl::Status CheckNoTail(absl::string_view op, absl::string_view name, const CheckedSeqlens& cu);
// t.shape[0] == cu.rows (the "total mismatch" message).
absl::Status CheckRows(absl::string_view op, absl::string_view name, const DLTensor& t,
                       const CheckedSeqlens& cu, absl::string_view cu_name);
// Both seqlens describe the same B sequences and every padded length holds the real one.
absl::Status CheckPaddedCovers(absl::string_view op, const CheckedSeqlens& real,
                               const CheckedSeqlens& padded);
absl::StatusOr<FloatType> FloatTypeOf(absl::string_view op, absl::string_view name,
                                      const DLTensor& t);
absl::StatusOr<bool> IsInt64Ids(absl::string_view op, absl::string_view name, const DLTensor& t);
// One element of `value` in dtype `t`, repeated over 16 bytes.
absl::Status FillPattern(absl::string_view op, double value, DLDataType t,
                         unsigned char (&pattern)[16]);

}  // namespace packsched::kernels::internal

#endif  // PACKSCHED_KERNELS_INTERNAL_VALIDATE_H_
