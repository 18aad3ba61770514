// packsched-server: the scheduler sidecar. Flags -> options -> gRPC server -> wait for
// SIGTERM/SIGINT -> graceful shutdown. With no group flags the server is a group of one.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/address.h"
#include "server/base/logging.h"
#include "server/base/status_macros.h"
#include "server/collective/backend.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/service/health_probe.h"
#include "server/service/rendezvous.h"
#include "server/service/server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port for trainer calls (loopback by default; port 0 picks a free port)");
ABSL_FLAG(std::string, port_file, "",
          "once the server accepts calls, write its port here (one line; atomic rename)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug (a line per round), info, warn, error");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS only");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA bundle: require client certificates it signed");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a bearer token every call must send (only with TLS or on loopback)");
ABSL_FLAG(int64_t, max_sequences_per_request,
          packsched::service::ServiceLimits{}.max_sequences_per_request,
          "most sequences in one request");
ABSL_FLAG(int64_t, max_micro_batches, packsched::service::ServiceLimits{}.max_micro_batches,
          "ceiling on a request's max_micro_batches (and its default)");
ABSL_FLAG(int64_t, max_streams, packsched::service::ServiceLimits{}.max_streams,
          "most planning streams");
ABSL_FLAG(int64_t, max_cached_rounds, packsched::service::ServiceLimits{}.max_cached_rounds,
          "finished rounds kept per stream for late callers (TP/PP/CP ranks)");
ABSL_FLAG(int64_t, max_cached_bytes, packsched::service::ServiceLimits{}.max_cached_bytes,
          "estimated bytes of finished rounds kept for late callers, over every stream (oldest "
          "evicted first; a larger result is served but not kept)");
ABSL_FLAG(int64_t, max_outstanding_rounds,
          packsched::service::ServiceLimits{}.max_outstanding_rounds,
          "rounds queued or running per stream");
ABSL_FLAG(absl::Duration, collective_timeout,
          packsched::service::ServiceLimits{}.collective_timeout,
          "bound on every server-side wait of a round (peers, forming the group)");
ABSL_FLAG(int64_t, rank, 0, "this sidecar's data-parallel rank, in [0, --world_size)");
ABSL_FLAG(int64_t, world_size, 1,
          "data-parallel ranks in the group (1: a group of one; more needs --rendezvous)");
ABSL_FLAG(std::string, rendezvous, "",
          "HOST:PORT of the group's rendezvous store: rank 0 serves it there (on every interface "
          "unless HOST is loopback or --rendezvous_listen says otherwise); every rank, rank 0 "
          "included, connects to it");
ABSL_FLAG(std::string, rendezvous_listen, "",
          "rank 0 only: the address to serve the rendezvous store on (default: from --rendezvous)");
ABSL_FLAG(bool, rendezvous_tls, false,
          "TLS on the rendezvous port: rank 0 serves it with --tls_cert/--tls_key (requiring "
          "client certificates when --tls_client_ca is set); every rank verifies rank 0 with "
          "--rendezvous_tls_ca and presents --tls_cert/--tls_key");
ABSL_FLAG(std::string, rendezvous_tls_ca, "",
          "PEM CA bundle that signed rank 0's certificate (default: the system roots)");
ABSL_FLAG(std::string, backend, "auto",
          "collective backend: auto (NCCL if every rank has a GPU and NCCL, else Gloo), gloo, "
          "nccl, local (a group of one)");
ABSL_FLAG(std::string, gloo_hostname, "",
          "address Gloo listens on and advertises (default: the local address of the connection "
          "to --rendezvous)");
ABSL_FLAG(std::string, gloo_iface, "",
          "network interface whose address Gloo uses (instead of --gloo_hostname)");
ABSL_FLAG(int64_t, local_gpu, -1, "CUDA device of the NCCL backend (default: LOCAL_RANK, else 0)");
ABSL_FLAG(int64_t, max_receive_message_bytes, int64_t{64} << 20, "largest request, bytes");
ABSL_FLAG(int64_t, max_concurrent_streams, 256, "concurrent calls per client connection");
ABSL_FLAG(int64_t, resource_quota_bytes, int64_t{1} << 30, "gRPC memory quota, bytes");
ABSL_FLAG(int64_t, max_threads, 64, "gRPC thread quota");
ABSL_FLAG(std::string, probe, "",
          "probe mode, for exec probes (Kubernetes' grpc probes dial the pod IP, not the "
          "loopback the sidecar listens on): check the grpc.health.v1 status of the server at "
          "this HOST:PORT, exit 0 if SERVING, else 1; give it the server's --tls_* flags when "
          "the server speaks TLS (see --probe_tls_ca)");
