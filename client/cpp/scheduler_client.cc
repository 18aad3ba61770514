#include "client/cpp/scheduler_client.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/plan_decoder.h"
#include "google/protobuf/arena.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "packsched/v1/scheduler.grpc.pb.h"
#include "server/base/status_macros.h"
#include "server/planner/schema.h"
#include "server/security/credentials.h"

namespace packsched::client {
namespace {

namespace v1 = ::packsched::v1;

// An arena for one call's request message: its repeated fields and sub-messages come from one
// block, freed at once. (Plan responses are decoded from their bytes, see plan_decoder.h.)
google::protobuf::ArenaOptions CallArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 32 << 10;  // a 1,024-sequence request is about 17 KiB
  options.max_block_size = 1 << 20;
  return options;
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// A planner enum value as the proto's (proto = planner + 1, server/planner/schema.h), or
// InvalidArgument for a value the sidecar does not take (dataset packing algorithms), naming the
// ones it does.
template <typename Proto, typename Enum>
absl::StatusOr<Proto> ToProto(absl::string_view field, Enum value, bool (*is_valid)(int)) {
  if (is_valid(static_cast<int>(value) + 1)) return static_cast<Proto>(static_cast<int>(value) + 1);
  std::string accepted;
  for (int v = 0; is_valid(v + 1); ++v) {
    absl::StrAppend(&accepted, v == 0 ? "" : " or ", planner::Name(static_cast<Enum>(v)));
  }
  return absl::InvalidArgumentError(absl::StrCat("options.", field, " = ", planner::Name(value),
                                                 ": the sidecar balances micro-batches with ",
                                                 accepted));
}

// FillOptions writes PACKSCHED_PLAN_OPTIONS into the proto, one macro per rule taking what it
// touches: `o` (the planner::PlanOptions), `out` (the v1::PlanOptions) and the row's columns. The
// Ceiling's planner default means "no limit of the caller's own": 0 lets the sidecar apply its
// --max_micro_batches (the default itself would exceed a lower server limit). The row
//   X(cap_mode, 2, Enum, CapMode, cap_mode, 3, "tokens ... | padded ...")
// expands, through PACKSCHED_FILL, to
//   {
//     ASSIGN_OR_RETURN(const v1::CapMode value,
//                      ToProto<v1::CapMode>("cap_mode", o.cap_mode, v1::CapMode_IsValid));
//     out->set_cap_mode(value);
//   }
#define PACKSCHED_FILL_Enum(out, o, name, Type, member)                         \
  {                                                                             \
    ASSIGN_OR_RETURN(const v1::Type value,                                      \
                     ToProto<v1::Type>(#name, (o).member, v1::Type##_IsValid)); \
    (out)->set_##name(value);                                                   \
  }
#define PACKSCHED_FILL_VALUE(out, o, name, Type, member) (out)->set_##name((o).member);
#define PACKSCHED_FILL_Cap PACKSCHED_FILL_VALUE
#define PACKSCHED_FILL_Unlimited PACKSCHED_FILL_VALUE
#define PACKSCHED_FILL_Count PACKSCHED_FILL_VALUE
#define PACKSCHED_FILL_Align PACKSCHED_FILL_VALUE
#define PACKSCHED_FILL_Weight PACKSCHED_FILL_VALUE
#define PACKSCHED_FILL_FixedK PACKSCHED_FILL_VALUE
#define PACKSCHED_FILL_Ceiling(out, o, name, Type, member) \
  (out)->set_##name((o).member == planner::PlanOptions{}.member ? 0 : (o).member);
#define PACKSCHED_FILL(name, number, Rule, Type, member, json, help) \
  PACKSCHED_FILL_##Rule(out, o, name, Type, member)

absl::Status FillOptions(const planner::PlanOptions& o, v1::PlanOptions* out) {
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_FILL)
  return absl::OkStatus();
}

// FillLoss writes PACKSCHED_LOSS_OPTIONS the same way, from `loss` (an enum value outside the
// planner's is sent as it is, for the sidecar to refuse). The row
//   X(mode, 1, Enum, LossMode, mode, loss_mode)
// expands, through PACKSCHED_FILL_LOSS, to
//   out->set_mode(static_cast<v1::LossMode>(static_cast<int>(loss.mode) + 1));
#define PACKSCHED_FILL_LOSS_Enum(out, loss, name, Type, member) \
  (out)->set_##name(static_cast<v1::Type>(static_cast<int>((loss).member) + 1));
#define PACKSCHED_FILL_LOSS_SumNorm(out, loss, name, Type, member) (out)->set_##name((loss).member);
#define PACKSCHED_FILL_LOSS(name, number, Rule, Type, member, key) \
  PACKSCHED_FILL_LOSS_##Rule(out, loss, name, Type, member)

void FillLoss(const planner::LossOptions& loss, v1::LossOptions* out) {
  PACKSCHED_LOSS_OPTIONS(PACKSCHED_FILL_LOSS)
}

// FillRoundOptions writes the request's PACKSCHED_ROUND_OPTIONS (members of the same name). The
// row
//   X(same_micro_num_in_dp, 16, true)
// expands, through PACKSCHED_FILL_ROUND, to
//   out->set_same_micro_num_in_dp(request.same_micro_num_in_dp);
#define PACKSCHED_FILL_ROUND_Option(out, request, name) (out)->set_##name((request).name);
#define PACKSCHED_FILL_ROUND(name, number, dflt) PACKSCHED_FILL_ROUND_Option(out, request, name)

template <typename Request>
void FillRoundOptions(const Request& request, v1::PlanOptions* out) {
  PACKSCHED_ROUND_OPTIONS(PACKSCHED_FILL_ROUND)
}

// The caller's global counts (PACKSCHED_GLOBAL_COUNTS, members of the same name) into the
// proto. The row
//   X(loss_tokens, 2, Loss)
// expands, through PACKSCHED_FILL_GLOBAL, to
//   g->set_loss_tokens(global.loss_tokens);
#define PACKSCHED_FILL_GLOBAL_Count(g, global, name) (g)->set_##name((global).name);
#define PACKSCHED_FILL_GLOBAL(name, number, Kind) PACKSCHED_FILL_GLOBAL_Count(g, global, name)

void FillGlobal(const GlobalCounts& global, v1::GlobalCounts* g) {
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_FILL_GLOBAL)
}

// The caller's forest (PACKSCHED_FOREST, members of the same name; every row, the Checked one
// as the caller gives it) into the proto. The row
//   X(node_len, 1, Nodes)
// expands, through PACKSCHED_FILL_FOREST, to
//   out->mutable_node_len()->Assign(forest.node_len.begin(), forest.node_len.end());
#define PACKSCHED_FILL_FOREST(name, number, Kind) \
  out->mutable_##name()->Assign(forest.name.begin(), forest.name.end());

void FillForest(const planner::Forest& forest, v1::Forest* out) {
  PACKSCHED_FOREST(PACKSCHED_FILL_FOREST)
}

}  // namespace

struct SchedulerClient::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Scheduler::Stub> stub;
  // Plan and Partition by hand: their responses come back as bytes, for DecodePlanResponse.
  std::string plan_name = absl::StrCat("/", v1::Scheduler::service_full_name(), "/Plan");
  std::string partition_name = absl::StrCat("/", v1::Scheduler::service_full_name(), "/Partition");
  std::unique_ptr<grpc::internal::RpcMethod> plan_method;
  std::unique_ptr<grpc::internal::RpcMethod> partition_method;

