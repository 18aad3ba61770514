#include "server/collective/recursive_doubling.h"

#include <cstring>
#include <utility>

#include "gloo/common/error.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace packsched::collective::internal {

void ReduceRecords(void* out, const void* a, const void* b, size_t n,
                   const std::vector<ReduceOp>& ops) {
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < ops.size(); ++j) {
      const size_t at = (r * ops.size() + j) * sizeof(int64_t);
      int64_t x, y;
      std::memcpy(&x, static_cast<const char*>(a) + at, sizeof(x));
      std::memcpy(&y, static_cast<const char*>(b) + at, sizeof(y));
      const int64_t z = Reduce(ops[j], x, y);
      std::memcpy(static_cast<char*>(out) + at, &z, sizeof(z));
    }
  }
}

// Our own slot range, apart from Gloo's collectives (types.h uses prefixes 0x01..0x08).
constexpr uint8_t kRecursiveDoublingSlotPrefix = 0x50;

void RecursiveDoublingAllreduce(gloo::Context& context, int64_t* data,
                                const std::vector<ReduceOp>& ops,
                                std::chrono::milliseconds timeout) {
  const int rank = context.rank;
  const Hypercube cube(context.size);
  const size_t bytes = ops.size() * sizeof(int64_t);
  std::vector<int64_t> incoming(ops.size());
  auto mine = context.createUnboundBuffer(data, bytes);
  auto theirs = context.createUnboundBuffer(incoming.data(), bytes);
  const uint64_t slot = gloo::Slot::build(kRecursiveDoublingSlotPrefix, 0);
  auto wait = [&](bool received) {
    if (!(received ? theirs->waitRecv(timeout) : mine->waitSend(timeout))) {
      throw gloo::IoException("recursive doubling: aborted");
    }
  };
  // Fold: among the first 2·extra ranks, each even rank hands its record to the next odd one.
  const int fold = cube.FoldPartner(rank);
  if (fold >= 0) {
    if (rank % 2 == 0) {
      mine->send(fold, slot);
      wait(false);
    } else {
      theirs->recv(fold, slot);
      wait(true);
      ReduceRecords(data, data, incoming.data(), 1, ops);
    }
  }
  const int virtual_rank = cube.VirtualRank(rank);
  if (virtual_rank >= 0) {
    for (int mask = 1; mask < cube.p; mask <<= 1) {
      const int partner = cube.RankOf(virtual_rank ^ mask);
      theirs->recv(partner, slot);
      mine->send(partner, slot);
      wait(true);
      wait(false);
      ReduceRecords(data, data, incoming.data(), 1, ops);
    }
  }
  // Unfold: the odd ranks give the result back to the even ranks that folded into them.
  if (fold >= 0) {
    if (rank % 2 == 0) {
      mine->recv(fold, slot);
      if (!mine->waitRecv(timeout)) throw gloo::IoException("recursive doubling: aborted");
    } else {
      mine->send(fold, slot);
      wait(false);
    }
  }
}

BoundRecursiveDoubling::BoundRecursiveDoubling(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)), cube_(context_->size) {
  const int rank = context_->rank;
  if (const int fold = cube_.FoldPartner(rank); fold >= 0) fold_ = AddLink(fold);
  if (const int v = cube_.VirtualRank(rank); v >= 0) {
    for (int mask = 1; mask < cube_.p; mask <<= 1) hops_.push_back(AddLink(cube_.RankOf(v ^ mask)));
  }
}

std::unique_ptr<BoundRecursiveDoubling::Link> BoundRecursiveDoubling::AddLink(int peer) {
  auto link = std::make_unique<Link>();
  std::unique_ptr<gloo::transport::Pair>& pair = context_->getPair(peer);
  for (int parity = 0; parity < 2; ++parity) {
    // A send buffer's slot names the partner's receive buffer of the same slot.
    link->send[parity] =
        pair->createSendBuffer(parity, link->out[parity].data(), sizeof(link->out[parity]));
    link->recv[parity] =
        pair->createRecvBuffer(parity, link->in[parity].data(), sizeof(link->in[parity]));
  }
  return link;
}

void BoundRecursiveDoubling::Run(int64_t* data, const std::vector<ReduceOp>& ops) {
  const int parity = parity_;
  parity_ ^= 1;
  const size_t bytes = ops.size() * sizeof(int64_t);
  // A send completes in place (the record is far below the socket buffer), so waiting for it
  // right away costs nothing and frees the staging copy for two calls later.
  auto send = [&](Link& link) {
    std::memcpy(link.out[parity].data(), data, bytes);
    link.send[parity]->send(0, bytes);
    link.send[parity]->waitSend();
  };
  auto receive = [&](Link& link) { link.recv[parity]->waitRecv(); };
  // Fold: among the first 2·extra ranks, each even rank hands its record to the next odd one.
  const bool folds_away = fold_ != nullptr && context_->rank % 2 == 0;
  if (fold_ != nullptr) {
    if (folds_away) {
      send(*fold_);
    } else {
      receive(*fold_);
      ReduceRecords(data, data, fold_->in[parity].data(), 1, ops);
    }
  }
  for (const std::unique_ptr<Link>& hop : hops_) {
    send(*hop);
    receive(*hop);
    ReduceRecords(data, data, hop->in[parity].data(), 1, ops);
  }
  // Unfold: the odd ranks give the result back to the even ranks that folded into them.
  if (fold_ != nullptr) {
    if (folds_away) {
      receive(*fold_);
      std::memcpy(data, fold_->in[parity].data(), bytes);
    } else {
      send(*fold_);
    }
  }
}

}  // namespace packsched::collective::internal
