#include "server/collective/gloo_collective.h"

#include <net/if.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"
#include "server/base/thread_name.h"
#include "server/collective/recursive_doubling.h"

namespace packsched::collective {
namespace {

using internal::BoundRecursiveDoubling;
using internal::Hypercube;
using internal::RecursiveDoublingAllreduce;
using internal::ReduceRecords;

// How much longer than the longest call a connection's own timeout is (see Create).
constexpr int64_t kPairTimeoutMarginMs = 1000;

std::chrono::milliseconds Remaining(absl::Time deadline) {
  // Gloo treats 0 as "no timeout"; never hand it 0 or less.
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// Gloo's view of our store, under one formation's prefix. Gloo reports failure only by throwing,
// so this adapter throws gloo::IoException, after keeping the Status for Create to return.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, absl::string_view prefix, absl::Time deadline)
      : store_(store), prefix_(prefix), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(Key(key), absl::string_view(data.data(), data.size()), deadline_));
  }

  // Gloo calls get before (or without) wait: it must block until the key exists.
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.Get(Key(key), deadline_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { WaitUntil(keys, deadline_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    WaitUntil(keys, std::min(deadline_, absl::Now() + absl::FromChrono(timeout)));
  }

  const absl::Status& failure() const { return failure_; }

 private:
  std::string Key(absl::string_view key) const { return absl::StrCat(prefix_, key); }

  void WaitUntil(const std::vector<std::string>& keys, absl::Time deadline) {
    for (const std::string& key : keys) Check(store_.Get(Key(key), deadline).status());
  }

  void Check(const absl::Status& status) {
    if (status.ok()) return;
    if (failure_.ok()) failure_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  KeyValueStore& store_;
  const std::string prefix_;
  const absl::Time deadline_;
  absl::Status failure_;
};

// A TCP device (one epoll thread) of this formation's own, as each sidecar process has: ranks
// formed as threads of one process (tests, benchmarks) then behave like separate processes
// instead of funnelling every rank's traffic through one event thread.
absl::StatusOr<std::shared_ptr<gloo::transport::Device>> CreateDevice(const GlooOptions& options) {
  // Checked here: Gloo's own lookup of a missing interface throws and leaks its getifaddrs list.
  if (options.hostname.empty() && !options.iface.empty() &&
      if_nametoindex(options.iface.c_str()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: no network interface named '", options.iface, "'"));
  }
  gloo::transport::tcp::attr attr;
  if (!options.hostname.empty()) {
    attr.hostname = options.hostname;
  } else if (!options.iface.empty()) {
    attr.iface = options.iface;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: cannot create a TCP device for hostname '", options.hostname,
                     "' / iface '", options.iface, "': ", e.what()));
  }
}

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

// Gloo's own all-reduce (bcube or ring) over the whole vector as ONE element of
// values.size() * 8 bytes, so that the reduction callback always sees whole records and can
// apply each word's op. (Gloo has no per-element op; this keeps it at one all-reduce.)
class RecordAllreduceOptions final : public gloo::AllreduceOptions {
 public:
  RecordAllreduceOptions(const std::shared_ptr<gloo::Context>& context, int64_t* data,
                         std::vector<ReduceOp> ops)
      : AllreduceOptions(context) {
    const size_t words = ops.size();
    impl_.out.push_back(context->createUnboundBuffer(data, words * sizeof(int64_t)));
    impl_.elements = 1;
    impl_.elementSize = words * sizeof(int64_t);
    impl_.reduce = [ops = std::move(ops)](void* out, const void* a, const void* b, size_t n) {
      ReduceRecords(out, a, b, n, ops);
    };
  }
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

// Runs `body`, turning whatever Gloo throws into a Status.
absl::Status RunGloo(absl::string_view what, int64_t rank, const std::function<void()>& body) {
  try {
    body();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    const std::string message = absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what());
    // Gloo's waits say "Timed out ..." (unbound buffers) or "Read timeout" / "Write timeout" /
    // "Connect timeout" (registered buffers and connections).
    const std::string lower = absl::AsciiStrToLower(e.what());
    if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout")) {
      return absl::DeadlineExceededError(message);
    }
    return absl::AbortedError(message);
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what()));
  }
}

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