  // Runs one unary call with the retry rule of the header.
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (v1::Scheduler::Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                    const Request& request, Response* response, absl::Duration timeout) {
    return Retried(timeout, [&](grpc::ClientContext* context) {
      response->Clear();
      return (stub.get()->*method)(context, request, response);
    });
  }

  // Runs a call whose response is a PlanResponse and decodes it (DecodePlanResponse; a forest
  // request's answer, which carries the tree layout, is parsed as a message instead).
  template <typename Request>
  absl::StatusOr<PlanResult> CallForPlan(const grpc::internal::RpcMethod& method,
                                         const Request& request, absl::Duration timeout) {
    if (request.has_forest()) {
      v1::PlanResponse response;
      RETURN_IF_ERROR(Retried(timeout, [&](grpc::ClientContext* context) {
        response.Clear();
        return grpc::internal::BlockingUnaryCall<Request, v1::PlanResponse,
                                                 google::protobuf::MessageLite,
                                                 google::protobuf::MessageLite>(
            channel.get(), method, context, request, &response);
      }));
      return internal::PlanResultFromProto(response);
    }
    grpc::ByteBuffer response;
    RETURN_IF_ERROR(Retried(timeout, [&](grpc::ClientContext* context) {
      response.Clear();
      return grpc::internal::BlockingUnaryCall<Request, grpc::ByteBuffer,
                                               google::protobuf::MessageLite, grpc::ByteBuffer>(
          channel.get(), method, context, request, &response);
    }));
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) {
      return absl::InternalError("the sidecar's response could not be read");
    }
    if (slices.size() == 1) {
      return internal::DecodePlanResponse(
          absl::string_view(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size()));
    }
    std::string joined;
    joined.reserve(response.Length());
    for (const grpc::Slice& slice : slices) {
      joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    return internal::DecodePlanResponse(joined);
  }

