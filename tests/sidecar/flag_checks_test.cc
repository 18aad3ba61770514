// Every flag of packsched-server checked before anything starts (flag_checks.h): a table of bad
// values, at least one per flag (a flag without a row fails the test), each refused with one
// line naming the flag, its value and the rule.

#include "server/sidecar/flag_checks.h"

#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sidecar/machine_checks.h"
#include "tests/testing/temp_dir.h"

namespace packsched::sidecar {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::packsched::testing::TempDir;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// One bad value: `flag` set to `value`, after the flags of `with`; CheckFlags's message must
// start with `message` ("{dir}" in any of them is a fresh directory holding `token`, a file
// holding only whitespace `blank`, and a PEM file `junk.pem` that is no certificate).
struct BadValue {
  std::string flag;
  std::string value;
  std::vector<std::pair<std::string, std::string>> with;
  std::string message;
};

std::vector<BadValue> BadValues() {
  return {
      {"listen", "127.0.0.1:99999", {}, "--listen=127.0.0.1:99999: port must be 0..65535"},
      {"listen", "localhost", {}, "--listen=localhost: no port"},
      {"port_file", "{dir}/none/port", {}, "--port_file={dir}/none/port: its directory"},
      {"log_level", "loud", {}, "--log_level=loud: log level 'loud' is not one of"},
      {"tls_cert",
       "{dir}/none.pem",
       {{"tls_key", "{dir}/token"}},
       "--tls_cert={dir}/none.pem: no such file"},
      {"tls_key", "{dir}/token", {}, "--tls_cert and --tls_key go together"},
      {"tls_client_ca", "{dir}/junk.pem", {}, "--tls_client_ca={dir}/junk.pem: needs --tls_cert"},
      {"auth_token_file", "{dir}", {}, "--auth_token_file={dir}: is a directory, not a file"},
      {"auth_token_file", "{dir}/blank", {}, "--auth_token_file={dir}/blank: is empty"},
      {"auth_token_file",
       "{dir}/token",
       {{"listen", "0.0.0.0:0"}},
       "--auth_token_file={dir}/token: a bearer token is accepted only over TLS or on loopback"},
      {"max_sequences_per_request", "0", {}, "--max_sequences_per_request=0: must be 1..67108864"},
      {"max_micro_batches", "67108865", {}, "--max_micro_batches=67108865: must be 1..67108864"},
      {"max_streams", "0", {}, "--max_streams=0: must be 1..4096"},
      {"max_streams", "4097", {}, "--max_streams=4097: must be 1..4096"},
      {"stream_idle_timeout", "-1s", {}, "--stream_idle_timeout=-1s: must be 0..8760h"},
      {"stream_idle_timeout", "inf", {}, "--stream_idle_timeout=inf: must be 0..8760h"},
      {"max_cached_rounds", "-1", {}, "--max_cached_rounds=-1: must be 0..1048576"},
      {"max_cached_bytes", "-1", {}, "--max_cached_bytes=-1: must be 0..1125899906842624"},
      {"max_inflight_bytes", "-1", {}, "--max_inflight_bytes=-1: must be 0..1125899906842624"},
      {"max_outstanding_rounds", "0", {}, "--max_outstanding_rounds=0: must be 1..1048576"},
      {"collective_timeout", "0", {}, "--collective_timeout=0: must be 1ms..24h"},
      {"rank", "5", {}, "--rank=5: must be 0..0 (--world_size=1)"},
      {"rank",
       "-1",
       {{"world_size", "2"}, {"rendezvous", "127.0.0.1:1"}},
       "--rank=-1: must be 0..1 (--world_size=2)"},
      {"world_size", "0", {}, "--world_size=0: must be 1..1048576"},
      {"world_size", "2", {}, "--world_size=2: needs --rendezvous=HOST:PORT"},
      {"rendezvous", "host:99999", {}, "--rendezvous=host:99999: port must be 1..65535"},
      {"rendezvous", "host:0", {}, "--rendezvous=host:0: port must be 1..65535"},
      {"rendezvous_listen",
       "127.0.0.1:1",
       {},
       "--rendezvous_listen=127.0.0.1:1: needs --rendezvous"},
      {"rendezvous_listen",
       "[::]:99999",
       {{"rendezvous", "127.0.0.1:1"}},
       "--rendezvous_listen=[::]:99999: port must be 1..65535"},
      {"rendezvous_tls",
       "true",
       {{"rendezvous", "127.0.0.1:1"}},
       "--rendezvous_tls=true: needs --tls_cert and --tls_key"},
      {"rendezvous_tls", "true", {}, "--rendezvous_tls=true: needs --rendezvous"},
      {"rendezvous_tls_ca",
       "{dir}/junk.pem",
       {{"rendezvous", "127.0.0.1:1"}},
       "--rendezvous_tls_ca={dir}/junk.pem: needs --rendezvous_tls"},
      {"backend", "carrier-pigeon", {}, "--backend=carrier-pigeon: must be auto, gloo, nccl or"},
      {"backend", "gloo", {}, "--backend=gloo: needs --rendezvous=HOST:PORT"},
      {"backend",
       "local",
       {{"world_size", "2"}, {"rendezvous", "127.0.0.1:1"}},
       "--backend=local: is a group of one, not --world_size=2"},
      // 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
      {"gloo_hostname", "192.0.2.1", {}, "--gloo_hostname=192.0.2.1: is not an address of this"},
      {"gloo_hostname",
       "127.0.0.1",
       {{"gloo_iface", "lo"}},
       "--gloo_hostname=127.0.0.1: not with --gloo_iface=lo"},
      {"gloo_iface", "no-such-if0", {}, "--gloo_iface=no-such-if0: no network interface named"},
      {"local_gpu", "-2", {}, "--local_gpu=-2: must be -1..1023"},
      {"local_gpu", "1024", {}, "--local_gpu=1024: must be -1..1023"},
      {"max_receive_message_bytes", "1023", {}, "--max_receive_message_bytes=1023: must be 1024.."},
      {"max_receive_message_bytes",
       "2147483648",
       {},
       "--max_receive_message_bytes=2147483648: must be 1024..2147483647"},
      {"max_concurrent_streams", "0", {}, "--max_concurrent_streams=0: must be 1..2147483647"},
      {"resource_quota_bytes", "1", {}, "--resource_quota_bytes=1: must be 1048576.."},
      {"max_threads", "1", {}, "--max_threads=1: must be 2..1024"},
      {"max_threads", "100000", {}, "--max_threads=100000: must be 2..1024"},
      {"planning_threads", "-1", {}, "--planning_threads=-1: must be 0..1024"},
      {"planning_threads",
       "9223372036854775807",
       {},
       "--planning_threads=9223372036854775807: must be 0..1024"},
      {"planning_queue", "-1", {}, "--planning_queue=-1: must be 0..1048576"},
      {"probe", "127.0.0.1:99999", {}, "--probe=127.0.0.1:99999: port must be 1..65535"},
      {"probe",
       "127.0.0.1:1",
       {{"status", "127.0.0.1:2"}},
       "--probe=127.0.0.1:1: not with --status"},
      {"probe_service",
       "Scheduler",
       {{"probe", "127.0.0.1:1"}},
       "--probe_service=Scheduler: must be '' (liveness) or packsched.v1.Scheduler"},
      {"probe_service",
       "packsched.v1.Scheduler",
       {},
       "--probe_service=packsched.v1.Scheduler: needs --probe"},
      {"probe_tls_ca",
       "{dir}/none.pem",
       {{"probe", "127.0.0.1:1"}},
       "--probe_tls_ca={dir}/none.pem: no such file"},
      {"probe_tls_ca", "{dir}/junk.pem", {}, "--probe_tls_ca={dir}/junk.pem: needs --probe"},
      {"probe_tls_server_name",
       "a b",
       {{"probe", "127.0.0.1:1"}},
       "--probe_tls_server_name=a b: must be a DNS name or an IP address"},
      {"status", "127.0.0.1:0", {}, "--status=127.0.0.1:0: port must be 1..65535"},
      {"status_json", "true", {}, "--status_json=true: needs --status"},
      {"metrics_listen", "127.0.0.1:99999", {}, "--metrics_listen=127.0.0.1:99999: port must be"},
      {"metrics_listen",
       "127.0.0.1:1,127.0.0.1:2",
       {},
       "--metrics_listen=127.0.0.1:1,127.0.0.1:2: one address only"},
      {"metrics_port_file",
       "{dir}/metrics-port",
       {},
       "--metrics_port_file={dir}/metrics-port: needs --metrics_listen"},
      {"shutdown_grace", "-1s", {}, "--shutdown_grace=-1s: must be 0..1h"},
      {"shutdown_grace", "2h", {}, "--shutdown_grace=2h: must be 0..1h"},
  };
}

class FlagChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.File("token")) << "s3cret\n";
    std::ofstream(dir_.File("blank")) << " \n\t\n";
    std::ofstream(dir_.File("junk.pem")) << "not pem\n";
  }

  std::string Fill(const std::string& text) const {
    return absl::StrReplaceAll(text, {{"{dir}", dir_.path()}});
  }

  TempDir dir_;
};

