#ifndef PACKSCHED_TESTS_KERNELS_CUDA_EMULATION_WARP_RUNTIME_H_
#define PACKSCHED_TESTS_KERNELS_CUDA_EMULATION_WARP_RUNTIME_H_

// A warp-accurate CPU emulation of one CUDA block: every CUDA thread is a fiber (ucontext) on the
// calling OS thread, switched only at synchronisation points, so the block's threads run
// interleaved but never concurrently (no data races in the emulation itself). Two kinds of
// synchronisation:
//   - __syncthreads: every live thread of the block arrives (threads that exited no longer count);
//   - warp collectives (WarpCollective, used by the ptx.cuh emulation for mma, ldmatrix and
//     shuffles): the 32 threads of a warp arrive with their inputs, the last one computes every
//     lane's output from all 32 inputs, then each lane continues with its own. The 32 lanes must
//     call the same collective (divergence aborts with a message), as mma.sync.aligned requires.
// A block in which no thread can progress (a warp collective that a lane never reaches, a barrier
// that an exited warp leaves short) aborts with a description instead of hanging.
//
// The block's dynamic shared memory is filled with 0xff bytes (NaN as float, fp16 and bf16) when
// the block starts, so that a read of a value never written shows up in the results.
//
// Between two synchronisation points a thread runs alone; the order in which the scheduler resumes
// the block's threads (`schedule`: ascending, descending, shuffled anew on every sweep, or one
// warp as far as it gets before the next) decides which of two unsynchronised accesses to the
// same shared memory comes first. A kernel whose results change with the order has a race that
// hardware could show (a missing __syncthreads or cp.async wait, a buffer refilled while another
// warp still reads it): the emulation's racecheck. RunGrid orders the blocks of a grid the same
// way (shuffled for the warp-by-warp order).
//
// Test-only. cuda_runtime.h (the same folder) provides threadIdx, blockIdx, gridDim and
// __syncthreads.

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace packsched_cuda_emulation {

inline constexpr int kWarpSize = 32;

// One asynchronous copy of 16 bytes (cp.async), performed at the wait that retires its group.
struct PendingCopy {
  void* dst;
  const void* src;
  bool fill;
};

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  bool done = false;
  std::vector<PendingCopy> open_group;              // issued since the last commit
  std::vector<std::vector<PendingCopy>> committed;  // oldest first
  const char* waiting_on = "";                      // for the deadlock report
};

// The data one warp collective exchanges: each lane's input and output (up to kSlotBytes each).
struct WarpExchange {
  static constexpr size_t kSlotBytes = 64;
  alignas(16) unsigned char in[kWarpSize][kSlotBytes];
  alignas(16) unsigned char out[kWarpSize][kSlotBytes];
  int arrived = 0;
  uint64_t generation = 0;
  const char* op = nullptr;
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<WarpExchange> warps;
  std::vector<unsigned char> smem;
  ucontext_t scheduler;
  int current = 0;
  int live = 0;
  int sync_arrived = 0;
  uint64_t sync_generation = 0;
  uint64_t progress = 0;  // bumped by every arrival, completion and exit
  const std::function<void()>* body = nullptr;
};

inline Block* current_block = nullptr;

// The order in which RunBlock resumes the threads of a block on each sweep (see the top):
// ascending, descending, shuffled anew on every sweep, or warp by warp in a shuffled order, each
// warp running as far as it can (to a barrier, or its end) before the next one starts, so that one
// warp gets ahead of the others as a warp may on hardware (a read of what another warp has copied
// or stored then comes before that warp's wait or store unless a barrier is in between).
enum class ThreadOrder { kAscending, kDescending, kShuffled, kWarpAhead };
struct Schedule {
  ThreadOrder order = ThreadOrder::kAscending;
  uint32_t seed = 0;  // kShuffled and kWarpAhead: the permutations' generator, reseeded per block
};
inline Schedule schedule;

