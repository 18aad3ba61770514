#ifndef PACKSCHED_SERVER_PLANNER_PLAN_MEMORY_H_
#define PACKSCHED_SERVER_PLANNER_PLAN_MEMORY_H_

// Internal to the planner: where its working partitions are allocated. A plan builds and drops
// thousands of small vectors (a list per part, per candidate); from the heap each is a malloc and
// a free, and the memory a freed list leaves behind is cold by the time the next one takes it.
// Inside a PlanArena they are carved from one block that each thread reuses from plan to plan,
// and all released at once when the arena ends.

#include <cstddef>
#include <memory>
#include <memory_resource>
#include <optional>

namespace packsched::planner::internal {

// The resource of the innermost PlanArena on this thread, else the heap.
std::pmr::memory_resource* PlanMemory();

// While alive, PlanMemory() on this thread is a monotonic resource over this thread's reusable
// block (256 KiB, then the heap). Whatever was allocated from it must be gone, or copied out to
// another resource, before it ends. Arenas nest: an inner one gets a block of its own.
class PlanArena {
 public:
  PlanArena();
  ~PlanArena();
  PlanArena(const PlanArena&) = delete;
  PlanArena& operator=(const PlanArena&) = delete;

 private:
  std::pmr::memory_resource* previous_;
  bool owns_thread_block_;
  std::optional<std::pmr::monotonic_buffer_resource> resource_;
};

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_PLAN_MEMORY_H_
