// scale_bench: a rank group of W real packsched-server processes on loopback (Gloo, rank 0
// serving the rendezvous store) at the sizes a 2-core machine allows (docs/benchmarks.md, "Store
// at scale"). For each W it reports:
//  - formation: from the moment every sidecar is up, the time until every rank has answered the
//    stream's first Plan (readiness, the first round's lookup, the Gloo formation, the round);
//  - store requests per rank: each sidecar's packsched_rendezvous_requests_total (its own
//    requests to rank 0's store) after formation — the most of a rank other than 0, and rank 0's;
//  - steady rounds: the slowest rank's Plan call, p50 and p99;
//  - rank 0's CPU (during formation, and idle for --idle_s) and RSS (/proc);
//  - heal: kill -9 of rank 1, then of rank 0, each restarted at once with its flags; the time from
//    the restarted sidecar's start until every rank has answered the next round (each rank resends
//    it after an error, as a trainer does), bounded by --heal_bound_s.
// Every process is stopped by its pid (SIGTERM, then SIGKILL) whatever happens.
//
//   build/tests/bench/scale_bench --world=16,64,128 [--server=other/packsched-server]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/scheduler_client.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/lengths.h"

ABSL_FLAG(std::vector<std::string>, world, (std::vector<std::string>{"16", "64"}),
          "world sizes to run, in order");
ABSL_FLAG(std::string, server, PACKSCHED_SERVER_PATH, "the packsched-server to run (a baseline)");
ABSL_FLAG(int64_t, n, 256, "sequences per rank and round");
ABSL_FLAG(int64_t, rounds, 30, "steady rounds measured");
ABSL_FLAG(int64_t, idle_s, 5, "seconds of idle over which rank 0's CPU is measured");
ABSL_FLAG(int64_t, heal_bound_s, 60, "give up on a heal after this long");
ABSL_FLAG(bool, heal, true, "measure the heals after kill -9 of rank 1 and of rank 0");

namespace {

using packsched::client::PlanRequest;
using packsched::client::PlanResult;
using packsched::client::SchedulerClient;
using packsched::testing::FreePort;
using packsched::testing::ServerProcess;

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[i];
}

// CPU seconds (user + system) of process `pid` so far.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Resident memory of process `pid`, MiB.
double RssMib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    int64_t kib = 0;
    std::istringstream(line.substr(6)) >> kib;
    return static_cast<double>(kib) / 1024.0;
  }
  return 0;
}

// The sum of packsched_rendezvous_requests_total over its methods at 127.0.0.1:`port`, or -1 if
// the sidecar does not export it (an older build) or cannot be reached.
int64_t StoreRequests(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  std::string body;
  char buffer[65536];
  for (ssize_t got; (got = read(fd, buffer, sizeof(buffer))) > 0;) body.append(buffer, got);
  close(fd);
  int64_t total = -1;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, "packsched_rendezvous_requests_total{")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      total = std::max<int64_t>(total, 0) + static_cast<int64_t>(value);
    }
  }
  return total;
}

class Group {
 public:
  Group(int64_t world_size, std::string binary)
      : w_(world_size),
        binary_(std::move(binary)),
        rendezvous_(absl::StrCat("127.0.0.1:", FreePort())),
        servers_(w_),
        clients_(w_),
        metrics_ports_(w_) {}

  // Starts rank `r` (again); false with its stderr printed if it does not come up.
  bool Start(int64_t r) {
    // Port 0 and a port file: a port picked in advance may be taken by then (W sidecars open
    // many ephemeral ports).
    const std::string metrics_file =
        absl::StrCat("/tmp/scale_bench_metrics_", getpid(), "_", r, "_", ++starts_);
    servers_[r] = std::make_unique<ServerProcess>(
        std::vector<std::string>{absl::StrCat("--rank=", r), absl::StrCat("--world_size=", w_),
                                 absl::StrCat("--rendezvous=", rendezvous_), "--backend=gloo",
                                 "--collective_timeout=30s", "--log_level=warn",
                                 "--metrics_listen=127.0.0.1:0",
                                 absl::StrCat("--metrics_port_file=", metrics_file)},
        binary_);
    if (!servers_[r]->started()) {
      std::fprintf(stderr, "rank %lld did not start:\n%s\n", static_cast<long long>(r),
                   servers_[r]->stderr_text().c_str());
      return false;
    }
    // The sidecar writes its metrics port file before its own port file.
    metrics_ports_[r] = std::atoi(packsched::testing::ReadAll(metrics_file).c_str());
    std::remove(metrics_file.c_str());
    packsched::client::ClientOptions options;
    options.target = servers_[r]->target();
    options.timeout = absl::Seconds(60);
    auto client = SchedulerClient::Create(options);
    if (!client.ok()) return false;
    clients_[r] = *std::move(client);
    return true;
  }

  void Kill(int64_t r) {
    kill(servers_[r]->pid(), SIGKILL);
    servers_[r]->Exited(absl::Seconds(10));
  }

