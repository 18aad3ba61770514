#include "server/security/credentials.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "server/base/address.h"
#include "server/base/status_macros.h"
#include "server/security/pem_check.h"

namespace packsched::security {
namespace {

absl::Status Unreadable(const NamedPath& file) {
  return absl::InvalidArgumentError(
      absl::StrCat(file.name, " = '", file.path, "': cannot be read"));
}

absl::Status Empty(const NamedPath& file) {
  return absl::InvalidArgumentError(absl::StrCat(file.name, " = '", file.path, "' is empty"));
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const NamedPath& file) {
  std::error_code error;
  if (std::filesystem::is_directory(file.path, error)) return Unreadable(file);
  std::ifstream in(file.path, std::ios::binary);
  if (!in) return Unreadable(file);
  std::stringstream contents;
  contents << in.rdbuf();
  // Never empty: gRPC would take an empty CA bundle for "the system roots".
  if (contents.str().empty()) return Empty(file);
  return contents.str();
}

absl::StatusOr<std::string> ReadTokenFile(const NamedPath& file) {
  // Reading a directory through a stream throws (and aborts the process).
  std::error_code error;
  if (std::filesystem::is_directory(file.path, error)) return Unreadable(file);
  std::ifstream in(file.path);
  if (!in) return Unreadable(file);
  const std::string contents((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  std::string token(absl::StripAsciiWhitespace(contents));
  if (token.empty()) return Empty(file);
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (files.cert.empty()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadPemFile({"--tls_key", files.key}));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile({"--tls_cert", files.cert}));
  if (!files.client_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile({"--tls_client_ca", files.client_ca}));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  // gRPC would take a key of another certificate and then only fail to listen.
  RETURN_IF_ERROR(CheckKeyPair({"--tls_cert", files.cert}, pair.cert_chain,
                               {"--tls_key", files.key}, pair.private_key));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(ssl);
}

absl::Status CheckTokenMayBeAccepted(absl::string_view token, bool tls, absl::string_view listen,
                                     absl::string_view what) {
  if (token.empty() || tls || IsLoopbackAddress(listen)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("a bearer token is accepted only over TLS or on loopback: ", what, " ", listen,
                   " needs --tls_cert and --tls_key"));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const std::optional<ChannelTls>& tls,
                                                           grpc::ChannelArguments args) {
  if (!tls.has_value()) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  if (tls->cert.path.empty() != tls->key.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tls->cert.name, " and ", tls->key.name, " go together"));
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls->root_certs.path.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(tls->root_certs));
  }
  if (!tls->cert.path.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile(tls->cert));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile(tls->key));
  }
  if (!tls->server_name.empty()) args.SetSslTargetNameOverride(tls->server_name);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

absl::Status CheckTokenMayBeSent(absl::string_view token, bool tls, absl::string_view target,
                                 absl::string_view what, absl::string_view remedy) {
  if (token.empty() || tls || IsLoopbackAddress(target)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("a bearer token is sent only over TLS or to loopback: ", what, " ", target,
                   " needs ", remedy));
}

void AddBearerToken(grpc::ClientContext& context, absl::string_view token) {
  if (token.empty()) return;
  context.AddMetadata(std::string(kAuthorizationKey), absl::StrCat(kBearerPrefix, token));
}

std::optional<absl::string_view> AuthorizationOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto it =
      metadata.find(grpc::string_ref(kAuthorizationKey.data(), kAuthorizationKey.size()));
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              absl::string_view token) {
  if (token.empty()) return absl::OkStatus();
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  if (!absl::StartsWith(*authorization, kBearerPrefix) ||
      !ConstantTimeEquals(authorization->substr(kBearerPrefix.size()), token)) {
    return absl::UnauthenticatedError("wrong bearer token");
  }
  return absl::OkStatus();
}

}  // namespace packsched::security
