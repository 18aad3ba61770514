#include "server/base/logging.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace packsched {

absl::Status CheckLogLevel(absl::string_view level) {
  // from_str maps every unknown name to `off`; only "off" itself may mean off.
  if (spdlog::level::from_str(std::string(level)) == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("log level '", level, "' is not one of trace, debug, info, warn, error, off"));
  }
  return absl::OkStatus();
}

absl::Status InitLogging(absl::string_view program, absl::string_view level) {
  if (absl::Status s = CheckLogLevel(level); !s.ok()) return s;
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  auto logger = spdlog::stderr_color_mt(std::string(program));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace packsched
