#ifndef PACKSCHED_SERVER_SERVICE_RESULT_CACHE_H_
#define PACKSCHED_SERVER_SERVICE_RESULT_CACHE_H_

// The round coordinator's cache of finished rounds, kept for the late callers of the same
// (stream, round) — the TP/PP/CP ranks of one DP rank. No gRPC or protobuf here.
//
// Bounded twice: a count of rounds per stream (--max_cached_rounds) and the estimated bytes of
// every stream's results together (--max_cached_bytes); the oldest entry goes first, whichever
// bound is exceeded. A result larger than the byte budget on its own is not kept at all.
//
// The cache also remembers, per stream, the highest round it has let go (evicted, or never kept
// because it was too large): a caller of such a round cannot be served, and running the round
// again would enter the collective alone, so the coordinator refuses it (coordinator.h).

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/service/round_types.h"

namespace packsched::service {

// An estimate of the heap bytes `result` holds (its vectors' capacities, a little per allocation,
// and the struct itself): O(number of micro-batches), no allocation.
int64_t EstimatedBytes(const RoundResult& result);

class ResultCache {
 public:
  struct Entry {
    uint64_t content_hash = 0;  // the content every caller of the round must send
    std::shared_ptr<const RoundResult> result;
    int64_t bytes = 0;  // EstimatedBytes(*result) when it was kept
  };

  // REQUIRES: max_rounds_per_stream >= 0, max_bytes >= 0 (0: nothing is kept).
  ResultCache(int64_t max_rounds_per_stream, int64_t max_bytes);

  ResultCache(const ResultCache&) = delete;
  ResultCache& operator=(const ResultCache&) = delete;

  // The kept entry of (stream, round), or std::nullopt.
  std::optional<Entry> Find(absl::string_view stream, int64_t round) const;

  // The highest round of `stream` let go so far (evicted, or too large to keep), or std::nullopt.
  std::optional<int64_t> HighestReleased(absl::string_view stream) const;

  // Keeps `result` as the entry of (stream, round), replacing any earlier entry, then evicts
  // the oldest entries until both bounds hold again. Returns false, keeping nothing, when
  // `bytes` alone exceeds the byte budget or the stream may keep no rounds (the round then
  // counts as let go).
  bool Insert(absl::string_view stream, int64_t round, uint64_t content_hash,
              std::shared_ptr<const RoundResult> result, int64_t bytes);

  // Drops every entry of `stream` and what the cache remembers of it (a reclaimed stream,
  // coordinator.h). Returns the highest round of `stream` it kept or had let go, or
  // std::nullopt.
  std::optional<int64_t> Forget(absl::string_view stream);

  int64_t Count(absl::string_view stream) const;  // entries of `stream`
  int64_t bytes() const;                          // over every stream

 private:
  using Key = std::pair<std::string, int64_t>;  // (stream, round)
  struct Kept {
    Entry entry;
    std::list<Key>::iterator age;             // its place in `oldest_first_`
    std::list<int64_t>::iterator stream_age;  // its place in its stream's `oldest_first`
  };
  struct PerStream {
    std::map<int64_t, Kept> rounds;
    std::list<int64_t> oldest_first;  // insertion order of `rounds`
    std::optional<int64_t> highest_released;
  };

  // Drops the entry of `round` (REQUIRES: kept); `released`: records the round as let go.
  void Erase(PerStream& stream, int64_t round, bool released) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Release(PerStream& stream, int64_t round);

  const int64_t max_rounds_per_stream_;
  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, PerStream> streams_ ABSL_GUARDED_BY(mu_);
  std::list<Key> oldest_first_ ABSL_GUARDED_BY(mu_);  // every stream's entries, insertion order
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_RESULT_CACHE_H_
