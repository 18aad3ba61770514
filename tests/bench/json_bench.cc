// json_bench: the CLI's hand-written JSON code against nlohmann-json on the same data, for the
// decision in docs/decisions.md. Plain main, no arguments; prints one line per case:
//   - reading 10^6 lengths as a JSON array: ParseLengths (hand-written) vs nlohmann's DOM
//     (json::parse, then the integers out of it) vs nlohmann's SAX parser keeping only the
//     integers (what read_jsonl.cc does per record);
//   - writing the plan of those lengths (kk, cap 65536): PlanJson (JsonWriter) vs the same
//     document as an nlohmann DOM (ordered_json, built by parsing PlanJson's text: the nodes a
//     writer through nlohmann would build from the plan) and its dump(), with
//     whether the bytes are identical.
// Times are the best of 3 runs; "heap" is the peak of live heap bytes the case allocated
// (counted by this binary's operator new), which is what a DOM adds.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "server/cli/json_output.h"
#include "server/cli/plan_command.h"
#include "server/cli/read_lengths.h"

namespace {

std::atomic<int64_t> live{0};
std::atomic<int64_t> peak{0};

void Count(int64_t bytes) {
  const int64_t now = live.fetch_add(bytes) + bytes;
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n + 16);
  if (p == nullptr) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = n;
  Count(static_cast<int64_t>(n));
  return static_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  void* base = static_cast<char*>(p) - 16;
  Count(-static_cast<int64_t>(*static_cast<std::size_t*>(base)));
  std::free(base);
}
void operator delete(void* p, std::size_t /*size*/) noexcept { operator delete(p); }

namespace packsched::cli {
namespace {

using Json = nlohmann::json;

// Best-of-3 wall time in ms and the peak heap the last run added (MiB).
template <typename Fn>
void Measure(const char* name, Fn fn) {
  double best = 1e300;
  double heap = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t base = live.load();
    peak.store(base);
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(
        best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
    heap = static_cast<double>(peak.load() - base) / (1 << 20);
  }
  std::printf("%-52s %9.1f ms %8.1f MiB heap\n", name, best, heap);
}

// Keeps the integers of a JSON array, nothing else.
struct IntsOnly : nlohmann::json_sax<Json> {
  std::vector<int64_t> values;
  bool null() override { return false; }
  bool boolean(bool /*value*/) override { return false; }
  bool number_integer(number_integer_t v) override {
    values.push_back(v);
    return true;
  }
  bool number_unsigned(number_unsigned_t v) override {
    values.push_back(static_cast<int64_t>(v));
    return true;
  }
  bool number_float(number_float_t /*value*/, const string_t& /*text*/) override { return false; }
  bool string(string_t& /*value*/) override { return false; }
  bool binary(binary_t& /*value*/) override { return false; }
  bool start_object(std::size_t /*elements*/) override { return false; }
  bool key(string_t& /*key*/) override { return false; }
  bool end_object() override { return false; }
  bool start_array(std::size_t /*elements*/) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& /*error*/) override {
    return false;
  }
};

int Main() {
  constexpr int kN = 1000000;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> length(1, 8191);
  std::vector<int64_t> lengths(kN);
  for (int64_t& l : lengths) l = length(rng);
  const std::string array = absl::StrCat("[", absl::StrJoin(lengths, ","), "]");
  std::printf("json_bench: %d lengths (%.1f MiB of JSON)\n", kN,
              static_cast<double>(array.size()) / (1 << 20));

  size_t sink = 0;
  Measure("read: ParseLengths (hand-written)", [&] { sink += ParseLengths(array, "in")->size(); });
  Measure("read: nlohmann DOM (json::parse + get)", [&] {
    const Json doc = Json::parse(array, nullptr, /*allow_exceptions=*/false);
    std::vector<int64_t> out;
    out.reserve(doc.size());
    for (const Json& v : doc) out.push_back(v.get<int64_t>());
    sink += out.size();
  });
  Measure("read: nlohmann SAX (integers only)", [&] {
    IntsOnly sax;
    Json::sax_parse(array, &sax);
    sink += sax.values.size();
  });

  PlanRequest request;
  request.options.max_token_len = 65536;
  const PlanRun run = *RunPlan(lengths, request);
  std::string hand;
  Measure("write: PlanJson (JsonWriter)", [&] { hand = PlanJson(run); });
  // ordered_json keeps the keys in PlanJson's order (json sorts them).
  nlohmann::ordered_json doc;
  Measure("write: nlohmann DOM build (from PlanJson's text)",
          [&] { doc = nlohmann::ordered_json::parse(hand, nullptr, /*allow_exceptions=*/false); });
  std::string dumped;
  Measure("write: nlohmann dump() of that DOM", [&] { dumped = doc.dump() + "\n"; });
  std::printf("write: %.1f MiB of JSON; nlohmann's bytes identical to PlanJson's: %s\n",
              static_cast<double>(hand.size()) / (1 << 20), dumped == hand ? "yes" : "no");
  if (dumped != hand) {
    size_t i = 0;
    while (i < hand.size() && i < dumped.size() && hand[i] == dumped[i]) ++i;
    const size_t from = i < 40 ? 0 : i - 40;
    std::printf("  first difference at byte %zu:\n  hand:     %s\n  nlohmann: %s\n", i,
                hand.substr(from, 80).c_str(), dumped.substr(from, 80).c_str());
  }
  return sink == 0;
}

}  // namespace
}  // namespace packsched::cli

int main() { return packsched::cli::Main(); }
