// JsonWriter and its helpers: separators, escaping, numbers that read back exactly.

#include "server/cli/json_writer.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace packsched::cli {
namespace {

TEST(JsonWriterTest, NestedObjectsAndArraysGetCommasAndColons) {
  JsonWriter w;
  w.BeginObject();
  w.Key("a");
  w.Int(1);
  w.Key("b");
  w.BeginArray();
  w.Int(-2);
  w.BeginObject();
  w.EndObject();
  w.BeginArray();
  w.EndArray();
  w.Null();
  w.EndArray();
  w.Key("c");
  w.BeginObject();
  w.Key("d");
  w.Bool(true);
  w.Key("e");
  w.Bool(false);
  w.EndObject();
  w.Key("f");
  w.String("x");
  w.EndObject();
  EXPECT_EQ(w.str(), R"({"a":1,"b":[-2,{},[],null],"c":{"d":true,"e":false},"f":"x"})");
}

TEST(JsonWriterTest, IntArraysOfBothWidths) {
  JsonWriter w;
  w.BeginArray();
  w.IntArray(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 0});
  w.IntArray(std::vector<int32_t>{});
  w.IntArray(std::vector<int32_t>{7, 8});
  w.EndArray();
  EXPECT_EQ(w.str(), "[[-9223372036854775808,0],[],[7,8]]");
}

TEST(JsonStringTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonString(""), R"("")");
  EXPECT_EQ(JsonString("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(JsonString("\n\r\t\b\f"), R"("\n\r\t\b\f")");
  EXPECT_EQ(JsonString(std::string("\x01\x1f\0", 3)), R"("\u0001\u001f\u0000")");
  EXPECT_EQ(JsonString("\x7f/é"), "\"\x7f/é\"");  // DEL, '/' and UTF-8 pass through
}

TEST(JsonNumberTest, NonFiniteBecomesNull) {
  EXPECT_EQ(JsonNumber(std::nan("")), "null");
  EXPECT_EQ(JsonNumber(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(JsonNumber(-std::numeric_limits<double>::infinity()), "null");
}

TEST(JsonNumberTest, ShortestFormThatReadsBackExactly) {
  EXPECT_EQ(JsonNumber(0.1), "0.1");
  EXPECT_EQ(JsonNumber(1.5), "1.5");
  EXPECT_EQ(JsonNumber(1.0), "1");
  const std::vector<double> values = {
      1.0 / 3.0, 1.1002557544757034, 5e-324, std::numeric_limits<double>::max(),
      -2.5e-7,   123456789.0123,     1e22};
  for (double v : values) {
    const std::string text = JsonNumber(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
    // A JSON number: optional '-', digits, optional fraction and exponent; no "inf"/"nan".
    EXPECT_EQ(text.find_first_not_of("-+0123456789.e"), std::string::npos) << text;
  }
}

TEST(JsonWriterTest, DoubleUsesTheSameRules) {
  JsonWriter w;
  w.BeginArray();
  w.Double(0.25);
  w.Double(std::nan(""));
  w.EndArray();
  EXPECT_EQ(w.str(), "[0.25,null]");
}

}  // namespace
}  // namespace packsched::cli
