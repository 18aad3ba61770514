#include "client/cpp/plan_decoder.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/planner/schema.h"

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

// The decoders' cases come from the schema tables (server/planner/schema.h): one `case number:`
// per field, reading it into the member of the same name, by the field's kind.

// packsched.v1.MicroBatch (PACKSCHED_MICRO_BATCH).
#define PACKSCHED_DECODE_PART_Int(name, number) \
  case number:                                  \
    return Int64(wire_type, in, &part->name);
#define PACKSCHED_DECODE_PART_Bool(name, number) \
  case number:                                   \
    return Bool(wire_type, in, &part->name);
#define PACKSCHED_DECODE_PART_Ints(name, number)                     \
  case number:                                                       \
    if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt; \
    return in.RepeatedVarint(wire_type, &part->name);
#define PACKSCHED_DECODE_PART_LossScale(name, number)               \
  case number: {                                                    \
    double value;                                                   \
    const std::optional<bool> read = Double(wire_type, in, &value); \
    if (read == true) *loss_scale = value;                          \
    return read;                                                    \
  }
#define PACKSCHED_DECODE_PART(name, number, Kind) PACKSCHED_DECODE_PART_##Kind(name, number)

bool DecodeMicroBatch(Reader& r, planner::MicroBatch* part, std::optional<double>* loss_scale) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      PACKSCHED_MICRO_BATCH(PACKSCHED_DECODE_PART)
      default:
        return std::nullopt;
    }
  });
}

// packsched.v1.GlobalCounts (PACKSCHED_GLOBAL_COUNTS), merged into `g`.
#define PACKSCHED_DECODE_GLOBAL(name, number, Kind) \
  case number:                                      \
    return Int64(wire_type, in, &g->name);

bool DecodeGlobal(Reader& r, GlobalCounts* g) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_DECODE_GLOBAL)
      default:
        return std::nullopt;
    }
  });
}

// The PlanStats message as the proto has it: the planner's stats, and the wire-only fields of
// PACKSCHED_PLAN_STATS (Cap: the client's PlanResult member of the same name; Micros: in
// microseconds).
struct WireStats {
  planner::PlanStats plan;
#define PACKSCHED_WIRE_STATS_Cap(name) int64_t name = 0;
#define PACKSCHED_WIRE_STATS_Micros(name) int64_t name = 0;
#define PACKSCHED_WIRE_STATS_Int(name)
#define PACKSCHED_WIRE_STATS_Double(name)
#define PACKSCHED_WIRE_STATS_LocalK(name)
#define PACKSCHED_WIRE_STATS(name, number, Kind, alias) PACKSCHED_WIRE_STATS_##Kind(name)
  PACKSCHED_PLAN_STATS(PACKSCHED_WIRE_STATS)
};

// packsched.v1.PlanStats (PACKSCHED_PLAN_STATS), merged into `s`.
#define PACKSCHED_DECODE_STATS_Int(name, number) \
  case number:                                   \
    return Int64(wire_type, in, &s->plan.name);
#define PACKSCHED_DECODE_STATS_Double(name, number) \
  case number:                                      \
    return Double(wire_type, in, &s->plan.name);
#define PACKSCHED_DECODE_STATS_Cap(name, number) \
  case number:                                   \
    return Int64(wire_type, in, &s->name);
#define PACKSCHED_DECODE_STATS_Micros(name, number) \
  case number:                                      \
    return Int64(wire_type, in, &s->name);
#define PACKSCHED_DECODE_STATS_LocalK(name, number)
#define PACKSCHED_DECODE_STATS(name, number, Kind, alias) \
  PACKSCHED_DECODE_STATS_##Kind(name, number)

bool DecodeStats(Reader& r, WireStats* s) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      PACKSCHED_PLAN_STATS(PACKSCHED_DECODE_STATS)
      default:
        return std::nullopt;
    }
  });
}

// The wire-only stats into `out` (Cap: the member of the same name; Micros: alias_time).
#define PACKSCHED_TAKE_STATS_Cap(name, alias) out->name = s.name;
#define PACKSCHED_TAKE_STATS_Micros(name, alias) out->alias##_time = absl::Microseconds(s.name);
#define PACKSCHED_TAKE_STATS_Int(name, alias)
#define PACKSCHED_TAKE_STATS_Double(name, alias)
#define PACKSCHED_TAKE_STATS_LocalK(name, alias)
#define PACKSCHED_TAKE_STATS(name, number, Kind, alias) PACKSCHED_TAKE_STATS_##Kind(name, alias)

void TakeWireStats(const WireStats& s, PlanResult* out) {
  PACKSCHED_PLAN_STATS(PACKSCHED_TAKE_STATS)
}

}  // namespace

