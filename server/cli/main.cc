// packsched: the offline planning CLI over the planner library (no gRPC, no protobuf).
//
//   packsched plan --lengths=FILE --max_token_len=16384 [--format=json] ...
//   packsched plan --dynamic_cp --world_size=8 --max_token_len=8192 --lengths=FILE ...
//   packsched plan --help
//
// stdout carries only the table or the JSON; errors go to stderr, one line each. Exit status: 0
// on success, 1 for bad input (the lengths, the forest; naming the sequence) or a plan that
// cannot be made, 2 for a usage error: a command line absl's parser would refuse (checked
// first: it would exit 1), a flag's value out of its range, flags that do not go together, or a
// file a flag names that cannot be read — all found before any input is read.

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/base/command_line.h"
#include "server/cli/dynamic_cp_command.h"
#include "server/cli/dynamic_cp_flags.h"
#include "server/cli/json_output.h"
#include "server/cli/plan_command.h"
#include "server/cli/plan_flags.h"
#include "server/cli/progress.h"
#include "server/cli/read_jsonl.h"
#include "server/cli/read_lengths.h"
#include "server/cli/read_tree.h"
#include "server/cli/table_output.h"
#include "server/cli/tree_command.h"

namespace packsched::cli {
namespace {

constexpr int kError = 1;
constexpr int kUsage = 2;
// A run that passes kProgressFirst reports on stderr every kProgressEvery (--progress).
constexpr absl::Duration kProgressFirst = absl::Seconds(3);
constexpr absl::Duration kProgressEvery = absl::Seconds(10);

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "packsched: %s\n", std::string(status.message()).c_str());
  return code;
}

// `packsched help`, or -h / --help anywhere before "--". Handled here rather than by absl,
// whose --help exits with status 1 and lists flags by source file.
bool WantsHelp(int argc, char** argv) {
  if (argc > 1 && absl::string_view(argv[1]) == "help") return true;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "-h" || arg == "--help" || arg == "-help") return true;
  }
  return false;
}

// Writes the plan to stdout; the exit status.
int Write(const absl::StatusOr<std::string>& out) {
  if (!out.ok()) return Fail(out.status(), kError);
  if (std::fwrite(out->data(), 1, out->size(), stdout) != out->size() || std::fflush(stdout) != 0) {
    return Fail(absl::UnavailableError("cannot write the plan to stdout"), kError);
  }
  return 0;
}

// `--tree=FILE`: the forest's plan as a table or JSON.
absl::StatusOr<std::string> PlanTree(const std::string& path, const PlanRequest& request,
                                     OutputFormat format) {
  absl::StatusOr<std::string> text = ReadInput(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<planner::Forest> forest = ParseForest(*text, path == "-" ? "stdin" : path);
  if (!forest.ok()) return forest.status();
  absl::StatusOr<TreePlanRun> run = RunTreePlan(*forest, request);
  if (!run.ok()) return run.status();
  return format == OutputFormat::kJson ? TreePlanJson(*run) : TreePlanTable(*run);
}

int Plan() {
  if (absl::Status status = CheckInputFlags(); !status.ok()) return Fail(status, kUsage);
  absl::StatusOr<PlanRequest> request = RequestFromFlags();
  if (!request.ok()) return Fail(request.status(), kUsage);
  absl::StatusOr<OutputFormat> format = FormatFromFlags();
  if (!format.ok()) return Fail(format.status(), kUsage);
  if (absl::Status status = CheckRequest(*request); !status.ok()) return Fail(status, kUsage);
  absl::StatusOr<std::optional<JsonlField>> field = JsonlFieldFromFlags();
  if (!field.ok()) return Fail(field.status(), kUsage);
  absl::StatusOr<DynamicCpRequest> dynamic = DynamicCpRequestFromFlags(*request);
  if (!dynamic.ok()) return Fail(dynamic.status(), kUsage);
  const std::string tree = TreePathFromFlags();
  if (!tree.empty()) {
    if (!LengthsPathFromFlags().empty()) {
      return Fail(absl::InvalidArgumentError("--tree and --lengths: give one input"), kUsage);
    }
    if (*field) {
      return Fail(absl::InvalidArgumentError(
                      "--length_field and --token_field read --lengths, not a --tree forest"),
                  kUsage);
    }
    return Write(PlanTree(tree, *request, *format));
  }

  std::optional<Progress> progress;
  if (ProgressFromFlags()) {
    progress.emplace(stderr, kProgressFirst, kProgressEvery, "reading the lengths");
  }
  const auto phase = [&](std::string name) {
    if (progress) progress->Phase(std::move(name));
  };
  const std::string path = LengthsPathFromFlags();
  absl::StatusOr<std::string> text = ReadInput(path);
  if (!text.ok()) return Fail(text.status(), kError);
  const std::string source = path.empty() || path == "-" ? "stdin" : path;
  absl::StatusOr<std::vector<int64_t>> lengths =
      *field ? ParseJsonlLengths(*text, source, **field) : ParseLengths(*text, source);
  if (!lengths.ok()) return Fail(lengths.status(), kError);
  text->clear();
  text->shrink_to_fit();

  phase(absl::StrCat("planning ", lengths->size(), " sequences"));
  if (DynamicCpFromFlags()) {
    absl::StatusOr<DynamicCpRun> run = RunDynamicCp(*lengths, *dynamic);
    if (!run.ok()) return Fail(run.status(), kError);
    phase("writing the plan");
    absl::StatusOr<std::string> out =
        *format == OutputFormat::kJson ? DynamicCpJson(*run) : DynamicCpTable(*run);
    progress.reset();
    return Write(out);
  }
  absl::StatusOr<PlanRun> run = RunPlan(*lengths, *request);
  if (!run.ok()) return Fail(run.status(), kError);
  phase("writing the plan");
  const std::string out = *format == OutputFormat::kJson ? PlanJson(*run) : PlanTable(*run);
  progress.reset();  // its closing line before the plan
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    return Fail(absl::UnavailableError("cannot write the plan to stdout"), kError);
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (WantsHelp(argc, argv)) {
    std::fputs(HelpText().c_str(), stdout);
    return 0;
  }
  absl::SetProgramUsageMessage(
      "packsched plan [flags]: offline planning ('packsched plan --help')");
  CommandLineRules rules;
  rules.program = "packsched";
  rules.positional = true;  // the command
  if (absl::Status status = CheckCommandLine(argc, argv, rules); !status.ok()) {
    return Fail(status, kUsage);
  }
  const std::optional<std::vector<char*>> parsed = ParseCheckedCommandLine(argc, argv);
  if (!parsed) return 0;  // help printed
  const std::vector<char*>& args = *parsed;
  if (args.size() < 2) {
    return Fail(absl::InvalidArgumentError("missing the command; usage: packsched plan [flags]"),
                kUsage);
  }
  const absl::string_view command = args[1];
  if (command != "plan") {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("unknown command '", command, "'; the command is 'plan'")),
                kUsage);
  }
  if (args.size() > 2) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("unexpected argument '", args[2], "' (flags are --name=value)")),
                kUsage);
  }
  return Plan();
}

}  // namespace
}  // namespace packsched::cli

int main(int argc, char** argv) { return packsched::cli::Main(argc, argv); }