// Statistics the tests read: ldmatrix phases (one 8 x 8 matrix each) whose 8 row addresses fall
// on conflicting shared-memory banks, ldmatrix phases in all, and mma instructions.
inline uint64_t ldmatrix_bank_conflicts = 0;
inline uint64_t ldmatrix_phases = 0;
inline uint64_t mma_calls = 0;  // warp-level mma.sync instructions

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s (block %u,%u,%u thread %d)\n", what, block_idx.x,
               block_idx.y, block_idx.z, current_block != nullptr ? current_block->current : -1);
  std::abort();
}

inline Block& CurrentBlock() {
  if (current_block == nullptr) Fail("a warp-level operation outside RunBlock");
  return *current_block;
}

inline void Yield() {
  Block& b = CurrentBlock();
  swapcontext(&b.fibers[b.current].context, &b.scheduler);
}

// __syncthreads of a fiber block.
inline void FiberSyncThreads() {
  Block& b = CurrentBlock();
  const uint64_t generation = b.sync_generation;
  ++b.progress;
  if (++b.sync_arrived == b.live) {
    b.sync_arrived = 0;
    ++b.sync_generation;
    return;
  }
  b.fibers[b.current].waiting_on = "__syncthreads";
  while (b.sync_generation == generation) Yield();
  b.fibers[b.current].waiting_on = "";
}

// The calling thread's lane and warp (blocks are one-dimensional).
inline int LaneOf(const Block& b) { return b.current % kWarpSize; }
inline int WarpOf(const Block& b) { return b.current / kWarpSize; }

// Runs `compute(ins, outs)` once for the calling warp when all its 32 lanes have called
// WarpCollective with the same `op` (a string literal); returns this lane's output.
template <typename In, typename Out, typename Compute>
Out WarpCollective(const char* op, const In& in, Compute&& compute) {
  static_assert(std::is_trivially_copyable_v<In> && std::is_trivially_copyable_v<Out>);
  static_assert(sizeof(In) <= WarpExchange::kSlotBytes && sizeof(Out) <= WarpExchange::kSlotBytes);
  Block& b = CurrentBlock();
  WarpExchange& w = b.warps[WarpOf(b)];
  const int lane = LaneOf(b);
  if (w.arrived == 0) {
    w.op = op;
  } else if (std::strcmp(w.op, op) != 0) {
    std::fprintf(stderr, "cuda emulation: lane %d calls %s while its warp is in %s\n", lane, op,
                 w.op);
    Fail("divergent warp collective");
  }
  std::memcpy(w.in[lane], &in, sizeof(In));
  const uint64_t generation = w.generation;
  ++b.progress;
  if (++w.arrived == kWarpSize) {
    In ins[kWarpSize];
    Out outs[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) std::memcpy(&ins[l], w.in[l], sizeof(In));
    compute(ins, outs);
    for (int l = 0; l < kWarpSize; ++l) std::memcpy(w.out[l], &outs[l], sizeof(Out));
    w.arrived = 0;
    ++w.generation;
  } else {
    b.fibers[b.current].waiting_on = op;
    while (w.generation == generation) Yield();
    b.fibers[b.current].waiting_on = "";
  }
  Out out;
  std::memcpy(&out, w.out[lane], sizeof(Out));
  return out;
}

// The calling thread's cp.async state.
inline Fiber& CurrentFiber() {
  Block& b = CurrentBlock();
  return b.fibers[b.current];
}

// True when [p, p + bytes) lies inside the block's shared memory.
inline bool InSmem(const void* p, size_t bytes) {
  const Block& b = CurrentBlock();
  const auto* c = static_cast<const unsigned char*>(p);
  return c >= b.smem.data() && c + bytes <= b.smem.data() + b.smem.size();
}

inline void FiberMain() {
  Block& b = *current_block;
  (*b.body)();
  b.fibers[b.current].done = true;
  --b.live;
  ++b.progress;
  if (b.sync_arrived > 0 && b.sync_arrived == b.live) {  // the exit completes a barrier
    b.sync_arrived = 0;
    ++b.sync_generation;
  }
}