ABSL_FLAG(std::string, probe_service, "",
          "with --probe: '' = the process is live; packsched.v1.Scheduler = the rank group has "
          "formed (readiness)");
ABSL_FLAG(std::string, probe_tls_ca, "",
          "with --probe against a server with --tls_cert: PEM CA bundle that signed the server's "
          "certificate (default: --tls_client_ca). The probe then speaks TLS and presents "
          "--tls_cert/--tls_key as its client certificate: give it the server's TLS flags");
ABSL_FLAG(std::string, probe_tls_server_name, "",
          "with a TLS --probe: the name the server's certificate must carry (default: the host "
          "of --probe)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "on SIGTERM/SIGINT, how long calls in progress may take to finish");

namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int) {
  const char byte = 1;
  const int saved = errno;
  [[maybe_unused]] ssize_t written = write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
  errno = saved;
}

absl::Status InstallSignalHandlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGTERM, &action, nullptr) != 0 || sigaction(SIGINT, &action, nullptr) != 0) {
    return absl::InternalError("sigaction failed");
  }
  // Gloo writes to peers' sockets without MSG_NOSIGNAL: a peer that died must fail the round
  // (ABORTED), not kill this process with SIGPIPE.
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) return absl::InternalError("ignoring SIGPIPE failed");
  return absl::OkStatus();
}

void WaitForSignal() {
  char byte;
  while (read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
}

absl::Status Positive(absl::string_view flag, int64_t value, int64_t min = 1) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " = ", value, ": must be >= ", min));
}

absl::StatusOr<packsched::service::ServerOptions> OptionsFromFlags() {
  packsched::service::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    std::ifstream in(path);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_token_file = '", path, "': cannot be read"));
    }
    std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    o.auth_token = std::string(absl::StripAsciiWhitespace(token));
    if (o.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--auth_token_file = '", path, "' is empty"));
    }
  }
  packsched::service::ServiceLimits& l = o.limits;
  l.max_sequences_per_request = absl::GetFlag(FLAGS_max_sequences_per_request);
  l.max_micro_batches = absl::GetFlag(FLAGS_max_micro_batches);
  l.max_streams = absl::GetFlag(FLAGS_max_streams);
  l.max_cached_rounds = absl::GetFlag(FLAGS_max_cached_rounds);
  l.max_cached_bytes = absl::GetFlag(FLAGS_max_cached_bytes);
  l.max_outstanding_rounds = absl::GetFlag(FLAGS_max_outstanding_rounds);
  l.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  RETURN_IF_ERROR(Positive("max_sequences_per_request", l.max_sequences_per_request));
  RETURN_IF_ERROR(Positive("max_micro_batches", l.max_micro_batches));
  if (l.max_micro_batches > packsched::planner::kMaxSequences) {
    return absl::InvalidArgumentError(absl::StrCat("--max_micro_batches = ", l.max_micro_batches,
                                                   ": at most ",
                                                   packsched::planner::kMaxSequences));
  }
  RETURN_IF_ERROR(Positive("max_streams", l.max_streams));
  RETURN_IF_ERROR(Positive("max_cached_rounds", l.max_cached_rounds, 0));
  RETURN_IF_ERROR(Positive("max_cached_bytes", l.max_cached_bytes, 0));
  RETURN_IF_ERROR(Positive("max_outstanding_rounds", l.max_outstanding_rounds));
  if (l.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--collective_timeout must be positive");
  }
  o.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  o.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.resource_quota_bytes = absl::GetFlag(FLAGS_resource_quota_bytes);
  o.max_threads = absl::GetFlag(FLAGS_max_threads);
  RETURN_IF_ERROR(Positive("max_receive_message_bytes", o.max_receive_message_bytes, 1024));
  RETURN_IF_ERROR(Positive("max_concurrent_streams", o.max_concurrent_streams));
  RETURN_IF_ERROR(Positive("resource_quota_bytes", o.resource_quota_bytes, 1 << 20));
  RETURN_IF_ERROR(Positive("max_threads", o.max_threads, 2));
  o.build_version = PACKSCHED_VERSION;
  o.rank = absl::GetFlag(FLAGS_rank);
  return o;
}

// Writes "PORT\n" to `path` atomically: a reader sees no file or the whole line.
absl::Status WritePortFile(const std::string& path, int port) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(temp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temp));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path));
  }
  return absl::OkStatus();
}

// The rank group: the rendezvous server (rank 0), the store client and the Group.
struct RankGroup {
  std::unique_ptr<packsched::collective::InMemoryStore> served;
  std::unique_ptr<packsched::service::RendezvousServer> server;
  std::unique_ptr<packsched::service::RendezvousStore> store;
  std::unique_ptr<packsched::group::Group> group;
};

