#ifndef PACKSCHED_TESTS_KERNELS_EMULATED_QUERY_ROWS_H_
#define PACKSCHED_TESTS_KERNELS_EMULATED_QUERY_ROWS_H_

// The query-row map for the tests that run the CUDA attention kernels under the CPU emulations
// (attention_emulated_test.cc, attention_tc_emulated_test.cc): query_row_maps.h, and the map's
// runs as the launchers hand them to the kernels (attention_query_runs.cuh).

#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_query_runs.cuh"
#include "kernels/internal/attention_args.h"
#include "tests/kernels/query_row_maps.h"

namespace packsched::kernels::testing {

// The map's runs as UploadQueryRuns gives them to the kernels (in the emulation the device's
// memory is the host's): at least one pair stored, so that an empty map still has a pointer.
struct QueryRuns {
  explicit QueryRuns(const std::vector<int32_t>& rows)
      : runs(internal::cuda::QueryRunsOf(rows.data(), static_cast<int64_t>(rows.size()))),
        count(static_cast<int64_t>(runs.size() / 2)) {
    if (runs.empty()) runs = {0, 0};
  }
  void SetOn(internal::AttentionArgs& a) const {
    a.query_runs = runs.data();
    a.num_query_runs = count;
  }
  std::vector<int32_t> runs;
  int64_t count;
};

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_EMULATED_QUERY_ROWS_H_
