#include "tests/collective/in_process_collective.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace packsched::collective {

// Shared by the ranks. Each rank numbers its own calls; call c of every rank meets in calls_[c].
class InProcessGroup {
 public:
  explicit InProcessGroup(int64_t world_size) : world_size_(world_size) {}

  int64_t world_size() const { return world_size_; }

  // Contributes `input` as rank `rank`'s call number `call`; returns every rank's input once all
  // have arrived (rank-major), or the group's failure.
  absl::StatusOr<std::vector<std::vector<int64_t>>> Exchange(int64_t rank, int64_t call,
                                                             std::vector<int64_t> input,
                                                             absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    Call& c = calls_[call];
    if (c.inputs.empty()) c.inputs.resize(world_size_);
    c.inputs[rank] = std::move(input);
    c.arrived.push_back(rank);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !broken_.ok() || static_cast<int64_t>(c.arrived.size()) == world_size_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      std::vector<int64_t> missing;
      for (int64_t r = 0; r < world_size_; ++r) {
        if (std::find(c.arrived.begin(), c.arrived.end(), r) == c.arrived.end()) {
          missing.push_back(r);
        }
      }
      broken_ = absl::DeadlineExceededError(absl::StrCat("in-process collective: ranks [",
                                                         absl::StrJoin(missing, ", "),
                                                         "] did not arrive before the deadline"));
      return broken_;
    }
    if (!broken_.ok()) return broken_;
    std::vector<std::vector<int64_t>> inputs = c.inputs;
    if (++c.departed == world_size_) calls_.erase(call);
    return inputs;
  }

  void Abort(int64_t rank) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) {
      broken_ = absl::AbortedError(absl::StrCat("in-process collective: rank ", rank, " aborted"));
    }
  }

 private:
  struct Call {
    std::vector<std::vector<int64_t>> inputs;
    std::vector<int64_t> arrived;
    int64_t departed = 0;
  };

  const int64_t world_size_;
  absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Call> calls_ ABSL_GUARDED_BY(mu_);
};

namespace {

class InProcessCollective final : public Collective {
 public:
  InProcessCollective(std::shared_ptr<InProcessGroup> group, int64_t rank)
      : group_(std::move(group)), rank_(rank) {}

  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return group_->world_size(); }
  absl::string_view backend() const override { return "in_process"; }

  absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                         absl::Time deadline) override {
    if (ops.size() != values.size()) {
      return absl::InvalidArgumentError("in-process collective: ops and values differ in size");
    }
    auto inputs = group_->Exchange(rank_, next_call_++,
                                   std::vector<int64_t>(values.begin(), values.end()), deadline);
    if (!inputs.ok()) return inputs.status();
    for (const std::vector<int64_t>& input : *inputs) {
      if (input.size() != values.size()) {
        return absl::FailedPreconditionError("in-process collective: ranks reduce different sizes");
      }
    }
    for (size_t i = 0; i < values.size(); ++i) {
      int64_t v = (*inputs)[0][i];
      for (size_t r = 1; r < inputs->size(); ++r) v = Reduce(ops[i], v, (*inputs)[r][i]);
      values[i] = v;
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                         absl::Time deadline) override {
    if (out.size() != record.size() * static_cast<size_t>(world_size())) {
      return absl::InvalidArgumentError("in-process collective: out must hold world_size records");
    }
    auto inputs = group_->Exchange(rank_, next_call_++,
                                   std::vector<int64_t>(record.begin(), record.end()), deadline);
    if (!inputs.ok()) return inputs.status();
    for (size_t r = 0; r < inputs->size(); ++r) {
      if ((*inputs)[r].size() != record.size()) {
        return absl::FailedPreconditionError("in-process collective: ranks gather different sizes");
      }
      std::copy((*inputs)[r].begin(), (*inputs)[r].end(), out.begin() + r * record.size());
    }
    return absl::OkStatus();
  }

  void Abort() override { group_->Abort(rank_); }

 private:
  std::shared_ptr<InProcessGroup> group_;
  const int64_t rank_;
  int64_t next_call_ = 0;  // only the calling thread touches it (one caller at a time)
};

}  // namespace

std::vector<std::unique_ptr<Collective>> CreateInProcessGroup(int64_t world_size) {
  auto group = std::make_shared<InProcessGroup>(world_size);
  std::vector<std::unique_ptr<Collective>> ranks;
  for (int64_t r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<InProcessCollective>(group, r));
  }
  return ranks;
}

}  // namespace packsched::collective
