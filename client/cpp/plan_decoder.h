#ifndef PACKSCHED_CLIENT_CPP_PLAN_DECODER_H_
#define PACKSCHED_CLIENT_CPP_PLAN_DECODER_H_

// The client's conversions of a packsched.v1.PlanResponse into its PlanResult (internal to
// client/cpp; scheduler_client.h is the public API).
//
// DecodePlanResponse reads the serialized message straight into PlanResult, without building the
// protobuf message first: parsing the message was most of a Plan call's cost on the client
// (every packed repeated field grown element by element, then copied again into the value
// types); this reads each packed field once into a vector reserved to its length. It follows the
// protobuf wire format as the generated parser does: repeated numeric fields packed or not (and
// split over several occurrences), the last occurrence of a scalar wins, repeated occurrences of
// a message field merge, unknown fields (groups included) and known fields sent with another
// wire type are skipped.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cpp/scheduler_client.h"
#include "packsched/v1/scheduler.pb.h"

namespace packsched::client::internal {

// The PlanResult of a parsed message (BalanceBatch's per-rank plans, a forest request's answer;
// the reference the decoder is tested against), its `tree` set when the message has one. Never
// fails.
PlanResult PlanResultFromProto(const v1::PlanResponse& response);
GlobalCounts GlobalCountsFromProto(const v1::GlobalCounts& global);

// The PlanResult of a serialized PlanResponse; equal to PlanResultFromProto of the parsed message
// but for `tree`, which it skips (the client parses a forest request's answer as a message).
// Returns Internal (the sidecar's answer is broken, not the caller's request), naming the byte
// offset, for malformed bytes (a truncated or overlong varint, a length past the end, field
// number 0, an unmatched group, a packed double field whose length is not a multiple of 8), all
// of which protobuf rejects too. Thread-safe (pure).
absl::StatusOr<PlanResult> DecodePlanResponse(absl::string_view bytes);

}  // namespace packsched::client::internal

#endif  // PACKSCHED_CLIENT_CPP_PLAN_DECODER_H_
