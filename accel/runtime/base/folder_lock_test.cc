#include "accel/runtime/base/folder_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace accel {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

TEST(FolderLockTest, ASecondClaimIsRefusedNamingTheFirst) {
  const std::string dir = FreshDir("claim");
  std::string holder;
  auto first = FolderLock::TryAcquire(dir, &holder);
  ASSERT_NE(first, nullptr) << holder;
  EXPECT_EQ(first->unlocked_reason(), "");
  EXPECT_EQ(FolderLock::TryAcquire(dir, &holder), nullptr);
  EXPECT_THAT(holder, StartsWith("pid " + std::to_string(getpid()) + " on "));
  EXPECT_THAT(holder, HasSubstr("folder_lock_test"));
  first.reset();
  EXPECT_NE(FolderLock::TryAcquire(dir, &holder), nullptr);
}

TEST(FolderLockTest, AHolderThatDiedBlocksNothing) {
  const std::string dir = FreshDir("died");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    std::string unused;
    auto lock = FolderLock::TryAcquire(dir, &unused);
    char byte = lock ? 'y' : 'n';
    (void)!write(ready[1], &byte, 1);
    pause();  // Killed below, holding the lock.
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 'y');
  std::string holder;
  EXPECT_EQ(FolderLock::TryAcquire(dir, &holder), nullptr);
  EXPECT_THAT(holder, StartsWith("pid " + std::to_string(child) + " "));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_NE(FolderLock::TryAcquire(dir, &holder), nullptr) << holder;
}

TEST(FolderLockTest, AFolderThatCannotHoldTheFileSaysWhy) {
  std::string holder;
  EXPECT_EQ(FolderLock::TryAcquire("/nonexistent/folder", &holder), nullptr);
  EXPECT_THAT(holder,
              HasSubstr("cannot open '/nonexistent/folder/accel.lock'"));
}

}  // namespace
}  // namespace accel
