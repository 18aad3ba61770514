// load_bench: C++ clients hammering one packsched-server (started here on loopback, or an
// existing one via --target) with Plan calls — each client its own connection and stream, a new
// round per request, n sequences of a realistic RL mix per request. Reports requests/s, latency
// percentiles, errors, CPU per plan (server and clients) and the server's memory (VmRSS after
// warm-up and at the end, VmHWM).
//
// Two modes:
//  - closed loop (default): each client sends its next request as soon as the previous one
//    returns. Throughput is what the machine gives; by Little's law the mean latency is then
//    clients / throughput, so it says little about latency at a given load.
//  - open loop (--rate=R, or a sweep --rates=R1,R2,...): R plans/s offered in total, spread
//    evenly over the clients (each sends at R / clients per second on a fixed schedule, the
//    clients' schedules staggered). Latency is measured from the INTENDED send time, so a
//    request that could not be sent on time (its client was still waiting for the previous one)
//    counts its wait: a stall is not hidden (no coordinated omission). Reports the offered and
//    achieved rates and the sends that started more than 1 ms after their slot.
//
//   build/bin/load_bench [--clients=8] [--duration=30s] [--n=1024] [--target=HOST:PORT
//                        [--server_pid=PID]] [--server_flags=--metrics_listen=127.0.0.1:0]
//   build/bin/load_bench --rate=2000 --duration=10s
//   build/bin/load_bench --rates=1000,1500,2000 --duration=10s    (one server, one run per rate)

#include <dirent.h>
#include <unistd.h>

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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/scheduler_client.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/lengths.h"

ABSL_FLAG(int, clients, 8, "concurrent clients (threads, one connection each)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(30), "measured time (per rate in a sweep)");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(2), "unmeasured time before it (per rate)");
ABSL_FLAG(int64_t, n, 1024, "sequences per request");
ABSL_FLAG(int64_t, max_token_len, 16384, "cap per micro-batch, tokens");
ABSL_FLAG(std::string, target, "",
          "an existing server (default: start build/bin/packsched-server)");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "extra flags, comma-separated, for the server it starts (e.g. "
          "--metrics_listen=127.0.0.1:0)");
ABSL_FLAG(int, server_pid, 0,
          "with --target: the server's process id, to report its CPU per plan and memory");
ABSL_FLAG(double, rate, 0,
          "open loop: plans/s offered over all clients, on a fixed schedule (0 = closed loop)");
ABSL_FLAG(std::string, rates, "",
          "open-loop sweep: comma-separated plans/s, one measured run per rate against the same "
          "server (overrides --rate)");

namespace {

using Clock = std::chrono::steady_clock;
using packsched::client::PlanRequest;
using packsched::client::SchedulerClient;

// A send counts as late when it starts more than this after its scheduled time.
constexpr auto kLateAfter = std::chrono::milliseconds(1);

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

// Context switches (voluntary + involuntary) of all of a process's threads so far, from
// /proc/<pid>/task/*/status; threads that already ended are not counted. -1 if unknown.
int64_t ProcContextSwitches(pid_t pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return -1;
  int64_t total = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream in(absl::StrCat(tasks, "/", entry->d_name, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
          line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        total += std::atoll(line.c_str() + line.find(':') + 1);
      }
    }
  }
  closedir(dir);
  return total;
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct ClientStats {
  std::vector<double> latencies_us;
  std::vector<double> server_us;    // the sidecar's own compute per plan (local + partition)
  int64_t completed_in_window = 0;  // answers (ok or not) received inside the measured window
  int64_t late = 0;                 // open loop: sends started > kLateAfter after their slot
  int64_t unsent = 0;               // open loop: due in the window, given up (far behind)
  double lateness_us = 0;           // open loop: summed over all measured sends
  int64_t errors = 0;
  std::string first_error;
};

// One client: its connection, its requests (cycled) and its next round (kept across runs, so a
// sweep never repeats a (stream, round) the server has cached).
struct Client {
  std::unique_ptr<SchedulerClient> client;
  std::vector<PlanRequest> requests;
  int64_t next_round = 0;
};

struct RunResult {
  double rate = 0;  // offered plans/s; 0 = closed loop
  double seconds = 0;
  std::vector<double> latencies_us;  // sorted
  std::vector<double> compute_us;    // sorted
  int64_t completed_in_window = 0;
  int64_t late = 0;
  int64_t unsent = 0;
  double mean_lateness_us = 0;
  int64_t errors = 0;
  std::string first_error;
  double server_cpu_ms_per_plan = -1;
  double server_switches_per_plan = -1;  // context switches of the server's threads
  double client_cpu_ms_per_plan = 0;
  int64_t rss_start = -1, rss_end = -1, hwm = -1;

