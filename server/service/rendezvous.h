#ifndef PACKSCHED_SERVER_SERVICE_RENDEZVOUS_H_
#define PACKSCHED_SERVER_SERVICE_RENDEZVOUS_H_

// The rank group's rendezvous store over gRPC (proto/packsched/v1/rendezvous.proto,
// docs/design.md §3): RendezvousServer serves an InMemoryStore on rank 0's --rendezvous address,
// and RendezvousStore is the KeyValueStore every rank (rank 0 included) uses to reach it. TLS and
// the bearer token: server/security/credentials.h.
//
// The server uses gRPC's callback API; a Get for a key that does not exist yet holds no thread:
// it registers an InMemoryStore watch and completes when the key is set, or with
// DEADLINE_EXCEEDED when the call's deadline passes (gRPC cancels the call; the watch is
// cancelled). The client channel reconnects fast (50 ms initial backoff, 500 ms at most) and its
// calls wait for the server to come up, so ranks started before rank 0 join quickly.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/store.h"

namespace packsched::service {

struct RendezvousTls {
  bool enabled = false;  // TLS on the rendezvous port (server: needs cert and key)
  // Server: PEM files of the certificate it presents (TLS when both are set) and, optionally,
  // the CA that must have signed client certificates. Client: the CA that signed the server's
  // certificate (`ca`; empty: the system roots) and, optionally, the client certificate/key.
  std::string cert;
  std::string key;
  std::string ca;
};

struct RendezvousServerOptions {
  std::string listen;  // host:port; port 0 picks a free port
  RendezvousTls tls;   // server side: cert + key (+ ca: require client certificates)
  // Bearer token every call must carry; empty = none. Accepted only over TLS or on loopback.
  std::string auth_token;
};

class RendezvousServer {
 public:
  // Serves `store` (not owned; must outlive the server). InvalidArgument for unreadable TLS
  // files, FailedPrecondition for a token without TLS off loopback, Unavailable if it cannot bind.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(
      collective::InMemoryStore* store, const RendezvousServerOptions& options);
  ~RendezvousServer();  // Shutdown() if not done

  int port() const;
  // Stops serving: waiting Gets end with CANCELLED/UNAVAILABLE on their clients. Idempotent.
  void Shutdown();

 private:
  struct State;
  explicit RendezvousServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

struct RendezvousClientOptions {
  std::string address;  // host:port of rank 0's rendezvous server
  RendezvousTls tls;    // client side: ca (+ cert/key for client certificates); empty: insecure
  std::string auth_token;
};

// A KeyValueStore backed by a remote RendezvousServer. Thread-safe. Every call is bounded by its
// deadline; calls wait (within it) for an unreachable server to come up, and then fail with
// DeadlineExceeded, except through FailFast(), where they fail at once with Unavailable. A call
// whose connection the channel dropped because rank 0 missed a keepalive ping (busy or stalled
// for seconds) is made again within its deadline, not failed (waiting view only). Errors name the
// rendezvous address.
class RendezvousStore final : public collective::KeyValueStore {
 public:
  static absl::StatusOr<std::unique_ptr<RendezvousStore>> Create(
      const RendezvousClientOptions& options);
  ~RendezvousStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key,
                                                    absl::Time deadline) override;
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired,
                                            absl::Time deadline) override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, absl::Time deadline) override;
  // The same channel, with calls that do not wait for the server to be reachable.
  collective::KeyValueStore& FailFast() override;
  // The channel's connectivity: true when it leaves READY before `deadline`, or left it since the
  // previous call (no request). One caller at a time.
  absl::StatusOr<bool> AwaitDisconnect(absl::Time deadline) override;

  // Ends every call in progress (a Get blocked until its deadline included) with Cancelled, and
  // makes every later call return Cancelled at once: what lets a shutting-down sidecar's stream
  // workers leave a group formation without waiting out --collective_timeout. Irreversible,
  // idempotent, thread-safe.
  void Cancel();

 private:
  struct State;
  class Call;
  explicit RendezvousStore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  std::unique_ptr<RendezvousStore> fail_fast_;  // null in the fail-fast view itself
};

// The local IP address this machine uses to reach `address` (host:port): what Gloo advertises
// by default. Resolves the host and connects a UDP socket (no packet is sent).
absl::StatusOr<std::string> LocalAddressTowards(absl::string_view address);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_RENDEZVOUS_H_
