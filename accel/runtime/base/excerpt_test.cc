#include "accel/runtime/base/excerpt.h"

#include <gtest/gtest.h>

#include <string>

namespace accel {
namespace {

TEST(ExcerptTest, ShortEscapedAndSaysWhatItLeftOut) {
  EXPECT_EQ(Excerpt("--num_processes=2"), "\"--num_processes=2\"");
  EXPECT_EQ(
      Excerpt(std::string(100000000, 'x')),
      "\"" + std::string(60, 'x') + "\" (the first 60 of 100000000 bytes)");
  EXPECT_EQ(Excerpt(std::string("\x7f"
                                "ELF\x02\0\n",
                                7)),
            "\"\\x7fELF\\x02\\x00\\x0a\"");
  EXPECT_EQ(Excerpt("say \"hi\"\\"), "\"say \\\"hi\\\"\\\\\"");
  EXPECT_EQ(Shown("--epochs"), "--epochs");
  EXPECT_EQ(Shown("--ep\tochs"), "\"--ep\\x09ochs\"");
}

TEST(ExcerptTest, IsUtf8TellsWellFormedText) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("plain ascii"));
  EXPECT_TRUE(IsUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsUtf8("\xff"));
  EXPECT_FALSE(IsUtf8("\xc3"));              // Cut off.
  EXPECT_FALSE(IsUtf8("\xc0\xaf"));          // Overlong '/'.
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));      // A surrogate.
  EXPECT_FALSE(IsUtf8("\xf4\x90\x80\x80"));  // Past U+10FFFF.
  EXPECT_FALSE(
      IsUtf8("a\x80"
             "b"));  // A lone continuation.
}

}  // namespace
}  // namespace accel