  // `invoke(context)` makes one attempt; retried by the rule of the header.
  template <typename Invoke>
  absl::Status Retried(absl::Duration timeout, Invoke invoke) {
    const absl::Time deadline =
        absl::Now() + (timeout == absl::ZeroDuration() ? options.timeout : timeout);
    absl::Duration backoff = options.initial_backoff;
    for (int attempt = 1;; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      // Queue while the sidecar is (re)connecting instead of failing at once.
      context.set_wait_for_ready(true);
      security::AddBearerToken(context, options.auth_token);
      const grpc::Status status = invoke(&context);
      if (status.ok()) return absl::OkStatus();
      const bool served = context.GetServerTrailingMetadata().contains("packsched-served");
      const bool unreached = status.error_code() == grpc::StatusCode::UNAVAILABLE && !served;
      if (!unreached || attempt >= options.max_attempts || absl::Now() + backoff >= deadline) {
        return FromGrpc(status);
      }
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(backoff));
      backoff = std::min(backoff * 2, options.max_backoff);
    }
  }
};

SchedulerClient::SchedulerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SchedulerClient::~SchedulerClient() = default;

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Create(ClientOptions options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target is empty");
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts = ", options.max_attempts, ": must be >= 1"));
  }
  // A token in plaintext to another machine could be read on the way (or by a wrong target).
  // Every bad option is InvalidArgument here (the header's contract).
  if (absl::Status sendable =
          security::CheckTokenMayBeSent(options.auth_token, !options.tls_root_certs_file.empty(),
                                        options.target, "target =", "tls_root_certs_file");
      !sendable.ok()) {
    return absl::InvalidArgumentError(sendable.message());
  }
  if (options.tls_root_certs_file.empty() &&
      (!options.tls_client_cert_file.empty() || !options.tls_client_key_file.empty())) {
    return absl::InvalidArgumentError(
        "tls_client_cert_file / tls_client_key_file need tls_root_certs_file (TLS); without it "
        "the client would connect in plaintext");
  }
  std::optional<security::ChannelTls> tls;
  if (!options.tls_root_certs_file.empty()) {
    tls.emplace();
    tls->root_certs = {"tls_root_certs_file", options.tls_root_certs_file};
    tls->cert = {"tls_client_cert_file", options.tls_client_cert_file};
    tls->key = {"tls_client_key_file", options.tls_client_key_file};
  }
  grpc::ChannelArguments args;
  // Reconnect fast: a sidecar that restarts (or starts after its trainer) is reached within
  // about 50-500 ms instead of gRPC's default 1 s+ backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetMaxReceiveMessageSize(-1);
  // One connection per client, not shared with other clients of the same target in the process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // gRPC's own retries are off: the retry rule above is ours (Call), and without it gRPC does
  // not keep a copy of every request for a retry it would never make.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->channel, security::MakeChannel(options.target, tls, args));
  impl->stub = v1::Scheduler::NewStub(impl->channel);
  impl->plan_method = std::make_unique<grpc::internal::RpcMethod>(
      impl->plan_name.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, impl->channel);
  impl->partition_method = std::make_unique<grpc::internal::RpcMethod>(
      impl->partition_name.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, impl->channel);
  impl->options = std::move(options);
  return std::unique_ptr<SchedulerClient>(new SchedulerClient(std::move(impl)));
}

