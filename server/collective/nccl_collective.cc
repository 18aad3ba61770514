// The NCCL backend proper; built only with PACKSCHED_WITH_NCCL (nccl_stub.cc otherwise).

#include "server/collective/nccl_collective.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace packsched::collective {

bool NcclBuilt() { return true; }

bool GpuAvailable() {
  int count = 0;
  // Without a driver this returns an error (not 0 devices): both mean "no GPU".
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return false;
  }
  return count > 0;
}

namespace {

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  return absl::InternalError(absl::StrCat("cuda ", what, ": ", cudaGetErrorString(error)));
}

// Polling without burning a core for a whole collective timeout: yield for the first polls (a
// round normally completes within tens of microseconds), then sleep 100 us between polls.
class Backoff {
 public:
  void Pause() {
    if (++polls_ < 256) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  int polls_ = 0;
};

}  // namespace

struct NcclCollective::Impl {
  int64_t rank = 0;
  int64_t world_size = 0;
  int device = 0;
  cudaStream_t stream = nullptr;

  absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;  // null once aborted
  bool in_call ABSL_GUARDED_BY(mu) = false;
  absl::Status broken ABSL_GUARDED_BY(mu);
  std::atomic<bool> abort_requested{false};

  // Device buffers, grown (rarely) to the largest call, and pinned host staging of the same
  // size: a copy to pageable memory would block the host until the collective finished, out
  // of reach of the deadline.
  int64_t* device_in = nullptr;
  int64_t* device_out = nullptr;
  int64_t* host = nullptr;
  size_t capacity = 0;  // words in each buffer

  ~Impl() {
    {
      absl::MutexLock lock(&mu);
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    }
    cudaSetDevice(device);
    if (device_in != nullptr) cudaFree(device_in);
    if (device_out != nullptr) cudaFree(device_out);
    if (host != nullptr) cudaFreeHost(host);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Aborts the communicator (if alive) and records `status` as the instance's failure.
  absl::Status Fail(absl::Status status) {
    absl::MutexLock lock(&mu);
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    if (broken.ok()) broken = std::move(status);
    return broken;
  }

  // Why a wait loop must stop now (Abort() was called, or the deadline passed); OK to go on.
  absl::Status StopWaiting(absl::string_view what, absl::Time deadline) const {
    if (abort_requested.load()) {
      return absl::AbortedError(absl::StrCat("nccl: rank ", rank, " aborted"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("nccl ", what, " on rank ", rank, " of ",
                                                      world_size,
                                                      " did not complete before the deadline"));
    }
    return absl::OkStatus();
  }

  // Waits until the communicator leaves ncclInProgress, checking for errors, Abort() and the
  // deadline. `comm_now` is the communicator the caller holds (in_call keeps it alive).
  absl::Status WaitReady(ncclComm_t comm_now, absl::string_view what, absl::Time deadline) {
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t result = ncclCommGetAsyncError(comm_now, &state);
      if (result != ncclSuccess) state = result;
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return absl::AbortedError(absl::StrCat("nccl ", what, " on rank ", rank, ": ",
                                               ncclGetErrorString(state), " (",
                                               ncclGetLastError(comm_now), ")"));
      }
      if (absl::Status stop = StopWaiting(what, deadline); !stop.ok()) return stop;
      backoff.Pause();
    }
  }

