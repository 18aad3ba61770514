#include "server/service/round_metrics.h"

namespace packsched::service {

metrics::RoundSample RoundSampleOf(absl::string_view stream, int64_t round,
                                   const absl::StatusOr<std::shared_ptr<const RoundResult>>& result,
                                   absl::Duration took, const group::RoundAgreement* agreement) {
  metrics::RoundSample s;
  s.stream = stream;
  s.round = round;
  s.whole = took;
  s.code = result.status().code();
  // Failures after the agreement (the agreed k over max_micro_batches: InvalidArgument;
  // Internal) are no peer's; of those before it, DeadlineExceeded, Aborted and
  // FailedPrecondition come only from the agreement (round_agreement.h).
  s.peer_failure = metrics::PeerFailureOf(s.code);
  if (agreement != nullptr) {
    const group::GroupInfo info = agreement->info();
    s.formations = info.formations;
    s.last_formation = info.last_formation;
  }
  if (!result.ok()) return s;
  const RoundResult& r = **result;
  const planner::PlanStats& stats = r.plan.stats;
  s.local = r.local_time;
  s.wait = r.wait_time;
  s.partition = r.partition_time;
  s.micro_batches = r.num_micro_batches;
  s.sequences = stats.num_sequences;
  s.dropped = static_cast<int64_t>(r.plan.dropped.size());
  s.imbalance = stats.imbalance;
  s.logical_tokens = stats.total_tokens;
  s.executed_tokens = stats.packed_tokens;
  s.forwarded_tokens = stats.forwarded_tokens;
  s.loss_tokens = r.loss ? r.loss->loss_tokens : 0;
  if (stats.naive_padded_tokens > 0) {
    s.padding_saved_ratio = 1.0 - static_cast<double>(stats.packed_tokens) /
                                      static_cast<double>(stats.naive_padded_tokens);
  }
  if (stats.over_cap_parts > 0) {
    // Over the cap: a part isolating one overlong sequence cannot be helped; any other can.
    int64_t isolated = 0;
    for (const planner::MicroBatch& part : r.plan.parts) isolated += part.overlong ? 1 : 0;
    s.over_cap_unavoidable = isolated;
    s.over_cap_avoidable = stats.over_cap_parts - isolated;
  }
  return s;
}

}  // namespace packsched::service