void Set(const std::string& name, const std::string& value) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  ASSERT_NE(flag, nullptr) << name;
  std::string error;
  ASSERT_TRUE(flag->ParseFrom(value, &error)) << name << "=" << value << ": " << error;
}

TEST_F(FlagChecks, TheDefaultsPass) { EXPECT_TRUE(CheckFlags().ok()) << CheckFlags(); }

TEST_F(FlagChecks, EveryBadValueIsRefusedNamingTheFlagAndTheRule) {
  for (const BadValue& bad : BadValues()) {
    absl::FlagSaver restore;  // every flag back to its default after the row
    for (const auto& [name, value] : bad.with) Set(name, Fill(value));
    Set(bad.flag, Fill(bad.value));
    const absl::Status status = CheckFlags();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.flag << "=" << bad.value;
    EXPECT_THAT(Message(status), StartsWith(Fill(bad.message))) << bad.flag << "=" << bad.value;
    EXPECT_EQ(Message(status).find('\n'), std::string::npos) << Message(status);
  }
}

// A new flag needs a row in the check table and a bad value above: the test fails until both
// exist. Every flag of packsched-server is defined in server/sidecar/flags.cc.
TEST_F(FlagChecks, EveryFlagHasARowAndABadValue) {
  std::set<std::string> defined;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename().find("server/sidecar/flags.cc") != std::string::npos) {
      defined.emplace(name);
    }
  }
  ASSERT_GT(defined.size(), 30u);
  const std::vector<std::string> rows = CheckedFlags();
  EXPECT_EQ(std::set<std::string>(rows.begin(), rows.end()), defined);
  EXPECT_EQ(rows.size(), defined.size()) << "a flag in two rows";
  std::set<std::string> tested;
  for (const BadValue& bad : BadValues()) tested.insert(bad.flag);
  for (const std::string& name : defined) EXPECT_TRUE(tested.contains(name)) << "--" << name;
}

