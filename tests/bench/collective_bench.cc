// Latency of the round agreement over Gloo on loopback, threads as ranks in one process.
//
//   build/bin/collective_bench                  everything below (about a minute on 2 cores)
//   build/bin/collective_bench --quick          fewer iterations, W up to 32
//   build/bin/collective_bench --only=scaling   one section: round, encodings, rendezvous, scaling
//
// 1. Round latency, W = 4, n = 1,024 sequences per rank (realistic RL lengths, different per
//    rank): the planner's local bound, StreamGroup::Agree (generation check, arrival key, one
//    all-reduce) and the partition into the agreed k. p50/p99 over many rounds, and the same for
//    the agreement alone.
// 2. One record all-reduce (what the Gloo backend does) against two all-reduces (MAX then SUM,
//    the alternative encoding), for recursive doubling (the default) and Gloo's bcube and ring.
// 3. Rendezvous time for W = 8: GlooCollective formation and a whole StreamGroup formation.
// 4. AgreeRound latency against W = 2 ... 64, with least-squares fits of a·log2(W) + b and
//    a·W + b, and what each projects for W = 10,000.
//
// Every rank is a thread and the machine may have fewer cores than W: with W ranks each
// waiting in turn for the others, oversubscription adds scheduling delay that grows with W, so
// the figures for large W are an upper bound for one-rank-per-host deployments.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/round.h"
#include "server/group/stream_group.h"
#include "server/planner/planner.h"
#include "tests/testing/lengths.h"

namespace packsched::collective {
namespace {

using group::AgreedRound;
using group::AgreeRound;
using group::Group;
using group::GroupOptions;
using group::RoundRecord;
using group::StreamGroup;

struct Stats {
  double p50_ms = 0, p99_ms = 0, mean_ms = 0;
};

Stats Summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Stats stats;
  stats.p50_ms = ms[ms.size() / 2];
  stats.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  for (double x : ms) stats.mean_ms += x / ms.size();
  return stats;
}

GlooOptions Loopback(
    GlooOptions::Algorithm algorithm = GlooOptions::Algorithm::kRecursiveDoubling) {
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.algorithm = algorithm;
  return options;
}

std::string Prefix() {
  static std::atomic<int> next{0};
  return absl::StrCat("bench/", next++, "/");
}

// Forms a Gloo group of `world_size` threads; returns the ranks, and the formation time.
std::vector<std::unique_ptr<GlooCollective>> Form(KeyValueStore& store, int64_t world_size,
                                                  GlooOptions options, double* seconds) {
  const std::string prefix = Prefix();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<std::unique_ptr<GlooCollective>> ranks(world_size);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int64_t r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      auto formed = GlooCollective::Create(store, prefix, r, world_size, options, deadline);
      if (!formed.ok()) {
        std::fprintf(stderr, "formation failed: %s\n", formed.status().ToString().c_str());
        std::exit(1);
      }
      ranks[r] = std::move(formed).value();
    });
  }
  for (std::thread& t : threads) t.join();
  if (seconds != nullptr) *seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return ranks;
}

// Runs `iterations` calls of body(rank, i) on every rank (one thread each, in lockstep through
// the collective) and returns rank 0's per-call latencies in milliseconds.
std::vector<double> Lockstep(int64_t world_size, int iterations,
                             const std::function<void(int64_t, int)>& body) {
  std::vector<double> ms;
  ms.reserve(iterations);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      for (int i = 0; i < iterations; ++i) {
        const absl::Time start = absl::Now();
        body(r, i);
        if (r == 0) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return ms;
}

RoundRecord Record(int64_t rank, int64_t round, int64_t local_k) {
  RoundRecord record;
  record.stream = "actor_update";
  record.round = round;
  record.options_hash = 1234;
  record.version = 1;
  record.local_k = local_k;
  record.num_sequences = 1024;
  record.loss_tokens = 1000000 + rank;
  record.sequences_with_loss = 1000;
  return record;
}

void Check(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "failed: %s\n", status.ToString().c_str());
  std::exit(1);
}

void Print(const char* what, const Stats& stats, int iterations) {
  std::printf("%-58s p50 %7.3f ms  p99 %7.3f ms  mean %7.3f ms  (%d rounds)\n", what, stats.p50_ms,
              stats.p99_ms, stats.mean_ms, iterations);
}

