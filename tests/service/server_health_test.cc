// The server's grpc.health.v1 statuses for a group of one: live ("") and ready
// (packsched.v1.Scheduler) at once — with no group flags, and with a rendezvous store and
// --world_size=1. (A group of several: tests/e2e/group_e2e_test.cc.) Regression: the readiness
// probe answered NOT_FOUND for a group of one, whose Scheduler service had no health status.

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/collective_agreement.h"
#include "server/group/group.h"
#include "server/group/group_agreement.h"
#include "server/service/health_probe.h"
#include "server/service/server.h"

namespace packsched::service {
namespace {

constexpr char kScheduler[] = "packsched.v1.Scheduler";

absl::StatusOr<Serving> Health(const SchedulerServer& server, const std::string& service) {
  return CheckHealth(absl::StrCat("127.0.0.1:", server.port()), service,
                     absl::Now() + absl::Seconds(10));
}

// A group of one (no group flags): the agreements the sidecar makes then.
ServerOptions OnAFreePort() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.agreements =
      std::make_shared<group::CollectiveAgreements>(options.limits.collective_timeout);
  return options;
}

TEST(ServerHealth, AGroupOfOneIsLiveAndReadyAtOnce) {
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(OnAFreePort());
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<Serving> live = Health(**server, "");
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(*live, Serving::kServing);
  absl::StatusOr<Serving> ready = Health(**server, kScheduler);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(*ready, Serving::kServing);
  (*server)->Shutdown(absl::ZeroDuration());
}

TEST(ServerHealth, ARankGroupOfOneIsReadyAtOnce) {
  collective::InMemoryStore store;
  absl::StatusOr<std::unique_ptr<group::Group>> group =
      group::Group::Create(&store, group::GroupOptions{});
  ASSERT_TRUE(group.ok()) << group.status();
  ServerOptions options = OnAFreePort();
  options.agreements = std::make_shared<group::GroupAgreements>(**group);
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<Serving> ready = Health(**server, kScheduler);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(*ready, Serving::kServing);
  (*server)->Shutdown(absl::ZeroDuration());
}

// The agreement port is the sidecar's to choose: a server is not started without it.
TEST(ServerHealth, AServerWithoutAgreementsIsNotStarted) {
  ServerOptions options = OnAFreePort();
  options.agreements = nullptr;
  EXPECT_EQ(SchedulerServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::service
