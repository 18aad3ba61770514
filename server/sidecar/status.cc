#include "server/sidecar/status.h"

#include <cstdio>
#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/security/credentials.h"
#include "server/service/status_client.h"

namespace packsched::sidecar {
namespace {

std::string Millis(int64_t us) { return absl::StrFormat("%.2f", static_cast<double>(us) / 1e3); }

}  // namespace

std::string StatusTable(const v1::GetStatusResponse& s) {
  std::string out;
  absl::StrAppendFormat(
      &out, "packsched-server %s (protocol %d), up %s\n", s.build_version(), s.proto_version(),
      absl::FormatDuration(absl::Trunc(absl::Microseconds(s.uptime_us()), absl::Seconds(1))));
  absl::StrAppendFormat(&out, "group       rank %d of %d, backend %s, generation %d, %s\n",
                        s.rank(), s.world_size(), s.backend().empty() ? "-" : s.backend(),
                        s.generation(), s.group_ready() ? "ready" : "NOT READY");
  const v1::Counters& c = s.counters();
  absl::StrAppendFormat(&out, "rounds      %d run, %d cache hits, %d joined in flight\n",
                        c.rounds(), c.cache_hits(), c.joined_in_flight());
  // Unavoidable: a micro-batch isolating one sequence longer than the cap; avoidable: several
  // sequences over it, a planner bug.
  absl::StrAppendFormat(&out,
                        "over cap    %d micro-batches: %d unavoidable (one overlong sequence "
                        "each), %d avoidable%s\n",
                        c.over_cap_parts(), c.over_cap_unavoidable_parts(),
                        c.over_cap_avoidable_parts(),
                        c.over_cap_avoidable_parts() > 0 ? " (a planner bug: report it)" : "");
  if (!c.errors_by_code().empty()) {
    std::string errors;
    // The map's order is unspecified: sort by code name for a stable table.
    std::map<std::string, int64_t> sorted(c.errors_by_code().begin(), c.errors_by_code().end());
    for (const auto& [code, count] : sorted) {
      absl::StrAppend(&errors, errors.empty() ? "" : ", ", code, " ", count);
    }
    absl::StrAppendFormat(&out, "errors      %s\n", errors);
  }
  absl::StrAppendFormat(&out, "streams     %d\n", s.streams_size());
  if (s.streams_size() > 0) {
    absl::StrAppendFormat(&out, "  %-24s %10s %9s %7s %11s %7s %16s\n", "stream", "last round",
                          "completed", "failed", "outstanding", "cached", "last round ms");
    for (const v1::StreamStatus& st : s.streams()) {
      absl::StrAppendFormat(
          &out, "  %-24s %10s %9d %7d %11d %7d %16s\n", st.name(),
          st.rounds_completed() > 0 ? absl::StrCat(st.last_round()) : "-", st.rounds_completed(),
          st.rounds_failed(), st.outstanding(), st.cached(),
          st.rounds_completed() + st.rounds_failed() > 0 ? Millis(st.last_round_duration_us())
                                                         : "-");
    }
  }
  return out;
}

int RunStatus(const StatusFlags& flags) {
  std::optional<service::ProbeTls> tls;
  if (!flags.tls.tls_cert.empty()) {
    tls.emplace();
    tls->root_certs_file = flags.tls.tls_ca.empty() ? flags.tls.tls_client_ca : flags.tls.tls_ca;
    tls->cert_file = flags.tls.tls_cert;
    tls->key_file = flags.tls.tls_key;
    tls->server_name = flags.tls.tls_server_name;
  }
  std::string token;
  if (!flags.auth_token_file.empty()) {
    absl::StatusOr<std::string> read =
        security::ReadTokenFile({"--auth_token_file", flags.auth_token_file});
    if (!read.ok()) {
      std::fprintf(stderr, "packsched-server --status: %s\n", read.status().ToString().c_str());
      return 1;
    }
    token = *read;
  }
  absl::StatusOr<v1::GetStatusResponse> status = service::FetchStatus(
      flags.target, absl::Now() + absl::Seconds(10), tls ? &*tls : nullptr, token);
  if (!status.ok()) {
    std::fprintf(stderr, "packsched-server --status: %s\n", status.status().ToString().c_str());
    return 1;
  }
  const std::string text = flags.json ? service::StatusJson(*status) : StatusTable(*status);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (flags.json) std::fputc('\n', stdout);
  return 0;
}

}  // namespace packsched::sidecar
