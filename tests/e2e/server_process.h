#ifndef PACKSCHED_TESTS_E2E_SERVER_PROCESS_H_
#define PACKSCHED_TESTS_E2E_SERVER_PROCESS_H_

// Runs the real packsched-server binary on loopback for a test: port 0 plus --port_file, waits
// until the port file appears, and stops the process (SIGTERM, then SIGKILL) when destroyed.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/temp_dir.h"

namespace packsched::testing {

// A loopback port that was free just now (bound, read, released), or 0 if none could be bound.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

class ServerProcess {
 public:
  // Starts PACKSCHED_SERVER_PATH with `flags` (plus --port_file, and --listen=127.0.0.1:0 unless
  // `flags` has a --listen). Check started() / port(). `binary`: another build's server (a
  // benchmark's baseline).
  explicit ServerProcess(std::vector<std::string> flags,
                         std::string binary = PACKSCHED_SERVER_PATH) {
    const std::string port_file = dir_.File("port");
    bool has_listen = false;
    for (const std::string& flag : flags) has_listen |= flag.rfind("--listen=", 0) == 0;
    if (!has_listen) flags.push_back("--listen=127.0.0.1:0");
    flags.push_back(absl::StrCat("--port_file=", port_file));
    stderr_path_ = dir_.File("stderr");
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
      std::vector<char*> argv;
      argv.push_back(binary.data());
      for (std::string& flag : flags) argv.push_back(flag.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      const std::string contents = ReadAll(port_file);
      if (!contents.empty()) {
        port_ = std::atoi(contents.c_str());
        port_file_contents_ = contents;
        return;
      }
      if (Exited(absl::ZeroDuration())) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  ~ServerProcess() {
    if (exit_status_) return;
    kill(pid_, SIGTERM);
    if (!Exited(absl::Seconds(10))) {
      kill(pid_, SIGKILL);
      Exited(absl::Seconds(10));
    }
  }

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  const std::string& port_file_contents() const { return port_file_contents_; }
  std::string stderr_text() const { return ReadAll(stderr_path_); }

  // Waits up to `timeout` for the process to exit; true (and exit_status() set) if it did.
  bool Exited(absl::Duration timeout) {
    if (exit_status_) return true;
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_status_ = status;
        return true;
      }
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  std::optional<int> exit_status() const { return exit_status_; }

 private:
  TempDir dir_{"e2e"};
  pid_t pid_ = -1;
  int port_ = 0;
  std::string port_file_contents_;
  std::string stderr_path_;
  std::optional<int> exit_status_;
};

}  // namespace packsched::testing

#endif  // PACKSCHED_TESTS_E2E_SERVER_PROCESS_H_
