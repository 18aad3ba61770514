// The generation ledger of a stream (stream_group.h): how a generation ends (the cause recorded
// before the number moves on), whether the one a rank holds ended before its round, and the
// deletion of ended generations' keys.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/group/blame.h"
#include "server/group/group_keys.h"
#include "server/group/stream_group.h"

namespace packsched::group {
namespace {

// How long a rank whose collective failed at once waits for the generation's recorded end.
constexpr absl::Duration kEndedWait = absl::Milliseconds(250);

}  // namespace

bool StreamGroup::StaleGeneration(int64_t generation, int64_t round, CleanupCalls& cleanup) {
  // Waits a moment for the cause: a restarted peer that reaches this round at the same time as
  // this rank records "restart" just after its first call, and a peer that dies during the round
  // is recorded by whichever rank noticed first.
  absl::StatusOr<std::string> why =
      cleanup.Get(keys::Ended(keys::Formation(stream_root_, generation)), absl::Now() + kEndedWait);
  if (why.ok()) return *why != absl::StrCat("round ", round);
  if (!absl::IsDeadlineExceeded(why.status())) return false;
  // Rank 0 restarted with an empty store: its run epoch is new (or not yet published), and this
  // generation never was in it.
  absl::StatusOr<std::optional<std::string>> epoch =
      cleanup.TryGet(keys::Epoch(group_.options_.key_root));
  std::string mine;
  {
    absl::MutexLock lock(&mu_);
    mine = info_.epoch;
  }
  return epoch.ok() && (!epoch->has_value() || **epoch != mine);
}

void StreamGroup::EndGeneration(int64_t generation, absl::Status why, absl::string_view cause,
                                CleanupCalls& cleanup) {
  // Why it ended, before it does: a rank still holding it reads this when its next call fails.
  // Several ranks end the same generation; compare-and-set makes it one bump.
  const bool recorded = cleanup
                            .CompareAndSet(keys::Ended(keys::Formation(stream_root_, generation)),
                                           std::nullopt, cause)
                            .ok() &&
                        cleanup
                            .CompareAndSet(keys::Generation(stream_root_), absl::StrCat(generation),
                                           absl::StrCat(generation + 1))
                            .ok();
  if (!recorded) {
    // The store could not be reached: the next formation records the end first, so that this
    // rank never forms the ended generation again (its keys are spent).
    unrecorded_end_ = UnrecordedEnd{stream_root_, generation, std::string(cause)};
  }
  std::shared_ptr<collective::Collective> spent;
  {
    absl::MutexLock lock(&mu_);
    spent = std::move(collective_);
    info_.formed = false;
    info_.last_error = std::move(why);
  }
  // Destroyed outside the lock: a Gloo member closes its connections, so peers still waiting
  // fail at once.
}

void StreamGroup::CleanEndedGenerations(int64_t generation, int64_t at_most, absl::Time deadline) {
  if (cleaned_root_ != stream_root_) {  // a new epoch (rank 0 restarted): nothing cleaned yet
    cleaned_root_ = stream_root_;
    cleaned_below_ = 0;
  }
  // Every rank is in `generation` (it formed, or a round on it completed): no one reads the
  // keys of earlier ones any more. (Kept until now so that every rank of a failed formation or
  // round could name the ranks at fault.)
  for (int64_t n = 0; n < at_most && cleaned_below_ < generation; ++n) {
    if (!group_.store_->DeletePrefix(keys::Formation(stream_root_, cleaned_below_), deadline)
             .ok()) {
      return;  // the next call resumes here
    }
    ++cleaned_below_;
  }
}

}  // namespace packsched::group
