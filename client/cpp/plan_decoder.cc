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
// per field, reading it into the member of the same name, by the field's kind. Each rule macro
// takes what it touches as arguments: the reader `in` and the field's `wire_type`, the object
// it fills, and the row's columns; the table's X macro binds them.

// packsched.v1.MicroBatch (PACKSCHED_MICRO_BATCH) into `part` (and `loss_scale`). The row
//   X(tokens, 2, Int)
// expands, through PACKSCHED_DECODE_PART, to
//   case 2:
//     return Int64(wire_type, in, &part->tokens);
#define PACKSCHED_DECODE_PART_Int(in, wire_type, part, loss_scale, name, number) \
  case number:                                                                   \
    return Int64(wire_type, in, &(part)->name);
#define PACKSCHED_DECODE_PART_Bool(in, wire_type, part, loss_scale, name, number) \
  case number:                                                                    \
    return Bool(wire_type, in, &(part)->name);
#define PACKSCHED_DECODE_PART_Ints(in, wire_type, part, loss_scale, name, number) \
  case number:                                                                    \
    if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;              \
    return (in).RepeatedVarint(wire_type, &(part)->name);
#define PACKSCHED_DECODE_PART_LossScale(in, wire_type, part, loss_scale, name, number) \
  case number: {                                                                       \
    double value;                                                                      \
    const std::optional<bool> read = Double(wire_type, in, &value);                    \
    if (read == true) *(loss_scale) = value;                                           \
    return read;                                                                       \
  }
#define PACKSCHED_DECODE_PART(name, number, Kind) \
  PACKSCHED_DECODE_PART_##Kind(in, wire_type, part, loss_scale, name, number)

bool DecodeMicroBatch(Reader& r, planner::MicroBatch* part, std::optional<double>* loss_scale) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      PACKSCHED_MICRO_BATCH(PACKSCHED_DECODE_PART)
      default:
        return std::nullopt;
    }
  });
}

// packsched.v1.GlobalCounts (PACKSCHED_GLOBAL_COUNTS), merged into `g`. The row
//   X(loss_tokens, 2, Loss)
// expands, through PACKSCHED_DECODE_GLOBAL, to
//   case 2:
//     return Int64(wire_type, in, &g->loss_tokens);
#define PACKSCHED_DECODE_GLOBAL_Count(in, wire_type, g, name, number) \
  case number:                                                        \
    return Int64(wire_type, in, &(g)->name);
#define PACKSCHED_DECODE_GLOBAL(name, number, Kind) \
  PACKSCHED_DECODE_GLOBAL_Count(in, wire_type, g, name, number)

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
// microseconds). The planner's own kinds are in `plan`: nothing to declare. The row
//   X(wait_us, 14, Micros, wait)
// expands, through PACKSCHED_WIRE_STATS, to
//   int64_t wait_us = 0;
struct WireStats {
  planner::PlanStats plan;
#define PACKSCHED_WIRE_STATS_Cap(name) int64_t name = 0;
#define PACKSCHED_WIRE_STATS_Micros(name) int64_t name = 0;
#define PACKSCHED_WIRE_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_WIRE_STATS, Kind, Cap, Micros)(name)
  PACKSCHED_PLAN_STATS(PACKSCHED_WIRE_STATS)
};

// packsched.v1.PlanStats (PACKSCHED_PLAN_STATS), merged into `s` (LocalK is not on the wire in
// PlanStats: the response's local_num_micro_batches carries it). The row
//   X(imbalance, 7, Double, _)
// expands, through PACKSCHED_DECODE_STATS, to
//   case 7:
//     return Double(wire_type, in, &s->plan.imbalance);
#define PACKSCHED_DECODE_STATS_Int(in, wire_type, s, name, number) \
  case number:                                                     \
    return Int64(wire_type, in, &(s)->plan.name);
#define PACKSCHED_DECODE_STATS_Double(in, wire_type, s, name, number) \
  case number:                                                        \
    return Double(wire_type, in, &(s)->plan.name);
#define PACKSCHED_DECODE_STATS_WIRE(in, wire_type, s, name, number) \
  case number:                                                      \
    return Int64(wire_type, in, &(s)->name);
#define PACKSCHED_DECODE_STATS_Cap PACKSCHED_DECODE_STATS_WIRE
#define PACKSCHED_DECODE_STATS_Micros PACKSCHED_DECODE_STATS_WIRE
#define PACKSCHED_DECODE_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_DECODE_STATS, Kind, LocalK)(in, wire_type, s, name, number)

