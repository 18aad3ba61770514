#include "server/base/file_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace packsched {
namespace {

absl::Status Refused(absl::string_view why) { return absl::InvalidArgumentError(why); }

// strerror(3)'s text, thread-safely.
std::string Reason(int error) { return std::error_code(error, std::generic_category()).message(); }

// stat(2) of `path`, following links; InvalidArgument when it does not exist or cannot be
// looked at.
absl::Status Stat(const std::string& path, struct stat* info) {
  if (stat(path.c_str(), info) == 0) return absl::OkStatus();
  const int error = errno;
  if (error == ENOENT || error == ENOTDIR) return Refused("no such file");
  return Refused(absl::StrCat("cannot be read: ", Reason(error)));
}

// Opens `path` for reading and closes it: the only check of readability that holds for root,
// ACLs and read-only mounts alike.
absl::Status CheckOpens(const std::string& path) {
  // O_NONBLOCK: a FIFO with no writer yet must not block the check.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Refused(absl::StrCat("cannot be read: ", Reason(errno)));
  close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckReadableFile(absl::string_view path) {
  const std::string p(path);
  struct stat info = {};
  if (absl::Status s = Stat(p, &info); !s.ok()) return s;
  if (S_ISDIR(info.st_mode)) return Refused("is a directory, not a file");
  if (!S_ISREG(info.st_mode)) return Refused("is not a regular file");
  return CheckOpens(p);
}

absl::Status CheckReadableInput(absl::string_view path) {
  const std::string p(path);
  struct stat info = {};
  if (absl::Status s = Stat(p, &info); !s.ok()) return s;
  if (S_ISDIR(info.st_mode)) return Refused("is a directory, not a file");
  if (!S_ISREG(info.st_mode) && !S_ISFIFO(info.st_mode) && !S_ISCHR(info.st_mode)) {
    return Refused("is not a file, a pipe or a character device");
  }
  return CheckOpens(p);
}

absl::Status CheckWritablePath(absl::string_view path) {
  const std::string p(path);
  if (p.empty() || p.back() == '/') return Refused("is a directory, not a file");
  struct stat info = {};
  if (stat(p.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return Refused("is a directory, not a file");
  }
  const size_t slash = p.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
  struct stat dir_info = {};
  if (stat(dir.c_str(), &dir_info) != 0 || !S_ISDIR(dir_info.st_mode)) {
    return Refused(absl::StrCat("its directory ", dir, " does not exist"));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Refused(absl::StrCat("cannot write in ", dir, ": ", Reason(errno)));
  }
  return absl::OkStatus();
}

}  // namespace packsched