// The rendezvous address rank 0 binds: --rendezvous_listen, else --rendezvous's port on
// loopback when its host is loopback, else on every interface.
std::string RendezvousListen(const std::string& rendezvous) {
  if (std::string listen = absl::GetFlag(FLAGS_rendezvous_listen); !listen.empty()) return listen;
  if (packsched::IsLoopbackAddress(rendezvous)) return rendezvous;
  const size_t colon = rendezvous.rfind(':');
  return absl::StrCat("[::]", colon == std::string::npos ? ":0" : rendezvous.substr(colon));
}

absl::StatusOr<RankGroup> GroupFromFlags(const packsched::service::ServerOptions& server) {
  namespace collective = packsched::collective;
  RankGroup g;
  const int64_t rank = absl::GetFlag(FLAGS_rank);
  const int64_t world_size = absl::GetFlag(FLAGS_world_size);
  const std::string rendezvous = absl::GetFlag(FLAGS_rendezvous);
  ASSIGN_OR_RETURN(collective::Backend backend,
                   collective::ParseBackend(absl::GetFlag(FLAGS_backend)));
  RETURN_IF_ERROR(Positive("world_size", world_size));
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank = ", rank, ": must be in [0, --world_size = ", world_size, ")"));
  }
  if (rendezvous.empty()) {
    if (world_size != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--world_size = ", world_size, " needs --rendezvous=HOST:PORT"));
    }
    if (backend != collective::Backend::kAuto && backend != collective::Backend::kLocal) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend = ", collective::BackendName(backend), " needs --rendezvous=HOST:PORT"));
    }
    return g;  // a group of one: the local backend, nothing stored
  }
  packsched::service::RendezvousTls tls;
  if (absl::GetFlag(FLAGS_rendezvous_tls)) {
    tls.enabled = true;
    tls.cert = server.tls_cert;
    tls.key = server.tls_key;
    if (tls.cert.empty() || tls.key.empty()) {
      return absl::InvalidArgumentError("--rendezvous_tls needs --tls_cert and --tls_key");
    }
  } else if (!absl::GetFlag(FLAGS_rendezvous_tls_ca).empty()) {
    return absl::InvalidArgumentError("--rendezvous_tls_ca needs --rendezvous_tls");
  }
  if (rank == 0) {
    g.served = std::make_unique<collective::InMemoryStore>();
    packsched::service::RendezvousServerOptions serve;
    serve.listen = RendezvousListen(rendezvous);
    serve.tls = tls;
    serve.tls.ca = absl::GetFlag(FLAGS_rendezvous_tls) ? server.tls_client_ca : "";
    serve.auth_token = server.auth_token;
    ASSIGN_OR_RETURN(g.server, packsched::service::RendezvousServer::Start(g.served.get(), serve));
    spdlog::info("serving the rendezvous store on {} (port {}){}", serve.listen, g.server->port(),
                 tls.enabled ? ", TLS" : "");
  }
  packsched::service::RendezvousClientOptions connect;
  connect.address = rendezvous;
  connect.auth_token = server.auth_token;
  if (absl::GetFlag(FLAGS_rendezvous_tls)) {
    connect.tls.enabled = true;
    connect.tls.ca = absl::GetFlag(FLAGS_rendezvous_tls_ca);  // empty: the system roots
    connect.tls.cert = server.tls_cert;
    connect.tls.key = server.tls_key;
  }
  ASSIGN_OR_RETURN(g.store, packsched::service::RendezvousStore::Create(connect));
  packsched::group::GroupOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.backend = backend;
  options.collective_timeout = server.limits.collective_timeout;
  options.gloo.iface = absl::GetFlag(FLAGS_gloo_iface);
  options.gloo.hostname = absl::GetFlag(FLAGS_gloo_hostname);
  if (options.gloo.hostname.empty() && options.gloo.iface.empty()) {
    ASSIGN_OR_RETURN(options.gloo.hostname, packsched::service::LocalAddressTowards(rendezvous));
  }
  int64_t gpu = absl::GetFlag(FLAGS_local_gpu);
  if (gpu < 0) {
    const char* local_rank = std::getenv("LOCAL_RANK");
    gpu = 0;
    if (local_rank != nullptr && !absl::SimpleAtoi(local_rank, &gpu)) {
      return absl::InvalidArgumentError(absl::StrCat("LOCAL_RANK = '", local_rank, "'"));
    }
  }
  options.nccl.device = static_cast<int>(gpu);
  ASSIGN_OR_RETURN(g.group, packsched::group::Group::Create(g.store.get(), std::move(options)));
  return g;
}