bool DecodeStats(Reader& r, WireStats* s) {
  return ForEachField(r, [&](uint32_t number, int wire_type, Reader& in) -> std::optional<bool> {
    switch (number) {
      PACKSCHED_PLAN_STATS(PACKSCHED_DECODE_STATS)
      default:
        return std::nullopt;
    }
  });
}

// The stats into `out`: the planner's (keeping out's local_k, which the response carries) and
// the wire-only ones (Cap: the member of the same name; Micros: alias_time). The row
//   X(wait_us, 14, Micros, wait)
// expands, through PACKSCHED_TAKE_STATS, to
//   out->wait_time = absl::Microseconds(s.wait_us);
#define PACKSCHED_TAKE_STATS_Cap(out, s, name, alias) (out)->name = (s).name;
#define PACKSCHED_TAKE_STATS_Micros(out, s, name, alias) \
  (out)->alias##_time = absl::Microseconds((s).name);
#define PACKSCHED_TAKE_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_TAKE_STATS, Kind, Cap, Micros)(out, s, name, alias)

void TakeWireStats(const WireStats& s, PlanResult* out) {
  const int64_t local_k = out->plan.stats.local_k;
  out->plan.stats = s.plan;
  out->plan.stats.local_k = local_k;
  PACKSCHED_PLAN_STATS(PACKSCHED_TAKE_STATS)
}

// From parsed messages (BalanceBatch's ranks): the same rules over the proto's accessors.

// The micro-batches `parts` into `out` (PACKSCHED_MICRO_BATCH): the loss scales only when some
// micro-batch has one. The row
//   X(cu_seqlens, 9, Ints)
// expands, through PACKSCHED_FROM_PART, to
//   part.cu_seqlens.assign(m.cu_seqlens().begin(), m.cu_seqlens().end());
#define PACKSCHED_FROM_PART_Int(part, m, has_scales, name) (part).name = (m).name();
#define PACKSCHED_FROM_PART_Bool(part, m, has_scales, name) (part).name = (m).name();
#define PACKSCHED_FROM_PART_Ints(part, m, has_scales, name) \
  (part).name.assign((m).name().begin(), (m).name().end());
#define PACKSCHED_FROM_PART_LossScale(part, m, has_scales, name) (has_scales) |= (m).has_##name();
#define PACKSCHED_FROM_PART(name, number, Kind) \
  PACKSCHED_FROM_PART_##Kind(part, m, has_scales, name)
// Only the LossScale kind is a loss scale: the others have nothing to do here.
#define PACKSCHED_SCALE_LossScale(out, m, name) (out)->loss_scales.push_back((m).name());
#define PACKSCHED_SCALE(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_SCALE, Kind, LossScale)(out, m, name)

void PartsFromProto(const google::protobuf::RepeatedPtrField<v1::MicroBatch>& parts,
                    PlanResult* out) {
  planner::MicroBatchPlan& plan = out->plan;
  bool has_scales = false;
  plan.parts.reserve(parts.size());
  for (const v1::MicroBatch& m : parts) {
    planner::MicroBatch part;
    PACKSCHED_MICRO_BATCH(PACKSCHED_FROM_PART)
    plan.parts.push_back(std::move(part));
  }
  if (!has_scales) return;
  for (const v1::MicroBatch& m : parts) {
    PACKSCHED_MICRO_BATCH(PACKSCHED_SCALE)
  }
}

// The stats `s` into `out` (PACKSCHED_PLAN_STATS): the planner's into its plan, the wire-only
// ones as TakeWireStats does (LocalK is the response's, read with it). The row
//   X(max_token_len, 9, Cap, cap)
// expands, through PACKSCHED_FROM_STATS, to
//   out->max_token_len = s.max_token_len();
#define PACKSCHED_FROM_STATS_Int(out, s, name, alias) (out)->plan.stats.name = (s).name();
#define PACKSCHED_FROM_STATS_Double PACKSCHED_FROM_STATS_Int
#define PACKSCHED_FROM_STATS_Cap(out, s, name, alias) (out)->name = (s).name();
#define PACKSCHED_FROM_STATS_Micros(out, s, name, alias) \
  (out)->alias##_time = absl::Microseconds((s).name());
#define PACKSCHED_FROM_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_FROM_STATS, Kind, LocalK)(out, s, name, alias)

