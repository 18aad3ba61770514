#ifndef PACKSCHED_SERVER_COLLECTIVE_NCCL_COLLECTIVE_H_
#define PACKSCHED_SERVER_COLLECTIVE_NCCL_COLLECTIVE_H_

// The NCCL backend (docs/design.md §3): one GPU per rank, a non-blocking communicator whose every
// wait polls for asynchronous errors against the caller's deadline and aborts the communicator
// on failure, timeout or Abort(). This header includes neither CUDA nor NCCL; in a build without
// PACKSCHED_WITH_NCCL, NcclBuilt() and GpuAvailable() are false and Create returns Unimplemented.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"
#include "server/collective/store.h"

namespace packsched::collective {

// True when this binary was built with the NCCL backend.
bool NcclBuilt();

// True when the NCCL backend is built and the CUDA runtime sees at least one GPU. An error from
// the runtime (no driver, as on CPU-only machines) counts as "no GPU".
bool GpuAvailable();

struct NcclOptions {
  // The CUDA device this rank uses (the server passes --local_gpu, else LOCAL_RANK). Two ranks
  // of one group must not share a device.
  int device = 0;
};

class NcclCollective final : public Collective {
 public:
  // Rank 0 creates NCCL's unique id and publishes it under `prefix` in `store`; every rank reads
  // it and joins the communicator, waiting at most until `deadline`. `prefix` must be fresh for
  // every formation. Returns Unimplemented without the NCCL backend, FailedPrecondition without
  // a usable device, DeadlineExceeded if the group did not form in time (the half-formed
  // communicator is aborted), Internal for other NCCL or CUDA errors.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(KeyValueStore& store,
                                                                absl::string_view prefix,
                                                                int64_t rank, int64_t world_size,
                                                                const NcclOptions& options,
                                                                absl::Time deadline);
  ~NcclCollective() override;  // aborts the communicator if it is still alive

  int64_t rank() const override;
  int64_t world_size() const override;
  absl::string_view backend() const override { return "nccl"; }

  // Values are grouped by op into one device buffer and reduced with at most three NCCL calls
  // inside one group (max, min, sum). Errors as Collective::AllReduce; any error aborts the
  // communicator and the instance returns that error from every later call.
  absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                         absl::Time deadline) override;
  absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                         absl::Time deadline) override;
  void Abort() override;

  struct Impl;  // CUDA/NCCL state (nccl_collective.cc)

 private:
  explicit NcclCollective(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_NCCL_COLLECTIVE_H_
