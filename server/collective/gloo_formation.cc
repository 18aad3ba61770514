#include "server/collective/gloo_formation.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"
#include "server/collective/gloo_transport.h"

namespace packsched::collective::internal {
namespace {

// How much longer than the longest call a connection's own timeout is (see FormPeers).
constexpr int64_t kPairTimeoutMarginMs = 1000;

// Ends a formation that is still connecting when its deadline passes, by closing the
// half-formed context's pairs. Gloo bounds the listening side's wait for a peer that has published
// its address to connect (Pair::waitUntilConnected) only by five times the pair timeout.
// Pair::close takes the pair's lock, moves it to CLOSED and notifies the condition variable that
// wait sleeps on, whose predicate (state >= CONNECTED) then holds: connect() returns as if
// connected, and Connect checks fired() after every connect() to tell the two apart. It fires the
// same way, at once, when `cancel` (if any) is cancelled: an abort or a shutdown during formation.
class FormationWatchdog {
 public:
  FormationWatchdog(absl::Time deadline, Cancellation* cancel) : cancel_(cancel) {
    if (cancel_ != nullptr) {
      cancel_id_ = cancel_->Register([this] {
        absl::MutexLock lock(&mu_);
        cancelled_ = true;
      });
    }
    thread_ = std::thread([this, deadline] { Run(deadline); });
  }
  ~FormationWatchdog() { Stop(); }

  FormationWatchdog(const FormationWatchdog&) = delete;
  FormationWatchdog& operator=(const FormationWatchdog&) = delete;

  // The pairs to close when it fires (at once if it already has). REQUIRES: every pair to `peers`
  // has been created; none is created after this.
  void Watch(std::shared_ptr<gloo::transport::Context> transport, std::vector<int> peers) {
    absl::MutexLock lock(&mu_);
    transport_ = std::move(transport);
    peers_ = std::move(peers);
    if (fired_) CloseLocked();
  }

  // Formation is over (either way): the watchdog will not fire any more. Joins its thread.
  void Stop() {
    if (cancel_ != nullptr) cancel_->Unregister(cancel_id_);  // first: its callback locks mu_
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  bool fired() const {
    absl::MutexLock lock(&mu_);
    return fired_;
  }
  // Whether it fired because formation was cancelled (not at the deadline).
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return fired_ && cancelled_;
  }

 private:
  void Run(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopped_ || cancelled_; };
    mu_.AwaitWithDeadline(absl::Condition(&woken), deadline);
    if (stopped_) return;
    fired_ = true;
    CloseLocked();
  }

  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (transport_ == nullptr) return;
    for (int peer : peers_) {
      try {
        if (auto& pair = transport_->getPair(peer)) pair->close();
      } catch (const std::exception&) {
        // A pair that already failed may throw on close; it is closed either way.
      }
    }
  }

  Cancellation* const cancel_;
  int64_t cancel_id_ = 0;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<gloo::transport::Context> transport_ ABSL_GUARDED_BY(mu_);
  std::vector<int> peers_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started once the rest is constructed
};

// A gloo::Context connected only to `peers` (the pairs to every other rank stay null, which
// Gloo's closeConnections skips). Formation exchanges one store key per rank, holding its
// addresses for its own peers, instead of Gloo's full mesh: a key of W addresses per rank, read
// by every rank (O(W^2) bytes through the store) and W - 1 sockets per rank.
class PeerContext final : public gloo::Context {
 public:
  PeerContext(int rank, int size) : gloo::Context(rank, size) {}

  // Throws what Gloo throws, or gloo::IoException after recording a store failure in `failure`.
  // `pair_timeout` bounds every wait of the pairs' bound buffers (and, five times over, a wait
  // for a peer that published its address to connect: `watchdog` closes the pairs at the
  // formation's deadline instead). `unconnected` is set to the peer whose connection failed or
  // was still pending when the watchdog fired; it stays -1 if every pair connected.
  void Connect(KeyValueStore& store, absl::string_view prefix,
               std::shared_ptr<gloo::transport::Device>& device, const std::vector<int>& peers,
               absl::Time deadline, std::chrono::milliseconds pair_timeout,
               FormationWatchdog& watchdog, absl::Status& failure, int& unconnected) {
    auto check = [&](const absl::Status& status) {
      if (status.ok()) return;
      if (failure.ok()) failure = status;
      throw gloo::IoException(std::string(status.message()));
    };
    auto key = [&](int of) { return absl::StrCat(prefix, "peer_addresses/", of); };
    std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
    transport->setTimeout(pair_timeout);
    // Ours: "<peer> <size> <bytes>" for each peer, in ascending peer order.
    std::string mine;
    for (int peer : peers) {
      const std::vector<char> address = transport->createPair(peer)->address().bytes();
      absl::StrAppend(&mine, peer, " ", address.size(), " ",
                      absl::string_view(address.data(), address.size()));
    }
    watchdog.Watch(transport, peers);
    check(store.Set(key(rank), mine, deadline));
    for (int peer : peers) {
      absl::StatusOr<std::string> theirs = store.Get(key(peer), deadline);
      check(theirs.status());
      absl::StatusOr<std::vector<char>> address = AddressFor(*theirs, peer);
      check(address.status());
      if (watchdog.fired()) {  // cancelled while this rank waited for the store
        unconnected = peer;
        throw gloo::IoException(absl::StrCat("Connect cancelled: rank ", peer));
      }
      try {
        transport->getPair(peer)->connect(*address);
      } catch (...) {
        unconnected = peer;
        throw;
      }
      if (watchdog.fired()) {
        unconnected = peer;
        throw gloo::IoException(absl::StrCat("Connect timeout: rank ", peer));
      }
    }
    device_ = device;
    transportContext_ = std::move(transport);
  }