  double Percentile(double p) const {
    if (latencies_us.empty()) return 0;
    return latencies_us[std::min(latencies_us.size() - 1,
                                 static_cast<size_t>(p * latencies_us.size()))];
  }
  // Answers received per second inside the window (below `rate` when the server falls behind).
  double achieved() const { return completed_in_window / seconds; }
};

// One measured run: warm-up, then `duration` measured. Closed loop when `rate` is 0.
RunResult Run(std::vector<Client>& clients, double rate, pid_t server_pid) {
  const int count = static_cast<int>(clients.size());
  const auto warmup = absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_warmup));
  const auto duration = absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_duration));
  // Every client's schedule starts here; the measured window is [measure_start, measure_end).
  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(20);
  const Clock::time_point measure_start = start + warmup;
  const Clock::time_point measure_end = measure_start + duration;
  // Open loop: client c sends at start + (c + i * clients) / rate, i = 0, 1, ...; a client
  // that falls this far behind its schedule gives up the sends left (counted as unsent).
  const Clock::time_point give_up = measure_end + std::chrono::seconds(5);

  std::atomic<bool> stop{false};  // closed loop only
  std::vector<ClientStats> stats(count);
  std::vector<std::thread> threads;
  for (int c = 0; c < count; ++c) {
    threads.emplace_back([&, c] {
      Client& client = clients[c];
      ClientStats& s = stats[c];
      s.latencies_us.reserve(200000);
      s.server_us.reserve(200000);
      for (int64_t i = 0;; ++i) {
        PlanRequest& request = client.requests[client.next_round % client.requests.size()];
        request.round = client.next_round++;
        Clock::time_point intended;
        if (rate > 0) {
          intended = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>((c + i * count) / rate));
          if (intended >= measure_end) break;
          if (Clock::now() >= give_up) {
            if (intended >= measure_start) ++s.unsent;
            continue;
          }
          std::this_thread::sleep_until(intended);
        } else {
          if (stop.load(std::memory_order_relaxed)) break;
          intended = Clock::now();
        }
        const Clock::time_point sent = Clock::now();
        const auto plan = client.client->Plan(request);
        const Clock::time_point done = Clock::now();
        if (done >= measure_start && done < measure_end) ++s.completed_in_window;
        // Closed loop: what completes inside the window; open loop: what was due inside it.
        const Clock::time_point stamp = rate > 0 ? intended : done;
        if (stamp < measure_start || stamp >= measure_end) continue;
        if (rate > 0) {
          if (sent - intended > kLateAfter) ++s.late;
          s.lateness_us += Micros(sent - intended);
        }
        if (plan.ok()) {
          s.latencies_us.push_back(Micros(done - intended));
          s.server_us.push_back(
              absl::ToDoubleMicroseconds(plan->local_time + plan->partition_time));
        } else if (s.errors++ == 0) {
          s.first_error = plan.status().ToString();
        }
      }
    });
  }

  RunResult r;
  r.rate = rate;
  std::this_thread::sleep_until(measure_start);
  r.rss_start = server_pid > 0 ? ProcStatusKb(server_pid, "VmRSS") : -1;
  const double server_cpu_start = server_pid > 0 ? ProcCpuSeconds(server_pid) : -1;
  const double self_cpu_start = ProcCpuSeconds(getpid());
  const int64_t switches_start = server_pid > 0 ? ProcContextSwitches(server_pid) : -1;
  std::this_thread::sleep_until(measure_end);
  const double server_cpu = server_pid > 0 ? ProcCpuSeconds(server_pid) - server_cpu_start : -1;
  const double self_cpu = ProcCpuSeconds(getpid()) - self_cpu_start;
  const int64_t switches = server_pid > 0 ? ProcContextSwitches(server_pid) - switches_start : -1;
  r.seconds = std::chrono::duration<double>(Clock::now() - measure_start).count();
  stop = true;
  for (std::thread& t : threads) t.join();
  r.rss_end = server_pid > 0 ? ProcStatusKb(server_pid, "VmRSS") : -1;
  r.hwm = server_pid > 0 ? ProcStatusKb(server_pid, "VmHWM") : -1;

  double lateness_us = 0;
  for (const ClientStats& s : stats) {
    r.latencies_us.insert(r.latencies_us.end(), s.latencies_us.begin(), s.latencies_us.end());
    r.compute_us.insert(r.compute_us.end(), s.server_us.begin(), s.server_us.end());
    r.completed_in_window += s.completed_in_window;
    r.late += s.late;
    r.unsent += s.unsent;
    lateness_us += s.lateness_us;
    r.errors += s.errors;
    if (r.first_error.empty()) r.first_error = s.first_error;
  }
  std::sort(r.latencies_us.begin(), r.latencies_us.end());
  std::sort(r.compute_us.begin(), r.compute_us.end());
  const double plans = std::max<double>(1, r.completed_in_window);
  const double sends = std::max<double>(1, r.latencies_us.size() + r.errors);
  r.mean_lateness_us = lateness_us / sends;
  if (server_pid > 0) r.server_cpu_ms_per_plan = server_cpu * 1000 / plans;
  if (server_pid > 0 && switches_start >= 0) r.server_switches_per_plan = switches / plans;
  r.client_cpu_ms_per_plan = self_cpu * 1000 / plans;
  return r;
}

