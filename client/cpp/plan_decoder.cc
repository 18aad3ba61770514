#include "client/cpp/plan_decoder.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packsched::client::internal {
namespace {

enum WireType : int {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// A bounds-checked cursor over [begin, end) of the whole message `base` (for error offsets).
class Reader {
 public:
  Reader(const char* base, const char* begin, const char* end)
      : base_(base), p_(begin), end_(end) {}

  bool done() const { return p_ == end_; }
  size_t offset() const { return static_cast<size_t>(p_ - base_); }

  // At most 10 bytes, as protobuf accepts.
  bool Varint(uint64_t* value) {
    uint64_t result = 0;
    for (int i = 0; i < 10 && p_ < end_; ++i) {
      const uint8_t byte = static_cast<uint8_t>(*p_++);
      result |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if (byte < 0x80) {
        *value = result;
        return true;
      }
    }
    return false;
  }
  bool Fixed64(uint64_t* value) {
    if (end_ - p_ < 8) return false;
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p_[i]);  // little endian
    p_ += 8;
    *value = v;
    return true;
  }
  bool Double(double* value) {
    uint64_t bits;
    if (!Fixed64(&bits)) return false;
    std::memcpy(value, &bits, sizeof(bits));
    return true;
  }
  // The payload of a length-delimited field.
  bool Sub(Reader* sub) {
    uint64_t size;
    if (!Varint(&size) || size > static_cast<uint64_t>(end_ - p_)) return false;
    *sub = Reader(base_, p_, p_ + size);
    p_ += size;
    return true;
  }
  // A tag: field number >= 1 and the wire type.
  bool Tag(uint32_t* field, int* wire_type) {
    uint64_t tag;
    if (!Varint(&tag) || tag > UINT32_MAX || (tag >> 3) == 0) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    return true;
  }
  // Skips the value of a field with `wire_type` (an unknown field, or a known one with an
  // unexpected wire type); a group up to its matching end.
  bool Skip(uint32_t field, int wire_type, int depth = 0) {
    uint64_t ignored;
    Reader sub(base_, p_, p_);
    switch (wire_type) {
      case kVarint:
        return Varint(&ignored);
      case kFixed64:
        return Fixed64(&ignored);
      case kLengthDelimited:
        return Sub(&sub);
      case kFixed32:
        if (end_ - p_ < 4) return false;
        p_ += 4;
        return true;
      case kStartGroup:
        if (depth > 100) return false;
        while (true) {
          uint32_t inner;
          int inner_type;
          if (!Tag(&inner, &inner_type)) return false;
          if (inner_type == kEndGroup) return inner == field;
          if (!Skip(inner, inner_type, depth + 1)) return false;
        }
      default:
        return false;  // an end-group without its start, or wire types 6 and 7
    }
  }

  // A repeated integer field, packed (length-delimited) or one value (varint).
  template <typename T>
  bool RepeatedVarint(int wire_type, std::vector<T>* out) {
    uint64_t value;
    if (wire_type == kVarint) {
      if (!Varint(&value)) return false;
      out->push_back(static_cast<T>(value));  // int32: the low 32 bits, as protobuf
      return true;
    }
    Reader packed(base_, p_, p_);
    if (!Sub(&packed)) return false;
    size_t count = 0;  // every varint ends with the one byte below 0x80
    for (const char* q = packed.p_; q < packed.end_; ++q) count += static_cast<uint8_t>(*q) < 0x80;
    out->reserve(out->size() + count);
    while (!packed.done()) {
      if (!packed.Varint(&value)) return false;
      out->push_back(static_cast<T>(value));
    }
    return true;
  }
  // A repeated double field, packed or one value (fixed64).
  bool RepeatedDouble(int wire_type, std::vector<double>* out) {
    double value;
    if (wire_type == kFixed64) {
      if (!Double(&value)) return false;
      out->push_back(value);
      return true;
    }
    Reader packed(base_, p_, p_);
    if (!Sub(&packed) || (packed.end_ - packed.p_) % 8 != 0) return false;
    out->reserve(out->size() + (packed.end_ - packed.p_) / 8);
    while (!packed.done()) {
      if (!packed.Double(&value)) return false;
      out->push_back(value);
    }
    return true;
  }