// Gives fiber `f` a stack of its own and a context that starts FiberMain and returns to the
// block's scheduler. A function of its own: getcontext returns twice as far as the compiler
// knows, so no caller's loop variable may live across it (-Wclobbered).
inline void InitFiber(Fiber& f, Block& b) {
  constexpr size_t kStackBytes = 256 * 1024;
  f.stack.reset(new char[kStackBytes]);
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.get();
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = &b.scheduler;
  makecontext(&f.context, &FiberMain, 0);
}

// Runs `body` as block `block` of `threads` CUDA threads (a multiple of 32) with `smem_bytes` of
// dynamic shared memory, to completion, resuming its threads in the order `schedule` says.
inline void RunBlock(dim3 block, int threads, size_t smem_bytes,
                     const std::function<void()>& body) {
  if (threads % kWarpSize != 0) Fail("RunBlock needs whole warps");
  Block b;
  b.fibers.resize(threads);
  b.warps.resize(threads / kWarpSize);
  b.smem.assign(smem_bytes, 0xff);
  b.live = threads;
  b.body = &body;
  block_idx = block;
  current_block = &b;
  fiber_sync_threads = &FiberSyncThreads;
  for (Fiber& f : b.fibers) InitFiber(f, b);
  auto resume = [&](int t) {
    if (b.fibers[t].done) return;
    b.current = t;
    thread_idx = dim3(t);
    swapcontext(&b.scheduler, &b.fibers[t].context);
  };
  const bool warp_ahead = schedule.order == ThreadOrder::kWarpAhead;
  std::vector<int> order(warp_ahead ? threads / kWarpSize : threads);  // warps or threads
  std::iota(order.begin(), order.end(), 0);
  if (schedule.order == ThreadOrder::kDescending) std::reverse(order.begin(), order.end());
  std::mt19937 shuffle(schedule.seed ^ (block.x * 0x9e3779b9u) ^ (block.y << 16) ^ block.z);
  while (b.live > 0) {
    const uint64_t before = b.progress;
    if (schedule.order == ThreadOrder::kShuffled || warp_ahead) {
      std::shuffle(order.begin(), order.end(), shuffle);
    }
    for (const int i : order) {
      if (!warp_ahead) {
        resume(i);
        continue;
      }
      // Warp i's lanes, ascending, again and again while any of them gets further.
      for (uint64_t seen = ~b.progress; seen != b.progress;) {
        seen = b.progress;
        for (int lane = 0; lane < kWarpSize; ++lane) resume(i * kWarpSize + lane);
      }
    }
    if (b.live > 0 && b.progress == before) {
      for (int t = 0; t < threads; ++t) {
        if (!b.fibers[t].done)
          std::fprintf(stderr, "thread %d waits on %s\n", t, b.fibers[t].waiting_on);
      }
      Fail("deadlock: no thread of the block can progress");
    }
  }
  fiber_sync_threads = nullptr;
  current_block = nullptr;
}

// Runs every block of `grid`, one at a time, with gridDim = grid: in the grid's linear order (x
// fastest) under the ascending schedule, else in the schedule's order of the linear indices (a
// grid whose results change with it has blocks that write the same memory unordered).
inline void RunGrid(dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  grid_dim = grid;
  std::vector<uint64_t> order(static_cast<size_t>(grid.x) * grid.y * grid.z);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (schedule.order == ThreadOrder::kDescending) std::reverse(order.begin(), order.end());
  if (schedule.order == ThreadOrder::kShuffled || schedule.order == ThreadOrder::kWarpAhead) {
    std::mt19937 shuffle(schedule.seed);
    std::shuffle(order.begin(), order.end(), shuffle);
  }
  for (const uint64_t i : order) {
    const auto x = static_cast<unsigned>(i % grid.x);
    const auto y = static_cast<unsigned>(i / grid.x % grid.y);
    const auto z = static_cast<unsigned>(i / grid.x / grid.y);
    RunBlock(dim3(x, y, z), threads, smem_bytes, body);
  }
}

}  // namespace packsched_cuda_emulation

#endif  // PACKSCHED_TESTS_KERNELS_CUDA_EMULATION_WARP_RUNTIME_H_