  // Waits for the stream's work (the collectives and copies), polling NCCL for async errors.
  absl::Status WaitStream(ncclComm_t comm_now, absl::string_view what, absl::Time deadline) {
    Backoff backoff;
    for (;;) {
      const cudaError_t query = cudaStreamQuery(stream);
      if (query == cudaSuccess) return absl::OkStatus();
      if (query != cudaErrorNotReady) return CudaError(query, what);
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_now, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        return absl::AbortedError(
            absl::StrCat("nccl ", what, " on rank ", rank, ": ", ncclGetErrorString(state)));
      }
      if (absl::Status stop = StopWaiting(what, deadline); !stop.ok()) return stop;
      backoff.Pause();
    }
  }

  absl::Status EnsureCapacity(size_t words) {
    if (words <= capacity) return absl::OkStatus();
    if (device_in != nullptr) cudaFree(device_in);
    if (device_out != nullptr) cudaFree(device_out);
    if (host != nullptr) cudaFreeHost(host);
    device_in = device_out = host = nullptr;
    capacity = 0;
    const size_t grown = std::max<size_t>(words, 256);
    cudaError_t error = cudaMalloc(&device_in, grown * sizeof(int64_t));
    if (error == cudaSuccess) error = cudaMalloc(&device_out, grown * sizeof(int64_t));
    if (error == cudaSuccess) error = cudaMallocHost(&host, grown * sizeof(int64_t));
    if (error != cudaSuccess) return CudaError(error, "cudaMalloc");
    capacity = grown;
    return absl::OkStatus();
  }

  // Runs one call: `enqueue` issues the NCCL calls on `stream`; once NCCL reports them enqueued
  // (a non-blocking communicator may return before that), `then` queues the copy back; then the
  // stream is awaited. Any error aborts the communicator and fails the instance.
  template <typename Enqueue, typename Then>
  absl::Status Run(absl::string_view what, absl::Time deadline, Enqueue enqueue, Then then) {
    ncclComm_t comm_now;
    {
      absl::MutexLock lock(&mu);
      if (!broken.ok()) return broken;
      comm_now = comm;
      in_call = true;
    }
    absl::Status status = [&]() -> absl::Status {
      const cudaError_t set = cudaSetDevice(device);
      if (set != cudaSuccess) return CudaError(set, "cudaSetDevice");
      const ncclResult_t issued = enqueue(comm_now);
      if (issued != ncclSuccess && issued != ncclInProgress) {
        return absl::AbortedError(
            absl::StrCat("nccl ", what, " on rank ", rank, ": ", ncclGetErrorString(issued)));
      }
      absl::Status ready = WaitReady(comm_now, what, deadline);
      if (!ready.ok()) return ready;
      const cudaError_t copied = then();
      if (copied != cudaSuccess) return CudaError(copied, what);
      return WaitStream(comm_now, what, deadline);
    }();
    {
      absl::MutexLock lock(&mu);
      in_call = false;
    }
    if (!status.ok()) return Fail(status);
    return absl::OkStatus();
  }
};

NcclCollective::NcclCollective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCollective::~NcclCollective() = default;

