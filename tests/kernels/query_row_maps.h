#ifndef PACKSCHED_TESTS_KERNELS_QUERY_ROW_MAPS_H_
#define PACKSCHED_TESTS_KERNELS_QUERY_ROW_MAPS_H_

// The query-row map (attention.h: AttentionSeqlens::query_rows) for the tests of the CUDA
// attention with one (on the device, attention_cuda_test.cc, and under the CPU emulations,
// emulated_query_rows.h): tree CP's head-tail row maps, and the checks of a mapped run against the
// same kernels without the map and against the CPU backend with it.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels::testing {

// The rows CP rank `rank` of a group of `cp` holds, as tree CP's map gives them
// (client/python/packsched/_tree_cp.py, tree_segment_rows): per segment of `cu` (lengths
// multiples of 2 cp) a head run and a tail run of L / cp rows together, the members taking theirs
// from the outside in. The split of each member's L / cp rows between head and tail is drawn from
// `seed` (the same draws for every rank, so the group's maps partition the rows) rather than
// balanced by work, so that runs start and end anywhere within the kernels' tiles and some are
// empty.
inline std::vector<int32_t> HeadTailRows(const std::vector<int32_t>& cu, int cp, int rank,
                                         uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> rows;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int32_t n = (cu[b + 1] - cu[b]) / cp;
    int32_t lo = cu[b], hi = cu[b + 1];
    for (int member = 0; member < cp; ++member) {
      const int32_t take = std::uniform_int_distribution<int32_t>(0, n)(rng);
      if (member == rank) {
        for (int32_t r = lo; r < lo + take; ++r) rows.push_back(r);
        for (int32_t r = hi - (n - take); r < hi; ++r) rows.push_back(r);
      }
      lo += take;
      hi -= n - take;
    }
  }
  return rows;
}

// Per row of q (tq rows) whether `rows` lists it.
inline std::vector<bool> MappedRows(const std::vector<int32_t>& rows, int64_t tq) {
  std::vector<bool> mapped(static_cast<size_t>(tq), false);
  for (const int32_t r : rows) mapped[static_cast<size_t>(r)] = true;
  return mapped;
}

// `in` with dout 0 on every row outside the map: the inputs under which the call without the map
// gives the mapped call's dk and dv (attention.h).
inline Inputs WithDoutOnlyOn(const Problem& p, Inputs in, const std::vector<bool>& mapped) {
  const int64_t row = p.heads * p.head_dim;
  for (size_t t = 0; t < mapped.size(); ++t) {
    if (mapped[t]) continue;
    for (int64_t i = 0; i < row; ++i) in.dout[t * row + i] = 0;
  }
  return in;
}

inline bool SameDoubleBits(double x, double y) { return std::memcmp(&x, &y, sizeof(x)) == 0; }

// A mapped run `got` against the run without the map `want` (on WithDoutOnlyOn's inputs): the
// mapped rows' out, lse and dq bitwise want's, every other row a query that sees no key (out 0,
// lse +inf, dq 0), dk and dv bitwise want's. Stops at the first difference.
inline void ExpectMappedRun(const Problem& p, const std::vector<bool>& mapped, const Outputs& want,
                            const Outputs& got, const std::string& what) {
  const int64_t tq = static_cast<int64_t>(mapped.size());
  const int64_t row = p.heads * p.head_dim;
  for (int64_t t = 0; t < tq; ++t) {
    for (int64_t i = 0; i < row; ++i) {
      const size_t x = static_cast<size_t>(t * row + i);
      ASSERT_TRUE(SameDoubleBits(got.out[x], mapped[t] ? want.out[x] : 0.0))
          << what << " out row " << t << ": " << got.out[x] << " vs " << want.out[x];
      ASSERT_TRUE(SameDoubleBits(got.dq[x], mapped[t] ? want.dq[x] : 0.0))
          << what << " dq row " << t << ": " << got.dq[x] << " vs " << want.dq[x];
    }
    for (int64_t h = 0; h < p.heads; ++h) {
      const size_t x = static_cast<size_t>(h * tq + t);
      ASSERT_TRUE(SameDoubleBits(got.lse[x], mapped[t] ? want.lse[x] : INFINITY))
          << what << " lse row " << t << " head " << h;
    }
  }
  for (size_t x = 0; x < want.dk.size(); ++x) {
    ASSERT_TRUE(SameDoubleBits(got.dk[x], want.dk[x]))
        << what << " dk element " << x << ": " << got.dk[x] << " vs " << want.dk[x];
    ASSERT_TRUE(SameDoubleBits(got.dv[x], want.dv[x]))
        << what << " dv element " << x << ": " << got.dv[x] << " vs " << want.dv[x];
  }
}

// The CPU backend with the map (`rows`) on `in`, against the kernels' mapped run `got`: the rows
// outside the map are bitwise the same (out 0, lse +inf, dq 0), and the mapped rows' out, lse
// and dq and all of dk and dv hold the tolerance rule against the reference on
// WithDoutOnlyOn's inputs `own` (the other rows' out, lse and dq taken from `want`, the kernels'
// run without the map on `own`, which the caller has checked against that reference).
template <typename T>
void ExpectCpuMapAgrees(const Problem& p, const Inputs& in, const Inputs& own,
                        const std::vector<int32_t>& rows, const std::vector<bool>& mapped,
                        const Outputs& want, const Outputs& got) {
  AttentionTensors<T> cpu(p, in);
  HostTensor map = CuTensor(rows);
  cpu.seqlens.query_rows = &map.view();
  ASSERT_TRUE(cpu.Forward(p.options).ok()) << cpu.Forward(p.options);
  ASSERT_TRUE(cpu.Backward(p.options).ok()) << cpu.Backward(p.options);
  Outputs c = cpu.Results();
  const int64_t tq = static_cast<int64_t>(mapped.size());
  const int64_t row = p.heads * p.head_dim;
  for (int64_t t = 0; t < tq; ++t) {
    if (mapped[t]) continue;
    for (int64_t i = 0; i < row; ++i) {
      const size_t x = static_cast<size_t>(t * row + i);
      ASSERT_TRUE(SameDoubleBits(c.out[x], got.out[x])) << "cpu map out row " << t;
      ASSERT_TRUE(SameDoubleBits(c.dq[x], got.dq[x])) << "cpu map dq row " << t;
      c.out[x] = want.out[x];
      c.dq[x] = want.dq[x];
    }
    for (int64_t h = 0; h < p.heads; ++h) {
      const size_t x = static_cast<size_t>(h * tq + t);
      ASSERT_TRUE(SameDoubleBits(c.lse[x], got.lse[x])) << "cpu map lse row " << t;
      c.lse[x] = want.lse[x];
    }
  }
  ExpectMatchesReference<T>(p, own, c, "cpu map ");
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_QUERY_ROW_MAPS_H_