  // Every rank plans `round`, resending after an error until `bound`; the time until the last
  // rank's answer, or a negative duration if some rank had none by then.
  absl::Duration Round(int64_t round, absl::Duration bound) {
    const absl::Time start = absl::Now();
    const absl::Time give_up = start + bound;
    std::vector<absl::Time> done(w_, absl::InfiniteFuture());
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < w_; ++r) {
      threads.emplace_back([&, r] {
        PlanRequest request;
        request.stream = "actor_update";
        request.round = round;
        request.lengths =
            packsched::testing::RealisticRlLengths(absl::GetFlag(FLAGS_n), 7919 * r + round);
        request.options.max_token_len = 16384;
        request.options.overlong = packsched::planner::OverlongPolicy::kIsolate;
        while (absl::Now() < give_up) {
          if (clients_[r]->Plan(request).ok()) {
            done[r] = absl::Now();
            return;
          }
          absl::SleepFor(absl::Milliseconds(50));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    const absl::Time last = *std::max_element(done.begin(), done.end());
    if (last == absl::InfiniteFuture()) return -absl::Seconds(1);
    return last - start;
  }

  pid_t pid(int64_t r) const { return servers_[r]->pid(); }
  int metrics_port(int64_t r) const { return metrics_ports_[r]; }

 private:
  const int64_t w_;
  const std::string binary_;
  const std::string rendezvous_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;  // stopped by pid when destroyed
  std::vector<std::unique_ptr<SchedulerClient>> clients_;
  std::vector<int> metrics_ports_;
  int64_t starts_ = 0;
};

std::string Seconds(absl::Duration d) {
  if (d < absl::ZeroDuration()) return "did not heal";
  return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d));
}

int Run(int64_t w) {
  Group group(w, absl::GetFlag(FLAGS_server));
  for (int64_t r = w - 1; r >= 0; --r) {
    if (!group.Start(r)) return 1;
  }
  // Each rank's requests so far (joining the run, and its idle epoch reads while the others
  // started), to tell the first round's own from them.
  std::vector<int64_t> before(w);
  for (int64_t r = 0; r < w; ++r) before[r] = StoreRequests(group.metrics_port(r));
  const double cpu0 = CpuSeconds(group.pid(0));
  const absl::Duration formation = group.Round(1, absl::Seconds(120));
  const double formation_cpu = CpuSeconds(group.pid(0)) - cpu0;
  if (formation < absl::ZeroDuration()) {
    std::fprintf(stderr, "W = %lld: the group did not form\n", static_cast<long long>(w));
    return 1;
  }
  // The replicas' writes of round 1; and the exposition is rebuilt at most once a second.
  absl::SleepFor(absl::Milliseconds(1200));
  int64_t most = -1, most_first = -1;
  for (int64_t r = 1; r < w; ++r) {
    const int64_t now = StoreRequests(group.metrics_port(r));
    most = std::max(most, now);
    if (now >= 0 && before[r] >= 0) most_first = std::max(most_first, now - before[r]);
  }
  const int64_t rank_zero = StoreRequests(group.metrics_port(0));
  std::vector<double> steady;
  int64_t round = 2;
  for (int64_t i = 0; i < absl::GetFlag(FLAGS_rounds); ++i, ++round) {
    const absl::Duration took = group.Round(round, absl::Seconds(60));
    if (took < absl::ZeroDuration()) {
      std::fprintf(stderr, "W = %lld: steady round %lld failed\n", static_cast<long long>(w),
                   static_cast<long long>(round));
      return 1;
    }
    steady.push_back(absl::ToDoubleMilliseconds(took));
  }
  const double idle_start = CpuSeconds(group.pid(0));
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_idle_s)));
  const double idle_cpu =
      (CpuSeconds(group.pid(0)) - idle_start) / static_cast<double>(absl::GetFlag(FLAGS_idle_s));
  const double rss = RssMib(group.pid(0));
  std::string heal1 = "not measured", heal0 = "not measured";
  if (absl::GetFlag(FLAGS_heal)) {
    const absl::Duration bound = absl::Seconds(absl::GetFlag(FLAGS_heal_bound_s));
    for (int64_t victim : {int64_t{1}, int64_t{0}}) {
      group.Kill(victim);
      if (!group.Start(victim)) return 1;
      const std::string healed = Seconds(group.Round(round++, bound));
      (victim == 1 ? heal1 : heal0) = healed;
    }
  }
  auto count = [](int64_t c) { return c < 0 ? std::string("—") : absl::StrCat(c); };
  std::printf(
      "| %lld | %.2f s | %.2f s | %s / %s | %s | %.1f / %.1f ms | %.1f%% | %.1f MiB | %s | %s |\n",
      static_cast<long long>(w), absl::ToDoubleSeconds(formation), formation_cpu,
      count(most_first).c_str(), count(most).c_str(), count(rank_zero).c_str(),
      Percentile(steady, 0.5), Percentile(steady, 0.99), 100 * idle_cpu, rss, heal1.c_str(),
      heal0.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf("scale_bench: %s, %u CPUs, loadavg %s\n", absl::GetFlag(FLAGS_server).c_str(),
              std::thread::hardware_concurrency(), load.c_str());
  std::printf(
      "| W | formation | rank 0 CPU during formation | store requests, most by a rank other "
      "than 0: first round / since start | by rank 0, since start | steady round p50 / p99 | rank "
      "0 CPU idle | rank 0 RSS | heal after "
      "kill -9 of rank 1 | of rank 0 |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& text : absl::GetFlag(FLAGS_world)) {
    int64_t w = 0;
    if (!absl::SimpleAtoi(text, &w) || w < 2) {
      std::fprintf(stderr, "--world: '%s' is not a world size >= 2\n", text.c_str());
      return 2;
    }
    if (int rc = Run(w); rc != 0) return rc;
  }
  return 0;
}
