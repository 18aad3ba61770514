#ifndef PACKSCHED_SERVER_SIDECAR_STATUS_H_
#define PACKSCHED_SERVER_SIDECAR_STATUS_H_

// `packsched-server --status=HOST:PORT`: one GetStatus call, printed for people (a table of the
// group and the streams) or, with --status_json, as JSON for programs.

#include <string>

#include "packsched/v1/scheduler.pb.h"
#include "server/sidecar/probe.h"

namespace packsched::sidecar {

// The flags of status mode, as given (flags.h: StatusFlagsFromFlags).
struct StatusFlags {
  std::string target;  // --status; empty: not status mode
  bool json = false;   // --status_json
  // TLS as the probe speaks it (--tls_*, --probe_tls_*), and the bearer token
  // (--auth_token_file, read by RunStatus).
  ProbeFlags tls;
  std::string auth_token_file;
};

// Runs the call and prints the answer on stdout: the process's exit code (0, or 1 with one line
// on stderr when the call fails).
int RunStatus(const StatusFlags& flags);

// The human table of `status` (what RunStatus prints without --status_json).
std::string StatusTable(const v1::GetStatusResponse& status);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_STATUS_H_
