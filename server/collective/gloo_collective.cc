// The instance (gloo_collective.h): a worker thread that runs the Gloo calls, and the caller's
// wait on its own deadline. Formation: gloo_formation.cc (a sidecar's) and gloo_full_mesh.cc
// (Gloo's own algorithms, comparison only); Gloo's device and exceptions: gloo_transport.cc.

#include "server/collective/gloo_collective.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/base/thread_name.h"
#include "server/collective/gloo_formation.h"
#include "server/collective/gloo_full_mesh.h"
#include "server/collective/gloo_transport.h"
#include "server/collective/recursive_doubling.h"

namespace packsched::collective {

using internal::BoundRecursiveDoubling;
using internal::CreateDevice;
using internal::FullMeshAllgather;
using internal::FullMeshAllreduce;
using internal::RecursiveDoublingAllreduce;
using internal::Remaining;
using internal::RunGloo;

struct GlooCollective::State {
  int64_t rank = 0;
  int64_t world_size = 0;
  GlooOptions::Algorithm algorithm = GlooOptions::Algorithm::kRecursiveDoubling;
  std::shared_ptr<gloo::Context> context;  // set before the worker starts; then read-only
  // kRecursiveDoubling: the all-reduce of small records (the rounds); used on the worker only.
  std::shared_ptr<BoundRecursiveDoubling> bound;

  // One call handed to the worker at a time (the Collective contract: one caller at a time).
  struct Job {
    std::function<absl::Status()> run;
    absl::Status status;
    bool done = false;
  };

  absl::Mutex mu;
  std::shared_ptr<Job> pending ABSL_GUARDED_BY(mu);
  bool busy ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::Status broken ABSL_GUARDED_BY(mu);  // the first failure; every later call returns it
  std::thread worker;

  static void WorkerLoop(std::shared_ptr<State> state) {
    NameThisThread("psched-gloo");
    for (;;) {
      std::shared_ptr<Job> job;
      {
        absl::MutexLock lock(&state->mu);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(state->mu) {
          return state->stop || state->pending != nullptr;
        };
        state->mu.Await(absl::Condition(&ready));
        if (state->pending == nullptr) return;
        job = std::move(state->pending);
        state->busy = true;
      }
      absl::Status status = job->run();
      absl::MutexLock lock(&state->mu);
      job->status = std::move(status);
      job->done = true;
      state->busy = false;
    }
  }

  // Hands `run` to the worker and waits for it, for an abort, or for `deadline`.
  absl::Status Call(std::function<absl::Status()> run, absl::string_view what,
                    absl::Time deadline) {
    absl::Status status = WaitFor(std::move(run), what, deadline);
    // A peer failed (or we were aborted): close our connections too, so the failure reaches every
    // rank at once — with recursive doubling, a rank whose partner died may be the only link to
    // others still waiting on it. A timeout does not cascade: every rank meets its own deadline
    // and reports DeadlineExceeded.
    if (absl::IsAborted(status)) CloseConnections();
    return status;
  }

  absl::Status WaitFor(std::function<absl::Status()> run, absl::string_view what,
                       absl::Time deadline) {
    auto job = std::make_shared<Job>();
    job->run = std::move(run);
    absl::MutexLock lock(&mu);
    if (!broken.ok()) return broken;
    pending = job;
    auto finished = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return job->done || aborted; };
    mu.AwaitWithDeadline(absl::Condition(&finished), deadline);
    if (job->done) {
      if (!job->status.ok()) broken = job->status;
      return job->status;
    }
    if (!aborted) {
      broken = absl::DeadlineExceededError(absl::StrCat("gloo ", what, " on rank ", rank, " of ",
                                                        world_size,
                                                        " did not complete before the deadline"));
    }
    // The worker may still be inside Gloo with its own copy of the data; it ends with Gloo's
    // timeout (or at once when connections close) and nobody reads its result.
    return broken;
  }

  // Closes every pair once: peers blocked on us fail at once with "connection closed".
  void CloseConnections() {
    {
      absl::MutexLock lock(&mu);
      if (closed) return;
      closed = true;
    }
    try {
      context->closeConnections();
    } catch (const std::exception&) {
      // Closing a pair that already failed may throw; the pair is gone either way.
    }
  }
};

