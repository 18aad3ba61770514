// dynamic_cp_bench: packsched's dynamic-CP plan (server/planner/dynamic_cp.h) against a model of
// Megatron-Core's hybrid context-parallel scheduler and against fixed CP at cp_max, on
// long-context mixes at R = 8, 16, 64 and 256 ranks, every plan costed by the same model.
//
//   dynamic_cp_bench [--seed=N] [--steps=N]
//
// The cost of a plan: a step is the sum over its barrier-separated slots of the slot's busiest
// rank, a rank's time the sum over the micro-batches it runs of micro_batch + h(L, c)
// (dynamic_cp.h), for a Llama-3-8B-shaped model (CostOfModelForBatch) on H100s: 400 TFLOP/s,
// NVLink 450 GB/s within 8-GPU nodes, 50 GB/s across nodes. Tokens per rank are capped at 32,768.
//
// The Megatron-Core model follows megatron/core/pipeline_parallel/hybrid_cp_schedule.py
// (BalancedCPScheduler, NVIDIA/Megatron-LM at d98e8a6), rule by rule:
// - the global batch's sub-samples sorted by length descending, once (get_groups_and_subsamples);
// - a sub-sample's CP size gpus_needed = max(1, 2^ceil(log2(L / max_seq_len_per_rank))), its
//   work L^2 / cp (get_total_workload);
// - groups (slots, a barrier after each) formed by next_hdp_group until every sub-sample is
//   placed: buckets of roughly equal work, one per distinct CP size (make_buckets_equal: close a
//   bucket past 1.1 x the target or to keep one sub-sample per remaining bucket); the first
//   bucket whose head can go to an existing CP group of its size or to enough free ranks gives
//   the next sub-sample; it joins the least-loaded existing group of its size unless the
//   lowest free ranks (by load, then rank) are less loaded, which form a new group; once a
//   smaller CP size than the first appears, the slot closes as soon as its loads are within 5%;
//   trim_overload drops the last sub-sample of the most loaded rank's group while that narrows
//   the spread (it goes back to the end of the queue); fill_empty_gpus then doubles the first
//   group of the smallest size over the idle ranks (shifting the later groups) until no rank
//   is idle;
// - each sub-sample is its own forward and backward pass on its group (with the per-pass
//   cost), at the CP size = the ranks that hold it.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/model_cost.h"

namespace packsched::planner {
namespace {

// The setting of the current table: the cap on a rank's rows, and fixed CP's size.
int64_t g_cap = 32768;
int64_t g_cp_max = 8;
constexpr int64_t kNodeRanks = 8;
constexpr double kFlops = 400e12;
constexpr double kNvlink = 450e9;
constexpr double kNetwork = 50e9;

ModelConfig Llama8B() {
  ModelConfig m;
  m.hidden_size = 4096;
  m.num_layers = 32;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.intermediate_size = 14336;
  m.vocab_size = 128256;
  return m;
}

// ---- The Megatron-Core model (see the header) ----
class MegatronHybridCp {
 public:
  MegatronHybridCp(int64_t max_per_rank, int64_t total) : max_(max_per_rank), total_(total) {}

  int64_t GpusNeeded(int64_t len) const {
    const double ratio = static_cast<double>(len) / static_cast<double>(max_);
    const double exponent = std::ceil(std::log2(ratio));  // 2^-k < 1 when ratio < 1/2
    return exponent <= 0 ? 1 : int64_t{1} << static_cast<int>(exponent);
  }
  double Work(int64_t len, int64_t cp) const {
    return static_cast<double>(len) * static_cast<double>(len) / static_cast<double>(cp);
  }
  double Work(int64_t len) const { return Work(len, GpusNeeded(len)); }

  using Sample = std::pair<int64_t, int64_t>;  // (id, length)

  std::vector<std::deque<Sample>> Buckets(const std::vector<Sample>& samples) const {
    std::vector<int64_t> kinds;
    for (const Sample& s : samples) kinds.push_back(GpusNeeded(s.second));
    std::sort(kinds.begin(), kinds.end());
    const int64_t k = std::unique(kinds.begin(), kinds.end()) - kinds.begin();
    double total_work = 0;
    for (const Sample& s : samples) total_work += Work(s.second, GpusNeeded(s.second));
    const double target = total_work / static_cast<double>(k);
    std::vector<std::deque<Sample>> buckets;
    std::deque<Sample> cur;
    double cur_work = 0;
    const int64_t remaining_k = k;
    const int64_t n = static_cast<int64_t>(samples.size());
    for (int64_t i = 0; i < n; ++i) {
      const double work = Work(samples[i].second);
      const double projected = cur_work + work;
      if (!cur.empty() && (projected > target * 1.1 ||
                           n - i <= remaining_k - static_cast<int64_t>(buckets.size()))) {
        buckets.push_back(cur);
        cur.clear();
        cur_work = 0;
      }
      cur.push_back(samples[i]);
      cur_work += work;
    }
    if (!cur.empty()) buckets.push_back(cur);
    return buckets;
  }

