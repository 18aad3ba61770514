#ifndef PACKSCHED_SERVER_GROUP_ARRIVAL_H_
#define PACKSCHED_SERVER_GROUP_ARRIVAL_H_

// A rank's arrival in a round, published to the rendezvous store only when the round is slow.
//
// Arrival keys exist to name the ranks that never came when a round times out. Writing one on
// every round would cost rank 0's store a call per rank per round (2·(W − 1) with the cleanup),
// in the path every round takes. Instead a rank publishes its key only if its round is still
// running `delay` after it began: a round whose ranks are all there ends long before that and
// writes nothing, while in a round that waits for a missing rank every present rank has
// published long before anyone times out and looks for who is missing. (A rank arriving less
// than `delay` before the others' deadline may be named missing: it was late by any measure.)
// A rank that published deletes its key once the round has succeeded.

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/store.h"

namespace packsched::group {

class ArrivalPublisher {
 public:
  // `store` must outlive the publisher. Starts one thread, idle between rounds.
  ArrivalPublisher(collective::KeyValueStore& store, absl::Duration delay);
  // Stops the thread: within a store call in progress, if any (bounded by its round's deadline).
  ~ArrivalPublisher();

  ArrivalPublisher(const ArrivalPublisher&) = delete;
  ArrivalPublisher& operator=(const ArrivalPublisher&) = delete;

  // A round begins: publish `key` at now + delay unless End() comes first. Store calls are
  // bounded by `deadline`. REQUIRES: the previous round has ended.
  void Begin(std::string key, absl::Time deadline);
  // The round ended (either way); waits for a publication in progress. Returns whether the key
  // was published (the caller deletes it after a success).
  bool End();

 private:
  void Run();

  collective::KeyValueStore& store_;
  const absl::Duration delay_;
  absl::Mutex mu_;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;  // Begin() count: tells one round from the next
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  bool publishing_ ABSL_GUARDED_BY(mu_) = false;
  bool published_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string key_ ABSL_GUARDED_BY(mu_);
  absl::Time due_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_ARRIVAL_H_
