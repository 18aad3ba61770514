#include "server/base/command_line.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/base/file_check.h"

namespace packsched {
namespace {

// Nested flagfiles deeper than this are taken for a loop.
constexpr int kMaxFlagfileDepth = 16;

// One argument and where it came from: `where` is empty for argv, else "--flagfile=F: line N"
// (prefixed to its errors). A flag without "=value" takes the next argument of the same source
// as its value, as Abseil's parser does.
struct Arg {
  std::string text;
  std::string where;
  int source = 0;
};

absl::Status Error(const Arg& arg, absl::string_view message) {
  return absl::InvalidArgumentError(arg.where.empty() ? std::string(message)
                                                      : absl::StrCat(arg.where, ": ", message));
}

bool IsIndirect(absl::string_view name) {
  return name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
}

// "-x=v" / "--x=v" / "--x" into the name and the value (has_value: there was an '=').
struct Split {
  absl::string_view name;
  absl::string_view value;
  bool has_value = false;
};

Split SplitFlag(absl::string_view flag) {
  Split s;
  const size_t equals = flag.find('=');
  s.name = flag.substr(0, equals);
  s.has_value = equals != absl::string_view::npos;
  if (s.has_value) s.value = flag.substr(equals + 1);
  return s;
}

// Expands argv: flagfiles' lines replace --flagfile, --fromenv's variables become flags.
class Expander {
 public:
  absl::Status AddArgv(int argc, char** argv) {
    std::vector<Arg> args;
    for (int i = 1; i < argc; ++i) args.push_back({argv[i], "", 0});
    return Add(args, 0);
  }

  const std::vector<Arg>& args() const { return out_; }

  // The names --undefok listed.
  const absl::flat_hash_set<std::string>& undefok() const { return undefok_; }

