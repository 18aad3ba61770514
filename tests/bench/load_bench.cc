// load_bench: C++ clients hammering one packsched-server (started here on loopback, or an
// existing one via --target) with Plan calls — each client its own connection and stream, a new
// round per request, n sequences of a realistic RL mix per request. Reports requests/s, latency
// percentiles, errors and the server's memory (VmRSS after warm-up and at the end, VmHWM).
//
//   build/bin/load_bench [--clients=8] [--duration=30s] [--n=1024] [--target=HOST:PORT]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/scheduler_client.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/lengths.h"

ABSL_FLAG(int, clients, 8, "concurrent clients (threads, one connection each)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(30), "measured time");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(2), "unmeasured time before it");
ABSL_FLAG(int64_t, n, 1024, "sequences per request");
ABSL_FLAG(int64_t, max_token_len, 16384, "cap per micro-batch, tokens");
ABSL_FLAG(std::string, target, "",
          "an existing server (default: start build/bin/packsched-server)");

namespace {

using packsched::client::PlanRequest;
using packsched::client::SchedulerClient;

// kB from a "Key:   123 kB" line of /proc/<pid>/status; -1 if absent.
int64_t ProcStatusKb(pid_t pid, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::atoll(line.c_str() + key.size() + 1);
  }
  return -1;
}

// CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat; -1 if unknown.
double ProcCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::atof(field.c_str());  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct ClientStats {
  std::vector<double> latencies_us;
  std::vector<double> server_us;  // the sidecar's own compute per plan (local + partition)
  int64_t errors = 0;
  std::string first_error;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_clients);
  const int64_t n = absl::GetFlag(FLAGS_n);

  std::unique_ptr<packsched::testing::ServerProcess> server;
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    server = std::make_unique<packsched::testing::ServerProcess>(
        std::vector<std::string>{"--log_level=warn"});
    if (!server->started()) {
      std::fprintf(stderr, "server did not start: %s\n", server->stderr_text().c_str());
      return 1;
    }
    target = server->target();
  }

  // Inputs prepared up front: 16 different batches per client, cycled.
  constexpr int kBatches = 16;
  std::vector<std::vector<PlanRequest>> requests(clients);
  for (int c = 0; c < clients; ++c) {
    for (int b = 0; b < kBatches; ++b) {
      PlanRequest r;
      r.stream = absl::StrCat("bench-", c);
      r.lengths = packsched::testing::RealisticRlLengths(n, 1000 * c + b);
      for (int64_t length : r.lengths) r.loss_tokens.push_back(length / 2);
      r.options.max_token_len = absl::GetFlag(FLAGS_max_token_len);
      r.options.overlong = packsched::planner::OverlongPolicy::kIsolate;
      requests[c].push_back(std::move(r));
    }
  }

  std::atomic<bool> measuring{false};
  std::atomic<bool> stop{false};
  std::vector<ClientStats> stats(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      packsched::client::ClientOptions options;
      options.target = target;
      options.timeout = absl::Seconds(10);
      auto client = SchedulerClient::Create(options);
      if (!client.ok()) {
        stats[c].errors++;
        stats[c].first_error = client.status().ToString();
        return;
      }
      stats[c].latencies_us.reserve(200000);
      stats[c].server_us.reserve(200000);
      for (int64_t round = 0; !stop.load(std::memory_order_relaxed); ++round) {
        PlanRequest& request = requests[c][round % kBatches];
        request.round = round;
        const auto start = std::chrono::steady_clock::now();
        const auto plan = (*client)->Plan(request);
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count();
        if (!measuring.load(std::memory_order_relaxed)) continue;
        if (plan.ok()) {
          stats[c].latencies_us.push_back(us);
          stats[c].server_us.push_back(
              absl::ToDoubleMicroseconds(plan->local_time + plan->partition_time));
        } else {
          if (stats[c].errors++ == 0) stats[c].first_error = plan.status().ToString();
        }
      }
    });
  }

  absl::SleepFor(absl::GetFlag(FLAGS_warmup));
  const int64_t rss_start = server ? ProcStatusKb(server->pid(), "VmRSS") : -1;
  const double server_cpu_start = server ? ProcCpuSeconds(server->pid()) : -1;
  const double self_cpu_start = ProcCpuSeconds(getpid());
  measuring = true;
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::GetFlag(FLAGS_duration));
  measuring = false;
  const double server_cpu = server ? ProcCpuSeconds(server->pid()) - server_cpu_start : -1;
  const double self_cpu = ProcCpuSeconds(getpid()) - self_cpu_start;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stop = true;
  for (std::thread& t : threads) t.join();
  const int64_t rss_end = server ? ProcStatusKb(server->pid(), "VmRSS") : -1;
  const int64_t hwm = server ? ProcStatusKb(server->pid(), "VmHWM") : -1;

  std::vector<double> all;
  std::vector<double> compute;
  int64_t errors = 0;
  std::string first_error;
  for (const ClientStats& s : stats) {
    all.insert(all.end(), s.latencies_us.begin(), s.latencies_us.end());
    compute.insert(compute.end(), s.server_us.begin(), s.server_us.end());
    errors += s.errors;
    if (first_error.empty()) first_error = s.first_error;
  }
  std::sort(all.begin(), all.end());
  std::sort(compute.begin(), compute.end());
  auto percentile = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))];
  };
  std::printf("load_bench: %d clients, n = %lld, %.1f s, target %s\n", clients,
              static_cast<long long>(n), seconds, target.c_str());
  std::printf("  plans             %zu\n", all.size());
  std::printf("  plans/s           %.0f\n", all.size() / seconds);
  std::printf("  latency p50       %.3f ms\n", percentile(0.50) / 1000);
  std::printf("  latency p99       %.3f ms\n", percentile(0.99) / 1000);
  std::printf("  latency p99.9     %.3f ms\n", percentile(0.999) / 1000);
  std::printf("  latency max       %.3f ms\n", all.empty() ? 0.0 : all.back() / 1000);
  std::printf(
      "  planner p50       %.3f ms (sidecar compute: validation, bound, partition, weights)\n",
      compute.empty() ? 0.0 : compute[compute.size() / 2] / 1000);
  std::printf("  errors            %lld%s%s\n", static_cast<long long>(errors),
              first_error.empty() ? "" : "  first: ", first_error.c_str());
  const double plans = std::max<double>(1, all.size());
  std::printf(
      "  CPU per plan      server %.3f ms, clients %.3f ms (user + system; %d cores here)\n",
      server_cpu * 1000 / plans, self_cpu * 1000 / plans,
      static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  if (server) {
    std::printf("  server VmRSS      %lld kB after warm-up, %lld kB at the end\n",
                static_cast<long long>(rss_start), static_cast<long long>(rss_end));
    std::printf("  server VmHWM      %lld kB (peak)\n", static_cast<long long>(hwm));
  }
  return errors == 0 ? 0 : 2;
}