 private:
  // This rank's entry in peer `of`'s published addresses.
  absl::StatusOr<std::vector<char>> AddressFor(absl::string_view published, int of) const {
    while (!published.empty()) {
      const size_t first = published.find(' ');
      const size_t second =
          first == absl::string_view::npos ? first : published.find(' ', first + 1);
      int peer = 0;
      size_t length = 0;
      if (second == absl::string_view::npos ||
          !absl::SimpleAtoi(published.substr(0, first), &peer) ||
          !absl::SimpleAtoi(published.substr(first + 1, second - first - 1), &length) ||
          length > published.size() - second - 1) {
        break;
      }
      const absl::string_view address = published.substr(second + 1, length);
      if (peer == rank) return std::vector<char>(address.begin(), address.end());
      published.remove_prefix(second + 1 + length);
    }
    return absl::InternalError(
        absl::StrCat("rank ", of, " published no address for rank ", rank,
                     " (ranks disagree on the world size or the algorithm)"));
  }
};

// Formation keys of our own, next to the peers' addresses: a rank has connected every pair
// (set before the barrier); the first rank that knew which peer failed to connect names it.
std::string ConnectedKey(absl::string_view prefix, int64_t rank) {
  return absl::StrCat(prefix, "connected/", rank);
}
std::string UnconnectedKey(absl::string_view prefix) { return absl::StrCat(prefix, "unconnected"); }

// How long a rank whose formation failed spends naming the rank at fault (store calls), beyond
// the formation's deadline.
constexpr absl::Duration kExplainBudget = absl::Milliseconds(500);
// How long a rank that cannot tell waits for the rank that knows to name it.
constexpr absl::Duration kBlameWait = absl::Milliseconds(250);

// The error of a formation whose pairs did not all connect (every rank had published its
// addresses). `unconnected`: the peer this rank waited for or failed to reach (-1: none; this
// rank then failed in the barrier, because a partner closed its connections or the deadline
// passed). Names the rank at fault: this rank's own peer (published for the others), else the
// peer named by whichever rank knew, else the ranks that never connected all their pairs.
// DeadlineExceeded once the deadline has passed (a rank that may only be slow), else Aborted (a
// rank that joined and went away, as in a round).
absl::Status ConnectFailure(KeyValueStore& store, absl::string_view prefix, int64_t rank,
                            int64_t world_size, int unconnected, bool timed_out,
                            const absl::Status& cause) {
  const absl::Time explain = absl::Now() + kExplainBudget;
  std::string named;
  if (unconnected >= 0) {
    // Value: "<rank> <timeout|reset>", first writer wins.
    absl::StatusOr<std::string> blame =
        store.CompareAndSet(UnconnectedKey(prefix), std::nullopt,
                            absl::StrCat(unconnected, timed_out ? " timeout" : " reset"), explain);
    named = absl::StrCat("[", unconnected, "]");
    if (blame.ok()) {
      int64_t first = -1;
      const std::vector<absl::string_view> parts = absl::StrSplit(*blame, ' ');
      if (absl::SimpleAtoi(parts[0], &first) && first != unconnected) {
        // Another rank's verdict came first; report it too, so every rank names the same one.
        named = absl::StrCat("[", first, ", ", unconnected, "]");
      }
    }
  } else {
    absl::StatusOr<std::string> blame =
        store.Get(UnconnectedKey(prefix), std::min(explain, absl::Now() + kBlameWait));
    if (blame.ok()) {
      const std::vector<absl::string_view> parts = absl::StrSplit(*blame, ' ');
      named = absl::StrCat("[", parts[0], "]");
      if (parts.size() > 1) timed_out = parts[1] == "timeout";
    } else if (absl::IsDeadlineExceeded(blame.status()) || absl::IsNotFound(blame.status())) {
      std::vector<int64_t> missing;
      for (int64_t r = 0; r < world_size && missing.size() < 16; ++r) {
        absl::StatusOr<std::optional<std::string>> value =
            store.TryGet(ConnectedKey(prefix, r), explain);
        if (!value.ok()) {
          missing.clear();  // the store cannot tell: name nobody
          break;
        }
        if (!value->has_value()) missing.push_back(r);
      }
      if (!missing.empty()) named = absl::StrCat("[", absl::StrJoin(missing, ", "), "]");
    }
  }
  if (named.empty()) {
    return timed_out ? absl::DeadlineExceededError(cause.message())
                     : absl::AbortedError(cause.message());
  }
  const std::string message =
      absl::StrCat("gloo rendezvous on rank ", rank, " of ", world_size, ": ranks ", named,
                   timed_out ? " published their addresses but did not connect in time"
                             : " published their addresses and then could not be reached",
                   " (", cause.message(), ")");
  return timed_out ? absl::DeadlineExceededError(message) : absl::AbortedError(message);
}

}  // namespace

