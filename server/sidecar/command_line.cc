#include "server/sidecar/command_line.h"

#include <cstdio>
#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/base/command_line.h"

#ifndef PACKSCHED_GIT_COMMIT
#define PACKSCHED_GIT_COMMIT "unknown"
#endif

namespace packsched::sidecar {

std::string VersionLine() {
  return absl::StrCat("packsched-server ", PACKSCHED_VERSION, " (commit ", PACKSCHED_GIT_COMMIT,
                      ")");
}

std::optional<int> ParseCommandLine(int argc, char** argv) {
  absl::SetProgramUsageMessage("packsched scheduler sidecar: packsched-server [--listen=...]");
  // --help lists the server's own flags (all in sidecar/flags.cc), not only main.cc's (none).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server/sidecar/");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return VersionLine() + "\n"; };
  absl::SetFlagsUsageConfig(usage);
  CommandLineRules rules;
  rules.program = "packsched-server";
  rules.not_empty = {"status", "probe"};
  if (const absl::Status checked = CheckCommandLine(argc, argv, rules); !checked.ok()) {
    std::fprintf(stderr, "packsched-server: %s\n", std::string(checked.message()).c_str());
    return kUsageError;
  }
  if (!ParseCheckedCommandLine(argc, argv)) return 0;  // help printed
  return std::nullopt;
}

}  // namespace packsched::sidecar
