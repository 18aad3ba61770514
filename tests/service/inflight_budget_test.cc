// The in-flight memory budget through the gRPC service: a request whose
// estimate does not fit is refused with RESOURCE_EXHAUSTED before it allocates; reservations
// end with their calls, so sequential requests, rounds joined by several callers and cache hits
// leave the whole budget free again.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "packsched/v1/scheduler.grpc.pb.h"
#include "server/group/collective_agreement.h"
#include "server/service/convert.h"
#include "server/service/request_memory.h"
#include "server/service/server.h"

namespace packsched::service {
namespace {

using ::testing::HasSubstr;

v1::PlanRequest SmallPlan(const std::string& stream, int64_t round) {
  v1::PlanRequest request;
  request.set_stream(stream);
  request.set_round(round);
  for (int i = 0; i < 64; ++i) request.add_lengths(100 + i);
  request.mutable_options()->set_max_token_len(1024);
  return request;
}

class InflightBudget : public ::testing::Test {
 protected:
  // Room for one small Plan's estimate, not two.
  void SetUp() override {
    one_ = EstimatePlanMemory(SmallPlan("s", 1), ServiceLimits()).bytes;
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.limits.max_inflight_bytes = one_ + one_ / 2;
    options.agreements =
        std::make_shared<group::CollectiveAgreements>(options.limits.collective_timeout);
    absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Scheduler::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                       grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(absl::ZeroDuration()); }

  grpc::Status Plan(const v1::PlanRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::PlanResponse response;
    return stub_->Plan(&context, request, &response);
  }

  // A reservation ends when gRPC frees the call's messages, just after the client has the
  // answer: a request that needs the whole budget succeeds within a moment once every earlier
  // call has ended — or never, if a reservation leaked.
  grpc::Status PlanOnceFree(const v1::PlanRequest& request) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (true) {
      grpc::Status status = Plan(request);
      if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || absl::Now() > deadline) {
        return status;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  int64_t one_ = 0;
  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

TEST_F(InflightBudget, RefusesARequestOverTheBudgetNamingEstimateAndFlag) {
  v1::PlanRequest amplifier = SmallPlan("s", 1);
  amplifier.mutable_options()->set_min_micro_batches(1'000'000);
  const grpc::Status status = Plan(amplifier);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("k up to 1000000"));
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("needs an estimated ",
                                     EstimatePlanMemory(amplifier, ServiceLimits()).bytes)));
  EXPECT_THAT(status.error_message(), HasSubstr("--max_inflight_bytes"));

  v1::PartitionRequest partition;
  partition.add_lengths(1);
  partition.add_lengths(1);
  partition.set_num_micro_batches(1'000'000);
  grpc::ClientContext context;
  v1::PlanResponse response;
  const grpc::Status refused = stub_->Partition(&context, partition, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_inflight_bytes"));

  // The refused round was not kept: the same round, within the budget, runs.
  EXPECT_TRUE(PlanOnceFree(SmallPlan("s", 1)).ok());
}

TEST_F(InflightBudget, EachCallGivesItsReservationBack) {
  for (int round = 1; round <= 20; ++round) {
    const grpc::Status status = PlanOnceFree(SmallPlan("s", round));
    ASSERT_TRUE(status.ok()) << round << ": " << status.error_message();
  }
}

TEST_F(InflightBudget, JoinersAndCacheHitsLeakNothing) {
  // The same round from several callers at once (some join it, some are refused by the
  // budget), then from a late caller (a cache hit).
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) callers.emplace_back([this] { Plan(SmallPlan("s", 7)); });
  for (std::thread& caller : callers) caller.join();
  EXPECT_TRUE(PlanOnceFree(SmallPlan("s", 7)).ok());
  // Afterwards the whole budget is free again: a new round needing it runs.
  EXPECT_TRUE(PlanOnceFree(SmallPlan("s", 8)).ok());
  EXPECT_TRUE(PlanOnceFree(SmallPlan("t", 1)).ok());
}

}  // namespace
}  // namespace packsched::service
