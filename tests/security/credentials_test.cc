// packsched::credentials (server/security/credentials.h): reading PEM and token files, server
// and channel credentials, where a bearer token may go without TLS, and the token check. Which
// addresses count as loopback in general: tests/base/address_test.cc.

#include "server/security/credentials.h"

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace packsched::security {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using ::packsched::testing::TempDir;

std::string Write(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// ---- Files

TEST(ReadPemFile, ReadsTheWholeFileAsIs) {
  TempDir dir;
  const std::string contents("-----BEGIN X-----\r\nAB\0CD\n-----END X-----\n", 40);
  const absl::StatusOr<std::string> read =
      ReadPemFile({"--tls_cert", Write(dir.File("a.pem"), contents)});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, contents);
}

TEST(ReadPemFile, AnUnreadableFileIsInvalidArgumentNamingTheFlagAndThePath) {
  TempDir dir;
  const std::string missing = dir.File("missing.pem");
  const absl::Status status = ReadPemFile({"--tls_client_ca", missing}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), absl::StrCat("--tls_client_ca = '", missing, "': cannot be read"));
  const absl::Status directory = ReadPemFile({"tls_root_certs_file", dir.path()}).status();
  EXPECT_EQ(directory.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(directory), HasSubstr("cannot be read"));
}

TEST(ReadPemFile, AnEmptyFileIsRefused) {
  // gRPC would take an empty CA bundle for the system roots.
  TempDir dir;
  const std::string empty = Write(dir.File("empty.pem"), "");
  const absl::Status status = ReadPemFile({"--rendezvous_tls_ca", empty}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), absl::StrCat("--rendezvous_tls_ca = '", empty, "' is empty"));
}

TEST(ReadTokenFile, StripsSurroundingWhitespace) {
  TempDir dir;
  const absl::StatusOr<std::string> token =
      ReadTokenFile({"--auth_token_file", Write(dir.File("token"), "  s3cret token\n\n")});
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret token");
}

TEST(ReadTokenFile, RefusesAnEmptyOrUnreadableFile) {
  TempDir dir;
  const std::string blank = Write(dir.File("blank"), " \n\t\n");
  const absl::Status empty = ReadTokenFile({"--auth_token_file", blank}).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(empty), absl::StrCat("--auth_token_file = '", blank, "' is empty"));
  const absl::Status missing = ReadTokenFile({"--auth_token_file", dir.File("none")}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(missing), HasSubstr("cannot be read"));
}

// ---- Server credentials

TEST(MakeServerCredentials, PlaintextWithoutFiles) {
  const auto credentials = MakeServerCredentials({});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_NE(*credentials, nullptr);
}

TEST(MakeServerCredentials, CertificateAndKeyGoTogether) {
  TempDir dir;
  const std::string pem = Write(dir.File("x.pem"), "x");
  for (const ServerTlsFiles& files :
       {ServerTlsFiles{pem, "", ""}, ServerTlsFiles{"", pem, ""}, ServerTlsFiles{pem, "", pem}}) {
    const absl::Status status = MakeServerCredentials(files).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(status), "--tls_cert and --tls_key go together");
  }
}

TEST(MakeServerCredentials, AClientCaNeedsTls) {
  TempDir dir;
  const absl::Status status =
      MakeServerCredentials({"", "", Write(dir.File("ca.pem"), "x")}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), HasSubstr("--tls_client_ca needs --tls_cert and --tls_key"));
}

TEST(MakeServerCredentials, UnreadableFilesAreNamedByTheirFlag) {
  TempDir dir;
  const std::string pem = Write(dir.File("x.pem"), "x");
  const std::string missing = dir.File("missing.pem");
  EXPECT_THAT(Message(MakeServerCredentials({pem, missing, ""}).status()),
              AllOf(HasSubstr("--tls_key = '"), HasSubstr(missing)));
  EXPECT_THAT(Message(MakeServerCredentials({missing, pem, ""}).status()),
              HasSubstr("--tls_cert = '"));
  EXPECT_THAT(Message(MakeServerCredentials({pem, pem, missing}).status()),
              HasSubstr("--tls_client_ca = '"));
}

// ---- Channels

TEST(MakeChannel, PlaintextWithoutTls) {
  const auto channel = MakeChannel("127.0.0.1:1", std::nullopt);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_NE(*channel, nullptr);
}

TEST(MakeChannel, AClientCertificateAndItsKeyGoTogether) {
  TempDir dir;
  const std::string pem = Write(dir.File("x.pem"), "x");
  ChannelTls tls;
  tls.root_certs = {"tls_root_certs_file", pem};
  tls.cert = {"tls_client_cert_file", pem};
  tls.key = {"tls_client_key_file", ""};
  absl::Status status = MakeChannel("127.0.0.1:1", tls).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), "tls_client_cert_file and tls_client_key_file go together");
  std::swap(tls.cert.path, tls.key.path);  // a key without its certificate
  EXPECT_EQ(MakeChannel("127.0.0.1:1", tls).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeChannel, UnreadableFilesAreNamedAsTheCallerSays) {
  TempDir dir;
  const std::string pem = Write(dir.File("x.pem"), "x");
  const std::string missing = dir.File("missing.pem");
  ChannelTls tls;
  tls.root_certs = {"--rendezvous_tls_ca", missing};
  EXPECT_EQ(Message(MakeChannel("h:1", tls).status()),
            absl::StrCat("--rendezvous_tls_ca = '", missing, "': cannot be read"));
  tls.root_certs.path = "";  // the system roots
  EXPECT_TRUE(MakeChannel("h:1", tls).ok());
  tls.cert = {"--tls_cert", pem};
  tls.key = {"--tls_key", missing};
  EXPECT_THAT(Message(MakeChannel("h:1", tls).status()), HasSubstr("--tls_key = '"));
}

