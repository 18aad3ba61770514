#include "server/sidecar/flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"
#include "server/service/limits.h"

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
          "most live planning streams (a stream exists once a valid request made it)");
ABSL_FLAG(absl::Duration, stream_idle_timeout,
          packsched::service::ServiceLimits{}.stream_idle_timeout,
          "a stream with no round queued or running and no call for this long is reclaimed with "
          "its thread and cached rounds (0: never)");
ABSL_FLAG(int64_t, max_cached_rounds, packsched::service::ServiceLimits{}.max_cached_rounds,
          "finished rounds kept per stream for late callers (TP/PP/CP ranks)");
ABSL_FLAG(int64_t, max_cached_bytes, packsched::service::ServiceLimits{}.max_cached_bytes,
          "estimated bytes of finished rounds kept for late callers, over every stream (oldest "
          "evicted first; a larger result is served but not kept)");
ABSL_FLAG(int64_t, max_inflight_bytes, packsched::service::ServiceLimits{}.max_inflight_bytes,
          "estimated peak bytes of the requests served at once (0 = no budget); a request "
          "that would exceed it is refused with RESOURCE_EXHAUSTED before it allocates");
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
ABSL_FLAG(int64_t, planning_threads, 0,
          "the sidecar's own workers for BalanceBatch and Partition (never gRPC's threads); 0 = "
          "half the cores the process may use, at least 1");
ABSL_FLAG(int64_t, planning_queue, 8,
          "BalanceBatch and Partition requests that may wait for a planning worker; one more is "
          "refused with RESOURCE_EXHAUSTED");
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
ABSL_FLAG(std::string, status, "",
          "status mode: print the GetStatus of the server at this HOST:PORT as a table (group, "
          "backend, generation, readiness, streams with their last round and its latency) and "
          "exit 0, or 1 if the call fails; give it the server's --tls_* and --auth_token_file "
          "flags when the server uses them");
ABSL_FLAG(bool, status_json, false, "with --status: print the status as JSON");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics at /metrics over plain HTTP (empty: off; port 0 "
          "picks a free port). Unauthenticated: keep it on loopback unless a scraper elsewhere "
          "needs it (e.g. 0.0.0.0:9464 in a pod, behind a NetworkPolicy)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "once metrics are served, write their port here (one line; atomic rename)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "on SIGTERM/SIGINT, how long calls in progress may take to finish");

namespace packsched::sidecar {

absl::StatusOr<service::ServerOptions> ServerOptionsFromFlags() {
  service::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    ASSIGN_OR_RETURN(o.auth_token, security::ReadTokenFile({"--auth_token_file", path}));
  }
  service::ServiceLimits& l = o.limits;
  l.max_sequences_per_request = absl::GetFlag(FLAGS_max_sequences_per_request);
  l.max_micro_batches = absl::GetFlag(FLAGS_max_micro_batches);
  l.max_streams = absl::GetFlag(FLAGS_max_streams);
  l.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  l.max_cached_rounds = absl::GetFlag(FLAGS_max_cached_rounds);
  l.max_cached_bytes = absl::GetFlag(FLAGS_max_cached_bytes);
  l.max_outstanding_rounds = absl::GetFlag(FLAGS_max_outstanding_rounds);
  l.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  l.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  o.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  o.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.resource_quota_bytes = absl::GetFlag(FLAGS_resource_quota_bytes);
  o.max_threads = absl::GetFlag(FLAGS_max_threads);
  o.planning_threads = absl::GetFlag(FLAGS_planning_threads);
  o.planning_queue = absl::GetFlag(FLAGS_planning_queue);
  o.build_version = PACKSCHED_VERSION;
  // What GetStatus reports before a stream forms its collective (a group of one is local).
  o.backend = absl::GetFlag(FLAGS_world_size) > 1 ? absl::GetFlag(FLAGS_backend) : "local";
  o.rank = absl::GetFlag(FLAGS_rank);
  return o;
}

RankGroupFlags RankGroupFlagsFromFlags() {
  RankGroupFlags f;
  f.rank = absl::GetFlag(FLAGS_rank);
  f.world_size = absl::GetFlag(FLAGS_world_size);
  f.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  f.rendezvous_listen = absl::GetFlag(FLAGS_rendezvous_listen);
  f.rendezvous_tls = absl::GetFlag(FLAGS_rendezvous_tls);
  f.rendezvous_tls_ca = absl::GetFlag(FLAGS_rendezvous_tls_ca);
  f.backend = absl::GetFlag(FLAGS_backend);
  f.gloo_hostname = absl::GetFlag(FLAGS_gloo_hostname);
  f.gloo_iface = absl::GetFlag(FLAGS_gloo_iface);
  f.local_gpu = absl::GetFlag(FLAGS_local_gpu);
  return f;
}

ProbeFlags ProbeFlagsFromFlags() {
  ProbeFlags f;
  f.target = absl::GetFlag(FLAGS_probe);
  f.service = absl::GetFlag(FLAGS_probe_service);
  f.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  f.tls_key = absl::GetFlag(FLAGS_tls_key);
  f.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  f.tls_ca = absl::GetFlag(FLAGS_probe_tls_ca);
  f.tls_server_name = absl::GetFlag(FLAGS_probe_tls_server_name);
  return f;
}

StatusFlags StatusFlagsFromFlags() {
  StatusFlags f;
  f.target = absl::GetFlag(FLAGS_status);
  f.json = absl::GetFlag(FLAGS_status_json);
  f.tls = ProbeFlagsFromFlags();
  f.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  return f;
}

MetricsFlags MetricsFlagsFromFlags() {
  MetricsFlags f;
  f.listen = absl::GetFlag(FLAGS_metrics_listen);
  f.port_file = absl::GetFlag(FLAGS_metrics_port_file);
  return f;
}

}  // namespace packsched::sidecar
