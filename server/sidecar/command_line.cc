#include "server/sidecar/command_line.h"

#include <cstdio>
#include <iostream>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

#ifndef PACKSCHED_GIT_COMMIT
#define PACKSCHED_GIT_COMMIT "unknown"
#endif

namespace packsched::sidecar {
namespace {

// Flags read from files or the environment: checked by absl's own parser.
bool IsIndirect(absl::string_view name) {
  return name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
}

// Flags that select a mode and are meaningless when given empty.
bool MustNotBeEmpty(absl::string_view name) { return name == "status" || name == "probe"; }

// Checks argv the way absl's parser reads it ("-x", "--x", "--x=v", "--x v" for a flag that is
// not a bool, "--nox" for a bool one; "--" ends the flags), before that parser, which exits 1 on
// any error. Returns the first error, or an empty string. Records absl's help and version flags
// as its parser does.
std::string CheckArguments(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") return "";
    if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) {
      return absl::StrCat("unexpected argument '", argv[i], "': packsched-server takes flags only");
    }
    absl::ConsumePrefix(&arg, "-");
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    const bool has_value = equals != absl::string_view::npos;
    absl::string_view value = has_value ? arg.substr(equals + 1) : absl::string_view();
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      absl::string_view positive = name;
      if (absl::ConsumePrefix(&positive, "no")) {
        absl::CommandLineFlag* bool_flag = absl::FindCommandLineFlag(positive);
        if (bool_flag != nullptr && bool_flag->IsOfType<bool>() && !has_value) continue;
      }
      if (absl::flags_internal::DeduceUsageFlags(name, value)) continue;
      return absl::StrCat("unknown flag --", name, " (--help lists them)");
    }
    if (IsIndirect(name)) {
      if (!has_value) ++i;
      continue;
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) return absl::StrCat("--", name, " needs a value");
      value = argv[++i];
    }
    if (MustNotBeEmpty(name) && value.empty()) {
      return absl::StrCat("--", name, " needs a HOST:PORT (it was given empty)");
    }
    // Sets the flag: absl's parser sets it again to the same value.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrCat("--", name, "=", value, ": ", error);
    }
  }
  return "";
}

}  // namespace

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
  if (const std::string error = CheckArguments(argc, argv); !error.empty()) {
    std::fprintf(stderr, "packsched-server: %s\n", error.c_str());
    return kUsageError;
  }
  // absl's parser itself, told to leave the help flags to us: it would exit 1 after --help.
  (void)absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    std::cout.flush();
    return 0;
  }
  return std::nullopt;
}

}  // namespace packsched::sidecar
