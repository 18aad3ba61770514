#ifndef PACKSCHED_SERVER_SIDECAR_PROCESS_H_
#define PACKSCHED_SERVER_SIDECAR_PROCESS_H_

// The process around packsched-server: SIGTERM/SIGINT (a self-pipe), SIGPIPE ignored, and
// --port_file.

#include <string>

#include "absl/status/status.h"

namespace packsched::sidecar {

// Makes SIGTERM and SIGINT wake WaitForSignal, and ignores SIGPIPE (Gloo writes to peers'
// sockets without MSG_NOSIGNAL: a peer that died must fail the round, not kill the process).
absl::Status InstallSignalHandlers();

// Blocks until SIGTERM or SIGINT (after InstallSignalHandlers).
void WaitForSignal();

// Writes "PORT\n" to `path` atomically: a reader sees no file or the whole line.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_PROCESS_H_
