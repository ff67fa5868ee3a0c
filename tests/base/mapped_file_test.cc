// MappedFile refuses anything that is not a regular file before open() could block on it (a FIFO
// with no writer blocks open(2) forever), and maps regular files byte for byte.
#include "metronome/base/mapped_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "metronome/base/errors.h"

namespace metronome {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the test's temp dir, removed at the end.
class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("metronome_mapped_file_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // The LoadError's message, or "" when none was thrown.
  static std::string ErrorOf(const std::string& path) {
    try {
      const MappedFile file(path);
    } catch (const LoadError& e) {
      return e.what();
    }
    return "";
  }

 private:
  fs::path dir_;
};

TEST_F(MappedFileTest, MapsARegularFileByteForByte) {
  const std::string path = Path("data.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out << "GGUF\x03 bytes";
  }
  const MappedFile file(path);
  ASSERT_EQ(file.bytes().size(), 11U);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.bytes().data()), 11), "GGUF\x03 bytes");
  EXPECT_EQ(file.path(), path);
}

TEST_F(MappedFileTest, AnEmptyFileMapsToAnEmptySpan) {
  const std::string path = Path("empty.bin");
  { std::ofstream out(path, std::ios::binary); }
  EXPECT_TRUE(MappedFile(path).bytes().empty());
}

TEST_F(MappedFileTest, AFifoIsRefusedWithoutBlocking) {
  // Before the stat() check this test hung in open(2) until ctest's timeout.
  const std::string path = Path("model.gguf");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const std::string error = ErrorOf(path);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("not a regular file (it is a FIFO)"), std::string::npos) << error;
}

TEST_F(MappedFileTest, DevicesAndDirectoriesAreRefusedNamingWhatTheyAre) {
  EXPECT_NE(ErrorOf("/dev/zero").find("it is a character device"), std::string::npos)
      << ErrorOf("/dev/zero");
  const std::string dir = Path("sub");
  fs::create_directories(dir);
  EXPECT_NE(ErrorOf(dir).find("it is a directory"), std::string::npos) << ErrorOf(dir);
}

TEST_F(MappedFileTest, AMissingFileCannotBeOpened) {
  const std::string error = ErrorOf(Path("none.gguf"));
  EXPECT_NE(error.find("none.gguf: cannot open"), std::string::npos) << error;
}

}  // namespace
}  // namespace metronome