// 1. The round as the service will run it, W = 4, n = 1,024 per rank.
void RoundLatency(int iterations) {
  constexpr int64_t kWorld = 4;
  InMemoryStore store;
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<std::unique_ptr<StreamGroup>> streams;
  for (int64_t r = 0; r < kWorld; ++r) {
    GroupOptions options;
    options.rank = r;
    options.world_size = kWorld;
    options.backend = Backend::kGloo;
    options.gloo = Loopback();
    options.collective_timeout = absl::Seconds(30);
    groups.push_back(std::move(Group::Create(&store, options)).value());
    streams.push_back(groups.back()->ForStream("actor_update"));
  }
  planner::PlanOptions plan_options;
  plan_options.max_token_len = 32768;
  std::vector<std::vector<int64_t>> lengths;
  for (int64_t r = 0; r < kWorld; ++r)
    lengths.push_back(testing::RealisticRlLengths(1024, 100 + r));

  std::vector<double> full = Lockstep(kWorld, iterations, [&](int64_t r, int i) {
    auto problem = planner::Problem::Create(lengths[r], plan_options);
    Check(problem.status());
    auto agreed = streams[r]->Agree(Record(r, i, problem->local_k()));
    Check(agreed.status());
    Check(problem->Partition(agreed->k).status());
  });
  Print("W=4 round: local bound + Agree + partition, n=1024/rank", Summarize(full), iterations);
  std::vector<double> alone(iterations);
  for (int i = 0; i < iterations; ++i) {
    const absl::Time start = absl::Now();
    auto problem = planner::Problem::Create(lengths[i % kWorld], plan_options);
    Check(problem.status());
    Check(problem->Partition(problem->local_k()).status());
    alone[i] = absl::ToDoubleMilliseconds(absl::Now() - start);
  }
  Print("planner alone (local bound + partition), one thread", Summarize(alone), iterations);
  std::vector<double> agree = Lockstep(kWorld, iterations, [&](int64_t r, int i) {
    Check(streams[r]->Agree(Record(r, iterations + i, 10 + r)).status());
  });
  Print("W=4 StreamGroup::Agree alone (store check + all-reduce)", Summarize(agree), iterations);
}

// 2. Encodings and algorithms for the 14-word round record, W = 4.
void Encodings(int iterations) {
  constexpr int64_t kWorld = 4;
  InMemoryStore store;
  for (auto algorithm : {GlooOptions::Algorithm::kRecursiveDoubling, GlooOptions::Algorithm::kBcube,
                         GlooOptions::Algorithm::kRing}) {
    auto ranks = Form(store, kWorld, Loopback(algorithm), nullptr);
    const char* name = algorithm == GlooOptions::Algorithm::kRecursiveDoubling
                           ? "recursive doubling"
                       : algorithm == GlooOptions::Algorithm::kBcube ? "gloo bcube"
                                                                     : "gloo ring";
    std::vector<ReduceOp> mixed(14, ReduceOp::kMax);
    for (int j = 0; j < 14; j += 3) mixed[j] = ReduceOp::kSum;
    for (int j = 1; j < 14; j += 3) mixed[j] = ReduceOp::kMin;
    const absl::Time far = absl::Now() + absl::Seconds(60);
    std::vector<double> one = Lockstep(kWorld, iterations, [&](int64_t r, int) {
      std::vector<int64_t> values(14, r);
      Check(ranks[r]->AllReduce(absl::MakeSpan(values), mixed, far));
    });
    Print(absl::StrCat("W=4 ", name, ": one all-reduce, 14 words, mixed ops").c_str(),
          Summarize(one), iterations);
    const std::vector<ReduceOp> max_ops(9, ReduceOp::kMax), sum_ops(5, ReduceOp::kSum);
    std::vector<double> two = Lockstep(kWorld, iterations, [&](int64_t r, int) {
      std::vector<int64_t> maxes(9, r), sums(5, r);
      Check(ranks[r]->AllReduce(absl::MakeSpan(maxes), max_ops, far));
      Check(ranks[r]->AllReduce(absl::MakeSpan(sums), sum_ops, far));
    });
    Print(absl::StrCat("W=4 ", name, ": two all-reduces (MAX 9, then SUM 5)").c_str(),
          Summarize(two), iterations);
  }
}

// 3. Rendezvous, W = 8.
void Rendezvous(int repeats) {
  constexpr int64_t kWorld = 8;
  InMemoryStore store;
  std::vector<double> gloo_ms, group_ms;
  for (int i = 0; i < repeats; ++i) {
    double seconds = 0;
    Form(store, kWorld, Loopback(), &seconds);
    gloo_ms.push_back(seconds * 1e3);

    InMemoryStore fresh;
    std::vector<std::unique_ptr<Group>> groups;
    std::vector<std::unique_ptr<StreamGroup>> streams;
    for (int64_t r = 0; r < kWorld; ++r) {
      GroupOptions options;
      options.rank = r;
      options.world_size = kWorld;
      options.backend = Backend::kAuto;
      options.can_use_nccl = false;
      options.gloo = Loopback();
      groups.push_back(std::move(Group::Create(&fresh, options)).value());
      streams.push_back(groups.back()->ForStream("s"));
    }
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int64_t r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] { Check(streams[r]->Form()); });
    }
    for (std::thread& t : threads) t.join();
    group_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  Print("W=8 Gloo rendezvous (GlooCollective::Create, all ranks)", Summarize(gloo_ms), repeats);
  Print("W=8 StreamGroup formation (epoch, auto backend, Gloo)", Summarize(group_ms), repeats);

  // Recursive doubling connects each rank to its hypercube partners only (log2 W); Gloo's own
  // algorithms need the full mesh (W - 1 each, and every rank reads every rank's W addresses).
  for (int64_t world : {8, 32, 64}) {
    for (const bool sparse : {true, false}) {
      std::vector<double> ms;
      for (int i = 0; i < std::max(1, repeats / 3); ++i) {
        double seconds = 0;
        Form(store, world,
             Loopback(sparse ? GlooOptions::Algorithm::kRecursiveDoubling
                             : GlooOptions::Algorithm::kRing),
             &seconds);
        ms.push_back(seconds * 1e3);
      }
      int64_t connections = world - 1;
      if (sparse) {
        connections = 0;
        for (int64_t r = 0; r < world; ++r) {
          connections = std::max<int64_t>(connections, RecursiveDoublingPeers(r, world).size());
        }
      }
      Print(absl::StrCat("W=", world, " Gloo formation, ",
                         sparse ? "recursive-doubling peers" : "full mesh", " (", connections,
                         " connections per rank at most)")
                .c_str(),
            Summarize(ms), static_cast<int>(ms.size()));
    }
  }
}