 private:
  // Appends `args`, expanding the indirect flags among them.
  absl::Status Add(const std::vector<Arg>& args, int depth) {
    for (size_t i = 0; i < args.size(); ++i) {
      const Arg& arg = args[i];
      absl::string_view text = arg.text;
      if (text == "--" && arg.where.empty()) {  // the rest are arguments, not flags
        for (; i < args.size(); ++i) out_.push_back(args[i]);
        return absl::OkStatus();
      }
      if (!absl::ConsumePrefix(&text, "-") || text.empty()) {
        out_.push_back(arg);
        continue;
      }
      absl::ConsumePrefix(&text, "-");
      Split flag = SplitFlag(text);
      if (!IsIndirect(flag.name)) {
        out_.push_back(arg);
        continue;
      }
      std::string value(flag.value);
      if (!flag.has_value) {
        if (i + 1 >= args.size()) {
          return Error(arg, absl::StrCat("--", flag.name, " needs a value"));
        }
        value = args[++i].text;
      }
      const std::string named = absl::StrCat("--", flag.name, "=", value);
      if (flag.name == "undefok") {
        for (absl::string_view name : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          undefok_.insert(std::string(name));
        }
        out_.push_back({named, arg.where, arg.source});
      } else if (flag.name == "flagfile") {
        for (absl::string_view file : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          if (absl::Status s = AddFlagfile(arg, std::string(file), depth); !s.ok()) return s;
        }
      } else {
        for (absl::string_view name : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          if (absl::Status s = AddFromEnv(arg, flag.name, name); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status AddFlagfile(const Arg& arg, const std::string& file, int depth) {
    const std::string named = absl::StrCat("--flagfile=", file);
    if (depth >= kMaxFlagfileDepth) {
      return Error(arg, absl::StrCat(named, ": flagfiles nested more than ", kMaxFlagfileDepth,
                                     " deep (a loop?)"));
    }
    if (absl::Status s = CheckReadableFile(file); !s.ok()) {
      return Error(arg, absl::StrCat(named, ": ", s.message()));
    }
    std::ifstream in(file);
    std::vector<Arg> lines;
    const int source = ++sources_;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      const absl::string_view stripped = absl::StripLeadingAsciiWhitespace(line);
      if (stripped.empty() || stripped[0] == '#') continue;
      Arg next{std::string(stripped), absl::StrCat(named, ": line ", number), source};
      if (stripped[0] != '-' || stripped == "--") {
        return Error(next, absl::StrCat("'", stripped, "' is not a flag"));
      }
      lines.push_back(std::move(next));
    }
    if (in.bad()) return Error(arg, absl::StrCat(named, ": cannot be read"));
    return Add(lines, depth + 1);
  }

  absl::Status AddFromEnv(const Arg& arg, absl::string_view how, absl::string_view name) {
    const std::string named = absl::StrCat("--", how, "=", name);
    if (IsIndirect(name)) return Error(arg, absl::StrCat(named, ": not a flag it can set"));
    const std::string variable = absl::StrCat("FLAGS_", name);
    const char* value = std::getenv(variable.c_str());  // NOLINT(concurrency-mt-unsafe)
    if (value == nullptr) {
      if (how == "tryfromenv") return absl::OkStatus();
      return Error(arg, absl::StrCat(named, ": ", variable, " is not set"));
    }
    out_.push_back({absl::StrCat("--", name, "=", value), absl::StrCat(named, " (", variable, ")"),
                    ++sources_});
    return absl::OkStatus();
  }

  std::vector<Arg> out_;
  absl::flat_hash_set<std::string> undefok_;
  int sources_ = 0;
};

// Checks one flag argument (text without its dashes) and sets the flag. `next` is the index
// of the argument after it; a flag that takes the next argument as its value advances it.
absl::Status CheckFlag(const std::vector<Arg>& args, size_t& next, absl::string_view text,
                       const Expander& expander, const CommandLineRules& rules) {
  const Arg& arg = args[next - 1];
  Split split = SplitFlag(text);
  const absl::string_view name = split.name;
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (IsIndirect(name)) return absl::OkStatus();  // expanded already
  if (flag == nullptr) {
    absl::string_view positive = name;
    const bool negated = absl::ConsumePrefix(&positive, "no");
    if (negated && !split.has_value) {
      absl::CommandLineFlag* bool_flag = absl::FindCommandLineFlag(positive);
      if (bool_flag != nullptr && bool_flag->IsOfType<bool>()) return absl::OkStatus();
    }
    if (absl::flags_internal::DeduceUsageFlags(name, split.value)) return absl::OkStatus();
    if (expander.undefok().contains(name) || (negated && expander.undefok().contains(positive))) {
      return absl::OkStatus();
    }
    return Error(arg, absl::StrCat("unknown flag --", name, " (--help lists them)"));
  }
  absl::string_view value = split.value;
  if (!split.has_value) {
    if (flag->IsOfType<bool>()) return absl::OkStatus();
    if (next >= args.size() || args[next].source != arg.source) {
      return Error(arg, absl::StrCat("--", name, " needs a value"));
    }
    value = args[next++].text;
  }
  for (const std::string& mode : rules.not_empty) {
    if (mode == name && value.empty()) {
      return Error(arg, absl::StrCat("--", name, " needs a value (it was given empty)"));
    }
  }
  std::string error;
  if (!flag->ParseFrom(value, &error)) {
    return Error(arg, absl::StrCat("--", name, "=", value, ": ", error));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCommandLine(int argc, char** argv, const CommandLineRules& rules) {
  Expander expander;
  if (absl::Status s = expander.AddArgv(argc, argv); !s.ok()) return s;
  const std::vector<Arg>& args = expander.args();
  for (size_t i = 0; i < args.size();) {
    const Arg& arg = args[i++];
    absl::string_view text = arg.text;
    if (text == "--" && arg.where.empty()) {
      if (rules.positional || i == args.size()) return absl::OkStatus();
      return Error(args[i], absl::StrCat("unexpected argument '", args[i].text,
                                         "': ", rules.program, " takes flags only"));
    }
    if (!absl::ConsumePrefix(&text, "-") || text.empty()) {
      if (rules.positional) continue;
      return Error(arg, absl::StrCat("unexpected argument '", arg.text, "': ", rules.program,
                                     " takes flags only"));
    }
    absl::ConsumePrefix(&text, "-");
    if (absl::Status s = CheckFlag(args, i, text, expander, rules); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::optional<std::vector<char*>> ParseCheckedCommandLine(int argc, char** argv) {
  std::vector<char*> args = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    std::cout.flush();
    return std::nullopt;
  }
  return args;
}

}  // namespace packsched
