// What a file flag needs of its path: a file to read, an input that may be a pipe, a place to
// write a port file.

#include "server/base/file_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace packsched {
namespace {

using ::packsched::testing::TempDir;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(CheckReadableFile, ARegularFileOnly) {
  TempDir dir;
  std::ofstream(dir.File("token")) << "t\n";
  EXPECT_TRUE(CheckReadableFile(dir.File("token")).ok());
  EXPECT_EQ(Message(CheckReadableFile(dir.File("missing"))), "no such file");
  EXPECT_EQ(Message(CheckReadableFile(dir.File("token/below"))), "no such file");
  EXPECT_EQ(Message(CheckReadableFile(dir.path())), "is a directory, not a file");
  EXPECT_EQ(Message(CheckReadableFile("/dev/null")), "is not a regular file");
  ASSERT_EQ(symlink(dir.File("token").c_str(), dir.File("link").c_str()), 0);
  EXPECT_TRUE(CheckReadableFile(dir.File("link")).ok());  // a mounted secret is a link
}

TEST(CheckReadableFile, AFileThisProcessCannotOpen) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads every file";
  TempDir dir;
  std::ofstream(dir.File("secret")) << "t\n";
  ASSERT_EQ(chmod(dir.File("secret").c_str(), 0), 0);
  EXPECT_EQ(Message(CheckReadableFile(dir.File("secret"))), "cannot be read: Permission denied");
}

TEST(CheckReadableInput, PipesAndDevicesToo) {
  TempDir dir;
  std::ofstream(dir.File("lengths")) << "5\n";
  EXPECT_TRUE(CheckReadableInput(dir.File("lengths")).ok());
  EXPECT_TRUE(CheckReadableInput("/dev/null").ok());
  ASSERT_EQ(mkfifo(dir.File("fifo").c_str(), 0600), 0);
  EXPECT_TRUE(CheckReadableInput(dir.File("fifo")).ok());  // no writer: the check must not block
  EXPECT_EQ(Message(CheckReadableInput(dir.path())), "is a directory, not a file");
  EXPECT_EQ(Message(CheckReadableInput(dir.File("missing"))), "no such file");
}

TEST(CheckWritablePath, ItsDirectoryMustExist) {
  TempDir dir;
  EXPECT_TRUE(CheckWritablePath(dir.File("port")).ok());
  std::ofstream(dir.File("old")) << "1\n";
  EXPECT_TRUE(CheckWritablePath(dir.File("old")).ok());  // replaced by a rename
  EXPECT_EQ(Message(CheckWritablePath(dir.path())), "is a directory, not a file");
  EXPECT_EQ(Message(CheckWritablePath(dir.File("sub/"))), "is a directory, not a file");
  EXPECT_EQ(Message(CheckWritablePath(dir.File("none/port"))),
            "its directory " + dir.File("none") + " does not exist");
  EXPECT_EQ(Message(CheckWritablePath(dir.File("old/port"))),
            "its directory " + dir.File("old") + " does not exist");
  if (geteuid() != 0) {
    EXPECT_EQ(Message(CheckWritablePath("/proc/port")).rfind("cannot write in /proc", 0), 0u);
  }
}

}  // namespace
}  // namespace packsched