  // One slot: per rank its sample ids; `samples` becomes the leftovers.
  std::vector<std::vector<Sample>> NextGroup(std::vector<Sample>& samples) const {
    std::vector<std::deque<Sample>> buckets = Buckets(samples);
    std::vector<std::vector<Sample>> mb(total_);
    std::vector<double> exec(total_, 0.0);
    std::vector<int64_t> gpu_group(total_, -1);
    std::map<int64_t, std::vector<int64_t>> members;
    std::map<int64_t, int64_t> size;
    int64_t next_gid = 0;
    int64_t prev_needed = -1;
    bool check_balance = false;
    constexpr double kDelta = 0.05;
    while (!buckets.empty()) {
      int64_t bucket = -1;
      for (size_t idx = 0; idx < buckets.size(); ++idx) {
        if (buckets[idx].empty()) continue;
        const int64_t needed = GpusNeeded(buckets[idx].front().second);
        bool existing = false;
        for (const auto& [gid, sz] : size) existing = existing || sz == needed;
        int64_t free = 0;
        for (int64_t r = 0; r < total_; ++r) free += gpu_group[r] < 0 ? 1 : 0;
        if (existing || free >= needed) {
          bucket = static_cast<int64_t>(idx);
          break;
        }
      }
      if (bucket < 0) break;
      const Sample sample = buckets[bucket].front();
      const int64_t needed = GpusNeeded(sample.second);
      if (prev_needed < 0) prev_needed = needed;
      int64_t best_gid = -1;
      double best_load = INFINITY;
      for (const auto& [gid, sz] : size) {
        if (sz != needed) continue;
        double load = 0;
        for (int64_t r : members[gid]) load = std::max(load, exec[r]);
        if (load < best_load) {
          best_load = load;
          best_gid = gid;
        }
      }
      std::vector<int64_t> free;
      for (int64_t r = 0; r < total_; ++r) {
        if (gpu_group[r] < 0) free.push_back(r);
      }
      std::vector<int64_t> chosen;
      if (static_cast<int64_t>(free.size()) >= needed) {
        std::stable_sort(free.begin(), free.end(),
                         [&](int64_t a, int64_t b) { return exec[a] < exec[b]; });
        std::vector<int64_t> fresh(free.begin(), free.begin() + needed);
        if (exec[fresh.back()] < best_load) {
          best_gid = -1;
          chosen = fresh;
        } else {
          chosen = members[best_gid];
        }
      } else {
        chosen = members[best_gid];
      }
      if (best_gid < 0) {
        best_gid = next_gid++;
        members[best_gid] = chosen;
        size[best_gid] = needed;
        for (int64_t r : chosen) gpu_group[r] = best_gid;
      }
      const double cost = Work(sample.second);
      for (int64_t r : chosen) {
        mb[r].push_back(sample);
        exec[r] += cost;
      }
      buckets[bucket].pop_front();
      while (!buckets.empty() && buckets.front().empty()) buckets.erase(buckets.begin());
      if (needed < prev_needed) check_balance = true;
      const double hi = *std::max_element(exec.begin(), exec.end());
      const double lo = *std::min_element(exec.begin(), exec.end());
      if (check_balance && !buckets.empty() && hi - lo <= kDelta * hi) break;
    }
    std::vector<Sample> leftovers;
    for (const auto& b : buckets) leftovers.insert(leftovers.end(), b.begin(), b.end());
    // trim_overload
    while (true) {
      const double hi = *std::max_element(exec.begin(), exec.end());
      const double lo = *std::min_element(exec.begin(), exec.end());
      const double slack = hi - lo;
      if (slack <= kDelta * hi || lo == 0) break;
      const int64_t max_r = std::max_element(exec.begin(), exec.end()) - exec.begin();
      const int64_t gid = gpu_group[max_r];
      if (mb[max_r].size() <= 1) break;
      const Sample last = mb[max_r].back();
      const double cost = Work(last.second);
      std::vector<double> proj = exec;
      for (int64_t r : members[gid]) proj[r] -= cost;
      const double proj_slack =
          *std::max_element(proj.begin(), proj.end()) - *std::min_element(proj.begin(), proj.end());
      if (!(proj_slack < slack)) break;
      for (int64_t r : members[gid]) {
        mb[r].pop_back();
        exec[r] -= cost;
      }
      leftovers.push_back(last);
    }
    // fill_empty_gpus
    auto any_empty = [&] {
      for (const auto& m : mb) {
        if (m.empty()) return true;
      }
      return false;
    };
    bool stuck = false;
    while (any_empty() && !size.empty() && !stuck) {
      int64_t min_size = INT64_MAX;
      for (const auto& [gid, sz] : size) min_size = std::min(min_size, sz);
      const int64_t next_power = std::min(min_size * 2, total_);
      for (const auto& [gid, sz] : size) {
        if (sz != min_size) continue;
        const std::vector<int64_t> group = members[gid];
        const int64_t needed_count = next_power - min_size;
        if (needed_count == 0) {  // all ranks in one group already (Megatron would loop here)
          stuck = true;
          break;
        }
        const int64_t start = group.front();
        const int64_t end = group.back();
        int64_t empty = 0;
        while (!mb[empty].empty()) ++empty;
        std::vector<std::vector<Sample>> fresh(total_);
        for (int64_t i = 0; i < start; ++i) fresh[i] = mb[i];
        for (int64_t i = start; i <= end + needed_count; ++i) fresh[i] = mb[end];
        for (int64_t i = end + 1; i < empty; ++i) fresh[i + needed_count] = mb[i];
        size[gid] = next_power;
        members[gid].clear();
        for (int64_t r = start; r <= end + needed_count; ++r) members[gid].push_back(r);
        for (auto& [other, m] : members) {
          if (other > gid) {
            for (int64_t& r : m) r += needed_count;
          }
        }
        mb = std::move(fresh);
        break;
      }
    }
    samples = std::move(leftovers);
    return mb;
  }

