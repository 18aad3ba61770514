#include "server/planner/plan_memory.h"

namespace packsched::planner::internal {
namespace {

constexpr size_t kBlockBytes = size_t{256} << 10;

thread_local std::pmr::memory_resource* current = nullptr;
thread_local bool block_in_use = false;

// This thread's block, made on first use and kept for the thread's life.
std::byte* ThreadBlock() {
  thread_local std::unique_ptr<std::byte[]> block(new std::byte[kBlockBytes]);
  return block.get();
}

}  // namespace

std::pmr::memory_resource* PlanMemory() {
  return current != nullptr ? current : std::pmr::new_delete_resource();
}

PlanArena::PlanArena() : previous_(current), owns_thread_block_(!block_in_use) {
  if (owns_thread_block_) {
    block_in_use = true;
    resource_.emplace(ThreadBlock(), kBlockBytes, std::pmr::new_delete_resource());
  } else {
    resource_.emplace(std::pmr::new_delete_resource());
  }
  current = &*resource_;
}

PlanArena::~PlanArena() {
  current = previous_;
  resource_.reset();
  if (owns_thread_block_) block_in_use = false;
}

}  // namespace packsched::planner::internal
