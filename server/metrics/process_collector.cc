#include "server/metrics/process_collector.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace packsched::metrics {
namespace {

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

prometheus::MetricFamily Single(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  prometheus::ClientMetric metric;
  metric.counter.value = value;
  metric.gauge.value = value;
  return prometheus::MetricFamily{std::move(name), std::move(help), type, {std::move(metric)}};
}

}  // namespace

std::optional<ProcessStat> ReadProcessStat() {
  const std::optional<std::string> stat = ReadFile("/proc/self/stat");
  const std::optional<std::string> system = ReadFile("/proc/stat");
  if (!stat || !system) return std::nullopt;
  // Fields after the command name, which is in parentheses and may hold spaces: field 3 (state)
  // is the first; utime 14, stime 15 and starttime 22 are in clock ticks, vsize 23 in bytes,
  // rss 24 in pages (proc(5)).
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(*stat).substr(close + 1), ' ', absl::SkipEmpty());
  auto field = [&](int number) -> std::optional<double> {
    const size_t index = number - 3;
    double value;
    if (index >= fields.size() || !absl::SimpleAtod(fields[index], &value)) return std::nullopt;
    return value;
  };
  const std::optional<double> utime = field(14), stime = field(15), start = field(22),
                              vsize = field(23), rss = field(24);
  double boot_time = -1;
  for (absl::string_view line : absl::StrSplit(*system, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) {
      if (!absl::SimpleAtod(line, &boot_time)) return std::nullopt;
    }
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  if (!utime || !stime || !start || !vsize || !rss || boot_time < 0 || ticks <= 0 || page <= 0) {
    return std::nullopt;
  }
  ProcessStat out;
  out.cpu_seconds = (*utime + *stime) / static_cast<double>(ticks);
  out.resident_bytes = *rss * static_cast<double>(page);
  out.virtual_bytes = *vsize;
  out.start_time_seconds = boot_time + *start / static_cast<double>(ticks);
  return out;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  if (const std::optional<ProcessStat> stat = ReadProcessStat()) {
    out.push_back(Single("process_cpu_seconds_total",
                         "CPU time of the process, user and system, in seconds",
                         MetricType::Counter, stat->cpu_seconds));
    out.push_back(Single("process_resident_memory_bytes",
                         "Resident set size of the process, in bytes", MetricType::Gauge,
                         stat->resident_bytes));
    out.push_back(Single("process_virtual_memory_bytes",
                         "Virtual memory size of the process, in bytes", MetricType::Gauge,
                         stat->virtual_bytes));
    out.push_back(Single("process_start_time_seconds",
                         "When the process started, in seconds since the Unix epoch",
                         MetricType::Gauge, stat->start_time_seconds));
  }
  std::error_code error;
  std::filesystem::directory_iterator fds("/proc/self/fd", error);
  if (!error) {
    double open = 0;
    for (const auto& entry : fds) {
      (void)entry;
      ++open;
    }
    out.push_back(Single("process_open_fds", "File descriptors the process holds open",
                         MetricType::Gauge, open));
  }
  return out;
}

}  // namespace packsched::metrics