  // Every slot of the step: per slot, per rank, its samples.
  std::vector<std::vector<std::vector<Sample>>> Schedule(const std::vector<int64_t>& lengths) {
    std::vector<Sample> samples;
    for (size_t i = 0; i < lengths.size(); ++i) samples.emplace_back(i, lengths[i]);
    std::stable_sort(samples.begin(), samples.end(),
                     [](const Sample& a, const Sample& b) { return a.second > b.second; });
    std::vector<std::vector<std::vector<Sample>>> slots;
    while (!samples.empty()) {
      const size_t before = samples.size();
      slots.push_back(NextGroup(samples));
      if (samples.size() >= before) break;  // nothing placed: the scheduler cannot go on
    }
    return slots;
  }

 private:
  int64_t max_;
  int64_t total_;
};

struct Figures {
  double step_s = 0;
  int64_t over_cap = 0;  // tokens above the cap, over ranks and passes
  double comm_gb = 0;    // keys and values moved, all ranks, forward and backward
  int64_t slots = 0;
  int64_t missing = 0;  // sequences not run exactly once
  double plan_ms = 0;   // CPU time of the planning thread
  double wall_ms = 0;
};

// This thread's CPU time (the shared machine's other load does not count).
double CpuMs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

double Seconds(int64_t cost, const ModelCost& mc) {
  return std::ldexp(static_cast<double>(cost), mc.shift) / kFlops;
}

double KvBytesPerToken(const ModelConfig& m) {
  return static_cast<double>(m.num_layers) * m.num_kv_heads * m.head_dim * 2 * 2 * 2;
}

Figures CostOfMegatron(const std::vector<int64_t>& lengths, int64_t ranks, const CpCostModel& cost,
                       const ModelCost& mc, const ModelConfig& m) {
  Figures f;
  const double start = CpuMs();
  MegatronHybridCp scheduler(g_cap, ranks);
  const auto slots = scheduler.Schedule(lengths);
  f.plan_ms = CpuMs() - start;
  std::vector<int64_t> runs(lengths.size(), 0);
  int64_t step = 0;
  int64_t comm_tokens = 0;
  for (const auto& slot : slots) {
    std::map<int64_t, int64_t> holders;
    for (const auto& rank : slot) {
      for (const auto& s : rank) ++holders[s.first];
    }
    int64_t busiest = 0;
    for (const auto& rank : slot) {
      int64_t t = 0;
      for (const auto& s : rank) {
        const int64_t c = holders[s.first];
        const int64_t aligned = *CpAlignedLength(s.second, c, 1);
        t += cost.micro_batch + *CpSequenceCost(cost, aligned, c);
        f.over_cap += std::max<int64_t>(0, aligned / c - g_cap);
      }
      busiest = std::max(busiest, t);
    }
    for (const auto& [id, c] : holders) {
      ++runs[id];
      comm_tokens += *CpAlignedLength(lengths[id], c, 1) * (c - 1);
    }
    step += busiest;
  }
  for (int64_t r : runs) f.missing += r == 1 ? 0 : 1;
  f.step_s = Seconds(step, mc);
  f.comm_gb = static_cast<double>(comm_tokens) * KvBytesPerToken(m) / 1e9;
  f.slots = static_cast<int64_t>(slots.size());
  return f;
}

Figures CostOfPlan(const std::vector<int64_t>& lengths, const DynamicCpOptions& o,
                   const ModelCost& mc, const ModelConfig& m) {
  Figures f;
  const double start = CpuMs();
  const auto wall = std::chrono::steady_clock::now();
  absl::StatusOr<DynamicCpPlan> plan = PlanDynamicCp(lengths, o);
  f.plan_ms = CpuMs() - start;
  f.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall).count();
  if (!plan.ok()) {
    std::fprintf(stderr, "plan failed: %s\n", std::string(plan.status().message()).c_str());
    std::exit(1);
  }
  std::vector<int64_t> runs(lengths.size(), 0);
  for (const CpSlotPlan& slot : plan->slots) {
    for (const CpGroupPlan& g : slot.groups) {
      for (int64_t i : g.sequences) ++runs[i];
      f.over_cap += std::max<int64_t>(0, g.tokens_per_rank - g_cap) * g.size;
    }
  }
  for (int64_t r : runs) f.missing += r == 1 ? 0 : 1;
  f.step_s = Seconds(plan->step_cost, mc);
  f.comm_gb = static_cast<double>(plan->comm_tokens) * KvBytesPerToken(m) / 1e9;
  f.slots = static_cast<int64_t>(plan->slots.size());
  return f;
}

// ---- Mixes: the step's sequences, about `slots` full micro-batches of tokens per rank ----
std::vector<int64_t> Mix(const std::string& name, int64_t ranks, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double budget = static_cast<double>(ranks) * g_cap * 6;  // ~6 micro-batches a rank
  std::vector<int64_t> out;
  double total = 0;
  while (total < budget) {
    double l = 0;
    if (name == "sft_heavy") {  // 1k-256k, Pareto tail (alpha 0.9)
      l = 1024.0 * std::pow(1.0 - u(rng), -1.0 / 0.9);
      l = std::min(l, 262144.0);
    } else if (name == "rl_long") {  // prompt 2k-16k + response, 20% truncated at 48k
      const double prompt = 2048 + u(rng) * 14336;
      const double response = std::min(-std::log(1.0 - u(rng)) * 20000.0, 49152.0);
      l = prompt + response;
    } else {  // vlm_bimodal: 70% text 512-4k, 30% video 32k-128k
      if (u(rng) < 0.7) {
        l = 512 + u(rng) * 3584;
      } else {
        std::normal_distribution<double> video(65536, 20000);
        l = std::clamp(video(rng), 32768.0, 131072.0);
      }
    }
    out.push_back(static_cast<int64_t>(l));
    total += l;
  }
  return out;
}

int Main(int argc, char** argv) {
  uint64_t seed = 20261207;
  int steps = 3;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (absl::StartsWith(arg, "--seed=")) (void)absl::SimpleAtoi(arg.substr(7), &seed);
    if (absl::StartsWith(arg, "--steps=")) (void)absl::SimpleAtoi(arg.substr(8), &steps);
  }
  const ModelConfig m = Llama8B();
  auto options_for = [&](const std::vector<int64_t>& lengths, int64_t ranks, const ModelCost& mc) {
    DynamicCpOptions o;
    o.ranks = ranks;
    o.max_tokens_per_rank = g_cap;
    o.sizes = CpSizeRule::kPowersOfTwo;
    o.cost.linear = mc.linear;
    o.cost.quadratic = mc.quadratic;
    o.cost.micro_batch = mc.micro_batch;
    o.cost.comm = *CpCommWeight(m, mc, kFlops / kNvlink, 2);
    o.cost.node_ranks = kNodeRanks;
    o.cost.comm_across_nodes = *CpCommWeight(m, mc, kFlops / kNetwork, 2);
    return o;
  };
  std::printf(
      "| cap | mix | R | n | Megatron hybrid CP (s) | fixed CP (s) | packsched (s) | vs Megatron | "
      "vs fixed | over cap M/F/P | KV GB M/F/P | slots M/F/P |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [cap, cp_max] : {std::pair<int64_t, int64_t>{32768, 8}, {16384, 16}}) {
    g_cap = cap;
    g_cp_max = cp_max;
    for (const char* mix : {"sft_heavy", "rl_long", "vlm_bimodal"}) {
      for (const int64_t ranks : {8, 16, 64, 256}) {
        if (ranks < cp_max) continue;
        Figures meg, fix, dyn;
        int64_t n_total = 0;
        for (int s = 0; s < steps; ++s) {
          std::mt19937_64 rng(seed + 1000003 * s + ranks * 7 + std::string(mix).size() + cap);
          const std::vector<int64_t> lengths = Mix(mix, ranks, rng);
          n_total += static_cast<int64_t>(lengths.size());
          const absl::StatusOr<ModelCost> mc = CostOfModelForBatch(m, lengths, 2 * ranks);
          if (!mc.ok()) return 1;
          const DynamicCpOptions o = options_for(lengths, ranks, *mc);
          DynamicCpOptions fixed = o;
          fixed.min_cp = g_cp_max;
          fixed.max_cp = g_cp_max;
          auto add = [](Figures& a, const Figures& b) {
            a.step_s += b.step_s;
            a.over_cap += b.over_cap;
            a.comm_gb += b.comm_gb;
            a.slots += b.slots;
            a.missing += b.missing;
          };
          add(meg, CostOfMegatron(lengths, ranks, o.cost, *mc, m));
          add(fix, CostOfPlan(lengths, fixed, *mc, m));
          add(dyn, CostOfPlan(lengths, o, *mc, m));
        }
        if (meg.missing + fix.missing + dyn.missing > 0) {
          std::fprintf(stderr, "a plan dropped or repeated a sequence (%ld/%ld/%ld)\n",
                       static_cast<long>(meg.missing), static_cast<long>(fix.missing),
                       static_cast<long>(dyn.missing));
          return 1;
        }
        std::printf(
            "| %ldk, CP %ld | %s | %ld | %ld | %.2f | %.2f | %.2f | %+.1f%% | %+.1f%% | "
            "%ld/%ld/%ld | %.0f/%.0f/%.0f | %ld/%ld/%ld |\n",
            static_cast<long>(cap / 1024), static_cast<long>(cp_max), mix, static_cast<long>(ranks),
            static_cast<long>(n_total / steps), meg.step_s / steps, fix.step_s / steps,
            dyn.step_s / steps, 100.0 * (dyn.step_s / meg.step_s - 1),
            100.0 * (dyn.step_s / fix.step_s - 1), static_cast<long>(meg.over_cap),
            static_cast<long>(fix.over_cap), static_cast<long>(dyn.over_cap), meg.comm_gb / steps,
            fix.comm_gb / steps, dyn.comm_gb / steps, static_cast<long>(meg.slots / steps),
            static_cast<long>(fix.slots / steps), static_cast<long>(dyn.slots / steps));
      }
    }
  }
  // Planning time: R = 256, 4,096 sequences of each mix at a 32k cap, `steps` inputs per mix
  // (seeds derived from --seed), 9 plans of each: the CPU time of this thread (what the planner
  // costs; the loaded machine's other work does not count) and the wall-clock time.
  g_cap = 32768;
  for (const char* mix : {"sft_heavy", "rl_long", "vlm_bimodal"}) {
    std::vector<double> cpu, wall;
    for (int s = 0; s < steps; ++s) {
      std::mt19937_64 rng(seed + 17 + 1000003 * s);
      std::vector<int64_t> lengths;
      while (lengths.size() < 4096) {
        const std::vector<int64_t> more = Mix(mix, 256, rng);
        lengths.insert(lengths.end(), more.begin(), more.end());
      }
      lengths.resize(4096);
      const absl::StatusOr<ModelCost> mc = CostOfModelForBatch(m, lengths, 512);
      if (!mc.ok()) return 1;
      const DynamicCpOptions o = options_for(lengths, 256, *mc);
      for (int rep = 0; rep < 9; ++rep) {
        const Figures f = CostOfPlan(lengths, o, *mc, m);
        cpu.push_back(f.plan_ms);
        wall.push_back(f.wall_ms);
      }
    }
    std::sort(cpu.begin(), cpu.end());
    std::sort(wall.begin(), wall.end());
    std::printf(
        "plan time, R = 256, n = 4096, %s, %zu plans: CPU median %.1f ms, min %.1f, max %.1f; "
        "wall median %.1f ms, min %.1f\n",
        mix, cpu.size(), cpu[cpu.size() / 2], cpu.front(), cpu.back(), wall[wall.size() / 2],
        wall.front());
  }
  return 0;
}

}  // namespace
}  // namespace packsched::planner

int main(int argc, char** argv) { return packsched::planner::Main(argc, argv); }