void Print(const RunResult& r, int clients, int64_t n, const std::string& target) {
  if (r.rate > 0) {
    std::printf(
        "load_bench: OPEN loop, %.0f plans/s offered (%.1f/s per client), %d clients, n = %lld, "
        "%.1f s, target %s\n",
        r.rate, r.rate / clients, clients, static_cast<long long>(n), r.seconds, target.c_str());
  } else {
    std::printf("load_bench: CLOSED loop, %d clients, n = %lld, %.1f s, target %s\n", clients,
                static_cast<long long>(n), r.seconds, target.c_str());
  }
  std::printf("  plans             %zu\n", r.latencies_us.size());
  if (r.rate > 0) {
    std::printf("  plans/s           %.0f achieved, %.0f offered\n", r.achieved(), r.rate);
    const double sends = std::max<double>(1, r.latencies_us.size() + r.errors);
    std::printf("  late sends        %lld (%.2f%%) started > 1 ms after their slot; mean %.3f ms\n",
                static_cast<long long>(r.late), 100.0 * r.late / sends, r.mean_lateness_us / 1000);
    if (r.unsent > 0) {
      std::printf("  unsent            %lld (their clients fell > 5 s behind)\n",
                  static_cast<long long>(r.unsent));
    }
    std::printf("  latency           from the intended send time\n");
  } else {
    std::printf("  plans/s           %.0f\n", r.achieved());
  }
  std::printf("  latency p50       %.3f ms\n", r.Percentile(0.50) / 1000);
  std::printf("  latency p99       %.3f ms\n", r.Percentile(0.99) / 1000);
  std::printf("  latency p99.9     %.3f ms\n", r.Percentile(0.999) / 1000);
  std::printf("  latency max       %.3f ms\n",
              r.latencies_us.empty() ? 0.0 : r.latencies_us.back() / 1000);
  std::printf(
      "  planner p50       %.3f ms (sidecar compute: validation, bound, partition, weights)\n",
      r.compute_us.empty() ? 0.0 : r.compute_us[r.compute_us.size() / 2] / 1000);
  std::printf("  errors            %lld%s%s\n", static_cast<long long>(r.errors),
              r.first_error.empty() ? "" : "  first: ", r.first_error.c_str());
  std::printf(
      "  CPU per plan      server %.3f ms, clients %.3f ms (user + system; %d cores here)\n",
      r.server_cpu_ms_per_plan, r.client_cpu_ms_per_plan,
      static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  if (r.server_switches_per_plan >= 0) {
    std::printf("  server switches   %.2f context switches per plan (all its threads)\n",
                r.server_switches_per_plan);
  }
  if (r.rss_start >= 0) {
    std::printf("  server VmRSS      %lld kB after warm-up, %lld kB at the end\n",
                static_cast<long long>(r.rss_start), static_cast<long long>(r.rss_end));
    std::printf("  server VmHWM      %lld kB (peak)\n", static_cast<long long>(r.hwm));
  }
}

}  // namespace

