#ifndef PACKSCHED_SERVER_COLLECTIVE_RECURSIVE_DOUBLING_H_
#define PACKSCHED_SERVER_COLLECTIVE_RECURSIVE_DOUBLING_H_

// Internal to the Gloo backend: the all-reduce of a round's small record by recursive doubling
// over Gloo's point-to-point buffers, in two forms — over Gloo's unbound buffers (any size; the
// formation barrier and the failure path's gather) and over buffers registered once at formation
// (a round's record: one message each way per hop).

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gloo/context.h"
#include "gloo/transport/buffer.h"
#include "server/collective/collective.h"

namespace packsched::collective::internal {

// out[r][j] = ops[j](a[r][j], b[r][j]) for `n` records of ops.size() words (byte pointers:
// Gloo hands its reduction callback untyped, possibly unaligned, memory). Sums wrap.
void ReduceRecords(void* out, const void* a, const void* b, size_t n,
                   const std::vector<ReduceOp>& ops);

// Recursive doubling's layout of W ranks: p = the largest power of two <= W takes part in the
// hypercube exchange; each of the first `extra` = W - p odd ranks first absorbs the even rank
// before it (the fold) and stands in for it.
struct Hypercube {
  explicit Hypercube(int world) {
    while (p * 2 <= world) p *= 2;
    extra = world - p;
  }
  // The rank that `rank` folds with, or -1.
  int FoldPartner(int rank) const {
    if (rank >= 2 * extra) return -1;
    return rank % 2 == 0 ? rank + 1 : rank - 1;
  }
  // The rank's index in the hypercube, or -1 for a rank folded away.
  int VirtualRank(int rank) const {
    if (rank < 2 * extra) return rank % 2 == 1 ? rank / 2 : -1;
    return rank - extra;
  }
  int RankOf(int virtual_rank) const {
    return virtual_rank < extra ? 2 * virtual_rank + 1 : virtual_rank + extra;
  }

  int p = 1;
  int extra = 0;
};

// Recursive doubling over Gloo's unbound buffers: every rank holds the whole (small) record
// and exchanges it with the rank whose index differs in one bit, log2(p) times (p the largest
// power of two <= W). The W - p extra ranks first fold into a partner and get the result back
// at the end: ceil(log2 W) + 2 hops at most, against bcube's 2·log2 W (and its W/2^k-way
// exchange when W is not a power of two). The ops are commutative and associative on int64 (sums
// wrap), so every rank computes the identical result. Each wait is bounded by `timeout`. Throws
// what Gloo throws. REQUIRES: `context` connected to this rank's partners (see Hypercube).
void RecursiveDoublingAllreduce(gloo::Context& context, int64_t* data,
                                const std::vector<ReduceOp>& ops,
                                std::chrono::milliseconds timeout);

// The same all-reduce over buffers registered once, at formation, for records of up to
// kMaxWords: the common path of every round. Gloo's unbound buffers rendezvous each message (the
// receiver announces its receive, the sender its send, and only then does the data go: three
// messages and an extra one-way trip per hop); a registered buffer is known to its pair, so a
// hop is one message each way, written straight into the partner's buffer.
//
// Each link (one per partner) sends once and receives once per call, into one of two buffers
// chosen by the call's parity. Two are enough: a partner can send into the buffer of parity p
// again only two calls later, and it cannot finish the call in between without this rank's part
// of it, which this rank sends only after reading the earlier message.
//
// Waits are bounded by the pairs' own timeout, fixed when they were created (Gloo's registered
// buffers take no timeout per wait). Not thread-safe: one call at a time, and every rank of the
// group makes the same sequence of calls.
class BoundRecursiveDoubling {
 public:
  static constexpr size_t kMaxWords = 32;

  // Registers the buffers. Call once the pairs to this rank's partners are connected and before
  // any partner can send into them (before the formation's barrier). Throws what Gloo throws.
  explicit BoundRecursiveDoubling(std::shared_ptr<gloo::Context> context);

  // All-reduces `data` (ops.size() words) across the group. REQUIRES: ops.size() <= kMaxWords.
  // Throws what Gloo throws.
  void Run(int64_t* data, const std::vector<ReduceOp>& ops);

 private:
  struct Link {
    std::array<std::array<int64_t, kMaxWords>, 2> out{}, in{};  // by parity
    std::array<std::unique_ptr<gloo::transport::Buffer>, 2> send, recv;
  };
  std::unique_ptr<Link> AddLink(int peer);

  std::shared_ptr<gloo::Context> context_;  // first: the buffers go before the pairs they use
  Hypercube cube_;
  std::unique_ptr<Link> fold_;               // with the fold partner, if any
  std::vector<std::unique_ptr<Link>> hops_;  // one per hypercube bit, in order
  int parity_ = 0;
};

}  // namespace packsched::collective::internal

#endif  // PACKSCHED_SERVER_COLLECTIVE_RECURSIVE_DOUBLING_H_
