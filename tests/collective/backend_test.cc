// Backend choice: parsing and forming. (The --backend=auto agreement through the store:
// tests/group/backend_agreement_test.cc.)

#include "server/collective/backend.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"

namespace packsched::collective {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(Backend, ParsesEveryNameAndRejectsOthers) {
  for (Backend backend : {Backend::kAuto, Backend::kGloo, Backend::kNccl, Backend::kLocal}) {
    EXPECT_EQ(*ParseBackend(BackendName(backend)), backend);
  }
  EXPECT_EQ(ParseBackend("NCCL").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Backend, FormsOnlyConcreteBackends) {
  InMemoryStore store;
  const GlooOptions gloo;
  const NcclOptions nccl;
  auto local = FormCollective(Backend::kLocal, store, "p/", 0, 1, gloo, nccl, Soon());
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)->backend(), "local");
  EXPECT_EQ(FormCollective(Backend::kLocal, store, "p/", 0, 2, gloo, nccl, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FormCollective(Backend::kAuto, store, "p/", 0, 1, gloo, nccl, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::collective
