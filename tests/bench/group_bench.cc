// group_bench: round latency of a rank group of real packsched-server processes on loopback
// (Gloo, rank 0 serving the rendezvous store): W sidecars, one C++ client per rank, every rank
// planning n sequences of a realistic RL mix per round. A round's latency is the slowest rank's
// Plan call (what a trainer step waits for), measured from the moment all W calls are released.
// Also reports the sidecars' own split (local / wait / partition) of the median round and the
// machine's load average, which matters on a shared machine.
//
//   build/bin/group_bench [--world_size=4] [--n=1024] [--rounds=300] [--warmup=20]

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "client/cpp/scheduler_client.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/lengths.h"

ABSL_FLAG(int64_t, world_size, 4, "sidecar processes (ranks)");
ABSL_FLAG(int64_t, n, 1024, "sequences per rank and round");
ABSL_FLAG(int64_t, rounds, 300, "measured rounds");
ABSL_FLAG(int64_t, warmup, 20, "unmeasured rounds before them (the group forms in the first)");
ABSL_FLAG(int64_t, max_token_len, 16384, "cap per micro-batch, tokens");

namespace {

using packsched::client::PlanRequest;
using packsched::client::PlanResult;
using packsched::client::SchedulerClient;
using packsched::testing::FreePort;
using packsched::testing::ServerProcess;

// CPU time spent by the whole machine (every process) so far, in milliseconds, from /proc/stat:
// user + nice + system + irq + softirq + steal.
double MachineBusyMs() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const double ticks = static_cast<double>(user + nice + system + irq + softirq + steal);
  return 1000.0 * ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[i];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t w = absl::GetFlag(FLAGS_world_size);
  const int64_t n = absl::GetFlag(FLAGS_n);
  const int64_t rounds = absl::GetFlag(FLAGS_rounds);
  const int64_t warmup = std::max<int64_t>(1, absl::GetFlag(FLAGS_warmup));
  const std::string rendezvous = absl::StrCat("127.0.0.1:", FreePort());

  std::vector<std::unique_ptr<ServerProcess>> servers(w);
  std::vector<std::unique_ptr<SchedulerClient>> clients(w);
  for (int64_t r = w - 1; r >= 0; --r) {
    servers[r] = std::make_unique<ServerProcess>(
        std::vector<std::string>{absl::StrCat("--rank=", r), absl::StrCat("--world_size=", w),
                                 absl::StrCat("--rendezvous=", rendezvous), "--backend=gloo",
                                 "--collective_timeout=30s", "--log_level=warn"});
    if (!servers[r]->started()) {
      std::fprintf(stderr, "rank %lld did not start:\n%s\n", static_cast<long long>(r),
                   servers[r]->stderr_text().c_str());
      return 1;
    }
    packsched::client::ClientOptions options;
    options.target = servers[r]->target();
    options.timeout = absl::Seconds(60);
    auto client = SchedulerClient::Create(options);
    if (!client.ok()) {
      std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      return 1;
    }
    clients[r] = *std::move(client);
  }

  // Requests built up front: a different batch per rank (and a few per rank, cycled).
  constexpr int kBatches = 8;
  std::vector<std::vector<PlanRequest>> requests(w);
  for (int64_t r = 0; r < w; ++r) {
    for (int b = 0; b < kBatches; ++b) {
      PlanRequest request;
      request.stream = "actor_update";
      request.lengths = packsched::testing::RealisticRlLengths(n, 7919 * r + b + 1);
      request.options.max_token_len = absl::GetFlag(FLAGS_max_token_len);
      request.options.overlong = packsched::planner::OverlongPolicy::kIsolate;
      requests[r].push_back(std::move(request));
    }
  }

  const int64_t total = warmup + rounds;
  std::vector<std::vector<double>> call_ms(w, std::vector<double>(total));
  std::vector<std::vector<double>> wait_ms(w, std::vector<double>(total));
  std::vector<std::vector<double>> local_ms(w, std::vector<double>(total));
  std::vector<std::vector<double>> partition_ms(w, std::vector<double>(total));
  std::vector<absl::Time> released(total);
  std::vector<absl::Status> errors(w);
  absl::Barrier* start_barrier = new absl::Barrier(static_cast<int>(w));
  double busy_at_warmup_end = 0;  // written by rank 0's thread before its first measured round
  std::vector<std::thread> threads;
  // Each rank's thread runs its rounds back to back, as a trainer does; a round's latency is the
  // slowest rank's call (all ranks start the round within microseconds of each other because
  // each waits for the previous round's agreement).
  for (int64_t r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      if (start_barrier->Block()) delete start_barrier;
      for (int64_t round = 0; round < total; ++round) {
        if (r == 0 && round == warmup) busy_at_warmup_end = MachineBusyMs();
        PlanRequest request = requests[r][round % kBatches];
        request.round = round + 1;
        const absl::Time start = absl::Now();
        absl::StatusOr<PlanResult> plan = clients[r]->Plan(request);
        call_ms[r][round] = absl::ToDoubleMilliseconds(absl::Now() - start);
        if (!plan.ok()) {
          errors[r] = plan.status();
          return;
        }
        wait_ms[r][round] = absl::ToDoubleMilliseconds(plan->wait_time);
        local_ms[r][round] = absl::ToDoubleMilliseconds(plan->local_time);
        partition_ms[r][round] = absl::ToDoubleMilliseconds(plan->partition_time);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double busy_per_round =
      (MachineBusyMs() - busy_at_warmup_end) / static_cast<double>(rounds);
  for (int64_t r = 0; r < w; ++r) {
    if (!errors[r].ok()) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(r),
                   errors[r].ToString().c_str());
      return 1;
    }
  }
  std::vector<double> slowest, rank_calls, local, wait, partition;
  for (int64_t round = warmup; round < total; ++round) {
    double worst = 0;
    for (int64_t r = 0; r < w; ++r) {
      worst = std::max(worst, call_ms[r][round]);
      rank_calls.push_back(call_ms[r][round]);
      local.push_back(local_ms[r][round]);
      wait.push_back(wait_ms[r][round]);
      partition.push_back(partition_ms[r][round]);
    }
    slowest.push_back(worst);
  }
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf(
      "group_bench: W = %lld sidecar processes, Gloo on loopback, n = %lld per rank, "
      "%lld rounds (after %lld warm-up), %u CPUs, loadavg %s\n",
      static_cast<long long>(w), static_cast<long long>(n), static_cast<long long>(rounds),
      static_cast<long long>(warmup), std::thread::hardware_concurrency(), load.c_str());
  std::printf(
      "round latency (slowest rank's Plan call): p50 %.3f ms  p90 %.3f ms  p99 %.3f ms"
      "  max %.3f ms\n",
      Percentile(slowest, 0.5), Percentile(slowest, 0.9), Percentile(slowest, 0.99),
      Percentile(slowest, 1.0));
  std::printf("per-rank Plan call: p50 %.3f ms  p99 %.3f ms\n", Percentile(rank_calls, 0.5),
              Percentile(rank_calls, 0.99));
  std::printf(
      "sidecar split, p50 per rank: local %.3f ms, wait for peers %.3f ms, partition "
      "%.3f ms\n",
      Percentile(local, 0.5), Percentile(wait, 0.5), Percentile(partition, 0.5));
  // What the machine spends per round (sidecars, clients, kernel): with C CPUs a round cannot
  // take less than that / C, however well the ranks overlap.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::printf(
      "machine CPU per round (all processes, /proc/stat): %.2f ms, so at least %.2f ms on "
      "%u CPUs\n",
      busy_per_round, busy_per_round / cpus, cpus);
  return 0;
}
