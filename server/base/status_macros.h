#ifndef PACKSCHED_SERVER_BASE_STATUS_MACROS_H_
#define PACKSCHED_SERVER_BASE_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr. packsched does not throw: every
// boundary returns a Status, and these keep the happy path readable.
//
//   RETURN_IF_ERROR(Validate(request));
//   ASSIGN_OR_RETURN(Problem problem, Problem::Create(lengths, options));

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PACKSCHED_CONCAT_INNER_(a, b) a##b
#define PACKSCHED_CONCAT_(a, b) PACKSCHED_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status packsched_status_ = (expr);             \
    if (!packsched_status_.ok()) return packsched_status_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>) once; on error returns its status, else moves the
// value into `lhs` (a declaration such as `Foo foo` or an existing lvalue).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  PACKSCHED_ASSIGN_OR_RETURN_IMPL_(PACKSCHED_CONCAT_(packsched_statusor_, __LINE__), lhs, rexpr)

// `statusor` names a variable and `lhs` may be a declaration, so neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define PACKSCHED_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // PACKSCHED_SERVER_BASE_STATUS_MACROS_H_
