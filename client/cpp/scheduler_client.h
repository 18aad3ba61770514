#ifndef PACKSCHED_CLIENT_CPP_SCHEDULER_CLIENT_H_
#define PACKSCHED_CLIENT_CPP_SCHEDULER_CLIENT_H_

// C++ client of the packsched sidecar (packsched.v1.Scheduler). Plain value types in and out:
// this header includes no gRPC or generated proto headers (the planner's option and plan types
// are reused, so a plan from the sidecar and one from the in-process planner look the same).
//
// Retries: a call is retried (same request, within its deadline, with backoff) only when it
// did not reach the sidecar's service — a connection that failed or dropped (UNAVAILABLE without
// the sidecar's answer). A round the sidecar answered, successfully or not, is never retried;
// sending a failed round again is the caller's decision (the sidecar runs it again).
//
// Thread-safe: one client may be shared by many threads (calls run concurrently over one
// HTTP/2 connection).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/forest.h"
#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"
#include "server/planner/planner.h"
#include "server/planner/tree_plan.h"

namespace packsched::client {

struct ClientOptions {
  // The sidecar, "host:port".
  std::string target = "127.0.0.1:50051";
  // Deadline of a call that does not pass its own. It covers waiting for the peer ranks, so keep
  // it above the sidecar's --collective_timeout.
  absl::Duration timeout = absl::Seconds(120);
  // Bearer token sent as "authorization: Bearer <token>"; empty = none. Only over TLS or to a
  // loopback target (Create fails otherwise).
  std::string auth_token;
  // TLS: a PEM file with the CA that signed the sidecar's certificate; empty = plaintext.
  std::string tls_root_certs_file;
  // Client certificate and key (PEM files) for sidecars started with --tls_client_ca.
  std::string tls_client_cert_file;
  std::string tls_client_key_file;
  // Attempts per call for failures to reach the sidecar (>= 1), backoff doubling from
  // `initial_backoff` up to `max_backoff`.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
};

struct GlobalCounts {
  int64_t num_sequences = 0;  // kept sequences over the DP ranks of the round
  int64_t loss_tokens = 0;
  int64_t sequences_with_loss = 0;
  int64_t world_size = 1;
};

struct PlanRequest {
  std::string stream;            // 1-128 printable ASCII characters
  int64_t round = 0;             // the same on every rank for the same call, increasing
  std::vector<int64_t> lengths;  // tokens per sequence
  // Set: tree packing (docs/design.md "Tree packing"): this forest instead of `lengths` (which
  // must be empty); loss_tokens per rollout; the result's `tree` holds the layout.
  std::optional<planner::Forest> forest;
  // algorithm must be kKarmarkarKarp or kLpt; max_token_len >= 1.
  planner::PlanOptions options;
  bool same_micro_num_in_dp = true;
  std::vector<int64_t> loss_tokens;  // empty = no loss weights
  planner::LossOptions loss;
};

struct PartitionRequest {
  std::vector<int64_t> lengths;
  std::optional<planner::Forest> forest;  // as in PlanRequest
  int64_t num_micro_batches = 0;          // the k the caller agreed
  planner::PlanOptions options;           // max_token_len may be 0 (no cap)
  std::vector<int64_t> loss_tokens;
  planner::LossOptions loss;
  std::optional<GlobalCounts> global;  // agreed counts; unset = this request's own
};

struct BalanceBatchRequest {
  std::vector<int64_t> lengths;           // the whole global batch
  std::optional<planner::Forest> forest;  // as in PlanRequest
  int64_t world_size = 1;
  planner::PlanOptions options;
  std::vector<int64_t> group_ids;  // optional, one per sequence (per rollout with a forest)
  std::vector<int64_t> loss_tokens;
  planner::LossOptions loss;
  planner::BalanceOptions balance;  // sync, micro_batch_cost (docs/design.md §2)
};

// One rank's plan. `plan` has the planner's shape (parts, reorder, revert, dropped, stats).
struct PlanResult {
  int64_t num_micro_batches = 0;        // agreed k
  int64_t local_num_micro_batches = 0;  // this rank's own bound
  planner::MicroBatchPlan plan;
  std::vector<double> loss_weights;  // per original sequence; empty without loss tokens
  std::vector<double> loss_scales;   // per micro-batch (NaN where weights differ); likewise
  GlobalCounts global;
  int64_t max_token_len = 0;
  absl::Duration local_time;      // sidecar: validation and local bound
  absl::Duration wait_time;       // sidecar: agreeing with the peers
  absl::Duration partition_time;  // sidecar: partition and loss weights
  // A forest request's plan: plan.parts are its micro-batches over pieces (also in tree->parts
  // with their layouts, linear in the pieces: planner::Entries(part, forest) gives the rows);
  // reorder, revert, dropped and loss_weights are over rollouts.
  std::optional<planner::TreePlan> tree;
};

struct RankPlan {
  std::vector<int64_t> indices;  // global indices of this rank, ascending
  int64_t cost = 0;
  PlanResult plan;  // indices inside are positions in `indices`
};

struct BalancedPlan {
  int64_t num_micro_batches = 0;
  std::vector<RankPlan> ranks;
  std::vector<int64_t> dropped;
  GlobalCounts global;
  planner::StepStats step;
};

// PlanDynamicCp (docs/design.md §2, "Dynamic context parallelism"): the whole step over
// options.ranks ranks (the request's world_size).
struct DynamicCpRequest {
  std::vector<int64_t> lengths;       // the whole step
  planner::DynamicCpOptions options;  // ranks: the world size; cost: the weights
  std::vector<int64_t> owner_ranks;   // optional, per sequence: the rank whose data holds it
  std::vector<int64_t> loss_tokens;   // optional, per sequence
  planner::LossOptions loss;
  std::optional<int64_t> rank;  // whose view; unset = every rank's
  // Optional, as PlanRequest's: the sidecars first agree in round `round` of `stream` that every
  // rank sent the same step (FailedPrecondition on every rank when one differs). Empty = none.
  std::string stream;
  int64_t round = 0;
};

// What one rank runs in one slot.
struct CpRankSlot {
  int64_t group = 0;       // the group's name (DynamicCpResult::group_names)
  int64_t first_rank = 0;  // the group: ranks [first_rank, first_rank + size)
  int64_t size = 0;
  int64_t cp_rank = 0;                 // this rank's index in the group
  std::vector<int64_t> sequences;      // global indices, ascending
  std::vector<int64_t> owner_ranks;    // per sequence (empty without owner_ranks)
  std::vector<int64_t> owner_indices;  // per sequence: its index among its owner's
  std::vector<int32_t> cu_seqlens;     // the group's aligned offsets
  std::vector<int64_t> shard_chunks;   // {cp_rank, 2 * size - 1 - cp_rank}
  int64_t tokens_per_rank = 0;
  std::vector<double> loss_weights;  // per sequence (empty without loss tokens)
};

struct CpRankView {
  int64_t rank = 0;
  std::vector<CpRankSlot> slots;  // one per slot, in slot order
};

struct DynamicCpResult {
  int64_t num_micro_batches = 0;
  std::vector<std::pair<int64_t, int64_t>> group_names;  // (first_rank, size) per name
  std::vector<CpRankView> ranks;                         // every rank's, or the one asked for
  std::vector<int64_t> cp_of_sequence;
  std::vector<int64_t> slot_of_sequence;
  int64_t step_cost = 0;
  int64_t lower_bound = 0;
  int64_t comm_tokens = 0;
  planner::DynamicCpOptions options;  // as applied
  uint64_t plan_fingerprint = 0;      // equal on every rank that planned the same step
};

struct ServerStatus {
  struct Stream {
    std::string name;
    int64_t last_round = 0;
    int64_t rounds_completed = 0;
    int64_t rounds_failed = 0;
    int64_t outstanding = 0;
    int64_t cached = 0;
  };
  int64_t rank = 0;
  int64_t world_size = 1;
  bool group_ready = false;
  std::string backend;
  int64_t generation = 0;
  std::vector<Stream> streams;
  int64_t rounds = 0;
  int64_t cache_hits = 0;
  int64_t joined_in_flight = 0;
  int64_t over_cap_parts = 0;
  int64_t over_cap_unavoidable_parts = 0;  // of over_cap_parts: one overlong sequence each
  int64_t over_cap_avoidable_parts = 0;    // of over_cap_parts: several sequences (must be 0)
  int64_t partitions = 0;
  int64_t balance_batches = 0;
  int64_t dynamic_cp_plans = 0;
  std::map<std::string, int64_t> errors_by_code;
  std::string build_version;
  int64_t proto_version = 0;
  absl::Duration uptime;
};

class SchedulerClient {
 public:
  // Creates a client (the connection is made lazily, on the first call). Returns
  // InvalidArgument for an empty target, max_attempts < 1, unreadable TLS files, a client
  // certificate without TLS, a client certificate without its key (or the reverse), or a bearer
  // token without TLS to a target off loopback.
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Create(ClientOptions options);
  ~SchedulerClient();

  // Each call's deadline is now + `timeout`; a zero timeout means ClientOptions::timeout.
  // Errors are the sidecar's status codes (see proto/packsched/v1/scheduler.proto); a call that
  // never reached the sidecar ends with UNAVAILABLE or DEADLINE_EXCEEDED; an answer that cannot
  // be decoded is INTERNAL.
  absl::StatusOr<PlanResult> Plan(const PlanRequest& request,
                                  absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<PlanResult> Partition(const PartitionRequest& request,
                                       absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<BalancedPlan> BalanceBatch(const BalanceBatchRequest& request,
                                            absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<ServerStatus> GetStatus(absl::Duration timeout = absl::ZeroDuration());
  // Every rank that sends the same step gets the same plan; ask for one rank's view with
  // request.rank.
  absl::StatusOr<DynamicCpResult> PlanDynamicCp(const DynamicCpRequest& request,
                                                absl::Duration timeout = absl::ZeroDuration());

 private:
  struct Impl;
  explicit SchedulerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packsched::client

#endif  // PACKSCHED_CLIENT_CPP_SCHEDULER_CLIENT_H_
