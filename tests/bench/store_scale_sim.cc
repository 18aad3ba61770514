// store_scale_sim: the rank group's store protocol at W = 1,024 and 4,096 in one process
// (docs/benchmarks.md, "Store at scale"). Every simulated rank is the real code — its Group
// (readiness), its GroupAgreements with its result replica (marks, the fold, the first round's
// lookup, the background writes) and its StreamGroup's formation (generation, joined, ended) —
// over one in-memory store served the way rank 0's rendezvous server serves it (a waiting Get is
// a watch, not a thread on a condition), each rank through its own request counter. Only the
// backend is simulated: its formation makes Gloo's store requests (its address, its recursive
// doubling partners' addresses, its "connected" key) and its all-reduce returns the rank's own
// record (every rank sends the same one).
//
// Latency model: every request costs `--latency_us` of rank 0's store, one at a time (rank 0's
// store serializes them), so formation takes at least (all the requests) × latency; each rank's
// own requests are sequential, so it takes at least (the most one rank makes) × latency. The
// modeled formation time is the larger. The simulation's own wall time is reported too (the
// code's CPU on this machine, threads as ranks).
//
//   build/tests/bench/store_scale_sim --world=1024,4096 --latency_us=100

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"
#include "server/collective/counting_store.h"
#include "server/collective/recursive_doubling.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/group_agreement.h"
#include "server/group/group_keys.h"
#include "server/group/round.h"
#include "server/group/round_agreement.h"

ABSL_FLAG(std::vector<std::string>, world, (std::vector<std::string>{"1024", "4096"}),
          "world sizes to simulate");
ABSL_FLAG(int64_t, latency_us, 100, "cost of one request at rank 0's store, serialized");

namespace packsched::group {
namespace {

using collective::Collective;
using collective::InMemoryStore;
using collective::KeyValueStore;

constexpr absl::Duration kTimeout = absl::Minutes(5);

// Rank 0's store as its rendezvous server serves it: a Get for a key not set yet is a watch that
// the Set completes, so thousands of waiting ranks cost no condition re-evaluation per write.
class ServedStore final : public KeyValueStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override {
    return store_.Set(key, value, deadline);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override {
    struct Waiter {
      absl::Notification done;
      std::string value;
    };
    auto waiter = std::make_shared<Waiter>();
    const int64_t id = store_.Watch(key, [waiter](std::string value) {
      waiter->value = std::move(value);
      waiter->done.Notify();
    });
    if (!waiter->done.WaitForNotificationWithDeadline(deadline) && store_.CancelWatch(id)) {
      return absl::DeadlineExceededError(absl::StrCat("store: key '", key, "' was not set"));
    }
    waiter->done.WaitForNotification();  // the callback won the race
    return waiter->value;
  }
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key,
                                                    absl::Time deadline) override {
    return store_.TryGet(key, deadline);
  }
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired,
                                            absl::Time deadline) override {
    return store_.CompareAndSet(key, expected, desired, deadline);
  }
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, absl::Time deadline) override {
    return store_.DeletePrefix(prefix, deadline);
  }

 private:
  InMemoryStore store_;
};

// The backend's part: what Gloo's recursive doubling formation asks of the store, and an
// all-reduce of identical records.
class SimulatedCollective final : public Collective {
 public:
  SimulatedCollective(int64_t rank, int64_t world_size) : rank_(rank), world_size_(world_size) {}
  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_size_; }
  absl::string_view backend() const override { return "simulated"; }
  absl::Status AllReduce(absl::Span<int64_t>, absl::Span<const collective::ReduceOp>,
                         absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status AllGather(absl::Span<const int64_t>, absl::Span<int64_t>, absl::Time) override {
    return absl::UnimplementedError("the simulation agrees every round");
  }
  void Abort() override {}

 private:
  const int64_t rank_;
  const int64_t world_size_;
};

