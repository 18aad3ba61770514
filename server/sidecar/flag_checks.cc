#include "server/sidecar/flag_checks.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/base/file_check.h"
#include "server/base/host_port.h"
#include "server/base/logging.h"
#include "server/base/status_macros.h"
#include "server/collective/backend.h"
#include "server/planner/options.h"
#include "server/security/credentials.h"
#include "server/security/pem_check.h"
#include "server/sidecar/machine_checks.h"

// Every flag of server/sidecar/flags.cc.
ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_client_ca);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(int64_t, max_sequences_per_request);
ABSL_DECLARE_FLAG(int64_t, max_micro_batches);
ABSL_DECLARE_FLAG(int64_t, max_streams);
ABSL_DECLARE_FLAG(absl::Duration, stream_idle_timeout);
ABSL_DECLARE_FLAG(int64_t, max_cached_rounds);
ABSL_DECLARE_FLAG(int64_t, max_cached_bytes);
ABSL_DECLARE_FLAG(int64_t, max_inflight_bytes);
ABSL_DECLARE_FLAG(int64_t, max_outstanding_rounds);
ABSL_DECLARE_FLAG(absl::Duration, collective_timeout);
ABSL_DECLARE_FLAG(int64_t, rank);
ABSL_DECLARE_FLAG(int64_t, world_size);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(std::string, rendezvous_listen);
ABSL_DECLARE_FLAG(bool, rendezvous_tls);
ABSL_DECLARE_FLAG(std::string, rendezvous_tls_ca);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, gloo_hostname);
ABSL_DECLARE_FLAG(std::string, gloo_iface);
ABSL_DECLARE_FLAG(int64_t, local_gpu);
ABSL_DECLARE_FLAG(int64_t, max_receive_message_bytes);
ABSL_DECLARE_FLAG(int64_t, max_concurrent_streams);
ABSL_DECLARE_FLAG(int64_t, resource_quota_bytes);
ABSL_DECLARE_FLAG(int64_t, max_threads);
ABSL_DECLARE_FLAG(int64_t, planning_threads);
ABSL_DECLARE_FLAG(int64_t, planning_queue);
ABSL_DECLARE_FLAG(std::string, probe);
ABSL_DECLARE_FLAG(std::string, probe_service);
ABSL_DECLARE_FLAG(std::string, probe_tls_ca);
ABSL_DECLARE_FLAG(std::string, probe_tls_server_name);
ABSL_DECLARE_FLAG(std::string, status);
ABSL_DECLARE_FLAG(bool, status_json);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, metrics_port_file);
ABSL_DECLARE_FLAG(absl::Duration, shutdown_grace);