TEST_F(FlagChecks, GoodValuesPass) {
  absl::FlagSaver restore;
  Set("listen", "[::1]:0");
  Set("port_file", dir_.File("port"));
  Set("auth_token_file", dir_.File("token"));  // on loopback: no TLS needed
  Set("world_size", "2");
  Set("rank", "1");
  Set("rendezvous", "127.0.0.1:29400");
  Set("backend", "gloo");
  Set("gloo_iface", "lo");
  Set("probe", "unix:/run/packsched.sock");
  Set("probe_service", "packsched.v1.Scheduler");
  Set("probe_tls_server_name", "sidecar.test");
  Set("metrics_listen", "127.0.0.1:0");
  Set("metrics_port_file", dir_.File("metrics-port"));
  Set("planning_threads", "4");
  Set("shutdown_grace", "0");
  EXPECT_TRUE(CheckFlags().ok()) << CheckFlags();
  Set("gloo_iface", "");
  Set("gloo_hostname", "127.0.0.1");
  EXPECT_TRUE(CheckFlags().ok()) << CheckFlags();
}

TEST_F(FlagChecks, LocalRankIsCheckedWhereTheGroupReadsIt) {
  absl::FlagSaver restore;
  ASSERT_EQ(setenv("LOCAL_RANK", "abc", 1), 0);
  EXPECT_TRUE(CheckFlags().ok()) << "a group of one does not read it";
  Set("rendezvous", "127.0.0.1:1");
  EXPECT_EQ(Message(CheckFlags()),
            "--local_gpu=-1: LOCAL_RANK='abc' is not a device number 0..1023");
  Set("local_gpu", "0");
  EXPECT_TRUE(CheckFlags().ok()) << "an explicit device does not read it";
  ASSERT_EQ(unsetenv("LOCAL_RANK"), 0);
}

TEST(CheckServerName, NamesAndAddresses) {
  EXPECT_TRUE(CheckServerName("f", "sidecar.test").ok());
  EXPECT_TRUE(CheckServerName("f", "10.0.0.5").ok());
  EXPECT_TRUE(CheckServerName("f", "::1").ok());
  EXPECT_FALSE(CheckServerName("f", "a..b").ok());
  EXPECT_FALSE(CheckServerName("f", "a_b").ok());
  EXPECT_FALSE(CheckServerName("f", std::string(64, 'a')).ok());
}

TEST(CheckInterface, LoopbackHasAnAddress) {
  EXPECT_TRUE(CheckInterface("lo").ok()) << CheckInterface("lo");
  EXPECT_THAT(Message(CheckInterface("no-such-if0")), HasSubstr("(there are: "));
}

TEST(CheckLocalAddress, OnlyThisMachinesAddresses) {
  EXPECT_TRUE(CheckLocalAddress("127.0.0.1").ok());
  EXPECT_TRUE(CheckLocalAddress("localhost").ok());
  EXPECT_THAT(Message(CheckLocalAddress("192.0.2.1")), HasSubstr("not an address of this machine"));
  EXPECT_THAT(Message(CheckLocalAddress("no-such-host.invalid")), HasSubstr("does not resolve"));
}

}  // namespace
}  // namespace packsched::sidecar