GlobalCounts GlobalCountsFromProto(const v1::GlobalCounts& g) {
  GlobalCounts out;
#define PACKSCHED_FROM_GLOBAL(name, number, Kind) out.name = g.name();
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_FROM_GLOBAL)
  return out;
}

#define PACKSCHED_FROM_PART_Int(name) part.name = m.name();
#define PACKSCHED_FROM_PART_Bool(name) part.name = m.name();
#define PACKSCHED_FROM_PART_Ints(name) part.name.assign(m.name().begin(), m.name().end());
#define PACKSCHED_FROM_PART_LossScale(name) has_scales |= m.has_##name();
#define PACKSCHED_FROM_PART(name, number, Kind) PACKSCHED_FROM_PART_##Kind(name)
#define PACKSCHED_SCALE_LossScale(name) out.loss_scales.push_back(m.name());
#define PACKSCHED_SCALE_Int(name)
#define PACKSCHED_SCALE_Bool(name)
#define PACKSCHED_SCALE_Ints(name)
#define PACKSCHED_SCALE(name, number, Kind) PACKSCHED_SCALE_##Kind(name)
#define PACKSCHED_FROM_RESPONSE_Count(name) out.name = r.name();
#define PACKSCHED_FROM_RESPONSE_LocalK(name) \
  out.name = r.name();                       \
  plan.stats.local_k = r.name();
#define PACKSCHED_FROM_RESPONSE_Indices(name) plan.name.assign(r.name().begin(), r.name().end());
#define PACKSCHED_FROM_RESPONSE_Weights(name) out.name.assign(r.name().begin(), r.name().end());
#define PACKSCHED_FROM_RESPONSE_Parts(name)
#define PACKSCHED_FROM_RESPONSE_Global(name)
#define PACKSCHED_FROM_RESPONSE_Stats(name)
#define PACKSCHED_FROM_RESPONSE_Tree(name)
#define PACKSCHED_FROM_RESPONSE(name, number, Kind) PACKSCHED_FROM_RESPONSE_##Kind(name)
#define PACKSCHED_FROM_STATS_Int(name) plan.stats.name = s.name();
#define PACKSCHED_FROM_STATS_Double(name) plan.stats.name = s.name();
#define PACKSCHED_FROM_STATS_Cap(name)
#define PACKSCHED_FROM_STATS_Micros(name)
#define PACKSCHED_FROM_STATS_LocalK(name)
#define PACKSCHED_FROM_STATS(name, number, Kind, alias) PACKSCHED_FROM_STATS_##Kind(name)

#define PACKSCHED_PARTS_NAME_Parts(name) name
#define PACKSCHED_PARTS_NAME_Count(name)
#define PACKSCHED_PARTS_NAME_LocalK(name)
#define PACKSCHED_PARTS_NAME_Indices(name)
#define PACKSCHED_PARTS_NAME_Weights(name)
#define PACKSCHED_PARTS_NAME_Global(name)
#define PACKSCHED_PARTS_NAME_Stats(name)
#define PACKSCHED_PARTS_NAME_Tree(name)
#define PACKSCHED_PARTS_NAME(name, number, Kind) PACKSCHED_PARTS_NAME_##Kind(name)

namespace {

std::vector<int64_t> Ints(const google::protobuf::RepeatedField<int64_t>& field) {
  return std::vector<int64_t>(field.begin(), field.end());
}

// A forest request's tree plan: the layouts beside the plan's micro-batches (over pieces).
planner::TreePlan TreePlanFromProto(const v1::TreePlan& tree, const planner::MicroBatchPlan& plan) {
  planner::TreePlan out;
  for (int i = 0; i < tree.layouts_size(); ++i) {
    const v1::TreeLayout& l = tree.layouts(i);
    planner::TreeMicroBatch part;
    if (static_cast<size_t>(i) < plan.parts.size()) part.batch = plan.parts[i];
    part.layout = planner::TreeLayout{Ints(l.nodes()),    Ints(l.piece_begin()),  Ints(l.row()),
                                      Ints(l.position()), Ints(l.subtree_end()),  Ints(l.parent()),
                                      Ints(l.rollouts()), Ints(l.rollout_entry())};
    out.parts.push_back(std::move(part));
  }
  out.dropped = plan.dropped;
  out.rollout_part = Ints(tree.rollout_part());
  out.stats = plan.stats;
  out.num_rollouts = static_cast<int64_t>(out.rollout_part.size());
  out.rollout_tokens = tree.rollout_tokens();
  out.forwarded_tokens = tree.forwarded_tokens();
  return out;
}

}  // namespace