namespace packsched::sidecar {
namespace {

// Bounds of the flags without one elsewhere: generous for any deployment, small enough that
// the value cannot wrap or exhaust the machine on its own.
constexpr int64_t kMaxStreams = 4096;  // each stream has a worker thread
constexpr int64_t kMaxQueued = int64_t{1} << 20;
constexpr int64_t kMaxBytes = int64_t{1} << 50;
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();  // gRPC takes an int
constexpr int64_t kMaxGpu = 1023;
constexpr absl::Duration kMaxCollectiveTimeout = absl::Hours(24);
constexpr absl::Duration kMaxShutdownGrace = absl::Hours(1);
constexpr absl::Duration kMaxIdleTimeout = absl::Hours(24 * 365);
constexpr absl::string_view kReadinessService = "packsched.v1.Scheduler";

absl::Status Refuse(absl::string_view flag, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", rule));
}

template <typename T>
std::string Text(const T& value) {
  return absl::StrCat(value);
}
std::string Text(bool value) { return value ? "true" : "false"; }
std::string Text(absl::Duration value) { return absl::FormatDuration(value); }

// `flag` (given as `value`) needs `other` to be set: "needs --other".
template <typename T>
absl::Status Needs(absl::string_view flag, const T& value, bool other_set,
                   absl::string_view other) {
  if (other_set) return absl::OkStatus();
  return Refuse(flag, Text(value), absl::StrCat("needs ", other));
}

// ---- The rows: one per flag (or per flags checked together), in flags.cc's order -------------

absl::Status Listen() { return CheckAddress("listen", absl::GetFlag(FLAGS_listen), 0, true); }

absl::Status PortFile() {
  const std::string path = absl::GetFlag(FLAGS_port_file);
  return path.empty() ? absl::OkStatus() : CheckWritable("port_file", path);
}

absl::Status LogLevel() {
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const absl::Status s = CheckLogLevel(level);
  return s.ok() ? s : Refuse("log_level", level, s.message());
}

absl::Status ServerTls() {
  return security::CheckServerTlsFiles({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                        absl::GetFlag(FLAGS_tls_client_ca)});
}

absl::Status AuthTokenFile() {
  const std::string path = absl::GetFlag(FLAGS_auth_token_file);
  if (path.empty()) return absl::OkStatus();
  if (absl::Status s = CheckReadable("auth_token_file", path, /*not_blank=*/true); !s.ok()) {
    return s;
  }
  // A token that may not be accepted where the server listens (a listen address off loopback,
  // without TLS) is a usage error too.
  const absl::Status accepted = security::CheckTokenMayBeAccepted(
      "token", !absl::GetFlag(FLAGS_tls_cert).empty(), absl::GetFlag(FLAGS_listen), "--listen =");
  return accepted.ok() ? accepted : Refuse("auth_token_file", path, accepted.message());
}

absl::Status Limits() {
  const absl::Status checks[] = {
      CheckRange("max_sequences_per_request", absl::GetFlag(FLAGS_max_sequences_per_request), 1,
                 planner::kMaxSequences),
      CheckRange("max_micro_batches", absl::GetFlag(FLAGS_max_micro_batches), 1,
                 planner::kMaxSequences),
      CheckRange("max_streams", absl::GetFlag(FLAGS_max_streams), 1, kMaxStreams),
      CheckDurationRange("stream_idle_timeout", absl::GetFlag(FLAGS_stream_idle_timeout),
                         absl::ZeroDuration(), kMaxIdleTimeout),
      CheckRange("max_cached_rounds", absl::GetFlag(FLAGS_max_cached_rounds), 0, kMaxQueued),
      CheckRange("max_cached_bytes", absl::GetFlag(FLAGS_max_cached_bytes), 0, kMaxBytes),
      CheckRange("max_inflight_bytes", absl::GetFlag(FLAGS_max_inflight_bytes), 0, kMaxBytes),
      CheckRange("max_outstanding_rounds", absl::GetFlag(FLAGS_max_outstanding_rounds), 1,
                 kMaxQueued),
      CheckDurationRange("collective_timeout", absl::GetFlag(FLAGS_collective_timeout),
                         absl::Milliseconds(1), kMaxCollectiveTimeout),
  };
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RankAndWorldSize() {
  const int64_t world_size = absl::GetFlag(FLAGS_world_size);
  const int64_t rank = absl::GetFlag(FLAGS_rank);
  if (absl::Status s = CheckRange("world_size", world_size, 1, planner::kMaxWorldSize); !s.ok()) {
    return s;
  }
  if (rank < 0 || rank >= world_size) {
    return Refuse("rank", Text(rank),
                  absl::StrCat("must be 0..", world_size - 1, " (--world_size=", world_size, ")"));
  }
  if (world_size > 1 && absl::GetFlag(FLAGS_rendezvous).empty()) {
    return Refuse("world_size", Text(world_size), "needs --rendezvous=HOST:PORT");
  }
  return absl::OkStatus();
}

absl::Status Rendezvous() {
  const std::string rendezvous = absl::GetFlag(FLAGS_rendezvous);
  const bool group = !rendezvous.empty();
  if (group) RETURN_IF_ERROR(CheckAddress("rendezvous", rendezvous, 1));
  if (const std::string listen = absl::GetFlag(FLAGS_rendezvous_listen); !listen.empty()) {
    RETURN_IF_ERROR(Needs("rendezvous_listen", listen, group, "--rendezvous=HOST:PORT"));
    RETURN_IF_ERROR(CheckAddress("rendezvous_listen", listen, 1));
  }
  if (absl::GetFlag(FLAGS_rendezvous_tls)) {
    RETURN_IF_ERROR(Needs("rendezvous_tls", true, group, "--rendezvous=HOST:PORT"));
    RETURN_IF_ERROR(
        Needs("rendezvous_tls", true,
              !absl::GetFlag(FLAGS_tls_cert).empty() && !absl::GetFlag(FLAGS_tls_key).empty(),
              "--tls_cert and --tls_key"));
  }
  if (const std::string ca = absl::GetFlag(FLAGS_rendezvous_tls_ca); !ca.empty()) {
    RETURN_IF_ERROR(
        Needs("rendezvous_tls_ca", ca, absl::GetFlag(FLAGS_rendezvous_tls), "--rendezvous_tls"));
    RETURN_IF_ERROR(security::CheckCertificateFile({"--rendezvous_tls_ca", ca}));
  }
  return absl::OkStatus();
}

absl::Status Backend() {
  const std::string name = absl::GetFlag(FLAGS_backend);
  absl::StatusOr<collective::Backend> backend = collective::ParseBackend(name);
  if (!backend.ok()) return Refuse("backend", name, "must be auto, gloo, nccl or local");
  if ((*backend == collective::Backend::kGloo || *backend == collective::Backend::kNccl) &&
      absl::GetFlag(FLAGS_rendezvous).empty()) {
    return Refuse("backend", name, "needs --rendezvous=HOST:PORT (a rank group)");
  }
  if (*backend == collective::Backend::kLocal && absl::GetFlag(FLAGS_world_size) > 1) {
    return Refuse(
        "backend", name,
        absl::StrCat("is a group of one, not --world_size=", absl::GetFlag(FLAGS_world_size)));
  }
  return absl::OkStatus();
}

absl::Status GlooAddress() {
  const std::string hostname = absl::GetFlag(FLAGS_gloo_hostname);
  const std::string iface = absl::GetFlag(FLAGS_gloo_iface);
  if (!hostname.empty()) {
    if (!iface.empty()) {
      return Refuse("gloo_hostname", hostname,
                    absl::StrCat("not with --gloo_iface=", iface, ": give one of them"));
    }
    if (absl::Status s = CheckLocalAddress(hostname); !s.ok()) {
      return Refuse("gloo_hostname", hostname, s.message());
    }
  }
  if (!iface.empty()) {
    if (absl::Status s = CheckInterface(iface); !s.ok()) {
      return Refuse("gloo_iface", iface, s.message());
    }
  }
  return absl::OkStatus();
}

absl::Status LocalGpu() {
  const int64_t gpu = absl::GetFlag(FLAGS_local_gpu);
  RETURN_IF_ERROR(CheckRange("local_gpu", gpu, -1, kMaxGpu));
  // -1 reads LOCAL_RANK, in a rank group only (rank_group.cc).
  const char* local_rank = std::getenv("LOCAL_RANK");  // NOLINT(concurrency-mt-unsafe)
  int64_t parsed = 0;
  if (gpu == -1 && local_rank != nullptr && !absl::GetFlag(FLAGS_rendezvous).empty() &&
      (!absl::SimpleAtoi(local_rank, &parsed) || parsed < 0 || parsed > kMaxGpu)) {
    return Refuse(
        "local_gpu", Text(gpu),
        absl::StrCat("LOCAL_RANK='", local_rank, "' is not a device number 0..", kMaxGpu));
  }
  return absl::OkStatus();
}

absl::Status GrpcSettings() {
  const absl::Status checks[] = {
      CheckRange("max_receive_message_bytes", absl::GetFlag(FLAGS_max_receive_message_bytes), 1024,
                 kMaxInt),
      CheckRange("max_concurrent_streams", absl::GetFlag(FLAGS_max_concurrent_streams), 1, kMaxInt),
      CheckRange("resource_quota_bytes", absl::GetFlag(FLAGS_resource_quota_bytes), 1 << 20,
                 kMaxBytes),
      // A ceiling gRPC may reach, not threads made at start: the range alone.
      CheckRange("max_threads", absl::GetFlag(FLAGS_max_threads), 2, kMaxFlagThreads),
      CheckThreads("planning_threads", absl::GetFlag(FLAGS_planning_threads), 0),
      CheckRange("planning_queue", absl::GetFlag(FLAGS_planning_queue), 0, kMaxQueued),
  };
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ProbeAndStatus() {
  const std::string probe = absl::GetFlag(FLAGS_probe);
  const std::string status = absl::GetFlag(FLAGS_status);
  if (!probe.empty()) {
    RETURN_IF_ERROR(CheckAddress("probe", probe, 1, true));
    if (!status.empty()) return Refuse("probe", probe, "not with --status: give one mode");
  }
  const bool client = !probe.empty() || !status.empty();
  if (const std::string service = absl::GetFlag(FLAGS_probe_service); !service.empty()) {
    RETURN_IF_ERROR(Needs("probe_service", service, !probe.empty(), "--probe=HOST:PORT"));
    if (service != kReadinessService) {
      return Refuse("probe_service", service,
                    absl::StrCat("must be '' (liveness) or ", kReadinessService, " (readiness)"));
    }
  }
  if (const std::string ca = absl::GetFlag(FLAGS_probe_tls_ca); !ca.empty()) {
    RETURN_IF_ERROR(Needs("probe_tls_ca", ca, client, "--probe or --status"));
    RETURN_IF_ERROR(security::CheckCertificateFile({"--probe_tls_ca", ca}));
  }
  if (const std::string name = absl::GetFlag(FLAGS_probe_tls_server_name); !name.empty()) {
    RETURN_IF_ERROR(Needs("probe_tls_server_name", name, client, "--probe or --status"));
    RETURN_IF_ERROR(CheckServerName("probe_tls_server_name", name));
  }
  if (!status.empty()) RETURN_IF_ERROR(CheckAddress("status", status, 1, true));
  if (absl::GetFlag(FLAGS_status_json)) {
    RETURN_IF_ERROR(Needs("status_json", true, !status.empty(), "--status=HOST:PORT"));
  }
  return absl::OkStatus();
}

absl::Status Metrics() {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!listen.empty()) RETURN_IF_ERROR(CheckAddress("metrics_listen", listen, 0));
  if (const std::string path = absl::GetFlag(FLAGS_metrics_port_file); !path.empty()) {
    RETURN_IF_ERROR(Needs("metrics_port_file", path, !listen.empty(), "--metrics_listen"));
    RETURN_IF_ERROR(CheckWritable("metrics_port_file", path));
  }
  return absl::OkStatus();
}

absl::Status ShutdownGrace() {
  return CheckDurationRange("shutdown_grace", absl::GetFlag(FLAGS_shutdown_grace),
                            absl::ZeroDuration(), kMaxShutdownGrace);
}

// One row: the flags it checks (space-separated) and the check.
struct Row {
  absl::string_view flags;
  absl::Status (*check)();
};

constexpr Row kRows[] = {
    {"listen", Listen},
    {"port_file", PortFile},
    {"log_level", LogLevel},
    {"tls_cert tls_key tls_client_ca", ServerTls},
    {"auth_token_file", AuthTokenFile},
    {"max_sequences_per_request max_micro_batches max_streams stream_idle_timeout "
     "max_cached_rounds max_cached_bytes max_inflight_bytes max_outstanding_rounds "
     "collective_timeout",
     Limits},
    {"rank world_size", RankAndWorldSize},
    {"rendezvous rendezvous_listen rendezvous_tls rendezvous_tls_ca", Rendezvous},
    {"backend", Backend},
    {"gloo_hostname gloo_iface", GlooAddress},
    {"local_gpu", LocalGpu},
    {"max_receive_message_bytes max_concurrent_streams resource_quota_bytes max_threads "
     "planning_threads planning_queue",
     GrpcSettings},
    {"probe probe_service probe_tls_ca probe_tls_server_name status status_json", ProbeAndStatus},
    {"metrics_listen metrics_port_file", Metrics},
    {"shutdown_grace", ShutdownGrace},
};

}  // namespace

absl::Status CheckFlags() {
  for (const Row& row : kRows) RETURN_IF_ERROR(row.check());
  return absl::OkStatus();
}

std::vector<std::string> CheckedFlags() {
  std::vector<std::string> names;
  for (const Row& row : kRows) {
    for (absl::string_view name : absl::StrSplit(row.flags, ' ')) names.emplace_back(name);
  }
  return names;
}

absl::Status CheckRange(absl::string_view flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Refuse(flag, Text(value), absl::StrCat("must be ", lo, "..", hi));
}

absl::Status CheckDurationRange(absl::string_view flag, absl::Duration value, absl::Duration lo,
                                absl::Duration hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Refuse(flag, Text(value), absl::StrCat("must be ", Text(lo), "..", Text(hi)));
}

absl::Status CheckAddress(absl::string_view flag, absl::string_view value, int min_port,
                          bool allow_unix) {
  if (allow_unix &&
      (absl::StartsWith(value, "unix:") || absl::StartsWith(value, "unix-abstract:"))) {
    return absl::OkStatus();
  }
  const absl::StatusOr<HostPort> parsed = ParseHostPort(value, min_port);
  return parsed.ok() ? absl::OkStatus() : Refuse(flag, value, parsed.status().message());
}

absl::Status CheckReadable(absl::string_view flag, absl::string_view path, bool not_blank) {
  if (absl::Status s = CheckReadableFile(path); !s.ok()) return Refuse(flag, path, s.message());
  if (!not_blank) return absl::OkStatus();
  std::ifstream in{std::string(path)};
  const std::string contents((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (absl::StripAsciiWhitespace(contents).empty()) return Refuse(flag, path, "is empty");
  return absl::OkStatus();
}

absl::Status CheckWritable(absl::string_view flag, absl::string_view path) {
  const absl::Status s = CheckWritablePath(path);
  return s.ok() ? s : Refuse(flag, path, s.message());
}

absl::Status CheckThreads(absl::string_view flag, int64_t value, int64_t lo) {
  RETURN_IF_ERROR(CheckRange(flag, value, lo, kMaxFlagThreads));
  if (const std::optional<int64_t> limit = ThreadLimit(); limit && value >= *limit) {
    return Refuse(flag, Text(value),
                  absl::StrCat("this process may have at most ", *limit,
                               " threads (RLIMIT_NPROC or the cgroup's pids.max)"));
  }
  return absl::OkStatus();
}

absl::Status CheckServerName(absl::string_view flag, absl::string_view value) {
  const std::string expected = "must be a DNS name or an IP address";
  if (value.size() > 253) return Refuse(flag, value, expected);
  if (ParseHostPort(absl::StrCat("[", value, "]:1")).ok()) return absl::OkStatus();  // IPv6
  for (absl::string_view label : absl::StrSplit(value, '.')) {
    if (label.empty() || label.size() > 63) return Refuse(flag, value, expected);
    for (const char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') {
        return Refuse(flag, value, expected);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace packsched::sidecar