GlooFormation FormPeers(KeyValueStore& store, absl::string_view prefix, int64_t rank,
                        int64_t world_size, std::shared_ptr<gloo::transport::Device>& device,
                        const GlooOptions& options, absl::Time deadline, Cancellation* cancel) {
  // Only the pairs the algorithm uses: ceil(log2 W) + 1 at most, not W - 1.
  auto peer_context =
      std::make_shared<PeerContext>(static_cast<int>(rank), static_cast<int>(world_size));
  peer_context->setTimeout(Remaining(deadline));
  std::vector<int> peers;
  for (int64_t peer : RecursiveDoublingPeers(rank, world_size)) {
    peers.push_back(static_cast<int>(peer));
  }
  // Bound waits (BoundRecursiveDoubling) have no timeout argument: they use the pairs' own,
  // which must outlast any later call's deadline, so it is the longest a call can have
  // (wait_timeout) plus a margin, not what is left of this formation: the caller's own
  // deadline (State::WaitFor) then always ends a call first, with DeadlineExceeded, however
  // late the worker thread is scheduled. Gloo also bounds the listening side's wait for a
  // partner to connect by five times this; the watchdog ends that wait at the formation's
  // deadline instead.
  const std::chrono::milliseconds pair_timeout =
      std::max(Remaining(deadline), absl::ToChronoMilliseconds(options.wait_timeout) +
                                        std::chrono::milliseconds(kPairTimeoutMarginMs));
  GlooFormation formed;
  std::shared_ptr<BoundRecursiveDoubling> bound;
  int unconnected = -1;
  FormationWatchdog watchdog(deadline, cancel);
  formed.connected = RunGloo("rendezvous", rank, [&] {
    peer_context->Connect(store, prefix, device, peers, deadline, pair_timeout, watchdog,
                          formed.store_failure, unconnected);
    // Every pair of this rank is up: a rank whose formation fails later names the ranks
    // without this key (ConnectFailure).
    if (absl::Status set = store.Set(ConnectedKey(prefix, rank), "1", deadline); !set.ok()) {
      formed.store_failure = set;
      throw gloo::IoException(std::string(set.message()));
    }
    // Before the barrier: no partner sends into these buffers before it has passed it.
    bound = std::make_shared<BoundRecursiveDoubling>(peer_context);
    // A barrier: each rank reaches only its partners, so formation completes on a rank only
    // once every rank has connected (the group is whole, not just this rank's corner of it).
    int64_t barrier = 0;
    RecursiveDoublingAllreduce(*peer_context, &barrier, {ReduceOp::kMax}, Remaining(deadline));
  });
  watchdog.Stop();
  // Cancelled: nobody is at fault, and the store (cancelled too at shutdown) is not asked who.
  if (watchdog.cancelled()) {
    formed.cancelled = true;
    return formed;
  }
  if (formed.connected.ok() && watchdog.fired()) {
    // Fired just as the barrier completed: the pairs are closed.
    formed.connected = absl::DeadlineExceededError(
        absl::StrCat("gloo rendezvous on rank ", rank, ": the deadline passed"));
  }
  if (!formed.connected.ok() && formed.store_failure.ok()) {
    formed.connected =
        ConnectFailure(store, prefix, rank, world_size, unconnected,
                       watchdog.fired() || absl::Now() >= deadline, formed.connected);
  }
  formed.context = std::move(peer_context);  // closed when dropped, after ConnectFailure
  formed.bound = std::move(bound);
  return formed;
}

}  // namespace packsched::collective::internal

namespace packsched::collective {

std::vector<int64_t> RecursiveDoublingPeers(int64_t rank, int64_t world_size) {
  std::vector<int64_t> peers;
  if (world_size < 1 || rank < 0 || rank >= world_size) return peers;
  const internal::Hypercube cube(static_cast<int>(world_size));
  const int r = static_cast<int>(rank);
  if (const int fold = cube.FoldPartner(r); fold >= 0) peers.push_back(fold);
  if (const int v = cube.VirtualRank(r); v >= 0) {
    for (int mask = 1; mask < cube.p; mask <<= 1) peers.push_back(cube.RankOf(v ^ mask));
  }
  std::sort(peers.begin(), peers.end());
  return peers;
}

}  // namespace packsched::collective
