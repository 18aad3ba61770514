#include "server/collective/store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace packsched::collective {

std::vector<InMemoryStore::Watcher> InMemoryStore::StoreLocked(absl::string_view key,
                                                               absl::string_view value) {
  values_.insert_or_assign(std::string(key), std::string(value));
  std::vector<Watcher> fired;
  auto it = watchers_.find(key);
  if (it != watchers_.end()) {
    fired = std::move(it->second);
    watchers_.erase(it);
    for (const Watcher& watcher : fired) watched_key_.erase(watcher.id);
  }
  return fired;
}

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value,
                                absl::Time deadline) {
  std::vector<Watcher> fired;
  {
    absl::MutexLock lock(&mu_);
    fired = StoreLocked(key, value);
  }
  for (Watcher& watcher : fired) watcher.done(std::string(value));
  return absl::OkStatus();
}

int64_t InMemoryStore::Watch(absl::string_view key, WatchCallback done) {
  std::string value;
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_watch_++;
    auto it = values_.find(key);
    if (it == values_.end()) {
      watchers_[std::string(key)].push_back(Watcher{id, std::move(done)});
      watched_key_.emplace(id, std::string(key));
      return id;
    }
    value = it->second;
  }
  done(std::move(value));
  return id;
}

bool InMemoryStore::CancelWatch(int64_t id) {
  WatchCallback dropped;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  auto key = watched_key_.find(id);
  if (key == watched_key_.end()) return false;
  auto it = watchers_.find(key->second);
  std::vector<Watcher>& list = it->second;
  for (auto w = list.begin(); w != list.end(); ++w) {
    if (w->id != id) continue;
    dropped = std::move(w->done);
    list.erase(w);
    break;
  }
  if (list.empty()) watchers_.erase(it);
  watched_key_.erase(key);
  return true;
}

absl::StatusOr<std::string> InMemoryStore::Get(absl::string_view key, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto exists = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&exists), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store: key '", key, "' was not set before the deadline"));
  }
  return values_.find(key)->second;
}

absl::StatusOr<std::optional<std::string>> InMemoryStore::TryGet(absl::string_view key,
                                                                 absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> InMemoryStore::CompareAndSet(absl::string_view key,
                                                         std::optional<absl::string_view> expected,
                                                         absl::string_view desired,
                                                         absl::Time deadline) {
  std::vector<Watcher> fired;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    const bool matches = it == values_.end() ? !expected.has_value()
                                             : expected.has_value() && it->second == *expected;
    if (!matches) return it == values_.end() ? std::string() : it->second;
    fired = StoreLocked(key, desired);
  }
  // A key created or changed here wakes its watchers as Set does (remote Gets wait on them).
  for (Watcher& watcher : fired) watcher.done(std::string(desired));
  return std::string(desired);
}

absl::StatusOr<int64_t> InMemoryStore::DeletePrefix(absl::string_view prefix, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  int64_t deleted = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && absl::StartsWith(it->first, prefix);) {
    it = values_.erase(it);
    ++deleted;
  }
  return deleted;
}

int64_t InMemoryStore::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(values_.size());
}

}  // namespace packsched::collective