 private:
  const char* base_;
  const char* p_;
  const char* end_;
};

// Reads every field of one message from `r`, calling `field(number, wire_type, r)` for each; the
// callback returns nullopt for a field it does not know with that wire type (skipped) and false
// for malformed bytes.
template <typename Field>
bool ForEachField(Reader& r, Field&& field) {
  while (!r.done()) {
    uint32_t number;
    int wire_type;
    if (!r.Tag(&number, &wire_type)) return false;
    const std::optional<bool> known = field(number, wire_type, r);
    if (known.has_value()) {
      if (!*known) return false;
    } else if (!r.Skip(number, wire_type)) {
      return false;
    }
  }
  return true;
}

// One int64 scalar: the value if `wire_type` is varint, else nullopt (skipped as unknown).
std::optional<bool> Int64(int wire_type, Reader& r, int64_t* out) {
  if (wire_type != kVarint) return std::nullopt;
  uint64_t value;
  if (!r.Varint(&value)) return false;
  *out = static_cast<int64_t>(value);
  return true;
}

std::optional<bool> Bool(int wire_type, Reader& r, bool* out) {
  if (wire_type != kVarint) return std::nullopt;
  uint64_t value;
  if (!r.Varint(&value)) return false;
  *out = value != 0;
  return true;
}

std::optional<bool> Double(int wire_type, Reader& r, double* out) {
  if (wire_type != kFixed64) return std::nullopt;
  return r.Double(out);
}

bool IsRepeatedNumeric(int wire_type, int element_wire_type) {
  return wire_type == kLengthDelimited || wire_type == element_wire_type;
}

// packsched.v1.MicroBatch (fields 1-13).
bool DecodeMicroBatch(Reader& r, planner::MicroBatch* part, std::optional<double>* loss_scale) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      case 1:
        if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;
        return in.RepeatedVarint(wire_type, &part->indices);
      case 2:
        return Int64(wire_type, in, &part->tokens);
      case 3:
        return Int64(wire_type, in, &part->aligned_tokens);
      case 4:
        return Int64(wire_type, in, &part->total);
      case 5:
        return Int64(wire_type, in, &part->padded_tokens);
      case 6:
        return Int64(wire_type, in, &part->cost);
      case 7:
        return Int64(wire_type, in, &part->max_seqlen);
      case 8:
        return Int64(wire_type, in, &part->max_seqlen_aligned);
      case 9:
        if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;
        return in.RepeatedVarint(wire_type, &part->cu_seqlens);
      case 10:
        if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;
        return in.RepeatedVarint(wire_type, &part->cu_seqlens_aligned);
      case 11:
        return Bool(wire_type, in, &part->empty);
      case 12:
        return Bool(wire_type, in, &part->overlong);
      case 13: {
        double value;
        const std::optional<bool> read = Double(wire_type, in, &value);
        if (read == true) *loss_scale = value;
        return read;
      }
      default:
        return std::nullopt;
    }
  });
}

// packsched.v1.GlobalCounts (fields 1-4), merged into `g`.
bool DecodeGlobal(Reader& r, GlobalCounts* g) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      case 1:
        return Int64(wire_type, in, &g->num_sequences);
      case 2:
        return Int64(wire_type, in, &g->loss_tokens);
      case 3:
        return Int64(wire_type, in, &g->sequences_with_loss);
      case 4:
        return Int64(wire_type, in, &g->world_size);
      default:
        return std::nullopt;
    }
  });
}

// The PlanStats message as the proto has it (microseconds and the cap included).
struct WireStats {
  planner::PlanStats plan;
  int64_t max_token_len = 0;
  int64_t local_us = 0;
  int64_t wait_us = 0;
  int64_t partition_us = 0;
};

// packsched.v1.PlanStats (fields 1-15), merged into `s`.
bool DecodeStats(Reader& r, WireStats* s) {
  planner::PlanStats& p = s->plan;
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      case 1:
        return Int64(wire_type, in, &p.num_sequences);
      case 2:
        return Int64(wire_type, in, &p.num_kept);
      case 3:
        return Int64(wire_type, in, &p.total_tokens);
      case 4:
        return Int64(wire_type, in, &p.total_cost);
      case 5:
        return Int64(wire_type, in, &p.max_part_cost);
      case 6:
        return Int64(wire_type, in, &p.min_part_cost);
      case 7:
        return Double(wire_type, in, &p.imbalance);
      case 8:
        return Int64(wire_type, in, &p.lower_bound_k);
      case 9:
        return Int64(wire_type, in, &s->max_token_len);
      case 10:
        return Int64(wire_type, in, &p.over_cap_parts);
      case 11:
        return Int64(wire_type, in, &p.naive_padded_tokens);
      case 12:
        return Int64(wire_type, in, &p.packed_tokens);
      case 13:
        return Int64(wire_type, in, &s->local_us);
      case 14:
        return Int64(wire_type, in, &s->wait_us);
      case 15:
        return Int64(wire_type, in, &s->partition_us);
      default:
        return std::nullopt;
    }
  });
}

}  // namespace

GlobalCounts GlobalCountsFromProto(const v1::GlobalCounts& g) {
  return {g.num_sequences(), g.loss_tokens(), g.sequences_with_loss(), g.world_size()};
}