std::vector<int64_t> RecursiveDoublingPeers(int64_t rank, int64_t world_size) {
  std::vector<int64_t> peers;
  if (world_size < 1 || rank < 0 || rank >= world_size) return peers;
  const Hypercube cube(static_cast<int>(world_size));
  const int r = static_cast<int>(rank);
  if (const int fold = cube.FoldPartner(r); fold >= 0) peers.push_back(fold);
  if (const int v = cube.VirtualRank(r); v >= 0) {
    for (int mask = 1; mask < cube.p; mask <<= 1) peers.push_back(cube.RankOf(v ^ mask));
  }
  std::sort(peers.begin(), peers.end());
  return peers;
}

struct GlooCollective::State {
  int64_t rank = 0;
  int64_t world_size = 0;
  GlooOptions::Algorithm algorithm = GlooOptions::Algorithm::kRecursiveDoubling;
  std::shared_ptr<gloo::Context> context;  // set before the worker starts; then read-only
  // kRecursiveDoubling: the all-reduce of small records (the rounds); used on the worker only.
  std::shared_ptr<BoundRecursiveDoubling> bound;

  // One call handed to the worker at a time (the Collective contract: one caller at a time).
  struct Job {
    std::function<absl::Status()> run;
    absl::Status status;
    bool done = false;
  };

  absl::Mutex mu;
  std::shared_ptr<Job> pending ABSL_GUARDED_BY(mu);
  bool busy ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::Status broken ABSL_GUARDED_BY(mu);  // the first failure; every later call returns it
  std::thread worker;

  static void WorkerLoop(std::shared_ptr<State> state) {
    NameThisThread("psched-gloo");
    for (;;) {
      std::shared_ptr<Job> job;
      {
        absl::MutexLock lock(&state->mu);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(state->mu) {
          return state->stop || state->pending != nullptr;
        };
        state->mu.Await(absl::Condition(&ready));
        if (state->pending == nullptr) return;
        job = std::move(state->pending);
        state->busy = true;
      }
      absl::Status status = job->run();
      absl::MutexLock lock(&state->mu);
      job->status = std::move(status);
      job->done = true;
      state->busy = false;
    }
  }

  // Hands `run` to the worker and waits for it, for an abort, or for `deadline`.
  absl::Status Call(std::function<absl::Status()> run, absl::string_view what,
                    absl::Time deadline) {
    absl::Status status = WaitFor(std::move(run), what, deadline);
    // A peer failed (or we were aborted): close our connections too, so the failure reaches every
    // rank at once — with recursive doubling, a rank whose partner died may be the only link to
    // others still waiting on it. A timeout does not cascade: every rank meets its own deadline
    // and reports DeadlineExceeded.
    if (absl::IsAborted(status)) CloseConnections();
    return status;
  }

  absl::Status WaitFor(std::function<absl::Status()> run, absl::string_view what,
                       absl::Time deadline) {
    auto job = std::make_shared<Job>();
    job->run = std::move(run);
    absl::MutexLock lock(&mu);
    if (!broken.ok()) return broken;
    pending = job;
    auto finished = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return job->done || aborted; };
    mu.AwaitWithDeadline(absl::Condition(&finished), deadline);
    if (job->done) {
      if (!job->status.ok()) broken = job->status;
      return job->status;
    }
    if (!aborted) {
      broken = absl::DeadlineExceededError(absl::StrCat("gloo ", what, " on rank ", rank, " of ",
                                                        world_size,
                                                        " did not complete before the deadline"));
    }
    // The worker may still be inside Gloo with its own copy of the data; it ends with Gloo's
    // timeout (or at once when connections close) and nobody reads its result.
    return broken;
  }

  // Closes every pair once: peers blocked on us fail at once with "connection closed".
  void CloseConnections() {
    {
      absl::MutexLock lock(&mu);
      if (closed) return;
      closed = true;
    }
    try {
      context->closeConnections();
    } catch (const std::exception&) {
      // Closing a pair that already failed may throw; the pair is gone either way.
    }
  }
};

