#ifndef PACKSCHED_SERVER_SECURITY_PEM_CHECK_H_
#define PACKSCHED_SERVER_SECURITY_PEM_CHECK_H_

// What the PEM files of a TLS flag hold, checked with OpenSSL (the library gRPC itself uses here)
// before anything is served: gRPC would only say that it cannot listen. Errors name each file
// as "<flag>=<path>" and say what is wrong with it.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/security/credentials.h"

namespace packsched::security {

// `pem` (the contents of `file`) holds at least one certificate and nothing that fails to
// parse as one. InvalidArgument "<name>=<path>: no PEM certificate in it" or "...: <OpenSSL's
// reason>".
absl::Status CheckCertificates(const NamedPath& file, absl::string_view pem);

// `key_pem` is an unencrypted PEM private key, and the public key of the first certificate of
// `cert_pem` is its own. InvalidArgument naming the file at fault: "<key>=<path>: not a PEM
// private key (an encrypted key needs a passphrase gRPC cannot give)" or "<key>=<path> is not
// the private key of <cert>=<path> (<OpenSSL's reason>)".
absl::Status CheckKeyPair(const NamedPath& cert, absl::string_view cert_pem, const NamedPath& key,
                          absl::string_view key_pem);

// The files of a server (--tls_cert, --tls_key, --tls_client_ca), read and checked: cert and key
// given together, a client CA only with them, each a readable regular file holding what its
// flag says, the key matching the certificate. InvalidArgument naming the flag(s) and file(s).
absl::Status CheckServerTlsFiles(const ServerTlsFiles& files);

// A CA bundle given by a flag (--rendezvous_tls_ca, --probe_tls_ca): a readable regular file
// holding at least one certificate. InvalidArgument "<name>=<path>: <why>".
absl::Status CheckCertificateFile(const NamedPath& file);

}  // namespace packsched::security

#endif  // PACKSCHED_SERVER_SECURITY_PEM_CHECK_H_