// 4. AgreeRound latency against W, and the fitted growth.
void Scaling(const std::vector<int64_t>& sizes, int base_iterations) {
  std::vector<double> x_log, x_lin, y;
  InMemoryStore store;
  for (int64_t world_size : sizes) {
    double formation = 0;
    auto ranks = Form(store, world_size, Loopback(), &formation);
    const int iterations = std::max<int>(50, base_iterations * 4 / static_cast<int>(world_size));
    const absl::Time far = absl::Now() + absl::Seconds(120);
    std::vector<double> ms = Lockstep(world_size, iterations, [&](int64_t r, int i) {
      Check(AgreeRound(*ranks[r], Record(r, i, 3 + r % 5), far).status());
    });
    const Stats stats = Summarize(ms);
    Print(absl::StrCat("AgreeRound W=", world_size, " (formed in ",
                       static_cast<int>(formation * 1e3), " ms)")
              .c_str(),
          stats, iterations);
    x_log.push_back(std::log2(static_cast<double>(world_size)));
    x_lin.push_back(static_cast<double>(world_size));
    y.push_back(stats.p50_ms);
  }
  auto fit = [&](const std::vector<double>& x, const char* form, double at) {
    const double n = static_cast<double>(x.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
    }
    const double a = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    const double b = (sy - a * sx) / n;
    double ss_res = 0, ss_tot = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ss_res += std::pow(y[i] - (a * x[i] + b), 2);
      ss_tot += std::pow(y[i] - sy / n, 2);
    }
    std::printf("fit p50 = %.4f * %-12s + %7.4f ms   R^2 = %.3f   at W = 10,000: %.2f ms\n", a,
                form, b, 1 - ss_res / ss_tot, a * at + b);
  };
  std::vector<double> x_wlog;
  for (size_t i = 0; i < x_lin.size(); ++i) x_wlog.push_back(x_lin[i] * x_log[i]);
  fit(x_log, "log2(W)", std::log2(10000.0));
  fit(x_lin, "W", 10000.0);
  // W ranks on this machine's few cores handle W·log2(W) messages per round between them: the
  // CPU-bound model for threads-as-ranks, not a deployment's critical path.
  fit(x_wlog, "W*log2(W)", 10000.0 * std::log2(10000.0));
  // A deployment (one rank per host) waits only for its own critical path: Hops(W) message
  // exchanges, each measured here at W = 2 (one hop, no oversubscription).
  auto hops = [](int64_t w) {
    int64_t p = 1, steps = 0;
    while (p * 2 <= w) p *= 2, ++steps;
    return steps + (w > p ? 2 : 0);
  };
  const double per_hop = y[0] / static_cast<double>(hops(sizes[0]));
  std::printf(
      "critical path: %lld hops at W = 10,000 x %.4f ms per loopback hop (W = 2) = %.2f ms"
      " (+ one network round trip per hop off loopback)\n",
      static_cast<long long>(hops(10000)), per_hop, per_hop * hops(10000));
}

}  // namespace
}  // namespace packsched::collective

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
  }
  auto run = [&](const char* section) { return only.empty() || only == section; };
  using namespace packsched::collective;
  std::printf("collective_bench: Gloo on 127.0.0.1, threads as ranks, %u hardware threads\n",
              std::thread::hardware_concurrency());
  if (run("round")) RoundLatency(quick ? 300 : 2000);
  if (run("encodings")) Encodings(quick ? 300 : 2000);
  if (run("rendezvous")) Rendezvous(quick ? 3 : 10);
  if (run("scaling")) {
    Scaling(
        quick ? std::vector<int64_t>{2, 4, 8, 16, 32} : std::vector<int64_t>{2, 4, 8, 16, 32, 64},
        quick ? 200 : 1000);
  }
  return 0;
}
