#include "server/security/pem_check.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/base/file_check.h"
#include "server/base/status_macros.h"

namespace packsched::security {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

std::string Named(const NamedPath& file) { return absl::StrCat(file.name, "=", file.path); }

absl::Status Refused(const NamedPath& file, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Named(file), ": ", why));
}

Bio MemoryBio(absl::string_view pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The reason of the last OpenSSL error on this thread ("key values mismatch"), and clears the
// queue; "unknown" when there is none.
std::string LastError() {
  const unsigned long code = ERR_peek_last_error();  // NOLINT(google-runtime-int): OpenSSL's type
  ERR_clear_error();
  const char* reason = code == 0 ? nullptr : ERR_reason_error_string(code);
  return reason != nullptr ? reason : "unknown";
}

// The first certificate of `pem`, or null.
Cert FirstCertificate(absl::string_view pem) {
  Bio bio = MemoryBio(pem);
  if (bio == nullptr) return nullptr;
  return Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// The file's contents, after checking that it is a readable regular file and not empty.
absl::StatusOr<std::string> ReadChecked(const NamedPath& file) {
  if (absl::Status s = CheckReadableFile(file.path); !s.ok()) return Refused(file, s.message());
  std::ifstream in(file.path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  if (!in.good() && !in.eof()) return Refused(file, "cannot be read");
  if (contents.str().empty()) return Refused(file, "is empty");
  return contents.str();
}

}  // namespace

absl::Status CheckCertificates(const NamedPath& file, absl::string_view pem) {
  ERR_clear_error();
  Bio bio = MemoryBio(pem);
  if (bio == nullptr) return absl::ResourceExhaustedError("OpenSSL cannot allocate a BIO");
  int count = 0;
  while (Cert cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) ++count;
  // The loop ends on "no start line" at the end of the input: an error only before any
  // certificate, or when something else stopped it (a certificate that does not parse).
  const unsigned long last = ERR_peek_last_error();  // NOLINT(google-runtime-int)
  if (count > 0 && ERR_GET_REASON(last) == PEM_R_NO_START_LINE) {
    ERR_clear_error();
    return absl::OkStatus();
  }
  if (count == 0 && (last == 0 || ERR_GET_REASON(last) == PEM_R_NO_START_LINE)) {
    ERR_clear_error();
    return Refused(file, "no PEM certificate in it");
  }
  return Refused(file, absl::StrCat("a certificate does not parse (", LastError(), ")"));
}

absl::Status CheckKeyPair(const NamedPath& cert, absl::string_view cert_pem, const NamedPath& key,
                          absl::string_view key_pem) {
  ERR_clear_error();
  RETURN_IF_ERROR(CheckCertificates(cert, cert_pem));
  Bio bio = MemoryBio(key_pem);
  if (bio == nullptr) return absl::ResourceExhaustedError("OpenSSL cannot allocate a BIO");
  // An empty passphrase: an encrypted key fails here instead of prompting on the terminal.
  char empty[] = "";
  Key private_key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, empty));
  if (private_key == nullptr) {
    ERR_clear_error();
    return Refused(key,
                   "not a PEM private key (an encrypted key needs a passphrase gRPC cannot give)");
  }
  const Cert first = FirstCertificate(cert_pem);
  if (first == nullptr || X509_check_private_key(first.get(), private_key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(Named(key), " is not the private key of ",
                                                   Named(cert), " (", LastError(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckServerTlsFiles(const ServerTlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both");
  }
  if (files.cert.empty()) {
    if (files.client_ca.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("--tls_client_ca=", files.client_ca,
                                                   ": needs --tls_cert and --tls_key (TLS)"));
  }
  const NamedPath cert{"--tls_cert", files.cert};
  const NamedPath key{"--tls_key", files.key};
  ASSIGN_OR_RETURN(const std::string cert_pem, ReadChecked(cert));
  ASSIGN_OR_RETURN(const std::string key_pem, ReadChecked(key));
  RETURN_IF_ERROR(CheckKeyPair(cert, cert_pem, key, key_pem));
  if (!files.client_ca.empty())
    RETURN_IF_ERROR(CheckCertificateFile({"--tls_client_ca", files.client_ca}));
  return absl::OkStatus();
}

absl::Status CheckCertificateFile(const NamedPath& file) {
  ASSIGN_OR_RETURN(const std::string pem, ReadChecked(file));
  return CheckCertificates(file, pem);
}

}  // namespace packsched::security