int main(int argc, char** argv) {
#ifdef NDEBUG
  // As in the server (server/main.cc): Debian's Abseil keeps a lock-order graph for every
  // absl::Mutex unless told not to; the clients' gRPC locks would pay for it on every call.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  absl::ParseCommandLine(argc, argv);
  const int count = absl::GetFlag(FLAGS_clients);
  const int64_t n = absl::GetFlag(FLAGS_n);

  std::vector<double> rates;
  for (absl::string_view field :
       absl::StrSplit(absl::GetFlag(FLAGS_rates), ',', absl::SkipWhitespace())) {
    double rate = 0;
    if (!absl::SimpleAtod(field, &rate) || rate <= 0) {
      std::fprintf(stderr, "--rates: '%s' is not a positive number\n", std::string(field).c_str());
      return 1;
    }
    rates.push_back(rate);
  }
  if (rates.empty()) rates.push_back(std::max(0.0, absl::GetFlag(FLAGS_rate)));

  std::unique_ptr<packsched::testing::ServerProcess> server;
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    std::vector<std::string> flags = {"--log_level=warn"};
    for (const std::string& flag : absl::GetFlag(FLAGS_server_flags)) flags.push_back(flag);
    server = std::make_unique<packsched::testing::ServerProcess>(std::move(flags));
    if (!server->started()) {
      std::fprintf(stderr, "server did not start: %s\n", server->stderr_text().c_str());
      return 1;
    }
    target = server->target();
  }

  // Connections and inputs prepared up front: 16 different batches per client, cycled.
  constexpr int kBatches = 16;
  std::vector<Client> clients(count);
  for (int c = 0; c < count; ++c) {
    packsched::client::ClientOptions options;
    options.target = target;
    options.timeout = absl::Seconds(10);
    auto client = SchedulerClient::Create(options);
    if (!client.ok()) {
      std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
      return 1;
    }
    clients[c].client = *std::move(client);
    for (int b = 0; b < kBatches; ++b) {
      PlanRequest r;
      r.stream = absl::StrCat("bench-", c);
      r.lengths = packsched::testing::RealisticRlLengths(n, 1000 * c + b);
      for (int64_t length : r.lengths) r.loss_tokens.push_back(length / 2);
      r.options.max_token_len = absl::GetFlag(FLAGS_max_token_len);
      r.options.overlong = packsched::planner::OverlongPolicy::kIsolate;
      clients[c].requests.push_back(std::move(r));
    }
  }

  const pid_t server_pid =
      server ? server->pid()
             : (absl::GetFlag(FLAGS_server_pid) > 0 ? absl::GetFlag(FLAGS_server_pid) : -1);
  std::vector<RunResult> results;
  for (double rate : rates) {
    results.push_back(Run(clients, rate, server_pid));
    Print(results.back(), count, n, target);
    std::fflush(stdout);
  }
  int64_t errors = 0;
  for (const RunResult& r : results) errors += r.errors;
  if (results.size() > 1) {
    std::printf(
        "\nsweep (open loop, %d clients, n = %lld, %s per rate; latency from the intended send)\n",
        count, static_cast<long long>(n),
        absl::FormatDuration(absl::GetFlag(FLAGS_duration)).c_str());
    std::printf("  %8s %9s %9s %9s %9s %8s %7s %18s\n", "offered", "achieved", "p50 ms", "p99 ms",
                "p99.9 ms", "late %", "errors", "CPU/plan srv/cli");
    for (const RunResult& r : results) {
      const double sends = std::max<double>(1, r.latencies_us.size() + r.errors);
      std::printf("  %8.0f %9.0f %9.3f %9.3f %9.3f %8.2f %7lld %8.3f / %.3f ms\n", r.rate,
                  r.achieved(), r.Percentile(0.50) / 1000, r.Percentile(0.99) / 1000,
                  r.Percentile(0.999) / 1000, 100.0 * r.late / sends,
                  static_cast<long long>(r.errors), r.server_cpu_ms_per_plan,
                  r.client_cpu_ms_per_plan);
    }
  }
  return errors == 0 ? 0 : 2;
}
