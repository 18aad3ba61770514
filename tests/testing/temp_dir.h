#ifndef PACKSCHED_TESTS_TESTING_TEMP_DIR_H_
#define PACKSCHED_TESTS_TESTING_TEMP_DIR_H_

// A fresh directory under $TMPDIR (or /tmp) for one test's files, removed with them when
// destroyed. path() is empty if the directory could not be made.

#include <stdlib.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace packsched::testing {

class TempDir {
 public:
  // `tag` names the directory ("packsched-<tag>-XXXXXX"), so a leftover says whose it was.
  explicit TempDir(absl::string_view tag = "test") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr ? base : "/tmp", "/packsched-", tag, "-XXXXXX");
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    if (!path_.empty()) {
      [[maybe_unused]] int rc = std::system(absl::StrCat("rm -rf '", path_, "'").c_str());
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

}  // namespace packsched::testing

#endif  // PACKSCHED_TESTS_TESTING_TEMP_DIR_H_
