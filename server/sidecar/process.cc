#include "server/sidecar/process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace packsched::sidecar {
namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int /*signal*/) {
  const char byte = 1;
  const int saved = errno;
  [[maybe_unused]] ssize_t written = write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
  errno = saved;
}

}  // namespace

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

}  // namespace packsched::sidecar