PlanResult PlanResultFromProto(const v1::PlanResponse& r) {
  PlanResult out;
  planner::MicroBatchPlan& plan = out.plan;
  bool has_scales = false;
  const auto& parts = r.PACKSCHED_PLAN_RESPONSE(PACKSCHED_PARTS_NAME)();
  plan.parts.reserve(parts.size());
  for (const v1::MicroBatch& m : parts) {
    planner::MicroBatch part;
    PACKSCHED_MICRO_BATCH(PACKSCHED_FROM_PART)
    plan.parts.push_back(std::move(part));
  }
  if (has_scales) {
    for (const v1::MicroBatch& m : parts) {
      PACKSCHED_MICRO_BATCH(PACKSCHED_SCALE)
    }
  }
  const v1::PlanStats& s = r.stats();
  PACKSCHED_PLAN_STATS(PACKSCHED_FROM_STATS)
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_FROM_RESPONSE)
  out.global = GlobalCountsFromProto(r.global());
#define PACKSCHED_FROM_WIRE_Cap(name, alias) out.name = s.name();
#define PACKSCHED_FROM_WIRE_Micros(name, alias) out.alias##_time = absl::Microseconds(s.name());
#define PACKSCHED_FROM_WIRE_Int(name, alias)
#define PACKSCHED_FROM_WIRE_Double(name, alias)
#define PACKSCHED_FROM_WIRE_LocalK(name, alias)
#define PACKSCHED_FROM_WIRE(name, number, Kind, alias) PACKSCHED_FROM_WIRE_##Kind(name, alias)
  PACKSCHED_PLAN_STATS(PACKSCHED_FROM_WIRE)
  if (r.has_tree()) out.tree = TreePlanFromProto(r.tree(), out.plan);
  return out;
}

// packsched.v1.PlanResponse (PACKSCHED_PLAN_RESPONSE).
#define PACKSCHED_DECODE_RESPONSE_Count(name, number) \
  case number:                                        \
    return Int64(wire_type, in, &out.name);
#define PACKSCHED_DECODE_RESPONSE_LocalK(name, number) \
  case number:                                         \
    return Int64(wire_type, in, &out.name);
#define PACKSCHED_DECODE_RESPONSE_Parts(name, number)            \
  case number: {                                                 \
    if (wire_type != kLengthDelimited) return std::nullopt;      \
    if (!in.Sub(&sub)) return false;                             \
    planner::MicroBatch& part = plan.parts.emplace_back();       \
    part.empty = false; /* the message's default */              \
    return DecodeMicroBatch(sub, &part, &scales.emplace_back()); \
  }
#define PACKSCHED_DECODE_RESPONSE_Indices(name, number)              \
  case number:                                                       \
    if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt; \
    return in.RepeatedVarint(wire_type, &plan.name);
#define PACKSCHED_DECODE_RESPONSE_Weights(name, number)               \
  case number:                                                        \
    if (!IsRepeatedNumeric(wire_type, kFixed64)) return std::nullopt; \
    return in.RepeatedDouble(wire_type, &out.name);
#define PACKSCHED_DECODE_RESPONSE_Global(name, number)      \
  case number:                                              \
    if (wire_type != kLengthDelimited) return std::nullopt; \
    return in.Sub(&sub) && DecodeGlobal(sub, &out.global);
#define PACKSCHED_DECODE_RESPONSE_Stats(name, number)       \
  case number:                                              \
    if (wire_type != kLengthDelimited) return std::nullopt; \
    return in.Sub(&sub) && DecodeStats(sub, &stats);
// A tree plan's layout answers a forest request; this decoder skips it as an unknown field.
#define PACKSCHED_DECODE_RESPONSE_Tree(name, number)
#define PACKSCHED_DECODE_RESPONSE(name, number, Kind) PACKSCHED_DECODE_RESPONSE_##Kind(name, number)

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
          PACKSCHED_PLAN_RESPONSE(PACKSCHED_DECODE_RESPONSE)
          default:
            return std::nullopt;
        }
      });
  if (!ok) {
    return absl::InternalError(absl::StrCat("malformed PlanResponse from the sidecar near byte ",
                                            r.offset(), " of ", bytes.size()));
  }
  bool has_scales = false;
  for (const std::optional<double>& scale : scales) has_scales |= scale.has_value();
  if (has_scales) {
    out.loss_scales.reserve(scales.size());
    for (const std::optional<double>& scale : scales) out.loss_scales.push_back(scale.value_or(0));
  }
  plan.stats = stats.plan;
#define PACKSCHED_BOUND_LocalK(name) plan.stats.local_k = out.name;
#define PACKSCHED_BOUND_Count(name)
#define PACKSCHED_BOUND_Parts(name)
#define PACKSCHED_BOUND_Indices(name)
#define PACKSCHED_BOUND_Weights(name)
#define PACKSCHED_BOUND_Global(name)
#define PACKSCHED_BOUND_Stats(name)
#define PACKSCHED_BOUND_Tree(name)
#define PACKSCHED_BOUND(name, number, Kind) PACKSCHED_BOUND_##Kind(name)
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_BOUND)
  TakeWireStats(stats, &out);
  return out;
}

}  // namespace packsched::client::internal
