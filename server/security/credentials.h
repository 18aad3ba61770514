#ifndef PACKSCHED_SERVER_SECURITY_CREDENTIALS_H_
#define PACKSCHED_SERVER_SECURITY_CREDENTIALS_H_

// TLS credentials and the bearer-token rules of every gRPC endpoint of packsched, in one place:
// the sidecar's Scheduler port (server/service/server.cc), the rank group's rendezvous store,
// server and client (server/service/rendezvous.cc), the exec health probe
// (server/service/health_probe.cc) and the C++ client (client/cpp/scheduler_client.cc, which
// links this library privately: its public header promises no gRPC).
//
//   files     ReadPemFile, ReadTokenFile: errors name the flag or option the path came from;
//             what the PEM files hold (a key that matches its certificate): pem_check.h
//   servers   MakeServerCredentials (plaintext, or TLS optionally requiring client
//             certificates); CheckTokenMayBeAccepted
//   channels  MakeChannel (plaintext, or TLS with a CA, a client certificate and a server-name
//             override); CheckTokenMayBeSent
//   tokens    "authorization: Bearer <token>": AddBearerToken on a call, AuthorizationOf and
//             CheckBearerToken (constant-time) on the server
//
// A bearer token travels without TLS only to or on loopback, as IsLoopbackAddress
// (server/base/address.h) defines it: a numeric 127.0.0.0/8 or ::1 address, `localhost`, or a
// unix: socket; a name that merely starts with "127." is not. (The Python client applies the
// same rule itself, client/python/packsched/client.py.)

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace packsched::security {

// ---- Files ----------------------------------------------------------------------------------

// A file given by a flag or an option: errors name it by `name` ("--tls_cert",
// "tls_root_certs_file").
struct NamedPath {
  std::string name;
  std::string path;  // empty: not given
};

// The whole file. InvalidArgument "<name> = '<path>': cannot be read" when it cannot be opened
// (or is a directory), "<name> = '<path>' is empty" when it is empty (an empty CA bundle would
// mean gRPC's default roots).
absl::StatusOr<std::string> ReadPemFile(const NamedPath& file);

// A bearer token: the file's contents without surrounding whitespace. InvalidArgument when it
// cannot be read (or is a directory) or holds nothing but whitespace ("<name> = '<path>' is
// empty").
absl::StatusOr<std::string> ReadTokenFile(const NamedPath& file);

// ---- Servers --------------------------------------------------------------------------------

// The PEM files of a server: both of the sidecar's servers (the Scheduler port and rank 0's
// rendezvous port) take them from --tls_cert, --tls_key and --tls_client_ca, and errors name
// those flags.
struct ServerTlsFiles {
  std::string cert;       // certificate chain; with `key`: TLS only
  std::string key;        // its private key
  std::string client_ca;  // CA bundle: require client certificates it signed (needs TLS)
};

// Plaintext credentials when no file is given; TLS with cert + key, requiring and verifying
// client certificates when client_ca is set too. InvalidArgument for a cert without its key (or
// the reverse), a client CA without TLS, a file that cannot be read, or a key that is not the
// certificate's (naming both files: pem_check.h, CheckKeyPair).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

// A server accepts a bearer token only over TLS or on a loopback listen address. OK when `token`
// is empty, `tls` is true or `listen` is loopback; otherwise FailedPrecondition "a bearer token
// is accepted only over TLS or on loopback: <what> <listen> needs --tls_cert and --tls_key",
// where `what` names the address ("--listen =", "the rendezvous address").
absl::Status CheckTokenMayBeAccepted(absl::string_view token, bool tls, absl::string_view listen,
                                     absl::string_view what);

// ---- Channels -------------------------------------------------------------------------------

// How a channel speaks TLS (PEM files).
struct ChannelTls {
  NamedPath root_certs;  // the CA bundle that signed the server's certificate; empty: system roots
  // A client certificate chain and its key, for a server that requires one; both or neither.
  NamedPath cert;
  NamedPath key;
  // The name the server's certificate must carry; empty: the host of the target.
  std::string server_name;
};

// A channel to `target` with `args` (connected lazily): plaintext without `tls`, else TLS as
// `tls` says. InvalidArgument for a client certificate without its key (or the reverse) or a
// file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const std::optional<ChannelTls>& tls,
    grpc::ChannelArguments args = grpc::ChannelArguments());

// A client sends a bearer token in plaintext only to a loopback target (anyone on the way, or a
// wrong target, could read it). OK when `token` is empty, `tls` is true or `target` is loopback;
// otherwise FailedPrecondition "a bearer token is sent only over TLS or to loopback: <what>
// <target> needs <remedy>" (what: "target =", "--rendezvous ="; remedy: the option or flag that
// turns TLS on).
absl::Status CheckTokenMayBeSent(absl::string_view token, bool tls, absl::string_view target,
                                 absl::string_view what, absl::string_view remedy);

// ---- Bearer tokens --------------------------------------------------------------------------

// The metadata key and scheme of a bearer token: "authorization: Bearer <token>".
inline constexpr absl::string_view kAuthorizationKey = "authorization";
inline constexpr absl::string_view kBearerPrefix = "Bearer ";

// Adds "authorization: Bearer <token>" to a call; nothing when `token` is empty.
void AddBearerToken(grpc::ClientContext& context, absl::string_view token);

// The call's `authorization` metadata value, nullopt when it sent none.
std::optional<absl::string_view> AuthorizationOf(const grpc::ServerContextBase& context);

// True when `a` and `b` are equal; the time taken depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Checks a call's `authorization` metadata value (nullopt when the call sent none) against the
// server's bearer `token`; every call passes when `token` is empty. Unauthenticated for a
// missing or wrong token (compared in constant time) or another scheme.
absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              absl::string_view token);

}  // namespace packsched::security

#endif  // PACKSCHED_SERVER_SECURITY_CREDENTIALS_H_
