#include "server/collective/counting_store.h"

#include <utility>

namespace packsched::collective {
namespace {

void Bump(std::atomic<int64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

CountingStore::CountingStore(KeyValueStore& inner)
    : CountingStore(inner, std::make_shared<Counters>()) {}

CountingStore::CountingStore(KeyValueStore& inner, std::shared_ptr<Counters> counters)
    : inner_(inner), counters_(std::move(counters)) {
  KeyValueStore& fail_fast = inner_.FailFast();
  if (&fail_fast != &inner_) fail_fast_.reset(new CountingStore(fail_fast, counters_));
}

StoreRequests CountingStore::requests() const {
  StoreRequests r;
  r.set = counters_->set.load(std::memory_order_relaxed);
  r.get = counters_->get.load(std::memory_order_relaxed);
  r.try_get = counters_->try_get.load(std::memory_order_relaxed);
  r.compare_and_set = counters_->compare_and_set.load(std::memory_order_relaxed);
  r.delete_prefix = counters_->delete_prefix.load(std::memory_order_relaxed);
  return r;
}

absl::Status CountingStore::Set(absl::string_view key, absl::string_view value,
                                absl::Time deadline) {
  Bump(counters_->set);
  return inner_.Set(key, value, deadline);
}

absl::StatusOr<std::string> CountingStore::Get(absl::string_view key, absl::Time deadline) {
  Bump(counters_->get);
  return inner_.Get(key, deadline);
}

absl::StatusOr<std::optional<std::string>> CountingStore::TryGet(absl::string_view key,
                                                                 absl::Time deadline) {
  Bump(counters_->try_get);
  return inner_.TryGet(key, deadline);
}

absl::StatusOr<std::string> CountingStore::CompareAndSet(absl::string_view key,
                                                         std::optional<absl::string_view> expected,
                                                         absl::string_view desired,
                                                         absl::Time deadline) {
  Bump(counters_->compare_and_set);
  return inner_.CompareAndSet(key, expected, desired, deadline);
}

absl::StatusOr<int64_t> CountingStore::DeletePrefix(absl::string_view prefix, absl::Time deadline) {
  Bump(counters_->delete_prefix);
  return inner_.DeletePrefix(prefix, deadline);
}

KeyValueStore& CountingStore::FailFast() { return fail_fast_ != nullptr ? *fail_fast_ : *this; }

}  // namespace packsched::collective
