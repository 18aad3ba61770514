// nccl_probe: the NCCL backend on a real GPU, for the GPU kit (tests/gpu/README.md).
//
//   nccl_probe [--rounds=N] [--device=D]     writes one JSON object to stdout; NCCL's own log
//                                            (NCCL_DEBUG=WARN unless set) goes to stderr
//
// Contract: exit 0 when the JSON was written, whatever it says (tests/gpu/report.py judges it);
// exit 2 only on bad arguments. Without a GPU it writes {"gpu": false, ...} and exits 0. It
// never asks for more than a few MiB of device memory.
//
// What it measures, in order, on one process:
//  1. device memory in use before this process touches CUDA (NVML, when libnvidia-ml loads),
//     after the CUDA context exists, after NcclCollective::Create (a group of one), and after the
//     rounds below: the CUDA context memory the sidecar's NCCL backend costs, and the host RSS;
//  2. a group of one: AllReduce of {sum, min, max} values and AllGather of a record, checked;
//  3. the round itself (packsched::group::AgreeRound, what the sidecar runs per planning round:
//     one all-reduce), N times after a warm-up: p50/p90/p99/max latency in microseconds; and a
//     failed round (one all-reduce plus the gather of the records that explain it), N/10 times;
//  4. two communicators in one process on the same device (a group of two, one thread each):
//     NCCL normally refuses two ranks on one GPU; the outcome and its message are recorded.

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/collective/nccl_collective.h"
#include "server/collective/store.h"
#include "server/group/round.h"

namespace {

using packsched::collective::InMemoryStore;
using packsched::collective::NcclCollective;
using packsched::collective::NcclOptions;
using packsched::collective::ReduceOp;

// A JSON string literal (quotes, backslashes and control characters escaped).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// The JSON object being written: members appended in order.
class Json {
 public:
  void Raw(const std::string& key, const std::string& value) {
    members_.push_back(absl::StrCat(Quote(key), ": ", value));
  }
  void Str(const std::string& key, const std::string& value) { Raw(key, Quote(value)); }
  void Num(const std::string& key, double value) { Raw(key, absl::StrFormat("%.6g", value)); }
  void Int(const std::string& key, int64_t value) { Raw(key, absl::StrCat(value)); }
  void Bool(const std::string& key, bool value) { Raw(key, value ? "true" : "false"); }
  std::string Text() const { return absl::StrCat("{", absl::StrJoin(members_, ", "), "}"); }

 private:
  std::vector<std::string> members_;
};

// Device memory in use on device `index` as NVML sees it (no CUDA context needed), in bytes;
// -1 when libnvidia-ml cannot be loaded or answers an error.
int64_t NvmlUsedBytes(unsigned index) {
  struct Memory {
    unsigned long long total, free, used;  // nvmlMemory_t
  };
  using Init = int (*)();
  using Handle = int (*)(unsigned, void**);
  using Info = int (*)(void*, Memory*);
  static void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return -1;
  auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
  auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto info = reinterpret_cast<Info>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  if (init == nullptr || handle == nullptr || info == nullptr) return -1;
  static const int initialized = init();
  void* device = nullptr;
  Memory memory{};
  if (initialized != 0 || handle(index, &device) != 0 || info(device, &memory) != 0) return -1;
  return static_cast<int64_t>(memory.used);
}

// Device memory in use as the CUDA runtime sees it (total - free), in bytes; -1 on error.
int64_t CudaUsedBytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(total - free);
}

// This process's resident set in bytes (VmRSS), -1 if unreadable.
int64_t RssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

// Memory at one stage of the probe, as a JSON object; `cuda` false before the context exists
// (cudaMemGetInfo would create it).
std::string MemoryStage(int device, bool cuda = true) {
  Json j;
  j.Int("nvml_used_bytes", NvmlUsedBytes(static_cast<unsigned>(device)));
  j.Int("cuda_used_bytes", cuda ? CudaUsedBytes() : -1);
  j.Int("host_rss_bytes", RssBytes());
  return j.Text();
}

std::string Percentiles(std::vector<double> us) {
  Json j;
  j.Int("count", static_cast<int64_t>(us.size()));
  if (!us.empty()) {
    std::sort(us.begin(), us.end());
    auto at = [&](double q) {
      return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
    };
    double sum = 0;
    for (double x : us) sum += x;
    j.Num("p50_us", at(0.50));
    j.Num("p90_us", at(0.90));
    j.Num("p99_us", at(0.99));
    j.Num("max_us", us.back());
    j.Num("mean_us", sum / us.size());
  }
  return j.Text();
}

absl::Time Deadline(int seconds) { return absl::Now() + absl::Seconds(seconds); }

// The group of one: values and a record, checked. Returns "" when right, else what was wrong.
std::string CheckCollectives(NcclCollective& nccl) {
  std::vector<int64_t> values = {5, -7, 11, 3};
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                     ReduceOp::kSum};
  if (absl::Status s = nccl.AllReduce(absl::MakeSpan(values), ops, Deadline(30)); !s.ok()) {
    return absl::StrCat("AllReduce: ", s.ToString());
  }
  if (values != std::vector<int64_t>{5, -7, 11, 3}) {
    return absl::StrCat("AllReduce gave ", absl::StrJoin(values, ","));
  }
  const std::vector<int64_t> record = {1, 2, 3};
  std::vector<int64_t> out(3);
  if (absl::Status s = nccl.AllGather(record, absl::MakeSpan(out), Deadline(30)); !s.ok()) {
    return absl::StrCat("AllGather: ", s.ToString());
  }
  if (out != record) return absl::StrCat("AllGather gave ", absl::StrJoin(out, ","));
  return "";
}