absl::StatusOr<PlanResult> SchedulerClient::Plan(const PlanRequest& request,
                                                 absl::Duration timeout) {
  google::protobuf::Arena arena(CallArenaOptions());
  auto& wire = *google::protobuf::Arena::CreateMessage<v1::PlanRequest>(&arena);
  wire.set_stream(request.stream);
  wire.set_round(request.round);
  wire.mutable_lengths()->Assign(request.lengths.begin(), request.lengths.end());
  RETURN_IF_ERROR(FillOptions(request.options, wire.mutable_options()));
  FillRoundOptions(request, wire.mutable_options());
  wire.mutable_loss_tokens()->Assign(request.loss_tokens.begin(), request.loss_tokens.end());
  FillLoss(request.loss, wire.mutable_loss());
  if (request.forest) FillForest(*request.forest, wire.mutable_forest());
  return impl_->CallForPlan(*impl_->plan_method, wire, timeout);
}

absl::StatusOr<PlanResult> SchedulerClient::Partition(const PartitionRequest& request,
                                                      absl::Duration timeout) {
  google::protobuf::Arena arena(CallArenaOptions());
  auto& wire = *google::protobuf::Arena::CreateMessage<v1::PartitionRequest>(&arena);
  wire.mutable_lengths()->Assign(request.lengths.begin(), request.lengths.end());
  wire.set_num_micro_batches(request.num_micro_batches);
  RETURN_IF_ERROR(FillOptions(request.options, wire.mutable_options()));
  wire.mutable_loss_tokens()->Assign(request.loss_tokens.begin(), request.loss_tokens.end());
  FillLoss(request.loss, wire.mutable_loss());
  if (request.forest) FillForest(*request.forest, wire.mutable_forest());
  if (request.global) FillGlobal(*request.global, wire.mutable_global());
  return impl_->CallForPlan(*impl_->partition_method, wire, timeout);
}

absl::StatusOr<BalancedPlan> SchedulerClient::BalanceBatch(const BalanceBatchRequest& request,
                                                           absl::Duration timeout) {
  v1::BalanceBatchRequest wire;
  wire.mutable_lengths()->Assign(request.lengths.begin(), request.lengths.end());
  wire.set_world_size(request.world_size);
  RETURN_IF_ERROR(FillOptions(request.options, wire.mutable_options()));
  wire.mutable_group_ids()->Assign(request.group_ids.begin(), request.group_ids.end());
  wire.mutable_loss_tokens()->Assign(request.loss_tokens.begin(), request.loss_tokens.end());
  FillLoss(request.loss, wire.mutable_loss());
  if (request.forest) FillForest(*request.forest, wire.mutable_forest());
  wire.set_sync(static_cast<v1::Sync>(static_cast<int>(request.balance.sync) + 1));
  wire.set_micro_batch_cost(request.balance.micro_batch_cost);
  v1::BalanceBatchResponse response;
  RETURN_IF_ERROR(impl_->Call(&v1::Scheduler::Stub::BalanceBatch, wire, &response, timeout));
  BalancedPlan out;
  out.num_micro_batches = response.num_micro_batches();
  for (const v1::RankPlan& rank : response.ranks()) {
    RankPlan r;
    r.indices.assign(rank.indices().begin(), rank.indices().end());
    r.cost = rank.cost();
    r.plan = internal::PlanResultFromProto(rank.plan());
    out.ranks.push_back(std::move(r));
  }
  out.dropped.assign(response.dropped().begin(), response.dropped().end());
  out.global = internal::GlobalCountsFromProto(response.global());
  const v1::StepStats& step = response.step();
  out.step = planner::StepStats{step.step_sync_cost(), step.micro_batch_sync_cost(),
                                step.ideal(),          step.efficiency(),
                                step.lower_bound(),    step.lower_bound_efficiency()};
  return out;
}