// A body of one macro without a semicolon, which clang-format 14 joins onto the signature.
// clang-format off
void StatsFromProto(const v1::PlanStats& s, PlanResult* out) {
  PACKSCHED_PLAN_STATS(PACKSCHED_FROM_STATS)
}  // clang-format on

std::vector<int64_t> Ints(const google::protobuf::RepeatedField<int64_t>& field) {
  return std::vector<int64_t>(field.begin(), field.end());
}

// A forest request's tree plan (PACKSCHED_TREE_PLAN, each layout's PACKSCHED_TREE_LAYOUT; members
// of the same name): the layouts beside the plan's micro-batches (over pieces). The rows
//   X(rollouts, 7, Ints)   X(rollout_part, 2, Ints)   X(forwarded_tokens, 3, Int)
// expand, through PACKSCHED_FROM_LAYOUT and PACKSCHED_FROM_TREE, to
//   part.layout.rollouts = Ints(l.rollouts());   (in the loop over the layouts)
//   out.rollout_part = Ints(tree.rollout_part());
//   out.forwarded_tokens = tree.forwarded_tokens();
#define PACKSCHED_FROM_LAYOUT(name, number, Kind) part.layout.name = Ints(l.name());
#define PACKSCHED_FROM_TREE_Layouts(out, tree, plan, name)                          \
  for (int i = 0; i < (tree).name##_size(); ++i) {                                  \
    const v1::TreeLayout& l = (tree).name(i);                                       \
    planner::TreeMicroBatch part;                                                   \
    if (static_cast<size_t>(i) < (plan).parts.size()) part.batch = (plan).parts[i]; \
    PACKSCHED_TREE_LAYOUT(PACKSCHED_FROM_LAYOUT)                                    \
    (out).parts.push_back(std::move(part));                                         \
  }
#define PACKSCHED_FROM_TREE_Ints(out, tree, plan, name) (out).name = Ints((tree).name());
#define PACKSCHED_FROM_TREE_Int(out, tree, plan, name) (out).name = (tree).name();
#define PACKSCHED_FROM_TREE(name, number, Kind) PACKSCHED_FROM_TREE_##Kind(out, tree, plan, name)

planner::TreePlan TreePlanFromProto(const v1::TreePlan& tree, const planner::MicroBatchPlan& plan) {
  planner::TreePlan out;
  PACKSCHED_TREE_PLAN(PACKSCHED_FROM_TREE)
  out.dropped = plan.dropped;
  out.stats = plan.stats;
  out.num_rollouts = static_cast<int64_t>(out.rollout_part.size());
  return out;
}

}  // namespace

// packsched.v1.GlobalCounts, member by member. The row
//   X(loss_tokens, 2, Loss)
// expands, through PACKSCHED_FROM_GLOBAL, to
//   out.loss_tokens = g.loss_tokens();
#define PACKSCHED_FROM_GLOBAL_Count(out, g, name) (out).name = (g).name();
#define PACKSCHED_FROM_GLOBAL(name, number, Kind) PACKSCHED_FROM_GLOBAL_Count(out, g, name)

GlobalCounts GlobalCountsFromProto(const v1::GlobalCounts& g) {
  GlobalCounts out;
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_FROM_GLOBAL)
  return out;
}

// packsched.v1.PlanResponse (PACKSCHED_PLAN_RESPONSE) into `out`, every kind. The row
//   X(reorder, 4, Indices)
// expands, through PACKSCHED_FROM_RESPONSE, to
//   out.plan.reorder.assign(r.reorder().begin(), r.reorder().end());
#define PACKSCHED_FROM_RESPONSE_Count(out, r, name) (out).name = (r).name();
#define PACKSCHED_FROM_RESPONSE_LocalK(out, r, name) \
  (out).name = (r).name();                           \
  (out).plan.stats.local_k = (r).name();
#define PACKSCHED_FROM_RESPONSE_Parts(out, r, name) PartsFromProto((r).name(), &(out));
#define PACKSCHED_FROM_RESPONSE_Indices(out, r, name) \
  (out).plan.name.assign((r).name().begin(), (r).name().end());
#define PACKSCHED_FROM_RESPONSE_Weights(out, r, name) \
  (out).name.assign((r).name().begin(), (r).name().end());
