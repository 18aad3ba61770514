#include "server/sidecar/probe.h"

#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/service/health_probe.h"

namespace packsched::sidecar {

// One health check, its outcome in the exit code and one line on stderr. With --tls_cert (the
// server's own TLS flags) it speaks TLS: verifying the server against --probe_tls_ca (default
// --tls_client_ca) and presenting --tls_cert/--tls_key, which a server with --tls_client_ca
// requires.
int RunProbe(const ProbeFlags& flags) {
  const std::string& target = flags.target;
  const std::string& health_service = flags.service;
  std::optional<service::ProbeTls> tls;
  if (!flags.tls_cert.empty()) {
    tls.emplace();
    tls->root_certs_file = flags.tls_ca;
    if (tls->root_certs_file.empty()) tls->root_certs_file = flags.tls_client_ca;
    if (tls->root_certs_file.empty()) {
      std::fprintf(stderr,
                   "packsched-server --probe: with --tls_cert, give --probe_tls_ca (the CA that "
                   "signed the server's certificate) or --tls_client_ca\n");
      return 1;
    }
    tls->cert_file = flags.tls_cert;
    tls->key_file = flags.tls_key;
    tls->server_name = flags.tls_server_name;
  }
  absl::StatusOr<service::Serving> serving = service::CheckHealth(
      target, health_service, absl::Now() + absl::Seconds(5), tls ? &*tls : nullptr);
  if (!serving.ok()) {
    std::fprintf(stderr, "packsched-server --probe: %s\n", serving.status().ToString().c_str());
    return 1;
  }
  if (*serving != service::Serving::kServing) {
    std::fprintf(stderr, "packsched-server --probe: '%s' at %s is not serving (status %d)\n",
                 health_service.c_str(), target.c_str(), static_cast<int>(*serving));
    return 1;
  }
  return 0;
}

}  // namespace packsched::sidecar
