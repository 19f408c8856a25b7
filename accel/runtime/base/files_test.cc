#include "accel/runtime/base/files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

TEST(FilesTest, CommitReplacesTheFileWhole) {
  const std::string dir = FreshDir("commit");
  WriteFileAtomically(dir + "/f", "old");
  AtomicFile file(dir + "/f");
  file.Write("new ");
  EXPECT_EQ(Read(dir + "/f"), "old");  // Not visible before Commit.
  file.Write(std::string(100000, 'x'));
  file.Commit();
  EXPECT_EQ(Read(dir + "/f"), "new " + std::string(100000, 'x'));
  EXPECT_THAT(ListFolder(dir), ElementsAre("f"));
  EXPECT_THROW(file.Write("more"), CheckpointError);
}

TEST(FilesTest, WithoutCommitTheOldFileStaysAndNothingIsLeft) {
  const std::string dir = FreshDir("abandon");
  WriteFileAtomically(dir + "/f", "old");
  {
    AtomicFile file(dir + "/f");
    file.Write("partial");
  }
  EXPECT_EQ(Read(dir + "/f"), "old");
  EXPECT_THAT(ListFolder(dir), ElementsAre("f"));
}

TEST(FilesTest, ErrorsNameTheFile) {
  EXPECT_THAT([] { WriteFileAtomically("/nonexistent-folder/f", "x"); },
              ::testing::ThrowsMessage<CheckpointError>(::testing::AllOf(
                  HasSubstr("cannot create '/nonexistent-folder/f.partial."),
                  HasSubstr("No such file or directory"))));
  const std::string dir = FreshDir("folder_in_the_way");
  mkdir((dir + "/sub").c_str(), 0755);
  mkdir((dir + "/sub/child").c_str(), 0755);
  EXPECT_THAT(
      [&] { WriteFileAtomically(dir + "/sub", "x"); },
      ::testing::ThrowsMessage<CheckpointError>(HasSubstr("cannot rename")));
  EXPECT_THAT(ListFolder(dir), ElementsAre("sub"));
}

TEST(FilesTest, MakeDirectoriesCreatesParentsAndNamesFailures) {
  const std::string dir = FreshDir("mkdir");
  MakeDirectories(dir + "/a/b/c");
  MakeDirectories(dir + "/a/b/c/");  // Again, with a trailing slash.
  EXPECT_THAT(ListFolder(dir + "/a/b"), ElementsAre("c"));
  EXPECT_FALSE(IsFile(dir + "/a"));
  WriteFileAtomically(dir + "/a/file", "x");
  EXPECT_TRUE(IsFile(dir + "/a/file"));
  EXPECT_THAT([&] { MakeDirectories(dir + "/a/file/sub"); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("cannot create folder '" + dir +
                            "/a/file/sub': Not a "
                            "directory")));
  EXPECT_THAT([&] { MakeDirectories(dir + "/a/file"); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("a file of that name is in the way")));
}

TEST(FilesTest, ListFolderIsSortedAndNamesFailures) {
  const std::string dir = FreshDir("list");
  for (const char* name : {"b", "a", "c.txt"}) {
    WriteFileAtomically(dir + "/" + name, "");
  }
  MakeDirectories(dir + "/sub");
  EXPECT_THAT(ListFolder(dir), ElementsAre("a", "b", "c.txt", "sub"));
  EXPECT_THAT([&] { ListFolder(dir + "/missing"); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("cannot list folder '" + dir +
                            "/missing': No such file or directory")));
}

TEST(FilesTest, RemoveOwnedTreeNeverFollowsALink) {
  const std::string dir = FreshDir("owned");
  const std::string outside = FreshDir("outside");
  WriteFileAtomically(outside + "/mine.pt", "keep");
  MakeDirectories(dir + "/tree/sub");
  WriteFileAtomically(dir + "/tree/a.pt", "");
  WriteFileAtomically(dir + "/tree/sub/b.pt", "");
  symlink(outside.c_str(), (dir + "/tree/sub/folder_link").c_str());
  symlink((outside + "/mine.pt").c_str(), (dir + "/tree/file_link.pt").c_str());
  const auto owned = [](const std::string& name) {
    return name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
  };
  EXPECT_TRUE(RemoveOwnedTree(dir + "/tree", owned).kept.empty());
  EXPECT_THAT(ListFolder(dir), ::testing::IsEmpty());
  EXPECT_EQ(Read(outside + "/mine.pt"), "keep");
  // A link as the folder itself goes as a link.
  symlink(outside.c_str(), (dir + "/linked").c_str());
  EXPECT_EQ(RemoveOwnedTree(dir + "/linked", owned).removed, 1u);
  EXPECT_THAT(ListFolder(dir), ::testing::IsEmpty());
  EXPECT_THAT(ListFolder(outside), ElementsAre("mine.pt"));
  // What `owned` rejects stays, with the folders that hold it.
  MakeDirectories(dir + "/mixed/notes");
  WriteFileAtomically(dir + "/mixed/x.pt", "");
  WriteFileAtomically(dir + "/mixed/notes/todo.txt", "");
  const Removal mixed = RemoveOwnedTree(dir + "/mixed", owned);
  EXPECT_THAT(mixed.kept, ElementsAre("notes/todo.txt"));
  EXPECT_EQ(mixed.removed, 1u);
  EXPECT_THAT(ListFolder(dir + "/mixed"), ElementsAre("notes"));
  EXPECT_TRUE(RemoveOwnedTree(dir + "/missing", owned).kept.empty());
}

}  // namespace
}  // namespace accel