#define PACKSCHED_FROM_RESPONSE_Global(out, r, name) (out).name = GlobalCountsFromProto((r).name());
#define PACKSCHED_FROM_RESPONSE_Stats(out, r, name) StatsFromProto((r).name(), &(out));
// A forest request's tree plan, last in the table: its micro-batches are the plan's, read above.
#define PACKSCHED_FROM_RESPONSE_Tree(out, r, name) \
  if ((r).has_##name()) (out).name = TreePlanFromProto((r).name(), (out).plan);
#define PACKSCHED_FROM_RESPONSE(name, number, Kind) PACKSCHED_FROM_RESPONSE_##Kind(out, r, name)

PlanResult PlanResultFromProto(const v1::PlanResponse& r) {
  PlanResult out;
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_FROM_RESPONSE)
  return out;
}

// packsched.v1.PlanResponse (PACKSCHED_PLAN_RESPONSE), from its bytes, into `out`: micro-batches
// into its plan (their loss scales into `scales`), the stats into `stats` (TakeWireStats after).
// The row
//   X(local_num_micro_batches, 2, LocalK)
// expands, through PACKSCHED_DECODE_RESPONSE, to
//   case 2: {
//     const std::optional<bool> read = Int64(wire_type, in, &out.local_num_micro_batches);
//     out.plan.stats.local_k = out.local_num_micro_batches;
//     return read;
//   }
#define PACKSCHED_DECODE_RESPONSE_Count(in, sub, wire_type, out, scales, stats, name, number) \
  case number:                                                                                \
    return Int64(wire_type, in, &(out).name);
#define PACKSCHED_DECODE_RESPONSE_LocalK(in, sub, wire_type, out, scales, stats, name, number) \
  case number: {                                                                               \
    const std::optional<bool> read = Int64(wire_type, in, &(out).name);                        \
    (out).plan.stats.local_k = (out).name;                                                     \
    return read;                                                                               \
  }
#define PACKSCHED_DECODE_RESPONSE_Parts(in, sub, wire_type, out, scales, stats, name, number) \
  case number: {                                                                              \
    if ((wire_type) != kLengthDelimited) return std::nullopt;                                 \
    if (!(in).Sub(&(sub))) return false;                                                      \
    planner::MicroBatch& part = (out).plan.parts.emplace_back();                              \
    part.empty = false; /* the message's default */                                           \
    return DecodeMicroBatch(sub, &part, &(scales).emplace_back());                            \
  }
#define PACKSCHED_DECODE_RESPONSE_Indices(in, sub, wire_type, out, scales, stats, name, number) \
  case number:                                                                                  \
    if (!IsRepeatedNumeric(wire_type, kVarint)) return std::nullopt;                            \
    return (in).RepeatedVarint(wire_type, &(out).plan.name);
#define PACKSCHED_DECODE_RESPONSE_Weights(in, sub, wire_type, out, scales, stats, name, number) \
  case number:                                                                                  \
    if (!IsRepeatedNumeric(wire_type, kFixed64)) return std::nullopt;                           \
    return (in).RepeatedDouble(wire_type, &(out).name);
#define PACKSCHED_DECODE_RESPONSE_Global(in, sub, wire_type, out, scales, stats, name, number) \
  case number:                                                                                 \
    if ((wire_type) != kLengthDelimited) return std::nullopt;                                  \
    return (in).Sub(&(sub)) && DecodeGlobal(sub, &(out).name);
#define PACKSCHED_DECODE_RESPONSE_Stats(in, sub, wire_type, out, scales, stats, name, number) \
  case number:                                                                                \
    if ((wire_type) != kLengthDelimited) return std::nullopt;                                 \
    return (in).Sub(&(sub)) && DecodeStats(sub, &(stats));
// A tree plan's layout answers a forest request; this decoder skips it as an unknown field.
#define PACKSCHED_DECODE_RESPONSE(name, number, Kind)            \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_DECODE_RESPONSE, Kind, Tree) \
  (in, sub, wire_type, out, scales, stats, name, number)

absl::StatusOr<PlanResult> DecodePlanResponse(absl::string_view bytes) {
  PlanResult out;
  out.global = GlobalCounts{0, 0, 0, 0};  // the message's defaults, as PlanResultFromProto
  std::vector<std::optional<double>> scales;
  WireStats stats;
  Reader r(bytes.data(), bytes.data(), bytes.data() + bytes.size());
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
  TakeWireStats(stats, &out);
  return out;
}

}  // namespace packsched::client::internal
