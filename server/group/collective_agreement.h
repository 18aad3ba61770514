#ifndef PACKSCHED_SERVER_GROUP_COLLECTIVE_AGREEMENT_H_
#define PACKSCHED_SERVER_GROUP_COLLECTIVE_AGREEMENT_H_

// The agreement port (round_agreement.h) over collectives made by a factory, without a store:
// each stream runs AgreeRound (round.h) on its own collective, made before the stream's first
// round and again after a round whose collective failed (DeadlineExceeded or Aborted: the group
// must then be formed again). Nothing is stored, so nothing is recovered, and it is always
// serving.
//
// Without a factory it is a group of one (a LocalCollective per stream): the sidecar without
// group flags. Tests pass collectives of their own (several ranks in one process, gated ones).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"
#include "server/group/round_agreement.h"

namespace packsched::group {

class CollectiveAgreements final : public RoundAgreements {
 public:
  // Makes a stream's collective. Called on the stream's worker thread (it may block) before the
  // stream's first round and again after a round whose collective failed; an error fails the
  // round that needed it.
  using CollectiveFactory =
      std::function<absl::StatusOr<std::unique_ptr<collective::Collective>>(absl::string_view)>;

  // Every round's collective calls end within `collective_timeout`. `make` empty: a
  // LocalCollective per stream (a group of one).
  explicit CollectiveAgreements(absl::Duration collective_timeout,
                                CollectiveFactory make = nullptr);

  std::unique_ptr<RoundAgreement> ForStream(std::string stream) override;
  // Of the collective made last (1 before any).
  int64_t world_size() const override { return world_size_.load(std::memory_order_acquire); }
  bool serving() const override { return true; }
  // Calls `listener(true)` now: serving() never changes.
  void SetServingListener(std::function<void(bool)> listener) override;

 private:
  friend class CollectiveAgreement;  // collective_agreement.cc

  absl::StatusOr<std::unique_ptr<collective::Collective>> Make(absl::string_view stream);

  const absl::Duration collective_timeout_;
  const CollectiveFactory make_;
  std::atomic<int64_t> world_size_{1};
};

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_COLLECTIVE_AGREEMENT_H_