// A real handshake: a server with MakeServerCredentials (requiring client certificates) and
// channels with MakeChannel, connected or refused. Skipped without openssl.
TEST(Credentials, TlsHandshakeWithClientCertificatesAndServerNameOverride) {
  TempDir dir;
  const std::string d = dir.path();
  const std::string script = absl::StrCat(
      "cd '", d, "' && ",
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key "
      "-out ca.pem -days 1 -subj /CN=packsched-test-ca && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key "
      "-out server.csr -subj /CN=sidecar.test && ",
      "printf 'subjectAltName=DNS:sidecar.test' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
      "-days 1 -extfile san.ext && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout client.key "
      "-out client.csr -subj /CN=client && ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
      "-days 1 > openssl.log 2>&1");
  if (std::system(script.c_str()) != 0) GTEST_SKIP() << "openssl could not make certificates";

  const auto server_credentials =
      MakeServerCredentials({dir.File("server.pem"), dir.File("server.key"), dir.File("ca.pem")});
  ASSERT_TRUE(server_credentials.ok()) << server_credentials.status();
  int port = 0;
  grpc::CallbackGenericService service;  // answers UNIMPLEMENTED; only the handshake matters
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", *server_credentials, &port);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(port, 0);
  const std::string target = absl::StrCat("127.0.0.1:", port);

  // Whether a channel completes its handshake within `seconds` (a refused one never does).
  auto connects = [&](const std::optional<ChannelTls>& tls, int seconds) {
    const auto channel = MakeChannel(target, tls);
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (!channel.ok()) return false;
    return (*channel)->WaitForConnected(std::chrono::system_clock::now() +
                                        std::chrono::seconds(seconds));
  };
  ChannelTls tls;
  tls.root_certs = {"ca", dir.File("ca.pem")};
  tls.cert = {"cert", dir.File("client.pem")};
  tls.key = {"key", dir.File("client.key")};
  tls.server_name = "sidecar.test";  // the certificate's name, not the target's host
  EXPECT_TRUE(connects(tls, 10));
  ChannelTls wrong_name = tls;
  wrong_name.server_name = "elsewhere.test";
  EXPECT_FALSE(connects(wrong_name, 2));
  ChannelTls no_client_certificate = tls;
  no_client_certificate.cert.path.clear();
  no_client_certificate.key.path.clear();
  EXPECT_FALSE(connects(no_client_certificate, 2));
  EXPECT_FALSE(connects(std::nullopt, 2));  // plaintext against TLS
  server->Shutdown();
}

// ---- Where a bearer token may go without TLS

TEST(CheckTokenMayBeAccepted, OnlyOverTlsOrOnLoopback) {
  EXPECT_TRUE(CheckTokenMayBeAccepted("", false, "0.0.0.0:50051", "--listen =").ok());  // no token
  EXPECT_TRUE(CheckTokenMayBeAccepted("t", true, "0.0.0.0:50051", "--listen =").ok());
  for (const char* loopback :
       {"127.0.0.1:50051", "127.9.9.9:0", "[::1]:1", "localhost:1", "unix:/run/packsched.sock"}) {
    EXPECT_TRUE(CheckTokenMayBeAccepted("t", false, loopback, "--listen =").ok()) << loopback;
  }
  const absl::Status status = CheckTokenMayBeAccepted("t", false, "0.0.0.0:50051", "--listen =");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(status),
            "a bearer token is accepted only over TLS or on loopback: --listen = 0.0.0.0:50051 "
            "needs --tls_cert and --tls_key");
  EXPECT_EQ(CheckTokenMayBeAccepted("t", false, "[::]:29400", "the rendezvous address").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CheckTokenMayBeSent, OnlyOverTlsOrToLoopback) {
  EXPECT_TRUE(CheckTokenMayBeSent("", false, "10.0.0.7:1", "target =", "tls").ok());
  EXPECT_TRUE(CheckTokenMayBeSent("t", true, "10.0.0.7:1", "target =", "tls").ok());
  for (const char* loopback :
       {"127.0.0.1:50051", "dns:///localhost:50051", "ipv6:[::1]:1", "unix-abstract:packsched"}) {
    EXPECT_TRUE(CheckTokenMayBeSent("t", false, loopback, "target =", "tls").ok()) << loopback;
  }
  // A name that merely starts with "127." resolves wherever its owner likes.
  for (const char* remote : {"127.evil.example:50051", "127.0.0.1.nip.io:1", "10.0.0.7:50051",
                             "sidecar.example.com:50051", ""}) {
    EXPECT_EQ(CheckTokenMayBeSent("t", false, remote, "target =", "tls").code(),
              absl::StatusCode::kFailedPrecondition)
        << remote;
  }
  EXPECT_EQ(Message(CheckTokenMayBeSent("t", false, "10.0.0.7:29400",
                                        "--rendezvous =", "--rendezvous_tls")),
            "a bearer token is sent only over TLS or to loopback: --rendezvous = 10.0.0.7:29400 "
            "needs --rendezvous_tls");
}

// ---- The token check

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));  // a trailing NUL counts
}

TEST(CheckBearerToken, AcceptsOnlyTheServersTokenInTheBearerScheme) {
  EXPECT_TRUE(CheckBearerToken(std::nullopt, "").ok());  // no token configured: every call passes
  EXPECT_TRUE(CheckBearerToken("anything", "").ok());
  EXPECT_TRUE(CheckBearerToken("Bearer s3cret", "s3cret").ok());
  EXPECT_EQ(CheckBearerToken(std::nullopt, "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Bearer wrong", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Basic s3cret", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("bearer s3cret", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Bearer s3cret2", "s3cret").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Bearer s3cre", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("s3cret", "s3cret").code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace packsched::security