GlooCollective::GlooCollective(std::shared_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(
    KeyValueStore& store, absl::string_view prefix, int64_t rank, int64_t world_size,
    const GlooOptions& options, absl::Time deadline, Cancellation* cancel) {
  if (world_size < 1 || world_size > (int64_t{1} << 20) || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is not in a group of ", world_size));
  }
  auto cancelled = [&] {
    return absl::AbortedError(absl::StrCat("gloo rendezvous on rank ", rank, " of ", world_size,
                                           " under '", prefix, "': cancelled"));
  };
  if (cancel != nullptr && cancel->cancelled()) return cancelled();
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device = CreateDevice(options);
  if (!device.ok()) return device.status();

  auto state = std::make_shared<State>();
  state->rank = rank;
  state->world_size = world_size;
  state->algorithm = options.algorithm;
  std::shared_ptr<gloo::Context> context;
  absl::Status store_failure;
  absl::Status connected;
  if (options.algorithm == GlooOptions::Algorithm::kRecursiveDoubling) {
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
    std::shared_ptr<BoundRecursiveDoubling> bound;
    int unconnected = -1;
    FormationWatchdog watchdog(deadline, cancel);
    connected = RunGloo("rendezvous", rank, [&] {
      peer_context->Connect(store, prefix, *device, peers, deadline, pair_timeout, watchdog,
                            store_failure, unconnected);
      // Every pair of this rank is up: a rank whose formation fails later names the ranks
      // without this key (ConnectFailure).
      if (absl::Status set = store.Set(ConnectedKey(prefix, rank), "1", deadline); !set.ok()) {
        store_failure = set;
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
    if (watchdog.cancelled()) return cancelled();
    if (connected.ok() && watchdog.fired()) {
      // Fired just as the barrier completed: the pairs are closed.
      connected = absl::DeadlineExceededError(
          absl::StrCat("gloo rendezvous on rank ", rank, ": the deadline passed"));
    }
    if (!connected.ok() && store_failure.ok()) {
      connected = ConnectFailure(store, prefix, rank, world_size, unconnected,
                                 watchdog.fired() || absl::Now() >= deadline, connected);
    }
    context = std::move(peer_context);  // closed when this returns, after ConnectFailure
    state->bound = std::move(bound);
  } else {
    auto full = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(rank),
                                                            static_cast<int>(world_size));
    // The transport keeps this as the bound of every wait that has no explicit timeout (bcube's).
    full->setTimeout(Remaining(deadline));
    StoreAdapter adapter(store, prefix, deadline);
    connected = RunGloo("rendezvous", rank, [&] { full->connectFullMesh(adapter, *device); });
    store_failure = adapter.failure();
    context = std::move(full);
    // A peer that joined and went away: Aborted, as in a round (DESIGN.md §3).
    if (!connected.ok() && absl::Now() < deadline) {
      connected = absl::AbortedError(connected.message());
    }
  }
  if (!store_failure.ok()) {
    return absl::Status(store_failure.code(),
                        absl::StrCat("gloo rendezvous of rank ", rank, " of ", world_size,
                                     " under '", prefix, "': ", store_failure.message()));
  }
  if (!connected.ok()) {
    if (absl::Now() >= deadline && !absl::IsDeadlineExceeded(connected)) {
      return absl::DeadlineExceededError(connected.message());
    }
    return connected;
  }
  state->context = std::move(context);
  state->worker = std::thread(&State::WorkerLoop, state);
  return std::unique_ptr<GlooCollective>(new GlooCollective(std::move(state)));
}

GlooCollective::~GlooCollective() {
  state_->CloseConnections();
  bool busy;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stop = true;
    busy = state_->busy;
  }
  // An idle worker sees `stop` and returns; a busy one is inside Gloo until its timeout or the
  // closed connections end the call, holding its own reference to the state.
  if (busy) {
    state_->worker.detach();
  } else {
    state_->worker.join();
  }
}

int64_t GlooCollective::rank() const { return state_->rank; }
int64_t GlooCollective::world_size() const { return state_->world_size; }

absl::Status GlooCollective::AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                                       absl::Time deadline) {
  if (ops.size() != values.size()) {
    return absl::InvalidArgumentError("gloo: ops and values differ in size");
  }
  if (values.empty()) return absl::OkStatus();
  // The worker works on its own copy, so a call abandoned at its deadline never writes `values`.
  auto data = std::make_shared<std::vector<int64_t>>(values.begin(), values.end());
  std::shared_ptr<gloo::Context> context = state_->context;
  std::shared_ptr<BoundRecursiveDoubling> bound =
      values.size() <= BoundRecursiveDoubling::kMaxWords ? state_->bound : nullptr;
  const GlooOptions::Algorithm algorithm = state_->algorithm;
  const int64_t rank = state_->rank;
  std::vector<ReduceOp> op_copy(ops.begin(), ops.end());
  absl::Status status = state_->Call(
      [=, ops = std::move(op_copy)]() mutable {
        return RunGloo("all-reduce", rank, [&] {
          if (bound != nullptr) {
            bound->Run(data->data(), ops);
            return;
          }
          if (algorithm == GlooOptions::Algorithm::kRecursiveDoubling) {
            RecursiveDoublingAllreduce(*context, data->data(), ops, Remaining(deadline));
            return;
          }
          RecordAllreduceOptions options(context, data->data(), std::move(ops));
          options.setAlgorithm(algorithm == GlooOptions::Algorithm::kBcube
                                   ? gloo::AllreduceOptions::Algorithm::BCUBE
                                   : gloo::AllreduceOptions::Algorithm::RING);
          options.setTimeout(Remaining(deadline));
          gloo::allreduce(options);
        });
      },
      "all-reduce", deadline);
  if (!status.ok()) return status;
  std::copy(data->begin(), data->end(), values.begin());
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                                       absl::Time deadline) {
  if (out.size() != record.size() * static_cast<size_t>(state_->world_size)) {
    return absl::InvalidArgumentError("gloo: out must hold world_size records");
  }
  if (record.empty()) return absl::OkStatus();
  auto in = std::make_shared<std::vector<int64_t>>(record.begin(), record.end());
  auto gathered = std::make_shared<std::vector<int64_t>>(out.size());
  std::shared_ptr<gloo::Context> context = state_->context;
  const int64_t rank = state_->rank;
  const bool sparse = state_->algorithm == GlooOptions::Algorithm::kRecursiveDoubling;
  absl::Status status = state_->Call(
      [=] {
        return RunGloo("all-gather", rank, [&] {
          if (sparse) {
            // Only the recursive-doubling pairs are connected: gather as an all-reduce (sum) of
            // the W records, each rank's own in its slot and zeros elsewhere (x + 0 = x, so the
            // sum is exact). W·record bytes per hop: the failure path only, where the records
            // name the ranks at fault.
            std::copy(in->begin(), in->end(), gathered->begin() + rank * in->size());
            RecursiveDoublingAllreduce(*context, gathered->data(),
                                       std::vector<ReduceOp>(gathered->size(), ReduceOp::kSum),
                                       Remaining(deadline));
            return;
          }
          gloo::AllgatherOptions options(context);
          options.setInput(in->data(), in->size());
          options.setOutput(gathered->data(), gathered->size());
          options.setTimeout(Remaining(deadline));
          gloo::allgather(options);
        });
      },
      "all-gather", deadline);
  if (!status.ok()) return status;
  std::copy(gathered->begin(), gathered->end(), out.begin());
  return absl::OkStatus();
}

void GlooCollective::Abort() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->aborted = true;
    if (state_->broken.ok()) {
      state_->broken = absl::AbortedError(absl::StrCat("gloo: rank ", state_->rank, " aborted"));
    }
  }
  state_->CloseConnections();
}

}  // namespace packsched::collective
