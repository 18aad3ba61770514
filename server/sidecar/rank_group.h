#ifndef PACKSCHED_SERVER_SIDECAR_RANK_GROUP_H_
#define PACKSCHED_SERVER_SIDECAR_RANK_GROUP_H_

// The sidecar's rank group, and where the agreement port is wired: the rendezvous store rank 0
// serves, the store client every rank uses, the Group, the agreements the server is handed
// (server/group/round_agreement.h) and the readiness watch, from the group flags (--rank,
// --world_size, --rendezvous, --backend, the Gloo address, --local_gpu, rendezvous TLS). Without
// --rendezvous: a group of one.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/collective/counting_store.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/readiness.h"
#include "server/group/round_agreement.h"
#include "server/service/rendezvous.h"
#include "server/service/server.h"

namespace packsched::sidecar {

// The group flags, as given (flags.h: RankGroupFlagsFromFlags); StartRankGroup checks them.
struct RankGroupFlags {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string rendezvous;         // HOST:PORT of rank 0's store; empty: a group of one
  std::string rendezvous_listen;  // rank 0: where to serve it (default: from `rendezvous`)
  bool rendezvous_tls = false;
  std::string rendezvous_tls_ca;
  std::string backend = "auto";
  std::string gloo_hostname;
  std::string gloo_iface;
  int64_t local_gpu = -1;  // negative: LOCAL_RANK, else 0
};

// The rank group: the rendezvous server (rank 0), the store client and the Group (all null for
// a group of one), the agreements over them and the readiness watch.
struct RankGroup {
  std::unique_ptr<collective::InMemoryStore> served;
  std::unique_ptr<service::RendezvousServer> server;
  std::unique_ptr<service::RendezvousStore> store;
  // `store` with its requests counted (packsched_rendezvous_requests_total): what the Group uses.
  std::unique_ptr<collective::CountingStore> counted;
  std::unique_ptr<group::Group> group;
  // The agreement port the server is handed: GroupAgreements over `group`, or a group of one
  // (CollectiveAgreements: a LocalCollective per stream). Never null once started.
  std::shared_ptr<group::RoundAgreements> agreements;
  // With several ranks: waits in the background for every rank to join the run (the Group is
  // then ready, and the server's health listener turns the Scheduler's readiness on). Null for
  // one rank, ready at once.
  std::unique_ptr<group::ReadinessWatch> readiness;
};

// Checks the flags and starts the group: rank 0 serves the store (with the server's TLS files
// and bearer token when --rendezvous_tls), every rank connects to it, the Group is created (it
// forms on each stream's first round), its agreements made and, with several ranks, the
// readiness watch started. InvalidArgument names the flag at fault.
absl::StatusOr<RankGroup> StartRankGroup(const RankGroupFlags& flags,
                                         const service::ServerOptions& server);

// Hands the group to the server's options: its agreements, and cancelling the store's waits at
// shutdown (a stream worker blocked on the store for a rank that never comes must not hold the
// shutdown for --collective_timeout).
void AttachRankGroup(RankGroup& group, service::ServerOptions& options);

// After the server has stopped: the readiness watch, the agreements, the Group, then the store
// client, then rank 0's store server.
void StopRankGroup(RankGroup& group);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_RANK_GROUP_H_