// --probe: one health check, its outcome in the exit code and one line on stderr. With
// --tls_cert (the server's own TLS flags) it speaks TLS: verifying the server against
// --probe_tls_ca (default --tls_client_ca) and presenting --tls_cert/--tls_key, which a server
// with --tls_client_ca requires.
int Probe(const std::string& target, const std::string& service) {
  std::optional<packsched::service::ProbeTls> tls;
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    tls.emplace();
    tls->root_certs_file = absl::GetFlag(FLAGS_probe_tls_ca);
    if (tls->root_certs_file.empty()) tls->root_certs_file = absl::GetFlag(FLAGS_tls_client_ca);
    if (tls->root_certs_file.empty()) {
      std::fprintf(stderr,
                   "packsched-server --probe: with --tls_cert, give --probe_tls_ca (the CA that "
                   "signed the server's certificate) or --tls_client_ca\n");
      return 1;
    }
    tls->cert_file = absl::GetFlag(FLAGS_tls_cert);
    tls->key_file = absl::GetFlag(FLAGS_tls_key);
    tls->server_name = absl::GetFlag(FLAGS_probe_tls_server_name);
  }
  absl::StatusOr<packsched::service::Serving> serving = packsched::service::CheckHealth(
      target, service, absl::Now() + absl::Seconds(5), tls ? &*tls : nullptr);
  if (!serving.ok()) {
    std::fprintf(stderr, "packsched-server --probe: %s\n", serving.status().ToString().c_str());
    return 1;
  }
  if (*serving != packsched::service::Serving::kServing) {
    std::fprintf(stderr, "packsched-server --probe: '%s' at %s is not serving (status %d)\n",
                 service.c_str(), target.c_str(), static_cast<int>(*serving));
    return 1;
  }
  return 0;
}

int Fail(const absl::Status& status) {
  spdlog::error("{}", status.ToString());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef NDEBUG
  // Debian's Abseil is built without NDEBUG, so by default every absl::Mutex (gRPC's own locks
  // included) keeps a process-wide lock-order graph to detect deadlocks: a cost on every lock
  // taken while another is held. Off in optimised builds; debug builds keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  absl::SetProgramUsageMessage("packsched scheduler sidecar: packsched-server [--listen=...]");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = packsched::InitLogging("packsched-server", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::fprintf(stderr, "packsched-server: %s\n", s.ToString().c_str());
    return 1;
  }
  if (const std::string target = absl::GetFlag(FLAGS_probe); !target.empty()) {
    return Probe(target, absl::GetFlag(FLAGS_probe_service));
  }
  if (absl::Status s = InstallSignalHandlers(); !s.ok()) return Fail(s);
  absl::StatusOr<packsched::service::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());

  absl::StatusOr<RankGroup> group = GroupFromFlags(*options);
  if (!group.ok()) return Fail(group.status());
  options->group = group->group.get();
  if (packsched::service::RendezvousStore* store = group->store.get(); store != nullptr) {
    // Shutdown must not wait out --collective_timeout in a group formation (a stream worker
    // blocked on the store for a rank that never comes).
    options->cancel_group_waits = [store] { store->Cancel(); };
  }

  // Serves before the group has formed: each stream forms it on its first round, waiting for
  // the peers at most --collective_timeout.
  absl::StatusOr<std::unique_ptr<packsched::service::SchedulerServer>> server =
      packsched::service::SchedulerServer::Start(*options);
  if (!server.ok()) return Fail(server.status());
  const int port = (*server)->port();
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, port); !s.ok()) return Fail(s);
  }
  spdlog::info("serving packsched.v1.Scheduler on {} (port {}){}{}; rank {} of {}{}{}",
               options->listen, port, options->tls_cert.empty() ? "" : ", TLS",
               options->auth_token.empty() ? "" : ", bearer token required", options->rank,
               absl::GetFlag(FLAGS_world_size),
               absl::GetFlag(FLAGS_rendezvous).empty() ? "" : ", rendezvous ",
               absl::GetFlag(FLAGS_rendezvous));

  WaitForSignal();
  spdlog::info("shutting down (grace {})",
               absl::FormatDuration(absl::GetFlag(FLAGS_shutdown_grace)));
  (*server)->Shutdown(absl::GetFlag(FLAGS_shutdown_grace));
  // The group outlives the server and its coordinator (which holds the streams' groups); rank 0's
  // store goes last.
  server->reset();
  group->group.reset();
  group->store.reset();
  if (group->server != nullptr) group->server->Shutdown();
  spdlog::info("stopped");
  return 0;
}