// What Gloo's formation barrier gives without the store: no rank's formation completes before
// every rank has connected (so no rank finishes the first round before the last one has looked
// it up and come to form).
class FormationBarrier {
 public:
  explicit FormationBarrier(int64_t world_size) : world_size_(world_size) {}
  bool Arrive(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    ++arrived_;
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_ >= world_size_; };
    return mu_.AwaitWithDeadline(absl::Condition(&all), deadline);
  }

 private:
  const int64_t world_size_;
  absl::Mutex mu_;
  int64_t arrived_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::StatusOr<std::unique_ptr<Collective>> FormSimulated(FormationBarrier& barrier,
                                                          KeyValueStore& store,
                                                          absl::string_view prefix, int64_t rank,
                                                          int64_t world_size, absl::Time deadline) {
  const collective::internal::Hypercube cube(static_cast<int>(world_size));
  std::vector<int> partners;
  const int me = static_cast<int>(rank);
  if (const int fold = cube.FoldPartner(me); fold >= 0) partners.push_back(fold);
  if (const int v = cube.VirtualRank(me); v >= 0) {
    for (int bit = 1; bit < cube.p; bit *= 2) partners.push_back(cube.RankOf(v ^ bit));
  }
  auto address = [&](int64_t of) { return absl::StrCat(prefix, "peer_addresses/", of); };
  if (absl::Status set = store.Set(address(rank), "address", deadline); !set.ok()) return set;
  for (int partner : partners) {
    if (absl::StatusOr<std::string> theirs = store.Get(address(partner), deadline); !theirs.ok()) {
      return theirs.status();
    }
  }
  if (absl::Status set = store.Set(absl::StrCat(prefix, "connected/", rank), "1", deadline);
      !set.ok()) {
    return set;
  }
  if (!barrier.Arrive(deadline)) return absl::DeadlineExceededError("formation barrier");
  return std::make_unique<SimulatedCollective>(rank, world_size);
}

struct SimulatedRank {
  SimulatedRank(KeyValueStore& store, FormationBarrier& barrier, int64_t rank, int64_t world_size)
      : counted(store) {
    GroupOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.backend = collective::Backend::kAuto;  // agreed through the store, as by default
    options.can_use_nccl = false;
    options.collective_timeout = kTimeout;
    options.form_collective = [&barrier](KeyValueStore& store, absl::string_view prefix,
                                         int64_t rank, int64_t world_size, absl::Time deadline) {
      return FormSimulated(barrier, store, prefix, rank, world_size, deadline);
    };
    group = *Group::Create(&counted, std::move(options));
    // No idle epoch polls: the requests counted are the protocol's, not the clock's.
    agreements = std::make_unique<GroupAgreements>(
        *group, ReplicaOptions{absl::Hours(1), absl::Milliseconds(100)});
    stream = agreements->ForStream("actor");
  }
  ~SimulatedRank() {
    stream.reset();
    agreements.reset();
  }
  collective::CountingStore counted;
  std::unique_ptr<Group> group;
  std::unique_ptr<GroupAgreements> agreements;
  std::unique_ptr<RoundAgreement> stream;
};

RoundRecord Record(int64_t round) {
  RoundRecord record;
  record.stream = "actor";
  record.round = round;
  record.options_hash = 5;
  record.version = 1;
  record.local_k = 2;
  record.num_sequences = 8;
  record.loss_tokens = 100;
  record.sequences_with_loss = 8;
  return record;
}

template <typename Body>
bool OnEveryRank(std::vector<std::unique_ptr<SimulatedRank>>& ranks, Body body) {
  std::vector<char> ok(ranks.size(), 0);
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] { ok[r] = body(*ranks[r]) ? 1 : 0; });
  }
  for (std::thread& t : threads) t.join();
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

struct Phase {
  int64_t total = 0;
  int64_t rank_zero = 0;
  int64_t most_other = 0;  // the most requests one rank other than 0 made
};

