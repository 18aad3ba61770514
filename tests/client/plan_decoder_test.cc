// DecodePlanResponse reads a serialized PlanResponse into the client's PlanResult exactly as
// parsing the message with protobuf and converting it does: every field, the wire-format
// variants the generated parser accepts, and the malformed bytes it rejects.

#include "client/cpp/plan_decoder.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packsched/v1/scheduler.pb.h"

namespace packsched::client::internal {
namespace {

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

std::vector<uint64_t> Bits(const std::vector<double>& values) {
  std::vector<uint64_t> bits;
  for (double value : values) bits.push_back(Bits(value));
  return bits;
}

void ExpectSame(const PlanResult& a, const PlanResult& b) {
  EXPECT_EQ(a.num_micro_batches, b.num_micro_batches);
  EXPECT_EQ(a.local_num_micro_batches, b.local_num_micro_batches);
  ASSERT_EQ(a.plan.parts.size(), b.plan.parts.size());
  for (size_t i = 0; i < a.plan.parts.size(); ++i) {
    const planner::MicroBatch& x = a.plan.parts[i];
    const planner::MicroBatch& y = b.plan.parts[i];
    EXPECT_EQ(x.indices, y.indices) << i;
    EXPECT_EQ(x.tokens, y.tokens) << i;
    EXPECT_EQ(x.aligned_tokens, y.aligned_tokens) << i;
    EXPECT_EQ(x.total, y.total) << i;
    EXPECT_EQ(x.padded_tokens, y.padded_tokens) << i;
    EXPECT_EQ(x.cost, y.cost) << i;
    EXPECT_EQ(x.max_seqlen, y.max_seqlen) << i;
    EXPECT_EQ(x.max_seqlen_aligned, y.max_seqlen_aligned) << i;
    EXPECT_EQ(x.cu_seqlens, y.cu_seqlens) << i;
    EXPECT_EQ(x.cu_seqlens_aligned, y.cu_seqlens_aligned) << i;
    EXPECT_EQ(x.empty, y.empty) << i;
    EXPECT_EQ(x.overlong, y.overlong) << i;
  }
  EXPECT_EQ(a.plan.reorder, b.plan.reorder);
  EXPECT_EQ(a.plan.revert, b.plan.revert);
  EXPECT_EQ(a.plan.dropped, b.plan.dropped);
  const planner::PlanStats& s = a.plan.stats;
  const planner::PlanStats& t = b.plan.stats;
  EXPECT_EQ(s.num_sequences, t.num_sequences);
  EXPECT_EQ(s.num_kept, t.num_kept);
  EXPECT_EQ(s.total_tokens, t.total_tokens);
  EXPECT_EQ(s.total_cost, t.total_cost);
  EXPECT_EQ(s.max_part_cost, t.max_part_cost);
  EXPECT_EQ(s.min_part_cost, t.min_part_cost);
  EXPECT_EQ(Bits(s.imbalance), Bits(t.imbalance));
  EXPECT_EQ(s.lower_bound_k, t.lower_bound_k);
  EXPECT_EQ(s.local_k, t.local_k);
  EXPECT_EQ(s.over_cap_parts, t.over_cap_parts);
  EXPECT_EQ(s.naive_padded_tokens, t.naive_padded_tokens);
  EXPECT_EQ(s.packed_tokens, t.packed_tokens);
  EXPECT_EQ(s.forwarded_tokens, t.forwarded_tokens);
  EXPECT_EQ(s.loss_tokens, t.loss_tokens);
  EXPECT_EQ(Bits(a.loss_weights), Bits(b.loss_weights));
  EXPECT_EQ(Bits(a.loss_scales), Bits(b.loss_scales));
  EXPECT_EQ(a.global.num_sequences, b.global.num_sequences);
  EXPECT_EQ(a.global.loss_tokens, b.global.loss_tokens);
  EXPECT_EQ(a.global.sequences_with_loss, b.global.sequences_with_loss);
  EXPECT_EQ(a.global.world_size, b.global.world_size);
  EXPECT_EQ(a.max_token_len, b.max_token_len);
  EXPECT_EQ(a.local_time, b.local_time);
  EXPECT_EQ(a.wait_time, b.wait_time);
  EXPECT_EQ(a.partition_time, b.partition_time);
}

// Decodes `bytes` both ways; protobuf must accept them.
void ExpectDecodesLikeProtobuf(const std::string& bytes) {
  v1::PlanResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  const absl::StatusOr<PlanResult> decoded = DecodePlanResponse(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSame(*decoded, PlanResultFromProto(parsed));
}

// Every field set, with values that stress the encoding (negatives, 64-bit, NaN).
v1::PlanResponse Full() {
  v1::PlanResponse r;
  r.set_num_micro_batches(3);
  r.set_local_num_micro_batches(2);
  for (int i = 0; i < 3; ++i) {
    v1::MicroBatch* m = r.add_micro_batches();
    m->add_indices(i);
    m->add_indices(int64_t{1} << 40);
    m->set_tokens(1000 + i);
    m->set_aligned_tokens(1024 + i);
    m->set_total(2048 + i);
    m->set_padded_tokens(4096 + i);
    m->set_cost(-(int64_t{1} << 62));
    m->set_max_seqlen(700 + i);
    m->set_max_seqlen_aligned(704 + i);
    for (int32_t v : {0, 300, 1000, -7, std::numeric_limits<int32_t>::max()}) m->add_cu_seqlens(v);
    for (int32_t v : {0, 304, 1024}) m->add_cu_seqlens_aligned(v);
    m->set_empty(i == 1);
    m->set_overlong(i == 2);
    if (i == 0) m->set_loss_scale(std::nan(""));
    if (i == 2) m->set_loss_scale(0.25);
  }
  for (int64_t v : {4, 0, 1, 2}) r.add_reorder(v);
  for (int64_t v : {1, 2, 3, -1, 0}) r.add_revert(v);
  r.add_dropped(3);
  for (double w : {0.5, -0.0, 1e-300, std::numeric_limits<double>::infinity()}) {
    r.add_loss_weights(w);
  }
  v1::GlobalCounts* g = r.mutable_global();
  g->set_num_sequences(5);
  g->set_loss_tokens(12345678901);
  g->set_sequences_with_loss(4);
  g->set_world_size(64);
  v1::PlanStats* s = r.mutable_stats();
  int64_t value = 11;
  for (int field = 1; field <= s->GetDescriptor()->field_count(); ++field) {
    const google::protobuf::FieldDescriptor* f = s->GetDescriptor()->FindFieldByNumber(field);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
      s->GetReflection()->SetDouble(s, f, 1.0625);
    } else {
      s->GetReflection()->SetInt64(s, f, value++ * 1000003);
    }
  }
  return r;
}

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string Tag(int field, int wire_type) { return Varint((field << 3) | wire_type); }
std::string Len(int field, const std::string& payload) {
  return Tag(field, 2) + Varint(payload.size()) + payload;
}

TEST(PlanDecoder, EveryFieldOfAFullResponse) {
  ExpectDecodesLikeProtobuf(Full().SerializeAsString());
  const PlanResult decoded = *DecodePlanResponse(Full().SerializeAsString());
  EXPECT_EQ(decoded.plan.parts[0].cu_seqlens[3], -7);
  EXPECT_EQ(decoded.plan.revert[3], -1);
  ASSERT_EQ(decoded.loss_scales.size(), 3u);
  EXPECT_TRUE(std::isnan(decoded.loss_scales[0]));
  EXPECT_EQ(decoded.loss_scales[1], 0.0);  // not set: 0, as the message reads
  EXPECT_EQ(decoded.loss_scales[2], 0.25);
}

TEST(PlanDecoder, EmptyAndDefaultMessages) {
  ExpectDecodesLikeProtobuf("");
  v1::PlanResponse r;
  r.add_micro_batches();  // every field default: not empty, as the message reads
  r.mutable_global();
  ExpectDecodesLikeProtobuf(r.SerializeAsString());
  EXPECT_FALSE(DecodePlanResponse(r.SerializeAsString())->plan.parts[0].empty);
  EXPECT_TRUE(DecodePlanResponse(r.SerializeAsString())->loss_scales.empty());
}

TEST(PlanDecoder, WireFormatVariantsTheGeneratedParserAccepts) {
  std::string bytes;
  bytes += Tag(4, 0) + Varint(5) + Tag(4, 0) + Varint(7);  // reorder unpacked
  bytes += Len(4, Varint(9) + Varint(300));                // then packed: appended
  bytes += Len(5, Varint(uint64_t(-1)));                   // revert -1 (10-byte varint)
  bytes += Tag(1, 0) + Varint(3) + Tag(1, 0) + Varint(4);  // a scalar twice: the last wins
  bytes += Tag(2, 5) + std::string(4, '\x01');             // a known field, other wire type
  bytes += Tag(7, 1) + std::string(8, '\0');               // loss_weights unpacked (0.0)
  bytes += Len(8, Tag(1, 0) + Varint(10));                 // global twice: merged
  bytes += Len(8, Tag(4, 0) + Varint(2));
  std::string part = Tag(9, 0) + Varint(uint64_t(-3)) + Len(9, Varint(8));  // cu_seqlens mixed
  part += Tag(13, 1) + std::string("\0\0\0\0\0\0\xf0\x3f", 8);              // loss_scale 1.0
  part += Tag(99, 2) + Varint(2) + "xy";                                    // unknown, inside
  bytes += Len(3, part);
  bytes += Len(3, "");  // a second, empty micro-batch
  // Unknown fields of every wire type, a group included.
  bytes += Tag(50, 0) + Varint(1) + Tag(51, 1) + std::string(8, 'a') + Len(52, "abc") + Tag(53, 5) +
           std::string(4, 'b') + Tag(54, 3) + Tag(1, 0) + Varint(1) + Tag(54, 4);
  bytes += Len(9, Tag(7, 1) + std::string("\0\0\0\0\0\0\0\x40", 8) + Tag(13, 0) + Varint(42));
  ExpectDecodesLikeProtobuf(bytes);
  const PlanResult decoded = *DecodePlanResponse(bytes);
  EXPECT_EQ(decoded.plan.reorder, (std::vector<int64_t>{5, 7, 9, 300}));
  EXPECT_EQ(decoded.num_micro_batches, 4);
  EXPECT_EQ(decoded.global.num_sequences, 10);
  EXPECT_EQ(decoded.global.world_size, 2);
  EXPECT_EQ(decoded.plan.parts[0].cu_seqlens, (std::vector<int32_t>{-3, 8}));
  EXPECT_EQ(decoded.loss_scales, (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(decoded.plan.stats.imbalance, 2.0);
  EXPECT_EQ(decoded.local_time, absl::Microseconds(42));
}

TEST(PlanDecoder, MalformedBytesAreAnInternalError) {
  for (const std::string& bytes :
       {std::string("\x08"), std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
        Tag(3, 2) + Varint(5) + "ab", std::string("\x00", 1), Tag(1, 4), Tag(60, 3) + Tag(1, 0),
        Tag(60, 3) + Tag(61, 4), Len(3, std::string("\x00", 1)), Len(7, std::string(7, '\0')),
        Tag(60, 7)}) {
    v1::PlanResponse parsed;
    EXPECT_FALSE(parsed.ParseFromString(bytes)) << "protobuf accepts it too";
    const absl::StatusOr<PlanResult> decoded = DecodePlanResponse(bytes);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInternal);
  }
  EXPECT_THAT(DecodePlanResponse("\x08").status().message(), ::testing::HasSubstr("byte"));
}

// Every prefix of a full response: the decoder fails exactly where protobuf fails, and agrees
// with it everywhere else (a prefix that ends between fields is a valid, shorter message).
TEST(PlanDecoder, EveryTruncationAgreesWithProtobuf) {
  const std::string full = Full().SerializeAsString();
  for (size_t n = 0; n <= full.size(); ++n) {
    const std::string prefix = full.substr(0, n);
    v1::PlanResponse parsed;
    const bool accepted = parsed.ParseFromString(prefix);
    const absl::StatusOr<PlanResult> decoded = DecodePlanResponse(prefix);
    ASSERT_EQ(decoded.ok(), accepted) << "prefix of " << n << " bytes";
    if (accepted) ExpectSame(*decoded, PlanResultFromProto(parsed));
  }
}

// A new field in the proto needs a line in DecodePlanResponse (and PlanResultFromProto).
TEST(PlanDecoder, KnowsEveryFieldOfTheMessages) {
  // 10 with `tree`, which the decoder skips on purpose (a forest request's layout; this client
  // sends lengths only).
  EXPECT_EQ(v1::PlanResponse::descriptor()->field_count(), 10);
  EXPECT_EQ(v1::MicroBatch::descriptor()->field_count(), 14);
  EXPECT_EQ(v1::GlobalCounts::descriptor()->field_count(), 4);
  EXPECT_EQ(v1::PlanStats::descriptor()->field_count(), 17);
}

}  // namespace
}  // namespace packsched::client::internal
