#include "server/cli/progress.h"

#include <utility>

#include "absl/time/clock.h"

namespace packsched::cli {

Progress::Progress(FILE* out, absl::Duration first, absl::Duration every, std::string phase)
    : out_(out),
      first_(first),
      every_(every),
      start_(absl::Now()),
      phase_(std::move(phase)),
      thread_([this] { Run(); }) {}

Progress::~Progress() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  if (reported_) {
    std::fprintf(out_, "packsched plan: done in %.1f s\n",
                 absl::ToDoubleSeconds(absl::Now() - start_));
  }
}

void Progress::Phase(std::string phase) {
  absl::MutexLock lock(&mu_);
  phase_ = std::move(phase);
}

void Progress::Run() {
  absl::MutexLock lock(&mu_);
  absl::Duration wait = first_;
  while (!mu_.AwaitWithTimeout(absl::Condition(&done_), wait)) {
    reported_ = true;
    std::fprintf(out_, "packsched plan: %s, %.0f s so far\n", phase_.c_str(),
                 absl::ToDoubleSeconds(absl::Now() - start_));
    std::fflush(out_);
    wait = every_;
  }
}

}  // namespace packsched::cli
