#include "server/collective/gloo_full_mesh.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "server/collective/gloo_transport.h"
#include "server/collective/recursive_doubling.h"

namespace packsched::collective::internal {
namespace {

// Gloo's view of our store, under one formation's prefix. Gloo reports failure only by throwing,
// so this adapter throws gloo::IoException, after keeping the Status for Create to return.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, absl::string_view prefix, absl::Time deadline)
      : store_(store), prefix_(prefix), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(Key(key), absl::string_view(data.data(), data.size()), deadline_));
  }

  // Gloo calls get before (or without) wait: it must block until the key exists.
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.Get(Key(key), deadline_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { WaitUntil(keys, deadline_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    WaitUntil(keys, std::min(deadline_, absl::Now() + absl::FromChrono(timeout)));
  }

  const absl::Status& failure() const { return failure_; }

 private:
  std::string Key(absl::string_view key) const { return absl::StrCat(prefix_, key); }

  void WaitUntil(const std::vector<std::string>& keys, absl::Time deadline) {
    for (const std::string& key : keys) Check(store_.Get(Key(key), deadline).status());
  }

  void Check(const absl::Status& status) {
    if (status.ok()) return;
    if (failure_.ok()) failure_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  KeyValueStore& store_;
  const std::string prefix_;
  const absl::Time deadline_;
  absl::Status failure_;
};

// Gloo's own all-reduce (bcube or ring) over the whole vector as ONE element of
// values.size() * 8 bytes, so that the reduction callback always sees whole records and can
// apply each word's op. (Gloo has no per-element op; this keeps it at one all-reduce.)
class RecordAllreduceOptions final : public gloo::AllreduceOptions {
 public:
  RecordAllreduceOptions(const std::shared_ptr<gloo::Context>& context, int64_t* data,
                         std::vector<ReduceOp> ops)
      : AllreduceOptions(context) {
    const size_t words = ops.size();
    impl_.out.push_back(context->createUnboundBuffer(data, words * sizeof(int64_t)));
    impl_.elements = 1;
    impl_.elementSize = words * sizeof(int64_t);
    impl_.reduce = [ops = std::move(ops)](void* out, const void* a, const void* b, size_t n) {
      ReduceRecords(out, a, b, n, ops);
    };
  }
};

}  // namespace

GlooFormation FormFullMesh(KeyValueStore& store, absl::string_view prefix, int64_t rank,
                           int64_t world_size, std::shared_ptr<gloo::transport::Device>& device,
                           absl::Time deadline) {
  GlooFormation formed;
  auto full = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(rank),
                                                          static_cast<int>(world_size));
  // The transport keeps this as the bound of every wait that has no explicit timeout (bcube's).
  full->setTimeout(Remaining(deadline));
  StoreAdapter adapter(store, prefix, deadline);
  formed.connected = RunGloo("rendezvous", rank, [&] { full->connectFullMesh(adapter, device); });
  formed.store_failure = adapter.failure();
  formed.context = std::move(full);
  // A peer that joined and went away: Aborted, as in a round (docs/design.md §3).
  if (!formed.connected.ok() && absl::Now() < deadline) {
    formed.connected = absl::AbortedError(formed.connected.message());
  }
  return formed;
}

void FullMeshAllreduce(const std::shared_ptr<gloo::Context>& context, int64_t* data,
                       std::vector<ReduceOp> ops, GlooOptions::Algorithm algorithm,
                       std::chrono::milliseconds timeout) {
  RecordAllreduceOptions options(context, data, std::move(ops));
  options.setAlgorithm(algorithm == GlooOptions::Algorithm::kBcube
                           ? gloo::AllreduceOptions::Algorithm::BCUBE
                           : gloo::AllreduceOptions::Algorithm::RING);
  options.setTimeout(timeout);
  gloo::allreduce(options);
}

void FullMeshAllgather(const std::shared_ptr<gloo::Context>& context, const int64_t* in,
                       size_t words, int64_t* out, std::chrono::milliseconds timeout) {
  gloo::AllgatherOptions options(context);
  options.setInput(const_cast<int64_t*>(in), words);
  options.setOutput(out, words * static_cast<size_t>(context->size));
  options.setTimeout(timeout);
  gloo::allgather(options);
}

}  // namespace packsched::collective::internal
