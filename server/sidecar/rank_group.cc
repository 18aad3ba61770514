#include "server/sidecar/rank_group.h"

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/base/address.h"
#include "server/base/status_macros.h"
#include "server/collective/backend.h"
#include "server/group/collective_agreement.h"
#include "server/group/group_agreement.h"
#include "spdlog/spdlog.h"

namespace packsched::sidecar {
namespace {

// How often a rank other than 0 reads the run epoch when idle (result_replica.h: a restart of
// rank 0 is noticed when the store's connection drops; this read is the backstop).
constexpr absl::Duration kEpochBackstop = absl::Seconds(10);

// The rendezvous address rank 0 binds: --rendezvous_listen, else --rendezvous's port on
// loopback when its host is loopback, else on every interface.
std::string RendezvousListen(const RankGroupFlags& flags) {
  const std::string& rendezvous = flags.rendezvous;
  if (!flags.rendezvous_listen.empty()) return flags.rendezvous_listen;
  if (IsLoopbackAddress(rendezvous)) return rendezvous;
  const size_t colon = rendezvous.rfind(':');
  return absl::StrCat("[::]", colon == std::string::npos ? ":0" : rendezvous.substr(colon));
}

}  // namespace

absl::StatusOr<RankGroup> StartRankGroup(const RankGroupFlags& flags,
                                         const service::ServerOptions& server) {
  RankGroup g;
  const int64_t rank = flags.rank;
  const int64_t world_size = flags.world_size;
  const std::string& rendezvous = flags.rendezvous;
  ASSIGN_OR_RETURN(collective::Backend backend, collective::ParseBackend(flags.backend));
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size = ", world_size, ": must be >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank = ", rank, ": must be in [0, --world_size = ", world_size, ")"));
  }
  if (rendezvous.empty()) {
    if (world_size != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--world_size = ", world_size, " needs --rendezvous=HOST:PORT"));
    }
    if (backend != collective::Backend::kAuto && backend != collective::Backend::kLocal) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend = ", collective::BackendName(backend), " needs --rendezvous=HOST:PORT"));
    }
    // A group of one: the local backend, nothing stored.
    g.agreements = std::make_shared<group::CollectiveAgreements>(server.limits.collective_timeout);
    return g;
  }
  service::RendezvousTls tls;
  if (flags.rendezvous_tls) {
    tls.enabled = true;
    tls.cert = server.tls_cert;
    tls.key = server.tls_key;
    if (tls.cert.empty() || tls.key.empty()) {
      return absl::InvalidArgumentError("--rendezvous_tls needs --tls_cert and --tls_key");
    }
  } else if (!flags.rendezvous_tls_ca.empty()) {
    return absl::InvalidArgumentError("--rendezvous_tls_ca needs --rendezvous_tls");
  }
  if (rank == 0) {
    g.served = std::make_unique<collective::InMemoryStore>();
    service::RendezvousServerOptions serve;
    serve.listen = RendezvousListen(flags);
    serve.tls = tls;
    serve.tls.ca = flags.rendezvous_tls ? server.tls_client_ca : "";
    serve.auth_token = server.auth_token;
    ASSIGN_OR_RETURN(g.server, service::RendezvousServer::Start(g.served.get(), serve));
    spdlog::info("serving the rendezvous store on {} (port {}){}", serve.listen, g.server->port(),
                 tls.enabled ? ", TLS" : "");
  }
  service::RendezvousClientOptions connect;
  connect.address = rendezvous;
  connect.auth_token = server.auth_token;
  if (flags.rendezvous_tls) {
    connect.tls.enabled = true;
    connect.tls.ca = flags.rendezvous_tls_ca;  // empty: the system roots
    connect.tls.cert = server.tls_cert;
    connect.tls.key = server.tls_key;
  }
  ASSIGN_OR_RETURN(g.store, service::RendezvousStore::Create(connect));
  group::GroupOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.backend = backend;
  options.collective_timeout = server.limits.collective_timeout;
  options.gloo.iface = flags.gloo_iface;
  options.gloo.hostname = flags.gloo_hostname;
  // Resolved whichever way Gloo gets its address: a name that does not resolve stops the start
  // here, naming DNS, instead of surfacing later as a store that never answers.
  absl::StatusOr<std::string> local = service::LocalAddressTowards(rendezvous);
  if (!local.ok()) {
    return absl::Status(local.status().code(), absl::StrCat("--rendezvous = '", rendezvous,
                                                            "': ", local.status().message()));
  }
  if (options.gloo.hostname.empty() && options.gloo.iface.empty()) options.gloo.hostname = *local;
  spdlog::info("rendezvous {} reached from local address {}; Gloo uses {}", rendezvous, *local,
               !options.gloo.iface.empty() ? absl::StrCat("interface ", options.gloo.iface)
                                           : absl::StrCat("address ", options.gloo.hostname));
  int64_t gpu = flags.local_gpu;
  if (gpu < 0) {
    const char* local_rank = std::getenv("LOCAL_RANK");  // NOLINT(concurrency-mt-unsafe)
    gpu = 0;
    if (local_rank != nullptr && !absl::SimpleAtoi(local_rank, &gpu)) {
      return absl::InvalidArgumentError(absl::StrCat("LOCAL_RANK = '", local_rank, "'"));
    }
  }
  options.nccl.device = static_cast<int>(gpu);
  g.counted = std::make_unique<collective::CountingStore>(*g.store);
  ASSIGN_OR_RETURN(g.group, group::Group::Create(g.counted.get(), std::move(options)));
  // The rendezvous store's connection tells a restart of rank 0 at once (ResultReplica watches
  // it); the epoch read is a backstop, so it is rare: 0.1 requests a second per rank when idle.
  g.agreements = std::make_shared<group::GroupAgreements>(
      *g.group, group::ReplicaOptions{.poll = kEpochBackstop});
  if (world_size > 1) g.readiness = std::make_unique<group::ReadinessWatch>(*g.group, nullptr);
  return g;
}

void AttachRankGroup(RankGroup& group, service::ServerOptions& options) {
  options.agreements = group.agreements;
  if (service::RendezvousStore* store = group.store.get(); store != nullptr) {
    // Shutdown must not wait out --collective_timeout in a group formation (a stream worker
    // blocked on the store for a rank that never comes).
    options.cancel_group_waits = [store] { store->Cancel(); };
  }
}

void StopRankGroup(RankGroup& group) {
  // The group outlives the server and its coordinator (which holds the streams' groups); rank 0's
  // store goes last.
  group.readiness.reset();
  group.agreements.reset();
  group.group.reset();
  group.counted.reset();
  group.store.reset();
  if (group.server != nullptr) group.server->Shutdown();
}

}  // namespace packsched::sidecar
