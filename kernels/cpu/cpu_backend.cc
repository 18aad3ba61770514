// The CPU backend: the reference implementation, and a usable path for host tensors. Every
// function runs on the calling thread. Data-dependent checks run in a first pass that reads only
// the inputs, so a failing call leaves its outputs untouched.

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/elementwise.h"
#include "kernels/common/half.h"
#include "kernels/internal/backend.h"

namespace packsched::kernels::internal::cpu {
namespace {

bool MaskAt(const void* mask, int mask_bytes, int64_t i) {
  switch (mask_bytes) {
    case 1:
      return static_cast<const uint8_t*>(mask)[i] != 0;
    case 4:
      return static_cast<const int32_t*>(mask)[i] != 0;
    default:
      return static_cast<const int64_t*>(mask)[i] != 0;
  }
}

const unsigned char* Row(const void* base, int64_t row, int64_t row_bytes) {
  return static_cast<const unsigned char*>(base) + row * row_bytes;
}
unsigned char* Row(void* base, int64_t row, int64_t row_bytes) {
  return static_cast<unsigned char*>(base) + row * row_bytes;
}

template <typename Id>
void ShiftLabelsTyped(const ShiftLabelsArgs& a) {
  const Id* ids = static_cast<const Id*>(a.ids);
  Id* labels = static_cast<Id*>(a.labels);
  const int32_t* layout = a.cu_padded != nullptr ? a.cu_padded : a.cu;
  const Id ignore = static_cast<Id>(a.ignore_index);
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t real_len = a.cu[b + 1] - a.cu[b];
    for (int64_t t = layout[b]; t < layout[b + 1]; ++t) {
      labels[t] = ShiftedLabel<Id>(ids, t, layout[b], real_len, ignore);
    }
  }
  // The tail: a segment without real tokens.
  for (int64_t t = layout[a.batch]; t < a.rows; ++t) {
    labels[t] = ShiftedLabel<Id>(ids, t, layout[a.batch], /*real_len=*/0, ignore);
  }
}

template <typename Label>
absl::Status CheckLabels(const CrossEntropyArgs& a) {
  const Label* labels = static_cast<const Label*>(a.labels);
  for (int64_t t = 0; t < a.cu[a.batch]; ++t) {  // tail labels are not read
    const int64_t l = labels[t];
    if (l != a.ignore_index && (l < 0 || l >= a.vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackedCrossEntropy: labels[", t, "] = ", l, " is outside [0, ", a.vocab,
                       ") and is not ignore_index (", a.ignore_index, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Label>
void CrossEntropyTyped(const CrossEntropyArgs& a) {
  using AccT = Acc<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const Label* labels = static_cast<const Label*>(a.labels);
  T* loss = static_cast<T*>(a.per_token_loss);
  T* seq_sum = static_cast<T*>(a.per_sequence_sum);
  for (int64_t b = 0; b < a.batch; ++b) {
    AccT sum = 0;
    int64_t count = 0;
    for (int64_t t = a.cu[b]; t < a.cu[b + 1]; ++t) {
      const int64_t label = labels[t];
      if (label == a.ignore_index) {
        loss[t] = FromAcc<T>(AccT(0));
        continue;
      }
      const T* row = logits + t * a.vocab;
      LogSumExp<AccT> lse = LseEmpty<AccT>();
      for (int64_t v = 0; v < a.vocab; ++v) LseAdd(lse, ToAcc(row[v]));
      loss[t] = FromAcc<T>(CrossEntropy(lse, ToAcc(row[label])));
      // The sum is over the values as stored, so it agrees with summing per_token_loss.
      sum += ToAcc(loss[t]);
      ++count;
    }
    seq_sum[b] = FromAcc<T>(sum);
    a.per_sequence_count[b] = count;
  }
  for (int64_t t = a.cu[a.batch]; t < a.rows; ++t) loss[t] = FromAcc<T>(AccT(0));  // the tail
}

template <typename Label>
void CrossEntropyByDtype(const CrossEntropyArgs& a) {
  switch (a.dtype) {
    case FloatType::kF16:
      return CrossEntropyTyped<Fp16, Label>(a);
    case FloatType::kBf16:
      return CrossEntropyTyped<Bf16, Label>(a);
    case FloatType::kF32:
      return CrossEntropyTyped<float, Label>(a);
    case FloatType::kF64:
      return CrossEntropyTyped<double, Label>(a);
  }
}

}  // namespace

absl::Status Unpad(const UnpadArgs& a) {
  // Pass 1: the mask must agree with cu_seqlens before anything is written.
  for (int64_t b = 0; b < a.batch; ++b) {
    int64_t count = 0;
    for (int64_t s = 0; s < a.seqlen; ++s) count += MaskAt(a.mask, a.mask_bytes, b * a.seqlen + s);
    if (count != a.cu_host[b + 1] - a.cu_host[b]) {
      return absl::InvalidArgumentError(absl::StrCat("Unpad: mask row ", b, " has ", count,
                                                     " tokens but cu_seqlens gives ",
                                                     a.cu_host[b + 1] - a.cu_host[b]));
    }
  }
  for (int64_t b = 0; b < a.batch; ++b) {
    int64_t out = a.cu[b];
    for (int64_t s = 0; s < a.seqlen; ++s) {
      const int64_t i = b * a.seqlen + s;
      if (!MaskAt(a.mask, a.mask_bytes, i)) continue;
      a.indices[out] = i;
      if (a.row_bytes > 0) {
        std::memcpy(Row(a.x_packed, out, a.row_bytes), Row(a.x, i, a.row_bytes), a.row_bytes);
      }
      ++out;
    }
  }
  return absl::OkStatus();
}

absl::Status Pad(const PadArgs& a) {
  for (int64_t i = 0; i < a.total; ++i) {
    if (a.indices[i] < 0 || a.indices[i] >= a.rows_out) {
      return absl::InvalidArgumentError(absl::StrCat("Pad: indices[", i, "] = ", a.indices[i],
                                                     " is outside [0, ", a.rows_out, ")"));
    }
  }
  if (a.rows_out * a.row_bytes > 0) std::memset(a.x, 0, a.rows_out * a.row_bytes);
  for (int64_t i = 0; i < a.total && a.row_bytes > 0; ++i) {
    std::memcpy(Row(a.x, a.indices[i], a.row_bytes), Row(a.x_packed, i, a.row_bytes), a.row_bytes);
  }
  return absl::OkStatus();
}

absl::Status PackAligned(const PackAlignedArgs& a) {
  const int64_t elem_bytes_pattern = 16;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = a.cu[b + 1] - a.cu[b];
    const int64_t start = a.cu_padded_host[b];
    const int64_t padded_len = a.cu_padded_host[b + 1] - start;
    if (len > 0 && a.row_bytes > 0) {
      std::memcpy(Row(a.x_aligned, start, a.row_bytes), Row(a.x_packed, a.cu[b], a.row_bytes),
                  len * a.row_bytes);
    }
    // Pad slots: the 16-byte pattern holds whole elements, and row_bytes is a whole number of
    // elements, so copying the pattern cyclically writes whole pad elements.
    unsigned char* pad = Row(a.x_aligned, start + len, a.row_bytes);
    const int64_t pad_bytes = (padded_len - len) * a.row_bytes;
    for (int64_t i = 0; i < pad_bytes; ++i) pad[i] = a.pad_pattern[i % elem_bytes_pattern];
    a.seqused[b] = static_cast<int32_t>(len);
  }
  // The tail [total_padded, rows): pad values too.
  unsigned char* tail = Row(a.x_aligned, a.total_padded, a.row_bytes);
  const int64_t tail_bytes = (a.rows - a.total_padded) * a.row_bytes;
  for (int64_t i = 0; i < tail_bytes; ++i) tail[i] = a.pad_pattern[i % elem_bytes_pattern];
  std::memcpy(a.cu_padded, a.cu_padded_host, (a.batch + 1) * sizeof(int32_t));
  return absl::OkStatus();
}

absl::Status UnpackAligned(const UnpackAlignedArgs& a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = a.cu[b + 1] - a.cu[b];
    if (len > 0 && a.row_bytes > 0) {
      std::memcpy(Row(a.x_packed, a.cu[b], a.row_bytes),
                  Row(a.x_aligned, a.cu_padded[b], a.row_bytes), len * a.row_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status PositionIds(const PositionIdsArgs& a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t t = a.cu[b]; t < a.cu[b + 1]; ++t) a.position_ids[t] = PositionId(t, a.cu[b]);
  }
  for (int64_t t = a.cu[a.batch]; t < a.rows; ++t) {  // the tail restarts at 0
    a.position_ids[t] = PositionId(t, SegmentStart(a.cu, a.batch, t));
  }
  return absl::OkStatus();
}

absl::Status ShiftLabels(const ShiftLabelsArgs& a) {
  if (a.ids_64) {
    ShiftLabelsTyped<int64_t>(a);
  } else {
    ShiftLabelsTyped<int32_t>(a);
  }
  return absl::OkStatus();
}

absl::Status PackedCrossEntropy(const CrossEntropyArgs& a) {
  if (a.labels_64) {
    if (absl::Status s = CheckLabels<int64_t>(a); !s.ok()) return s;
    CrossEntropyByDtype<int64_t>(a);
  } else {
    if (absl::Status s = CheckLabels<int32_t>(a); !s.ok()) return s;
    CrossEntropyByDtype<int32_t>(a);
  }
  return absl::OkStatus();
}

}  // namespace packsched::kernels::internal::cpu