absl::StatusOr<ServerStatus> SchedulerClient::GetStatus(absl::Duration timeout) {
  v1::GetStatusResponse response;
  RETURN_IF_ERROR(
      impl_->Call(&v1::Scheduler::Stub::GetStatus, v1::GetStatusRequest(), &response, timeout));
  ServerStatus out;
  out.rank = response.rank();
  out.world_size = response.world_size();
  out.group_ready = response.group_ready();
  out.backend = response.backend();
  out.generation = response.generation();
  for (const v1::StreamStatus& s : response.streams()) {
    out.streams.push_back({s.name(), s.last_round(), s.rounds_completed(), s.rounds_failed(),
                           s.outstanding(), s.cached()});
  }
  const v1::Counters& c = response.counters();
  out.rounds = c.rounds();
  out.cache_hits = c.cache_hits();
  out.joined_in_flight = c.joined_in_flight();
  out.over_cap_parts = c.over_cap_parts();
  out.over_cap_unavoidable_parts = c.over_cap_unavoidable_parts();
  out.over_cap_avoidable_parts = c.over_cap_avoidable_parts();
  out.partitions = c.partitions();
  out.balance_batches = c.balance_batches();
  out.dynamic_cp_plans = c.dynamic_cp_plans();
  out.errors_by_code.insert(c.errors_by_code().begin(), c.errors_by_code().end());
  out.build_version = response.build_version();
  out.proto_version = response.proto_version();
  out.uptime = absl::Microseconds(response.uptime_us());
  return out;
}

namespace {

// The dynamic-CP options, by the schema table's rules (PACKSCHED_DYNAMIC_CP_OPTIONS): every
// planner option is sent (the link ratios are a model's, which this client does not send). The
// row
//   X(linear, 7, Weight, int64, cost.linear, cp_linear, Own, "...")
// expands, through PACKSCHED_FILL_DCP, to
//   out->set_linear(o.cost.linear);
#define PACKSCHED_FILL_DCP_INT(o, out, name, Type, member) (out)->set_##name((o).member);
#define PACKSCHED_FILL_DCP_Cap PACKSCHED_FILL_DCP_INT
#define PACKSCHED_FILL_DCP_Int PACKSCHED_FILL_DCP_INT
#define PACKSCHED_FILL_DCP_MaxCp PACKSCHED_FILL_DCP_INT
#define PACKSCHED_FILL_DCP_Weight PACKSCHED_FILL_DCP_INT
#define PACKSCHED_FILL_DCP_Nodes PACKSCHED_FILL_DCP_INT
#define PACKSCHED_FILL_DCP_Enum(o, out, name, Type, member) \
  (out)->set_##name(static_cast<v1::Type>(static_cast<int>((o).member) + 1));
#define PACKSCHED_FILL_DCP(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_FILL_DCP, Rule, Ratio, Bytes)(o, out, name, Type, member)

v1::DynamicCpOptions DynamicCpOptionsToProto(const planner::DynamicCpOptions& o) {
  v1::DynamicCpOptions wire;
  v1::DynamicCpOptions* out = &wire;
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_FILL_DCP)
  return wire;
}

