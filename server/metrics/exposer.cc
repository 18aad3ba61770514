#include "server/metrics/exposer.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/base/thread_name.h"
#include "server/metrics/listen_socket.h"

namespace packsched::metrics {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

// One accepted connection: its request as read so far, then its answer as written so far.
struct Connection {
  int fd = -1;
  absl::Time deadline;
  std::string in;
  std::shared_ptr<const std::string> body;  // the cached exposition (200) or null
  std::string head;                         // status line and headers, or a whole error answer
  size_t written = 0;                       // of head + body
  bool answering = false;
};

std::string Answer(absl::string_view status, absl::string_view text) {
  return absl::StrCat("HTTP/1.1 ", status,
                      "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ",
                      text.size(), "\r\nConnection: close\r\n\r\n", text);
}

}  // namespace

// The poll loop: owns the listening socket, the wake-up eventfd and the connections.
class MetricsEndpoint::Loop {
 public:
  Loop(int listen_fd, int wake_fd, const SidecarMetrics& metrics, const Options& options)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), metrics_(metrics), options_(options) {}

  ~Loop() {
    for (Connection& c : connections_) close(c.fd);
    close(listen_fd_);
    close(wake_fd_);
  }

  void Stop() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  void Run() {
    NameThisThread("metrics-http");
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      absl::Time next = absl::InfiniteFuture();
      for (const Connection& c : connections_) {
        fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
        next = std::min(next, c.deadline);
      }
      int timeout_ms = -1;
      if (next != absl::InfiniteFuture()) {
        timeout_ms = static_cast<int>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
      }
      if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;
      // Connections first (their indices match fds[2...]), then new ones.
      const absl::Time now = absl::Now();
      for (size_t i = 0; i < connections_.size(); ++i) {
        Connection& c = connections_[i];
        if (fds[i + 2].revents != 0) Serve(c, now);
        if (c.fd >= 0 && now >= c.deadline) {
          close(c.fd);
          c.fd = -1;
        }
      }
      connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                        [](const Connection& c) { return c.fd < 0; }),
                         connections_.end());
      if (fds[1].revents != 0) Accept(now);
    }
  }

 private:
  void Accept(absl::Time now) {
    while (true) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left; anything else: try at the next readiness
      if (static_cast<int>(connections_.size()) >= options_.max_connections) {
        // The oldest connection makes room (connections_ is in accept order).
        close(connections_.front().fd);
        connections_.erase(connections_.begin());
      }
      Connection c;
      c.fd = fd;
      c.deadline = now + options_.request_timeout;
      connections_.push_back(std::move(c));
    }
  }

  // Reads what `c` sent or writes what is left of its answer; closes it (fd = -1) when done or
  // broken.
  void Serve(Connection& c, absl::Time now) {
    if (!c.answering) {
      char buffer[2048];
      const ssize_t n = read(c.fd, buffer, sizeof(buffer));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(c.fd);
        c.fd = -1;
        return;
      }
      if (n > 0) c.in.append(buffer, static_cast<size_t>(n));
      const size_t end =
          c.in.find("\r\n\r\n") != std::string::npos ? c.in.find("\r\n\r\n") : c.in.find("\n\n");
      if (end == std::string::npos) {
        if (c.in.size() > kMaxRequestBytes) {
          c.head = Answer("431 Request Header Fields Too Large", "request too large\n");
          c.answering = true;
        }
        return;
      }
      Route(c, now);
      c.answering = true;
    }
    while (true) {
      const size_t total = c.head.size() + (c.body ? c.body->size() : 0);
      if (c.written >= total) {
        shutdown(c.fd, SHUT_WR);
        close(c.fd);
        c.fd = -1;
        return;
      }
      const bool in_head = c.written < c.head.size();
      const char* data =
          in_head ? c.head.data() + c.written : c.body->data() + (c.written - c.head.size());
      const size_t left = in_head ? c.head.size() - c.written : total - c.written;
      const ssize_t n = send(c.fd, data, left, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        close(c.fd);
        c.fd = -1;
        return;
      }
      c.written += static_cast<size_t>(n);
      transferred_bytes_ += static_cast<uint64_t>(n);
    }
  }

  // The answer to the request line in c.in.
  void Route(Connection& c, absl::Time now) {
    absl::string_view line = c.in;
    line = line.substr(0, line.find_first_of("\r\n"));
    const size_t space = line.find(' ');
    const absl::string_view method = line.substr(0, space);
    absl::string_view target =
        space == absl::string_view::npos ? absl::string_view() : line.substr(space + 1);
    target = target.substr(0, target.find(' '));
    target = target.substr(0, target.find('?'));
    if (method != "GET" && method != "HEAD") {
      c.head = Answer("405 Method Not Allowed", "only GET /metrics\n");
      return;
    }
    if (target != "/metrics") {
      c.head = Answer("404 Not Found", "only GET /metrics\n");
      return;
    }
    if (exposition_ == nullptr || now - built_ >= options_.cache_interval) {
      exposition_ = std::make_shared<const std::string>(absl::StrCat(
          metrics_.Serialize(),
          "# HELP exposer_scrapes_total Scrapes of /metrics answered (before this one)\n"
          "# TYPE exposer_scrapes_total counter\nexposer_scrapes_total ",
          scrapes_,
          "\n# HELP exposer_transferred_bytes_total Bytes of /metrics answers sent (before this "
          "one)\n# TYPE exposer_transferred_bytes_total counter\nexposer_transferred_bytes_total ",
          transferred_bytes_, "\n"));
      built_ = now;
    }
    ++scrapes_;
    c.head = absl::StrCat(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        "Content-Length: ",
        exposition_->size(), "\r\nConnection: close\r\n\r\n");
    if (method == "GET") c.body = exposition_;
  }

  const int listen_fd_;
  const int wake_fd_;
  const SidecarMetrics& metrics_;
  const Options options_;
  std::vector<Connection> connections_;  // in accept order
  std::shared_ptr<const std::string> exposition_;
  absl::Time built_;
  uint64_t scrapes_ = 0;            // GET and HEAD /metrics answered
  uint64_t transferred_bytes_ = 0;  // every answer's bytes sent
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Loop> loop, int port, std::string address)
    : loop_(std::move(loop)), port_(port), address_(std::move(address)) {
  thread_ = std::thread([this] { loop_->Run(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  loop_->Stop();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, const SidecarMetrics& metrics, const Options& options) {
  absl::StatusOr<ListenSocket> socket = BindListenSocket("metrics_listen", listen);
  if (!socket.ok()) return socket.status();
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(socket->fd);
    return absl::UnavailableError("--metrics_listen: eventfd failed");
  }
  auto loop = std::make_unique<Loop>(socket->fd, wake_fd, metrics, options);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(loop), socket->port, socket->address));
}

}  // namespace packsched::metrics
