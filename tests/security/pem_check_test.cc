// What the PEM files of the TLS flags hold, checked before anything is served: a key that is
// not its certificate's is named with both files (gRPC would only fail to listen). Skipped
// without the openssl command, which makes the files.

#include "server/security/pem_check.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/security/credentials.h"
#include "tests/testing/temp_dir.h"

namespace packsched::security {
namespace {

using ::testing::HasSubstr;

using ::packsched::testing::TempDir;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

class PemCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two self-signed pairs, a passphrase-locked copy of a's key, a bundle and a non-PEM file.
    const std::string script = absl::StrCat(
        "(cd '", dir_.path(), "' && for n in a b; do ",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $n.key "
        "-out $n.pem -days 1 -subj /CN=$n || exit 1; done && ",
        "openssl ec -in a.key -aes256 -passout pass:secret -out locked.key && ",
        "cat a.pem b.pem > both.pem && printf 'not pem\\n' > junk.pem) > '", dir_.File("log"),
        "' 2>&1");
    if (std::system(script.c_str()) != 0) {
      GTEST_SKIP() << "openssl could not make certificates";
    }
  }

  std::string File(const std::string& name) const { return dir_.File(name); }

  TempDir dir_;
};

TEST_F(PemCheck, AKeyAndItsCertificatePass) {
  EXPECT_TRUE(CheckServerTlsFiles({File("a.pem"), File("a.key"), ""}).ok());
  EXPECT_TRUE(CheckServerTlsFiles({File("a.pem"), File("a.key"), File("both.pem")}).ok());
  EXPECT_TRUE(CheckServerTlsFiles({}).ok());
  EXPECT_TRUE(CheckCertificateFile({"--probe_tls_ca", File("both.pem")}).ok());
}

TEST_F(PemCheck, AKeyOfAnotherCertificateNamesBothFiles) {
  const absl::Status status = CheckServerTlsFiles({File("a.pem"), File("b.key"), ""});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), absl::StrCat("--tls_key=", File("b.key"),
                                          " is not the private key of --tls_cert=", File("a.pem"),
                                          " (key values mismatch)"));
  // The server's own credentials say the same, where gRPC said "cannot listen".
  EXPECT_EQ(Message(MakeServerCredentials({File("a.pem"), File("b.key"), ""}).status()),
            Message(status));
}

TEST_F(PemCheck, FilesThatDoNotHoldWhatTheirFlagSays) {
  EXPECT_EQ(Message(CheckServerTlsFiles({File("a.key"), File("a.key"), ""})),
            absl::StrCat("--tls_cert=", File("a.key"), ": no PEM certificate in it"));
  EXPECT_EQ(Message(CheckServerTlsFiles({File("a.pem"), File("a.pem"), ""})),
            absl::StrCat("--tls_key=", File("a.pem"),
                         ": not a PEM private key (an encrypted key needs a passphrase gRPC "
                         "cannot give)"));
  EXPECT_THAT(Message(CheckServerTlsFiles({File("a.pem"), File("locked.key"), ""})),
              HasSubstr("not a PEM private key"));
  EXPECT_EQ(Message(CheckServerTlsFiles({File("a.pem"), File("a.key"), File("junk.pem")})),
            absl::StrCat("--tls_client_ca=", File("junk.pem"), ": no PEM certificate in it"));
  EXPECT_EQ(Message(CheckCertificateFile({"--rendezvous_tls_ca", File("missing.pem")})),
            absl::StrCat("--rendezvous_tls_ca=", File("missing.pem"), ": no such file"));
  EXPECT_EQ(Message(CheckCertificateFile({"--rendezvous_tls_ca", dir_.path()})),
            absl::StrCat("--rendezvous_tls_ca=", dir_.path(), ": is a directory, not a file"));
}

TEST_F(PemCheck, FlagsThatGoTogether) {
  EXPECT_EQ(Message(CheckServerTlsFiles({File("a.pem"), "", ""})),
            "--tls_cert and --tls_key go together: give both");
  EXPECT_EQ(
      Message(CheckServerTlsFiles({"", "", File("a.pem")})),
      absl::StrCat("--tls_client_ca=", File("a.pem"), ": needs --tls_cert and --tls_key (TLS)"));
}

}  // namespace
}  // namespace packsched::security