// AgreeRound `rounds` times (after 20 warm-ups); `fail` makes this rank's record carry an error,
// so every round also gathers the records. Latencies in microseconds; `error` set on failure.
std::vector<double> TimeRounds(NcclCollective& nccl, int rounds, bool fail, std::string* error) {
  std::vector<double> us;
  packsched::group::RoundRecord mine;
  mine.stream = "actor_update";
  mine.version = 1;
  mine.local_k = 12;
  mine.num_sequences = 1024;
  mine.loss_tokens = 3'000'000;
  mine.sequences_with_loss = 1024;
  if (fail) mine.error = absl::InvalidArgumentError("nccl_probe: a planted failure");
  for (int i = -20; i < rounds; ++i) {
    mine.round = i + 21;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<packsched::group::AgreedRound> agreed =
        packsched::group::AgreeRound(nccl, mine, Deadline(30));
    const auto stop = std::chrono::steady_clock::now();
    const bool as_expected =
        fail ? agreed.status().code() == absl::StatusCode::kInvalidArgument
             : agreed.ok() && agreed->k == mine.local_k && agreed->world_size == 1;
    if (!as_expected) {
      *error =
          absl::StrCat(fail ? "failed" : "ok", " round ", mine.round, ": ",
                       agreed.ok() ? absl::StrCat("k=", agreed->k) : agreed.status().ToString());
      return us;
    }
    if (i >= 0) us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
  }
  return us;
}

// Two ranks of one group on the same device, one thread each.
std::string TwoCommunicators(int device) {
  InMemoryStore store;
  absl::Status status[2];
  std::vector<int64_t> sums[2] = {{1}, {2}};
  std::thread threads[2];
  for (int r = 0; r < 2; ++r) {
    threads[r] = std::thread([&, r] {
      cudaSetDevice(device);
      NcclOptions options;
      options.device = device;
      auto created = NcclCollective::Create(store, "probe/two/", r, 2, options, Deadline(20));
      if (!created.ok()) {
        status[r] = created.status();
        return;
      }
      status[r] = (*created)->AllReduce(absl::MakeSpan(sums[r]), {ReduceOp::kSum}, Deadline(20));
    });
  }
  for (auto& t : threads) t.join();
  Json j;
  const bool ok = status[0].ok() && status[1].ok() && sums[0][0] == 3 && sums[1][0] == 3;
  j.Bool("ok", ok);
  j.Str("rank0", status[0].ToString());
  j.Str("rank1", status[1].ToString());
  if (status[0].ok() && status[1].ok()) j.Str("sums", absl::StrCat(sums[0][0], ",", sums[1][0]));
  return j.Text();
}

int Main(int argc, char** argv) {
  int rounds = 2000;
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--rounds=", 0) == 0) {
      rounds = std::atoi(arg.c_str() + 9);
    } else if (arg.rfind("--device=", 0) == 0) {
      device = std::atoi(arg.c_str() + 9);
    } else {
      std::fprintf(stderr, "usage: nccl_probe [--rounds=N] [--device=D]\n");
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;
  setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  setenv("NCCL_DEBUG", "WARN", /*overwrite=*/0);
  // NCCL logs to stdout by default: keep stdout for the JSON.
  setenv("NCCL_DEBUG_FILE", "/dev/stderr", /*overwrite=*/0);

  Json j;
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  j.Int("nccl_version", nccl_version);
  int runtime_version = 0, driver_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  cudaDriverGetVersion(&driver_version);
  j.Int("cuda_runtime_version", runtime_version);
  j.Int("cuda_driver_version", driver_version);
  j.Raw("memory_before_cuda", MemoryStage(device, /*cuda=*/false));
  const bool gpu = packsched::collective::GpuAvailable();
  j.Bool("gpu", gpu);
  if (!gpu) {
    j.Str("error", "no GPU visible to the CUDA runtime");
    std::printf("%s\n", j.Text().c_str());
    return 0;
  }
  cudaSetDevice(device);
  cudaFree(nullptr);  // creates the context
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  j.Str("device_name", prop.name);
  j.Raw("memory_after_context", MemoryStage(device));

  InMemoryStore store;
  NcclOptions options;
  options.device = device;
  const auto init_start = std::chrono::steady_clock::now();
  auto created = NcclCollective::Create(store, "probe/one/", 0, 1, options, Deadline(60));
  j.Num("init_ms",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - init_start)
            .count());
  if (!created.ok()) {
    j.Str("error", absl::StrCat("NcclCollective::Create: ", created.status().ToString()));
    std::printf("%s\n", j.Text().c_str());
    return 0;
  }
  NcclCollective& nccl = **created;
  j.Raw("memory_after_init", MemoryStage(device));
  const std::string wrong = CheckCollectives(nccl);
  j.Bool("collectives_ok", wrong.empty());
  if (!wrong.empty()) j.Str("collectives_error", wrong);

  std::string round_error;
  j.Raw("round", Percentiles(TimeRounds(nccl, rounds, /*fail=*/false, &round_error)));
  std::string failed_error;
  j.Raw("failed_round",
        Percentiles(TimeRounds(nccl, std::max(1, rounds / 10), /*fail=*/true, &failed_error)));
  if (!round_error.empty()) j.Str("round_error", round_error);
  if (!failed_error.empty()) j.Str("failed_round_error", failed_error);
  j.Raw("memory_after_rounds", MemoryStage(device));
  created->reset();
  j.Raw("memory_after_destroy", MemoryStage(device));
  j.Raw("two_communicators", TwoCommunicators(device));
  std::printf("%s\n", j.Text().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
