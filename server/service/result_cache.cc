#include "server/service/result_cache.h"

#include <algorithm>
#include <utility>

namespace packsched::service {
namespace {

// What the allocator adds to each heap block, about (size-class rounding and headers): a plan
// holds a few tiny vectors per micro-batch, so this is a good part of its real footprint.
constexpr int64_t kPerAllocation = 16;

template <typename T>
int64_t VectorBytes(const std::vector<T>& v) {
  if (v.capacity() == 0) return 0;
  return static_cast<int64_t>(v.capacity() * sizeof(T)) + kPerAllocation;
}

}  // namespace

int64_t EstimatedBytes(const RoundResult& result) {
  const planner::MicroBatchPlan& plan = result.plan;
  int64_t bytes = static_cast<int64_t>(sizeof(RoundResult)) + VectorBytes(plan.parts) +
                  VectorBytes(plan.reorder) + VectorBytes(plan.revert) + VectorBytes(plan.dropped);
  for (const planner::MicroBatch& part : plan.parts) {
    bytes += VectorBytes(part.indices) + VectorBytes(part.cu_seqlens) +
             VectorBytes(part.cu_seqlens_aligned);
  }
  if (result.loss)
    bytes += VectorBytes(result.loss->weights) + VectorBytes(result.loss->loss_scales);
  if (result.tree) {
    bytes += VectorBytes(result.tree->parts) + VectorBytes(result.tree->rollout_part) +
             VectorBytes(result.tree->dropped);
    for (const planner::TreeMicroBatch& part : result.tree->parts) {
      const planner::TreeLayout& l = part.layout;
      bytes += VectorBytes(part.batch.indices) + VectorBytes(part.batch.cu_seqlens) +
               VectorBytes(part.batch.cu_seqlens_aligned) + VectorBytes(l.rollouts) +
               VectorBytes(l.piece_rollouts) + VectorBytes(l.piece_rollout_begin);
    }
  }
  return bytes;
}

ResultCache::ResultCache(int64_t max_rounds_per_stream, int64_t max_bytes)
    : max_rounds_per_stream_(max_rounds_per_stream), max_bytes_(max_bytes) {}

std::optional<ResultCache::Entry> ResultCache::Find(absl::string_view stream, int64_t round) const {
  absl::MutexLock lock(&mu_);
  const auto s = streams_.find(stream);
  if (s == streams_.end()) return std::nullopt;
  const auto kept = s->second.rounds.find(round);
  if (kept == s->second.rounds.end()) return std::nullopt;
  return kept->second.entry;
}

std::optional<int64_t> ResultCache::HighestReleased(absl::string_view stream) const {
  absl::MutexLock lock(&mu_);
  const auto s = streams_.find(stream);
  if (s == streams_.end()) return std::nullopt;
  return s->second.highest_released;
}

void ResultCache::Release(PerStream& stream, int64_t round) {
  stream.highest_released = std::max(stream.highest_released.value_or(round), round);
}

void ResultCache::Erase(PerStream& stream, int64_t round, bool released) {
  const auto kept = stream.rounds.find(round);
  bytes_ -= kept->second.entry.bytes;
  oldest_first_.erase(kept->second.age);
  stream.oldest_first.erase(kept->second.stream_age);
  stream.rounds.erase(kept);
  if (released) Release(stream, round);
}

bool ResultCache::Insert(absl::string_view stream_name, int64_t round, uint64_t content_hash,
                         std::shared_ptr<const RoundResult> result, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  PerStream& stream = streams_[stream_name];
  if (stream.rounds.contains(round)) Erase(stream, round, /*released=*/false);
  if (max_rounds_per_stream_ == 0 || bytes > max_bytes_) {
    Release(stream, round);
    return false;
  }
  // Room first, so the new entry is never the one evicted.
  while (static_cast<int64_t>(stream.rounds.size()) >= max_rounds_per_stream_) {
    Erase(stream, stream.oldest_first.front(), /*released=*/true);
  }
  while (bytes_ + bytes > max_bytes_) {
    const Key oldest = oldest_first_.front();
    Erase(streams_.find(oldest.first)->second, oldest.second, /*released=*/true);
  }
  oldest_first_.emplace_back(std::string(stream_name), round);
  stream.oldest_first.push_back(round);
  stream.rounds[round] = Kept{Entry{content_hash, std::move(result), bytes},
                              std::prev(oldest_first_.end()), std::prev(stream.oldest_first.end())};
  bytes_ += bytes;
  return true;
}

std::optional<int64_t> ResultCache::Forget(absl::string_view stream_name) {
  absl::MutexLock lock(&mu_);
  const auto s = streams_.find(stream_name);
  if (s == streams_.end()) return std::nullopt;
  PerStream& stream = s->second;
  while (!stream.rounds.empty()) Erase(stream, stream.rounds.begin()->first, /*released=*/true);
  const std::optional<int64_t> highest = stream.highest_released;
  streams_.erase(s);
  return highest;
}

int64_t ResultCache::Count(absl::string_view stream) const {
  absl::MutexLock lock(&mu_);
  const auto s = streams_.find(stream);
  return s == streams_.end() ? 0 : static_cast<int64_t>(s->second.rounds.size());
}

int64_t ResultCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace packsched::service
