// Planner speed on realistic RL mixes (tests/testing/lengths.h: prompt 200-2,000 + response
// 50-16,000 tokens, lognormal), one thread.
//
//   build/bin/planner_bench                                   everything
//   build/bin/planner_bench --benchmark_filter='Kk/65536'     one case (peak_rss_mib is then
//                                                             that case's own peak)
//
// Targets: Kk/4096/16384 under 5 ms, Kk/65536/16384 under 300 ms. SidecarPlan/1024/*
// is the planner part of the sidecar's load benchmark.
// Counters: k (micro-batches), max_over_mean (largest part cost / mean part cost),
// over_cap (parts over the cap), peak_rss_mib (the process's peak resident set so far).

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "server/planner/options.h"
#include "server/planner/planner.h"
#include "tests/testing/lengths.h"

namespace packsched::planner {
namespace {

constexpr uint64_t kSeed = 1;

double PeakRssMib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

void Report(benchmark::State& state, const MicroBatchPlan& plan) {
  state.counters["k"] = static_cast<double>(plan.parts.size());
  state.counters["max_over_mean"] = plan.stats.imbalance;
  state.counters["over_cap"] = static_cast<double>(plan.stats.over_cap_parts);
  state.counters["peak_rss_mib"] = PeakRssMib();
}

PlanOptions Options(int64_t cap, Algorithm algorithm) {
  PlanOptions options;
  options.max_token_len = cap;
  options.algorithm = algorithm;
  // About 1% of the mix is longer than 16,384 tokens: each gets a micro-batch of its own (and
  // counts in over_cap), as a trainer that keeps every sequence needs.
  options.overlong = OverlongPolicy::kIsolate;
  return options;
}

// Args: n, cap.
void BalanceWith(benchmark::State& state, Algorithm algorithm) {
  const std::vector<int64_t> lengths = testing::RealisticRlLengths(state.range(0), kSeed);
  const PlanOptions options = Options(state.range(1), algorithm);
  MicroBatchPlan plan;
  for (auto _ : state) {
    plan = *PlanMicroBatches(lengths, options);
    benchmark::DoNotOptimize(plan.parts.data());
  }
  Report(state, plan);
}

void BM_Kk(benchmark::State& state) { BalanceWith(state, Algorithm::kKarmarkarKarp); }
void BM_Lpt(benchmark::State& state) { BalanceWith(state, Algorithm::kLpt); }

// Args: n, cap.
void BM_Bfd(benchmark::State& state) {
  const std::vector<int64_t> lengths = testing::RealisticRlLengths(state.range(0), kSeed);
  const PlanOptions options = Options(state.range(1), Algorithm::kBestFitDecreasing);
  MicroBatchPlan plan;
  for (auto _ : state) {
    plan = *PackDataset(lengths, options);
    benchmark::DoNotOptimize(plan.parts.data());
  }
  Report(state, plan);
}

// Args: n, k. `packsched plan --num_parts=k` without a cap.
void BM_FixedK(benchmark::State& state) {
  const std::vector<int64_t> lengths = testing::RealisticRlLengths(state.range(0), kSeed);
  const PlanOptions options;
  MicroBatchPlan plan;
  for (auto _ : state) {
    plan = *PartitionFixedK(lengths, state.range(1), options);
    benchmark::DoNotOptimize(plan.parts.data());
  }
  Report(state, plan);
}

// Args: n, cap. The sidecar's per-request path (Problem::Create, then Partition at the local
// bound; kk, isolate) over 16 inputs (seeds 1..16) in turn: one seed alone is not typical,
// since the bound's repair probes run only when best-fit decreasing misses the volume bound.
// The counters describe the last input planned.
void BM_SidecarPlan(benchmark::State& state) {
  constexpr uint64_t kInputs = 16;
  std::vector<std::vector<int64_t>> inputs;
  for (uint64_t seed = 1; seed <= kInputs; ++seed) {
    inputs.push_back(testing::RealisticRlLengths(state.range(0), seed));
  }
  const PlanOptions options = Options(state.range(1), Algorithm::kKarmarkarKarp);
  MicroBatchPlan plan;
  uint64_t i = 0;
  for (auto _ : state) {
    const Problem problem = *Problem::Create(inputs[i++ % kInputs], options);
    plan = *problem.Partition(problem.local_k());
    benchmark::DoNotOptimize(plan.parts.data());
  }
  Report(state, plan);
}

// Args: n, cap. One rank's planner work in a round of a group of 4 (the sidecar's path with
// peers): Problem::Create for the local bound, then Partition at the agreed k, the largest of
// the 4 ranks' bounds (each rank plans n + 61·rank sequences of its own mix, as group_bench
// does). Time per rank, averaged over the 4; 3 of them plan above their own bound.
void BM_GroupRank(benchmark::State& state) {
  constexpr int kRanks = 4;
  std::vector<std::vector<int64_t>> inputs;
  const PlanOptions options = Options(state.range(1), Algorithm::kKarmarkarKarp);
  int64_t k = 0;
  for (int r = 0; r < kRanks; ++r) {
    inputs.push_back(testing::RealisticRlLengths(state.range(0) + 61 * r, 1000 + r));
    k = std::max(k, Problem::Create(inputs.back(), options)->local_k());
  }
  MicroBatchPlan plan;
  int r = 0;
  for (auto _ : state) {
    const Problem problem = *Problem::Create(inputs[r++ % kRanks], options);
    plan = *problem.Partition(k);
    benchmark::DoNotOptimize(plan.parts.data());
  }
  Report(state, plan);
}

// Args: n, world size; cap 16,384. Counters: the common k and the ranks' cost spread.
void BM_BalanceBatch(benchmark::State& state) {
  const std::vector<int64_t> lengths = testing::RealisticRlLengths(state.range(0), kSeed);
  const PlanOptions options = Options(16384, Algorithm::kKarmarkarKarp);
  BalancedBatch batch;
  for (auto _ : state) {
    batch = *BalanceBatch(lengths, state.range(1), options);
    benchmark::DoNotOptimize(batch.ranks.data());
  }
  int64_t largest = 0, total = 0;
  for (const RankBatch& rank : batch.ranks) {
    largest = std::max(largest, rank.cost);
    total += rank.cost;
  }
  state.counters["k"] = static_cast<double>(batch.num_micro_batches);
  state.counters["rank_max_over_mean"] = static_cast<double>(largest) *
                                         static_cast<double>(batch.ranks.size()) /
                                         static_cast<double>(total);
  state.counters["peak_rss_mib"] = PeakRssMib();
}

// Args: n, world size; cap 16,384, `sync` under the attention cost (24,576 L + L^2) with 2,048
// tokens' worth per micro-batch (schedule_bench.py's model). Counters: the common k and the
// step's efficiency (ideal / the step under that sync).
void BalanceBatchSync(benchmark::State& state, Sync sync) {
  const std::vector<int64_t> lengths = testing::RealisticRlLengths(state.range(0), kSeed);
  PlanOptions options = Options(16384, Algorithm::kKarmarkarKarp);
  options.cost = CostModel::kAttention;
  options.attention = AttentionCost{24576, 1};
  BalanceOptions balance;
  balance.sync = sync;
  balance.micro_batch_cost = int64_t{2048} * 24576;
  BalancedBatch batch;
  for (auto _ : state) {
    batch = *BalanceBatch(lengths, state.range(1), options, {}, balance);
    benchmark::DoNotOptimize(batch.ranks.data());
  }
  state.counters["k"] = static_cast<double>(batch.num_micro_batches);
  state.counters["efficiency"] = batch.step.efficiency;
  state.counters["peak_rss_mib"] = PeakRssMib();
}

void BM_BalanceBatchMicroBatch(benchmark::State& state) {
  BalanceBatchSync(state, Sync::kMicroBatch);
}
void BM_BalanceBatchStep(benchmark::State& state) { BalanceBatchSync(state, Sync::kStep); }

void BalanceCases(benchmark::internal::Benchmark* b) {
  b->Args({4096, 16384})->Args({16384, 65536})->Args({65536, 16384});
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Kk)->Apply(BalanceCases);
// The sidecar's request size (its load benchmark's): one rank's n = 1,024.
BENCHMARK(BM_Kk)->Args({1024, 16384})->Args({1024, 65536})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SidecarPlan)->Args({1024, 16384})->Args({1024, 65536})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GroupRank)->Args({1024, 16384})->Args({1024, 65536})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Lpt)->Apply(BalanceCases);
BENCHMARK(BM_Bfd)->Apply(BalanceCases);
BENCHMARK(BM_FixedK)->Args({4096, 256})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BalanceBatch)->Args({4096, 8})->Args({65536, 64})->Unit(benchmark::kMillisecond);
// W = n (one sequence per rank) and a large batch over few ranks; one iteration each.
void SyncCases(benchmark::internal::Benchmark* b) {
  b->Args({1000, 1000})->Args({10000, 10000})->Args({100000, 100000})->Args({524288, 128});
  b->Iterations(1)->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_BalanceBatchMicroBatch)->Apply(SyncCases);
BENCHMARK(BM_BalanceBatchStep)->Apply(SyncCases);

}  // namespace
}  // namespace packsched::planner

BENCHMARK_MAIN();
