// ParseLengths: both input formats, and errors that name where and what.

#include "server/cli/read_lengths.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/options.h"

namespace packsched::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<std::vector<int64_t>> lengths = ParseLengths(text, "in.txt");
  EXPECT_FALSE(lengths.ok()) << "parsed: " << text;
  EXPECT_EQ(lengths.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(lengths.status().message());
}

TEST(ParseLengthsTest, OneIntegerPerLine) {
  EXPECT_THAT(*ParseLengths("3\n1\n4\n", "in"), ElementsAre(3, 1, 4));
}

TEST(ParseLengthsTest, LinesToleratesBlankLinesSpacesCrlfAndNoFinalNewline) {
  EXPECT_THAT(*ParseLengths("\n  3 \r\n\t1\n\n4", "in"), ElementsAre(3, 1, 4));
}

TEST(ParseLengthsTest, JsonArrayAcrossLines) {
  EXPECT_THAT(*ParseLengths(" [1, 2,2 ,\n 5]\n", "in"), ElementsAre(1, 2, 2, 5));
}

TEST(ParseLengthsTest, AcceptsTheLargestLength) {
  EXPECT_THAT(*ParseLengths(std::to_string(planner::kMaxLength), "in"),
              ElementsAre(planner::kMaxLength));
}

TEST(ParseLengthsTest, NotAnIntegerNamesSourceLineAndToken) {
  EXPECT_THAT(ErrorOf("5\n\n7\nabc\n"), HasSubstr("in.txt:4: 'abc' is not an integer"));
  EXPECT_THAT(ErrorOf("5\n2.5\n"), HasSubstr("in.txt:2: '2.5'"));
  EXPECT_THAT(ErrorOf("5 6\n"), HasSubstr("in.txt:1: '5 6'"));
}

TEST(ParseLengthsTest, OutOfRangeNamesTheValue) {
  EXPECT_THAT(ErrorOf("4\n0\n"), HasSubstr("in.txt:2: length 0 is out of range"));
  EXPECT_THAT(ErrorOf("-3\n"), HasSubstr("in.txt:1: length -3 is out of range"));
  EXPECT_THAT(ErrorOf(std::to_string(planner::kMaxLength + 1)),
              HasSubstr("length 2147483648 is out of range"));
  EXPECT_THAT(ErrorOf("99999999999999999999\n"),
              HasSubstr("'99999999999999999999' is out of range"));
}

TEST(ParseLengthsTest, JsonErrorsNameLineColumnAndIndex) {
  EXPECT_THAT(ErrorOf("[1,\n 2.5]"), HasSubstr("in.txt:2:2: index 1: '2.5' is not an integer"));
  EXPECT_THAT(ErrorOf("[1, 0]"), HasSubstr("in.txt:1:5: index 1: length 0 is out of range"));
  EXPECT_THAT(ErrorOf("[1,,2]"), HasSubstr("in.txt:1:4: expected a length at index 1"));
  EXPECT_THAT(ErrorOf("[1 2]"), HasSubstr("in.txt:1:4: expected ',' or ']' after index 0"));
  EXPECT_THAT(ErrorOf("[1, 2"), HasSubstr("ends before its ']'"));
  EXPECT_THAT(ErrorOf("[1,"), HasSubstr("ends before its ']'"));
  EXPECT_THAT(ErrorOf("[1] [2]"), HasSubstr("in.txt:1:5: unexpected '[2]' after the JSON array"));
  EXPECT_THAT(ErrorOf("[\"7\"]"), HasSubstr("'\"7\"' is not an integer"));
}

TEST(ParseLengthsTest, NoLengthsIsAnError) {
  EXPECT_THAT(ErrorOf(""), HasSubstr("in.txt: no lengths"));
  EXPECT_THAT(ErrorOf("\n \n"), HasSubstr("no lengths"));
  EXPECT_THAT(ErrorOf("[ ]"), HasSubstr("no lengths"));
}

TEST(ParseLengthsTest, BinaryGarbageIsShownPrintably) {
  const std::string message = ErrorOf(std::string("1\n\x01\x02", 4));
  EXPECT_THAT(message, HasSubstr("in.txt:2: '\?\?'"));
}

TEST(ReadInputTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadInput("/nonexistent/lengths.txt").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace packsched::cli