PlanResult PlanResultFromProto(const v1::PlanResponse& r) {
  PlanResult out;
  out.num_micro_batches = r.num_micro_batches();
  out.local_num_micro_batches = r.local_num_micro_batches();
  planner::MicroBatchPlan& plan = out.plan;
  plan.parts.reserve(r.micro_batches_size());
  bool has_scales = false;
  for (const v1::MicroBatch& m : r.micro_batches()) {
    planner::MicroBatch part;
    part.indices.assign(m.indices().begin(), m.indices().end());
    part.tokens = m.tokens();
    part.aligned_tokens = m.aligned_tokens();
    part.total = m.total();
    part.padded_tokens = m.padded_tokens();
    part.cost = m.cost();
    part.max_seqlen = m.max_seqlen();
    part.max_seqlen_aligned = m.max_seqlen_aligned();
    part.cu_seqlens.assign(m.cu_seqlens().begin(), m.cu_seqlens().end());
    part.cu_seqlens_aligned.assign(m.cu_seqlens_aligned().begin(), m.cu_seqlens_aligned().end());
    part.empty = m.empty();
    part.overlong = m.overlong();
    plan.parts.push_back(std::move(part));
    has_scales |= m.has_loss_scale();
  }
  if (has_scales) {
    for (const v1::MicroBatch& m : r.micro_batches()) out.loss_scales.push_back(m.loss_scale());
  }
  plan.reorder.assign(r.reorder().begin(), r.reorder().end());
  plan.revert.assign(r.revert().begin(), r.revert().end());
  plan.dropped.assign(r.dropped().begin(), r.dropped().end());
  out.loss_weights.assign(r.loss_weights().begin(), r.loss_weights().end());
  const v1::PlanStats& s = r.stats();
  plan.stats.num_sequences = s.num_sequences();
  plan.stats.num_kept = s.num_kept();
  plan.stats.total_tokens = s.total_tokens();
  plan.stats.total_cost = s.total_cost();
  plan.stats.max_part_cost = s.max_part_cost();
  plan.stats.min_part_cost = s.min_part_cost();
  plan.stats.imbalance = s.imbalance();
  plan.stats.lower_bound_k = s.lower_bound_k();
  plan.stats.local_k = r.local_num_micro_batches();
  plan.stats.over_cap_parts = s.over_cap_parts();
  plan.stats.naive_padded_tokens = s.naive_padded_tokens();
  plan.stats.packed_tokens = s.packed_tokens();
  out.global = GlobalCountsFromProto(r.global());
  out.max_token_len = s.max_token_len();
  out.local_time = absl::Microseconds(s.local_us());
  out.wait_time = absl::Microseconds(s.wait_us());
  out.partition_time = absl::Microseconds(s.partition_us());
  return out;
}

absl::StatusOr<PlanResult> DecodePlanResponse(absl::string_view bytes) {
  PlanResult out;
  out.global = GlobalCounts{0, 0, 0, 0};  // the message's defaults, as PlanResultFromProto
  std::vector<std::optional<double>> scales;
  WireStats stats;
  Reader r(bytes.data(), bytes.data(), bytes.data() + bytes.size());
  planner::MicroBatchPlan& plan = out.plan;
  const bool ok =
      ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
        Reader sub = in;
        switch (number) {
          case 1:
            return Int64(wire_type, in, &out.num_micro_batches);
          case 2:
            return Int64(wire_type, in, &out.local_num_micro_batches);
          case 3: {
            if (wire_type != kLengthDelimited) return std::nullopt;
            if (!in.Sub(&sub)) return false;
            planner::MicroBatch& part = plan.parts.emplace_back();
            part.empty = false;  // the message's default
            return DecodeMicroBatch(sub, &part, &scales.emplace_back());
          }
          case 4:
            if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;
            return in.RepeatedVarint(wire_type, &plan.reorder);
          case 5:
            if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;
            return in.RepeatedVarint(wire_type, &plan.revert);
          case 6:
            if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;
            return in.RepeatedVarint(wire_type, &plan.dropped);
          case 7:
            if (!IsRepeatedNumeric(wire_type, kFixed64)) return std::nullopt;
            return in.RepeatedDouble(wire_type, &out.loss_weights);
          case 8:
            if (wire_type != kLengthDelimited) return std::nullopt;
            return in.Sub(&sub) && DecodeGlobal(sub, &out.global);
          case 9:
            if (wire_type != kLengthDelimited) return std::nullopt;
            return in.Sub(&sub) && DecodeStats(sub, &stats);
          default:
            return std::nullopt;
        }
      });
  if (!ok) {
    return absl::InternalError(absl::StrCat(
        "malformed PlanResponse from the sidecar near byte ", r.offset(), " of ", bytes.size()));
  }
  bool has_scales = false;
  for (const std::optional<double>& scale : scales) has_scales |= scale.has_value();
  if (has_scales) {
    out.loss_scales.reserve(scales.size());
    for (const std::optional<double>& scale : scales) out.loss_scales.push_back(scale.value_or(0));
  }
  plan.stats = stats.plan;
  plan.stats.local_k = out.local_num_micro_batches;
  out.max_token_len = stats.max_token_len;
  out.local_time = absl::Microseconds(stats.local_us);
  out.wait_time = absl::Microseconds(stats.wait_us);
  out.partition_time = absl::Microseconds(stats.partition_us);
  return out;
}

}  // namespace packsched::client::internal