GlooCollective::GlooCollective(std::shared_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(
    KeyValueStore& store, absl::string_view prefix, int64_t rank, int64_t world_size,
    const GlooOptions& options, absl::Time deadline, Cancellation* cancel) {
  if (world_size < 1 || world_size > (int64_t{1} << 20) || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is not in a group of ", world_size));
  }
  auto cancelled = [&] {
    return absl::AbortedError(absl::StrCat("gloo rendezvous on rank ", rank, " of ", world_size,
                                           " under '", prefix, "': cancelled"));
  };
  if (cancel != nullptr && cancel->cancelled()) return cancelled();
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device = CreateDevice(options);
  if (!device.ok()) return device.status();

  auto state = std::make_shared<State>();
  state->rank = rank;
  state->world_size = world_size;
  state->algorithm = options.algorithm;
  // kRecursiveDoubling, a sidecar's: only the pairs the algorithm uses, ceil(log2 W) + 1 at
  // most, not W - 1. Gloo's own algorithms (comparison only): its full mesh.
  internal::GlooFormation formed =
      options.algorithm == GlooOptions::Algorithm::kRecursiveDoubling
          ? internal::FormPeers(store, prefix, rank, world_size, *device, options, deadline, cancel)
          : internal::FormFullMesh(store, prefix, rank, world_size, *device, deadline);
  if (formed.cancelled) return cancelled();
  const absl::Status& store_failure = formed.store_failure;
  absl::Status& connected = formed.connected;
  if (!store_failure.ok()) {
    return absl::Status(store_failure.code(),
                        absl::StrCat("gloo rendezvous of rank ", rank, " of ", world_size,
                                     " under '", prefix, "': ", store_failure.message()));
  }
  if (!connected.ok()) {
    if (absl::Now() >= deadline && !absl::IsDeadlineExceeded(connected)) {
      return absl::DeadlineExceededError(connected.message());
    }
    return connected;
  }
  state->context = std::move(formed.context);
  state->bound = std::move(formed.bound);
  state->worker = std::thread(&State::WorkerLoop, state);
  return std::unique_ptr<GlooCollective>(new GlooCollective(std::move(state)));
}

GlooCollective::~GlooCollective() {
  state_->CloseConnections();
  bool busy;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stop = true;
    busy = state_->busy;
  }
  // An idle worker sees `stop` and returns; a busy one is inside Gloo until its timeout or the
  // closed connections end the call, holding its own reference to the state.
  if (busy) {
    state_->worker.detach();
  } else {
    state_->worker.join();
  }
}

int64_t GlooCollective::rank() const { return state_->rank; }
int64_t GlooCollective::world_size() const { return state_->world_size; }

absl::Status GlooCollective::AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                                       absl::Time deadline) {
  if (ops.size() != values.size()) {
    return absl::InvalidArgumentError("gloo: ops and values differ in size");
  }
  if (values.empty()) return absl::OkStatus();
  // The worker works on its own copy, so a call abandoned at its deadline never writes `values`.
  auto data = std::make_shared<std::vector<int64_t>>(values.begin(), values.end());
  std::shared_ptr<gloo::Context> context = state_->context;
  std::shared_ptr<BoundRecursiveDoubling> bound =
      values.size() <= BoundRecursiveDoubling::kMaxWords ? state_->bound : nullptr;
  const GlooOptions::Algorithm algorithm = state_->algorithm;
  const int64_t rank = state_->rank;
  std::vector<ReduceOp> op_copy(ops.begin(), ops.end());
  absl::Status status = state_->Call(
      [=, ops = std::move(op_copy)]() mutable {
        return RunGloo("all-reduce", rank, [&] {
          if (bound != nullptr) {
            bound->Run(data->data(), ops);
            return;
          }
          if (algorithm == GlooOptions::Algorithm::kRecursiveDoubling) {
            RecursiveDoublingAllreduce(*context, data->data(), ops, Remaining(deadline));
            return;
          }
          FullMeshAllreduce(context, data->data(), std::move(ops), algorithm, Remaining(deadline));
        });
      },
      "all-reduce", deadline);
  if (!status.ok()) return status;
  std::copy(data->begin(), data->end(), values.begin());
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                                       absl::Time deadline) {
  if (out.size() != record.size() * static_cast<size_t>(state_->world_size)) {
    return absl::InvalidArgumentError("gloo: out must hold world_size records");
  }
  if (record.empty()) return absl::OkStatus();
  auto in = std::make_shared<std::vector<int64_t>>(record.begin(), record.end());
  auto gathered = std::make_shared<std::vector<int64_t>>(out.size());
  std::shared_ptr<gloo::Context> context = state_->context;
  const int64_t rank = state_->rank;
  const bool sparse = state_->algorithm == GlooOptions::Algorithm::kRecursiveDoubling;
  absl::Status status = state_->Call(
      [=] {
        return RunGloo("all-gather", rank, [&] {
          if (sparse) {
            // Only the recursive-doubling pairs are connected: gather as an all-reduce (sum) of
            // the W records, each rank's own in its slot and zeros elsewhere (x + 0 = x, so the
            // sum is exact). W·record bytes per hop: the failure path only, where the records
            // name the ranks at fault.
            std::copy(in->begin(), in->end(), gathered->begin() + rank * in->size());
            RecursiveDoublingAllreduce(*context, gathered->data(),
                                       std::vector<ReduceOp>(gathered->size(), ReduceOp::kSum),
                                       Remaining(deadline));
            return;
          }
          FullMeshAllgather(context, in->data(), in->size(), gathered->data(), Remaining(deadline));
        });
      },
      "all-gather", deadline);
  if (!status.ok()) return status;
  std::copy(gathered->begin(), gathered->end(), out.begin());
  return absl::OkStatus();
}

void GlooCollective::Abort() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->aborted = true;
    if (state_->broken.ok()) {
      state_->broken = absl::AbortedError(absl::StrCat("gloo: rank ", state_->rank, " aborted"));
    }
  }
  state_->CloseConnections();
}

}  // namespace packsched::collective
