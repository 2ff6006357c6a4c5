// samples/support/test_fashion_mnist_reader.cpp — the IDX reader of fashion_mnist.hpp on files it
// writes itself (gzwrite into a temporary folder): a valid set round-trips, shards cover every
// example once, and every malformed file (missing, wrong magic, wrong dimensions, truncated, images
// and labels disagreeing, a label above 9) throws fashion_mnist_error naming the file and the fault.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"

namespace fm = flexpar::samples;
namespace fs = std::filesystem;

namespace {

void put_u32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}

void write_gz(const fs::path& file, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(file.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  gzclose(f);
}

std::vector<std::uint8_t> images_file(std::uint32_t magic, std::uint32_t count, std::uint32_t rows, std::uint32_t cols,
                                      std::size_t payload) {
  std::vector<std::uint8_t> b;
  put_u32(b, magic);
  put_u32(b, count);
  put_u32(b, rows);
  put_u32(b, cols);
  for (std::size_t i = 0; i < payload; ++i) b.push_back(static_cast<std::uint8_t>(i * 7));
  return b;
}

std::vector<std::uint8_t> labels_file(std::uint32_t magic, std::uint32_t count, std::size_t payload,
                                      std::uint8_t bad_at_end = 0) {
  std::vector<std::uint8_t> b;
  put_u32(b, magic);
  put_u32(b, count);
  for (std::size_t i = 0; i < payload; ++i) b.push_back(static_cast<std::uint8_t>(i % 10));
  if (bad_at_end != 0 && payload > 0) b.back() = bad_at_end;
  return b;
}

class reader : public testing::Test {
 protected:
  void SetUp() override {
    std::string name = "fashion_mnist_reader_";
    name.append(std::to_string(::getpid()));
    dir_ = fs::temp_directory_path() / name;
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::vector<std::uint8_t>& images, const std::vector<std::uint8_t>& labels) {
    write_gz(dir_ / "t10k-images-idx3-ubyte.gz", images);
    write_gz(dir_ / "t10k-labels-idx1-ubyte.gz", labels);
  }

  /// The message of the fashion_mnist_error that loading the test split throws ("" if none).
  std::string error_of_load() {
    try {
      (void)fm::load_fashion_mnist(fm::fashion_mnist_split::test, dir_);
    } catch (const fm::fashion_mnist_error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

}  // namespace

TEST_F(reader, valid_set_round_trips_and_shards_cover_every_example_once) {
  constexpr std::uint32_t n = 11;
  write(images_file(0x803, n, 28, 28, n * 784), labels_file(0x801, n, n));
  const auto set = fm::load_fashion_mnist(fm::fashion_mnist_split::test, dir_);
  ASSERT_EQ(set.count, n);
  EXPECT_EQ(set.pixels(), 784u);
  for (std::size_t i = 0; i < n * 784; ++i) ASSERT_EQ(set.images[i], static_cast<std::uint8_t>(i * 7));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(set.labels[i], i % 10);
  for (int p : {1, 2, 3, 4, 5, 7, 11, 13}) {  // 13 > n: some shards are empty
    std::size_t total = 0, next_label = 0;
    for (int r = 0; r < p; ++r) {
      const auto s = set.shard(r, p);
      EXPECT_LE(s.count, n / static_cast<std::size_t>(p) + 1);
      EXPECT_GE(s.count, n / static_cast<std::size_t>(p));
      for (std::size_t i = 0; i < s.count; ++i) ASSERT_EQ(s.labels[i], (next_label + i) % 10) << "p " << p;
      next_label += s.count;
      total += s.count;
    }
    EXPECT_EQ(total, n);
  }
  EXPECT_THROW((void)set.shard(3, 3), std::invalid_argument);
  EXPECT_EQ(set.first(4).count, 4u);
  EXPECT_EQ(set.first(100).count, n);
}

TEST_F(reader, missing_files_name_the_file_and_the_package) {
  EXPECT_FALSE(fm::fashion_mnist_present(dir_));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("t10k-images-idx3-ubyte.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("dataset-fashion-mnist"), std::string::npos) << e;
}

TEST_F(reader, wrong_magic_number) {
  write(images_file(0x801, 2, 28, 28, 2 * 784), labels_file(0x801, 2, 2));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("magic number 0x00000801, expected 0x00000803"), std::string::npos) << e;
}

TEST_F(reader, wrong_image_dimensions) {
  write(images_file(0x803, 2, 32, 32, 2 * 1024), labels_file(0x801, 2, 2));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("images are 32 x 32, expected 28 x 28"), std::string::npos) << e;
}

TEST_F(reader, truncated_payload) {
  write(images_file(0x803, 3, 28, 28, 3 * 784 - 5), labels_file(0x801, 3, 3));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("header announces 2352 bytes of data, the file holds 2347"), std::string::npos) << e;
}

TEST_F(reader, empty_file) {
  write({}, labels_file(0x801, 0, 0));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("shorter than an IDX header"), std::string::npos) << e;
}

TEST_F(reader, images_and_labels_disagree_on_the_count) {
  write(images_file(0x803, 3, 28, 28, 3 * 784), labels_file(0x801, 2, 2));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("2 labels for 3 images"), std::string::npos) << e;
  EXPECT_NE(e.find("t10k-labels-idx1-ubyte.gz"), std::string::npos) << e;
}

TEST_F(reader, label_above_nine) {
  write(images_file(0x803, 3, 28, 28, 3 * 784), labels_file(0x801, 3, 3, 12));
  const std::string e = error_of_load();
  EXPECT_NE(e.find("label 12 of example 2 is not 0..9"), std::string::npos) << e;
}