// The options applied, back from the wire. The row
//   X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "...")
// expands, through PACKSCHED_READ_DCP, to
//   o.min_cp = p.min_cp();
#define PACKSCHED_READ_DCP_INT(p, o, name, Type, member) (o).member = (p).name();
#define PACKSCHED_READ_DCP_Cap PACKSCHED_READ_DCP_INT
#define PACKSCHED_READ_DCP_Int PACKSCHED_READ_DCP_INT
#define PACKSCHED_READ_DCP_MaxCp PACKSCHED_READ_DCP_INT
#define PACKSCHED_READ_DCP_Weight PACKSCHED_READ_DCP_INT
#define PACKSCHED_READ_DCP_Nodes PACKSCHED_READ_DCP_INT
#define PACKSCHED_READ_DCP_Enum(p, o, name, Type, member) \
  if ((p).name() != 0) (o).member = static_cast<planner::Type>((p).name() - 1);
#define PACKSCHED_READ_DCP(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_READ_DCP, Rule, Ratio, Bytes)(p, o, name, Type, member)

planner::DynamicCpOptions DynamicCpOptionsFromProto(const v1::DynamicCpOptions& p, int64_t ranks) {
  planner::DynamicCpOptions o;
  o.ranks = ranks;
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_READ_DCP)
  return o;
}

CpRankSlot CpRankSlotFromProto(const v1::CpRankSlot& p) {
  CpRankSlot s;
  s.group = p.group();
  s.first_rank = p.ranks().first_rank();
  s.size = p.ranks().size();
  s.cp_rank = p.cp_rank();
  s.sequences.assign(p.sequences().begin(), p.sequences().end());
  s.owner_ranks.assign(p.owner_ranks().begin(), p.owner_ranks().end());
  s.owner_indices.assign(p.owner_indices().begin(), p.owner_indices().end());
  s.cu_seqlens.assign(p.cu_seqlens().begin(), p.cu_seqlens().end());
  s.shard_chunks.assign(p.shard_chunks().begin(), p.shard_chunks().end());
  s.tokens_per_rank = p.tokens_per_rank();
  s.loss_weights.assign(p.loss_weights().begin(), p.loss_weights().end());
  return s;
}

}  // namespace

absl::StatusOr<DynamicCpResult> SchedulerClient::PlanDynamicCp(const DynamicCpRequest& request,
                                                               absl::Duration timeout) {
  v1::PlanDynamicCpRequest wire;
  wire.mutable_lengths()->Assign(request.lengths.begin(), request.lengths.end());
  wire.set_world_size(request.options.ranks);
  *wire.mutable_options() = DynamicCpOptionsToProto(request.options);
  wire.mutable_owner_ranks()->Assign(request.owner_ranks.begin(), request.owner_ranks.end());
  wire.mutable_loss_tokens()->Assign(request.loss_tokens.begin(), request.loss_tokens.end());
  FillLoss(request.loss, wire.mutable_loss());
  if (request.rank) wire.set_rank(*request.rank);
  wire.set_stream(request.stream);
  wire.set_round(request.round);
  v1::PlanDynamicCpResponse response;
  RETURN_IF_ERROR(impl_->Call(&v1::Scheduler::Stub::PlanDynamicCp, wire, &response, timeout));
  DynamicCpResult out;
  out.num_micro_batches = response.num_micro_batches();
  for (const v1::CpGroup& g : response.group_names()) {
    out.group_names.emplace_back(g.first_rank(), g.size());
  }
  for (const v1::CpRankView& view : response.ranks()) {
    CpRankView v;
    v.rank = view.rank();
    for (const v1::CpRankSlot& slot : view.slots()) v.slots.push_back(CpRankSlotFromProto(slot));
    out.ranks.push_back(std::move(v));
  }
  out.cp_of_sequence.assign(response.cp_of_sequence().begin(), response.cp_of_sequence().end());
  out.slot_of_sequence.assign(response.slot_of_sequence().begin(),
                              response.slot_of_sequence().end());
  out.step_cost = response.step_cost();
  out.lower_bound = response.lower_bound();
  out.comm_tokens = response.comm_tokens();
  out.options = DynamicCpOptionsFromProto(response.options(), request.options.ranks);
  out.plan_fingerprint = response.plan_fingerprint();
  return out;
}

}  // namespace packsched::client
