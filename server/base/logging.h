#ifndef PACKSCHED_SERVER_BASE_LOGGING_H_
#define PACKSCHED_SERVER_BASE_LOGGING_H_

// Process-wide logging setup over spdlog. Logs go to stderr only, so programs whose stdout
// is their output (the `packsched plan` CLI prints a table or JSON) stay pipe-clean.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace packsched {

// OK when `level` is one InitLogging takes; otherwise InvalidArgument "log level 'x' is not
// one of trace, debug, info, warn, error, off". Touches no logger.
absl::Status CheckLogLevel(absl::string_view level);

// Installs a stderr logger named `program` as spdlog's default, at `level` ("trace", "debug",
// "info", "warn", "error", "off"). Returns InvalidArgument naming the level if it is unknown.
// Call once at startup, before other threads log. Not thread-safe against concurrent logging.
absl::Status InitLogging(absl::string_view program, absl::string_view level);

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_LOGGING_H_
