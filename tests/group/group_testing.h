#ifndef PACKSCHED_TESTS_GROUP_GROUP_TESTING_H_
#define PACKSCHED_TESTS_GROUP_GROUP_TESTING_H_

// What the Group tests share: one sidecar's Group and stream context, and a store that forwards
// every call to another (tests override what they change).

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/stream_group.h"
#include "tests/testing/ignore_sigpipe.h"

namespace packsched::group::testing {

using collective::KeyValueStore;

// One sidecar: its Group and the context of stream "actor".
struct Rank {
  Rank(KeyValueStore& store, GroupOptions options) {
    auto created = Group::Create(&store, std::move(options));
    EXPECT_TRUE(created.ok()) << created.status();
    group = std::move(created).value();
    stream = group->ForStream("actor");
  }
  std::unique_ptr<Group> group;
  std::unique_ptr<StreamGroup> stream;
};

// Hands every call to Inner() once Admit(deadline) lets it through (by default always).
class ForwardingStore : public KeyValueStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override {
    if (absl::Status admitted = Admit(deadline); !admitted.ok()) return admitted;
    return Inner().Set(key, value, deadline);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override {
    if (absl::Status admitted = Admit(deadline); !admitted.ok()) return admitted;
    return Inner().Get(key, deadline);
  }
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key,
                                                    absl::Time deadline) override {
    if (absl::Status admitted = Admit(deadline); !admitted.ok()) return admitted;
    return Inner().TryGet(key, deadline);
  }
  absl::StatusOr<std::string> CompareAndSet(absl::string_view key,
                                            std::optional<absl::string_view> expected,
                                            absl::string_view desired,
                                            absl::Time deadline) override {
    if (absl::Status admitted = Admit(deadline); !admitted.ok()) return admitted;
    return Inner().CompareAndSet(key, expected, desired, deadline);
  }
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, absl::Time deadline) override {
    if (absl::Status admitted = Admit(deadline); !admitted.ok()) return admitted;
    return Inner().DeletePrefix(prefix, deadline);
  }

 protected:
  virtual KeyValueStore& Inner() = 0;
  // Whether a call reaches Inner(); its error is the call's otherwise.
  virtual absl::Status Admit(absl::Time /*deadline*/) { return absl::OkStatus(); }
};

}  // namespace packsched::group::testing

#endif  // PACKSCHED_TESTS_GROUP_GROUP_TESTING_H_
