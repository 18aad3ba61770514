#ifndef PACKSCHED_SERVER_COLLECTIVE_GLOO_COLLECTIVE_H_
#define PACKSCHED_SERVER_COLLECTIVE_GLOO_COLLECTIVE_H_

// The Gloo backend: TCP between CPU processes (docs/design.md §3). One GlooCollective is one
// rank's member of one generation of a group; a failed call ends it and the group is formed again
// under a fresh prefix.
//
// Gloo's calls block and report failures by throwing; here they run on a worker thread owned by
// the instance, every gloo::Exception is turned into a Status, and the caller waits on its own
// deadline, so a call returns by its deadline (plus scheduling noise) even when Gloo does not.
//
// REQUIRES: SIGPIPE is ignored in the process (packsched-server's main does so): Gloo writes
// without MSG_NOSIGNAL, and a write to a peer that died would otherwise kill the process.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/cancellation.h"
#include "server/collective/collective.h"
#include "server/collective/store.h"

namespace packsched::collective {

struct GlooOptions {
  // The address this rank listens on and advertises to its peers (a name or an IP). Tests use
  // "127.0.0.1". Empty: the address of `iface` when that is set, else the address the machine's
  // hostname resolves to (Gloo's default).
  std::string hostname;
  // A network interface whose address is used ("eth0"), when `hostname` is empty.
  std::string iface;
  // The all-reduce algorithm. kRecursiveDoubling (ours, over Gloo's point-to-point buffers):
  // ceil(log2 W) message steps, + 2 when W is not a power of two — the latency-optimal choice
  // for a record of a few words, and the only one a sidecar uses (no flag selects another, and
  // the rank group's group::Group::Create refuses another).
  // kBcube and kRing are Gloo's own (2·log2 W steps when W is a power of two, else a final
  // W/2^k-way exchange; 2·(W - 1) steps), kept for comparison in tests and
  // tests/bench/collective_bench.cc only, in a file of their own (gloo_full_mesh.h). Their calls
  // have the same bounds as kRecursiveDoubling's (the caller's deadline; Abort() ends a call at
  // once), but their formation (Gloo's full mesh) does not: a peer that publishes its addresses
  // and never connects holds it for up to five times what is left of the formation (Gloo's own
  // connection wait) with no watchdog, the error does not name that peer, and a Cancellation is
  // only checked before formation starts.
  enum class Algorithm { kRecursiveDoubling, kBcube, kRing };
  Algorithm algorithm = Algorithm::kRecursiveDoubling;
  // The longest deadline a call on the formed group will have (the collective timeout). Under
  // kRecursiveDoubling the all-reduce waits on buffers whose only bound is the connection's
  // timeout, fixed at formation: it is max(what is left of the formation, wait_timeout + 1 s), so
  // that no wait ends before its call's deadline.
  absl::Duration wait_timeout = absl::ZeroDuration();
};

// The ranks that rank `rank` of `world_size` exchanges records with under kRecursiveDoubling,
// ascending: its fold partner when W is not a power of two, and one partner per bit of the
// largest power of two <= W (none for a rank that folds away) — at most floor(log2 W) + 1.
// The relation is symmetric. Under kRecursiveDoubling a rank connects to these alone; Gloo's
// own algorithms need the full mesh (W - 1 connections per rank). Empty for a bad rank.
std::vector<int64_t> RecursiveDoublingPeers(int64_t rank, int64_t world_size);

class GlooCollective final : public Collective {
 public:
  // Forms rank `rank` of a group of `world_size` through `store`: every rank publishes its
  // addresses under `prefix` and connects to its RecursiveDoublingPeers (kRecursiveDoubling),
  // or to every other rank (Gloo's algorithms). `prefix` must be fresh for every
  // formation (Gloo's keys are fixed names): the group layer uses run epoch + generation.
  // `store` is used only during this call.
  // Returns InvalidArgument for a bad rank, size or device option; DeadlineExceeded if some
  // rank did not publish its address, or published it but did not connect, by `deadline` (the
  // latter naming it: "ranks [2] published their addresses but did not connect in time");
  // Aborted, naming it, when a rank that published its address could not be reached before the
  // deadline (it went away); the store's error if the store failed. Returns by `deadline` plus
  // about half a second (naming the rank at fault), whatever the peers do: a watchdog closes a
  // pair still waiting for its partner to connect at `deadline`.
  //
  // `cancel` (optional, not owned; must outlive the call): when it is cancelled, formation ends
  // with Aborted ("cancelled") at once under kRecursiveDoubling — the watchdog closes the
  // half-formed pairs, which wakes a wait for a partner to connect or in the barrier — except
  // that a store call in progress (waiting for a peer's addresses) returns first: the store's own
  // cancellation ends that (RendezvousStore::Cancel, as the service does at shutdown). Under
  // kBcube and kRing it is checked only before formation starts (see GlooOptions::Algorithm).
  //
  // Store keys under `prefix`: peer_addresses/<rank>, connected/<rank> (all of a rank's pairs
  // are up), unconnected (the rank at fault, named by the first rank that saw it).
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Create(
      KeyValueStore& store, absl::string_view prefix, int64_t rank, int64_t world_size,
      const GlooOptions& options, absl::Time deadline, Cancellation* cancel = nullptr);

  // Closes the connections (peers in a call fail with Aborted) and stops the worker. Does not
  // wait for a Gloo call that is still blocked: that call ends with Gloo's own timeout and
  // touches only state it shares with nothing else.
  ~GlooCollective() override;

  int64_t rank() const override;
  int64_t world_size() const override;
  absl::string_view backend() const override { return "gloo"; }

  // One all-reduce whatever the mix of ops: the whole vector is reduced as one record, each
  // word with its own op. Errors as Collective::AllReduce; after any error the instance
  // returns that error from every later call.
  absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                         absl::Time deadline) override;
  absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                         absl::Time deadline) override;
  // Fails the call in flight (if any) at once with Aborted and closes the connections, so that
  // peers fail theirs with Aborted instead of waiting for their deadline.
  void Abort() override;

  struct State;  // shared with the worker thread (gloo_collective.cc)

 private:
  explicit GlooCollective(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_GLOO_COLLECTIVE_H_