int64_t NcclCollective::rank() const { return impl_->rank; }
int64_t NcclCollective::world_size() const { return impl_->world_size; }

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(
    KeyValueStore& store, absl::string_view prefix, int64_t rank, int64_t world_size,
    const NcclOptions& options, absl::Time deadline) {
  if (world_size < 1 || world_size > (int64_t{1} << 20) || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " is not in a group of ", world_size));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || options.device < 0 || options.device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl: device ", options.device, " is not available (", count, " CUDA devices visible)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->world_size = world_size;
  impl->device = options.device;
  cudaError_t error = cudaSetDevice(options.device);
  if (error == cudaSuccess) error = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) return CudaError(error, "stream");
  // Buffers for the largest call up front: the gather of a failed round's records (W records).
  // cudaMalloc/cudaFree synchronise the device, which must not happen in the middle of a round.
  if (absl::Status room = impl->EnsureCapacity(static_cast<size_t>(world_size) *
                                               static_cast<size_t>(kMaxGatheredRecordWords));
      !room.ok()) {
    return room;
  }

  // The unique id travels through the store: rank 0 writes it, the others wait for it.
  const std::string key = absl::StrCat(prefix, "nccl_unique_id");
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) {
      return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(made)));
    }
    absl::Status set =
        store.Set(key, absl::string_view(id.internal, sizeof(id.internal)), deadline);
    if (!set.ok()) return set;
  } else {
    absl::StatusOr<std::string> value = store.Get(key, deadline);
    if (!value.ok()) return value.status();
    if (value->size() != sizeof(id.internal)) {
      return absl::InternalError("nccl: the unique id in the store has the wrong size");
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is ours, bounded by the deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitRankConfig(&comm, static_cast<int>(world_size), id,
                                                   static_cast<int>(rank), &config);
  if (init != ncclSuccess && init != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::InternalError(absl::StrCat("ncclCommInitRankConfig: ", ncclGetErrorString(init)));
  }
  {
    absl::MutexLock lock(&impl->mu);
    impl->comm = comm;
  }
  absl::Status ready = impl->WaitReady(comm, "init", deadline);
  if (!ready.ok()) return impl->Fail(ready);  // ~Impl frees the rest
  return std::unique_ptr<NcclCollective>(new NcclCollective(std::move(impl)));
}

absl::Status NcclCollective::AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                                       absl::Time deadline) {
  if (ops.size() != values.size()) {
    return absl::InvalidArgumentError("nccl: ops and values differ in size");
  }
  if (values.empty()) return absl::OkStatus();
  Impl& impl = *impl_;
  // Stage the values grouped by op: [max..., min..., sum...], so one NCCL call serves each op.
  constexpr ReduceOp kOrder[] = {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum};
  constexpr ncclRedOp_t kNccl[] = {ncclMax, ncclMin, ncclSum};
  std::vector<size_t> slot(values.size());
  size_t begin[4] = {0, 0, 0, 0};
  size_t words = 0;
  for (int o = 0; o < 3; ++o) {
    begin[o] = words;
    for (size_t i = 0; i < values.size(); ++i) {
      if (ops[i] == kOrder[o]) slot[i] = words++;
    }
  }
  begin[3] = words;
  if (absl::Status room = impl.EnsureCapacity(words); !room.ok()) return impl.Fail(room);
  for (size_t i = 0; i < values.size(); ++i) impl.host[slot[i]] = values[i];
  absl::Status status = impl.Run(
      "all-reduce", deadline,
      [&](ncclComm_t comm) {
        if (cudaMemcpyAsync(impl.device_in, impl.host, words * sizeof(int64_t),
                            cudaMemcpyHostToDevice, impl.stream) != cudaSuccess) {
          return ncclUnhandledCudaError;
        }
        ncclResult_t result = ncclGroupStart();
        for (int o = 0; o < 3 && (result == ncclSuccess || result == ncclInProgress); ++o) {
          const size_t count = begin[o + 1] - begin[o];
          if (count == 0) continue;
          result = ncclAllReduce(impl.device_in + begin[o], impl.device_out + begin[o], count,
                                 ncclInt64, kNccl[o], comm, impl.stream);
        }
        const ncclResult_t ended = ncclGroupEnd();
        if (result == ncclSuccess || result == ncclInProgress) result = ended;
        return result;
      },
      [&] {
        return cudaMemcpyAsync(impl.host, impl.device_out, words * sizeof(int64_t),
                               cudaMemcpyDeviceToHost, impl.stream);
      });
  if (!status.ok()) return status;
  for (size_t i = 0; i < values.size(); ++i) values[i] = impl.host[slot[i]];
  return absl::OkStatus();
}

absl::Status NcclCollective::AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                                       absl::Time deadline) {
  if (out.size() != record.size() * static_cast<size_t>(impl_->world_size)) {
    return absl::InvalidArgumentError("nccl: out must hold world_size records");
  }
  if (record.empty()) return absl::OkStatus();
  Impl& impl = *impl_;
  if (absl::Status room = impl.EnsureCapacity(out.size()); !room.ok()) return impl.Fail(room);
  std::copy(record.begin(), record.end(), impl.host);
  absl::Status status = impl.Run(
      "all-gather", deadline,
      [&](ncclComm_t comm) {
        if (cudaMemcpyAsync(impl.device_in, impl.host, record.size() * sizeof(int64_t),
                            cudaMemcpyHostToDevice, impl.stream) != cudaSuccess) {
          return ncclUnhandledCudaError;
        }
        return ncclAllGather(impl.device_in, impl.device_out, record.size(), ncclInt64, comm,
                             impl.stream);
      },
      [&] {
        return cudaMemcpyAsync(impl.host, impl.device_out, out.size() * sizeof(int64_t),
                               cudaMemcpyDeviceToHost, impl.stream);
      });
  if (!status.ok()) return status;
  std::copy(impl.host, impl.host + out.size(), out.begin());
  return absl::OkStatus();
}

void NcclCollective::Abort() {
  Impl& impl = *impl_;
  impl.abort_requested.store(true);
  absl::MutexLock lock(&impl.mu);
  if (impl.broken.ok()) {
    impl.broken = absl::AbortedError(absl::StrCat("nccl: rank ", impl.rank, " aborted"));
  }
  // A call in flight sees abort_requested and aborts the communicator itself.
  if (!impl.in_call && impl.comm != nullptr) {
    ncclCommAbort(impl.comm);
    impl.comm = nullptr;
  }
}

}  // namespace packsched::collective
