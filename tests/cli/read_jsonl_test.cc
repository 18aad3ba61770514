// ParseJsonlLengths: the length or token field of each record, and errors that name the line.

#include "server/cli/read_jsonl.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/options.h"

namespace packsched::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const JsonlField kLen{JsonlField::Kind::kLength, "len"};
const JsonlField kIds{JsonlField::Kind::kTokens, "input_ids"};

std::string ErrorOf(const std::string& text, const JsonlField& field) {
  absl::StatusOr<std::vector<int64_t>> lengths = ParseJsonlLengths(text, "d.jsonl", field);
  EXPECT_FALSE(lengths.ok());
  EXPECT_EQ(lengths.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(lengths.status().message());
}

TEST(ParseJsonlLengthsTest, TheLengthFieldOfEachRecordSkippingBlankLinesAndOtherFields) {
  const std::string text =
      "{\"id\": \"a\", \"len\": 7, \"input_ids\": [1, 2]}\n"
      "\n"
      "  {\"meta\": {\"len\": 99, \"x\": [[1], {\"len\": 5}]}, \"len\": 3}\r\n"
      "{\"len\": 2147483647}";
  EXPECT_THAT(*ParseJsonlLengths(text, "d", kLen), ElementsAre(7, 3, planner::kMaxLength));
}

TEST(ParseJsonlLengthsTest, TheTokenFieldCountsTheArraysOwnElementsOnly) {
  const std::string text =
      "{\"input_ids\": [5, 6, 7], \"len\": 100}\n"
      "{\"other\": [1, 2, 3, 4], \"input_ids\": [[1, 2], \"x\", {\"input_ids\": [1]}, null]}\n";
  EXPECT_THAT(*ParseJsonlLengths(text, "d", kIds), ElementsAre(3, 4));
}

TEST(ParseJsonlLengthsTest, ErrorsNameTheLineAndWhatIsWrong) {
  EXPECT_THAT(ErrorOf("{\"len\": 1}\n{\"len\": 2", kLen),
              HasSubstr("d.jsonl:2: not valid JSON: column"));
  EXPECT_THAT(ErrorOf("{\"len\": 1}\n\n{\"n\": 2}\n", kLen),
              HasSubstr("d.jsonl:3: no field 'len'"));
  EXPECT_THAT(ErrorOf("{\"len\": 2.5}", kLen),
              HasSubstr("d.jsonl:1: field 'len' is the number 2.5, not an integer length"));
  EXPECT_THAT(ErrorOf("{\"len\": \"7\"}", kLen), HasSubstr("is a string, not an integer"));
  EXPECT_THAT(ErrorOf("{\"len\": 1, \"len\": 2}", kLen), HasSubstr("field 'len' appears twice"));
  EXPECT_THAT(ErrorOf("{\"len\": 0}", kLen), HasSubstr("field 'len': length 0 is out of range"));
  EXPECT_THAT(ErrorOf("{\"len\": 18446744073709551615}", kLen), HasSubstr("is out of range"));
  EXPECT_THAT(ErrorOf("[1, 2]", kLen), HasSubstr("d.jsonl:1: the record is an array"));
  EXPECT_THAT(ErrorOf("7", kLen), HasSubstr("the record is the integer 7, not a JSON object"));
  EXPECT_THAT(ErrorOf("{\"input_ids\": 7}", kIds),
              HasSubstr("field 'input_ids' is the integer 7, not an array of tokens"));
  EXPECT_THAT(ErrorOf("{\"input_ids\": []}", kIds), HasSubstr("length 0 is out of range"));
  EXPECT_THAT(ErrorOf("{\"len\": 1} {\"len\": 2}", kLen), HasSubstr("d.jsonl:1: not valid JSON"));
  EXPECT_THAT(ErrorOf("\n \n", kLen), HasSubstr("d.jsonl: no records in the input"));
}

}  // namespace
}  // namespace packsched::cli
