#ifndef PACKSCHED_SERVER_BASE_FILE_CHECK_H_
#define PACKSCHED_SERVER_BASE_FILE_CHECK_H_

// What a file flag needs of its path, checked before a program starts anything: a file to read
// (a token, a certificate, a config) or a place to write one (a port file). Errors say which
// rule the path breaks, without naming a flag: the caller does.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace packsched {

// `path` (symbolic links followed) is a regular file this process can open for reading.
// InvalidArgument: "no such file", "is a directory, not a file", "is not a regular file",
// "cannot be read: <reason>".
absl::Status CheckReadableFile(absl::string_view path);

// `path` is something to read input from: a regular file, a pipe or a character device (a
// process substitution's /dev/fd/N), not a directory, that this process can open for reading.
// InvalidArgument as CheckReadableFile.
absl::Status CheckReadableInput(absl::string_view path);

// A file can be written at `path`: it is not a directory, and its directory exists and this
// process may create files in it (a port file is written beside it, then renamed onto it).
// InvalidArgument: "is a directory, not a file", "its directory <dir> does not exist",
// "cannot write in <dir>: <reason>".
absl::Status CheckWritablePath(absl::string_view path);

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_FILE_CHECK_H_
