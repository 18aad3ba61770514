#ifndef PACKSCHED_SERVER_SIDECAR_PROBE_H_
#define PACKSCHED_SERVER_SIDECAR_PROBE_H_

// `packsched-server --probe=HOST:PORT`: one grpc.health.v1 check for exec probes (Kubernetes'
// own grpc probes dial the pod IP, not the loopback the sidecar listens on).

#include <string>

namespace packsched::sidecar {

// The flags of probe mode, as given (flags.h: ProbeFlagsFromFlags).
struct ProbeFlags {
  std::string target;   // --probe; empty: not probe mode
  std::string service;  // --probe_service: "" = liveness, packsched.v1.Scheduler = readiness
  // The server's own TLS flags: with tls_cert the probe speaks TLS, verifying the server against
  // tls_ca (--probe_tls_ca, default tls_client_ca) and presenting tls_cert/tls_key, which a
  // server with --tls_client_ca requires.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string tls_ca;           // --probe_tls_ca
  std::string tls_server_name;  // --probe_tls_server_name; empty: the host of the target
};

// Runs the check: the process's exit code (0 if SERVING, else 1, with one line on stderr).
int RunProbe(const ProbeFlags& flags);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_PROBE_H_