Phase Between(const std::vector<int64_t>& before,
              const std::vector<std::unique_ptr<SimulatedRank>>& ranks, std::vector<int64_t>& now) {
  Phase phase;
  now.clear();
  for (size_t r = 0; r < ranks.size(); ++r) {
    now.push_back(ranks[r]->counted.requests().total());
    const int64_t made = now[r] - before[r];
    phase.total += made;
    if (r == 0) {
      phase.rank_zero = made;
    } else {
      phase.most_other = std::max(phase.most_other, made);
    }
  }
  return phase;
}

int Simulate(int64_t world_size, absl::Duration latency) {
  ServedStore store;
  FormationBarrier barrier(world_size);
  std::vector<std::unique_ptr<SimulatedRank>> ranks;
  for (int64_t r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<SimulatedRank>(store, barrier, r, world_size));
  }
  std::vector<int64_t> before(world_size, 0);
  std::vector<int64_t> now;
  const absl::Time start = absl::Now();
  // Formation: every rank joins the run (readiness; its replica's mark, folded by rank 0), then
  // its first round: the lookup, the stream's formation and the agreement.
  if (!OnEveryRank(ranks, [](SimulatedRank& rank) {
        absl::StatusOr<bool> ready = rank.group->AwaitMembers(absl::Now() + kTimeout);
        if (!ready.ok() || !*ready) return false;
        absl::StatusOr<AgreedRound> agreed = rank.stream->Agree(Record(1));
        if (!agreed.ok()) std::fprintf(stderr, "%s\n", agreed.status().ToString().c_str());
        return agreed.ok();
      })) {
    std::fprintf(stderr, "W = %lld: formation failed\n", static_cast<long long>(world_size));
    return 1;
  }
  const absl::Duration formation_wall = absl::Now() - start;
  absl::SleepFor(absl::Milliseconds(200));  // the replicas' writes of round 1
  const Phase formation = Between(before, ranks, now);
  before = now;
  // A steady round: the formed collective; each rank's result is written in the background.
  const absl::Time steady_start = absl::Now();
  OnEveryRank(ranks, [](SimulatedRank& rank) { return rank.stream->Agree(Record(2)).ok(); });
  const absl::Duration steady_wall = absl::Now() - steady_start;
  absl::SleepFor(absl::Milliseconds(200));
  const Phase steady = Between(before, ranks, now);

  const double log2w = std::log2(static_cast<double>(world_size));
  const absl::Duration modeled = std::max(
      latency * formation.total, latency * std::max(formation.rank_zero, formation.most_other));
  std::printf(
      "| %lld | %lld | %lld (%.1f · log2 W) | %lld | %.1f s | %.1f s | %lld | %lld | %.2f s |\n",
      static_cast<long long>(world_size), static_cast<long long>(formation.total),
      static_cast<long long>(formation.most_other), formation.most_other / log2w,
      static_cast<long long>(formation.rank_zero), absl::ToDoubleSeconds(modeled),
      absl::ToDoubleSeconds(formation_wall), static_cast<long long>(steady.total),
      static_cast<long long>(steady.rank_zero), absl::ToDoubleSeconds(steady_wall));
  std::fflush(stdout);
  ranks.clear();
  return 0;
}

}  // namespace
}  // namespace packsched::group

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Duration latency = absl::Microseconds(absl::GetFlag(FLAGS_latency_us));
  std::printf(
      "| W | formation: requests, all ranks | most by one rank other than 0 | by rank 0 | "
      "modeled formation (%lld µs a request, serialized) | simulation wall time | steady round: "
      "requests, all ranks | by rank 0 | steady round wall time |\n|---|---|---|---|---|---|---|"
      "---|---|\n",
      static_cast<long long>(absl::ToInt64Microseconds(latency)));
  for (const std::string& w : absl::GetFlag(FLAGS_world)) {
    int64_t world_size = 0;
    if (!absl::SimpleAtoi(w, &world_size) || world_size < 2) {
      std::fprintf(stderr, "--world: '%s' is not a world size >= 2\n", w.c_str());
      return 2;
    }
    if (int rc = packsched::group::Simulate(world_size, latency); rc != 0) return rc;
  }
  return 0;
}
