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

}  // namespace
}  // namespace accel
