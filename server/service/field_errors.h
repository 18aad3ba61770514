#ifndef PACKSCHED_SERVER_SERVICE_FIELD_ERRORS_H_
#define PACKSCHED_SERVER_SERVICE_FIELD_ERRORS_H_

// The InvalidArgument errors that name a request field and its value, shared by the request
// conversion (convert.h) and the Partition and BalanceBatch handlers (partition.h,
// balance_batch.h).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace packsched::service {

// "<field> = <value> is not a known <Enum> value".
inline absl::Status NotKnown(absl::string_view field, int value,
                             const google::protobuf::EnumDescriptor* descriptor) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " is not a known ", descriptor->name(), " value"));
}

// "<field> = <value>: must be >= 0".
inline absl::Status Negative(absl::string_view field, int64_t value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": must be >= 0"));
}

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_FIELD_ERRORS_H_
