// samples/support/fashion_mnist.hpp — reads Fashion-MNIST (IDX files, gzip-compressed) with zlib.
//
// Header-only, for the samples (link ZLIB::ZLIB). The Debian package `dataset-fashion-mnist`
// installs the four files under /usr/share/datasets/fashion-mnist/; FLEXPAR_FASHION_MNIST_DIR or an
// explicit folder overrides that. Every file is checked: its IDX magic number (0x00000803 images,
// 0x00000801 labels), its dimensions (28 x 28), that the images and labels files agree on the count,
// that no label is above 9, and that the file holds exactly the bytes its header announces. Every
// failure throws fashion_mnist_error naming the file and what was wrong.
//
//   auto train = flexpar::samples::load_fashion_mnist(flexpar::samples::fashion_mnist_split::train);
//   auto mine  = train.shard(comm.rank(), comm.size());   // this rank's contiguous slice
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flexpar::samples {

namespace detail {
/// Concatenation by append (GCC 12 warns falsely on `"literal" + std::string` under -Werror).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}
}  // namespace detail

/// A Fashion-MNIST file is missing, unreadable or malformed; what() names the file and the problem.
class fashion_mnist_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Which half of the data set: 60000 training or 10000 test images.
enum class fashion_mnist_split { train, test };

/// Images (row-major 28 x 28 bytes, 0..255, one after the other) and their labels (0..9).
struct fashion_mnist_set {
  std::size_t count = 0;             ///< number of examples
  std::size_t rows = 0, cols = 0;    ///< 28, 28
  std::vector<std::uint8_t> images;  ///< count * rows * cols pixels
  std::vector<std::uint8_t> labels;  ///< count labels, each 0..9

  /// Pixels per image (784).
  [[nodiscard]] std::size_t pixels() const noexcept { return rows * cols; }

  /// The contiguous slice [rank*count/size, (rank+1)*count/size) of this set (every example goes to
  /// exactly one rank; sizes differ by at most one). @pre 0 <= rank < size.
  [[nodiscard]] fashion_mnist_set shard(int rank, int size) const {
    if (size <= 0 || rank < 0 || rank >= size)
      throw std::invalid_argument(
          detail::concat("fashion_mnist_set::shard: rank ", std::to_string(rank), " of ", std::to_string(size)));
    const std::size_t begin = count * static_cast<std::size_t>(rank) / static_cast<std::size_t>(size);
    const std::size_t end = count * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(size);
    return slice(begin, end);
  }

  /// The first min(n, count) examples.
  [[nodiscard]] fashion_mnist_set first(std::size_t n) const { return slice(0, std::min(n, count)); }

  /// Examples [begin, end). @pre begin <= end <= count.
  [[nodiscard]] fashion_mnist_set slice(std::size_t begin, std::size_t end) const {
    if (begin > end || end > count) throw std::out_of_range("fashion_mnist_set::slice out of range");
    fashion_mnist_set out;
    out.count = end - begin;
    out.rows = rows;
    out.cols = cols;
    const auto px = static_cast<std::ptrdiff_t>(pixels());
    out.images.assign(images.begin() + static_cast<std::ptrdiff_t>(begin) * px,
                      images.begin() + static_cast<std::ptrdiff_t>(end) * px);
    out.labels.assign(labels.begin() + static_cast<std::ptrdiff_t>(begin),
                      labels.begin() + static_cast<std::ptrdiff_t>(end));
    return out;
  }
};

/// The folder of the four .gz files: FLEXPAR_FASHION_MNIST_DIR if set, else the Debian location.
inline std::filesystem::path fashion_mnist_default_dir() {
  if (const char* dir = std::getenv("FLEXPAR_FASHION_MNIST_DIR"); dir != nullptr && *dir != '\0') return dir;
  return "/usr/share/datasets/fashion-mnist";
}

/// True when the four files exist in `dir` (so a test can skip rather than fail).
inline bool fashion_mnist_present(const std::filesystem::path& dir = fashion_mnist_default_dir()) {
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"})
    if (!std::filesystem::is_regular_file(dir / f)) return false;
  return true;
}

namespace detail {

/// The whole decompressed content of a .gz file (a plain file is read as is: gzread passes it
/// through).
inline std::vector<std::uint8_t> gunzip_file(const std::filesystem::path& file) {
  struct closer {
    void operator()(gzFile_s* f) const noexcept { gzclose(f); }
  };
  std::unique_ptr<gzFile_s, closer> gz(gzopen(file.c_str(), "rb"));
  if (!gz) {
    std::string text = "Fashion-MNIST: cannot open ";
    text.append(file.string());
    text.append(" (install the Debian package dataset-fashion-mnist, or set FLEXPAR_FASHION_MNIST_DIR)");
    throw fashion_mnist_error(text);
  }
  std::vector<std::uint8_t> out;
  std::array<std::uint8_t, 1 << 16> buffer{};
  for (;;) {
    const int n = gzread(gz.get(), buffer.data(), static_cast<unsigned>(buffer.size()));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(gz.get(), &code);
      std::string text = "Fashion-MNIST: ";
      text.append(file.string());
      text.append(": zlib error: ");
      text.append(msg != nullptr ? msg : "unknown");
      throw fashion_mnist_error(text);
    }
    if (n == 0) break;
    out.insert(out.end(), buffer.begin(), buffer.begin() + n);
  }
  return out;
}

inline std::uint32_t big_endian_u32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) |
         std::uint32_t{b[at + 3]};
}

[[noreturn]] inline void malformed(const std::filesystem::path& file, const std::string& what) {
  std::string text = "Fashion-MNIST: ";
  text.append(file.string());
  text.append(": ");
  text.append(what);
  throw fashion_mnist_error(text);
}

/// Checks an IDX header (magic, dimension count) and the payload length; returns the dimensions.
inline std::vector<std::uint32_t> idx_dimensions(const std::filesystem::path& file, const std::vector<std::uint8_t>& b,
                                                 std::uint32_t expected_magic) {
  if (b.size() < 4) malformed(file, concat("shorter than an IDX header (", std::to_string(b.size()), " bytes)"));
  const std::uint32_t magic = big_endian_u32(b, 0);
  if (magic != expected_magic) {
    char text[96];
    std::snprintf(text, sizeof text, "IDX magic number 0x%08x, expected 0x%08x", magic, expected_magic);
    malformed(file, text);
  }
  const std::size_t dims = magic & 0xffu;
  const std::size_t header = 4 + 4 * dims;
  if (b.size() < header) malformed(file, "truncated IDX header");
  std::vector<std::uint32_t> d(dims);
  std::size_t payload = 1;
  for (std::size_t i = 0; i < dims; ++i) {
    d[i] = big_endian_u32(b, 4 + 4 * i);
    payload *= d[i];
  }
  if (b.size() - header != payload)
    malformed(file, concat("header announces ", std::to_string(payload), " bytes of data, the file holds ",
                           std::to_string(b.size() - header)));
  return d;
}

}  // namespace detail

/// Loads one split from `dir`. @throws fashion_mnist_error (file missing, not IDX, wrong magic or
/// dimensions, truncated, images and labels disagree on the count, a label above 9).
inline fashion_mnist_set load_fashion_mnist(fashion_mnist_split which,
                                            const std::filesystem::path& dir = fashion_mnist_default_dir()) {
  const std::string_view prefix = which == fashion_mnist_split::train ? "train" : "t10k";
  const auto images_file = dir / detail::concat(prefix, "-images-idx3-ubyte.gz");
  const auto labels_file = dir / detail::concat(prefix, "-labels-idx1-ubyte.gz");

  fashion_mnist_set set;
  std::vector<std::uint8_t> raw = detail::gunzip_file(images_file);
  const auto idims = detail::idx_dimensions(images_file, raw, 0x00000803u);
  if (idims[1] != 28 || idims[2] != 28)
    detail::malformed(images_file, detail::concat("images are ", std::to_string(idims[1]), " x ",
                                                  std::to_string(idims[2]), ", expected 28 x 28"));
  set.count = idims[0];
  set.rows = idims[1];
  set.cols = idims[2];
  set.images.assign(raw.begin() + 16, raw.end());

  raw = detail::gunzip_file(labels_file);
  const auto ldims = detail::idx_dimensions(labels_file, raw, 0x00000801u);
  if (ldims[0] != set.count)
    detail::malformed(labels_file, detail::concat(std::to_string(ldims[0]), " labels for ", std::to_string(set.count),
                                                  " images in ", images_file.filename().string()));
  set.labels.assign(raw.begin() + 8, raw.end());
  for (std::size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] > 9)
      detail::malformed(labels_file, detail::concat("label ", std::to_string(set.labels[i]), " of example ",
                                                    std::to_string(i), " is not 0..9"));
  return set;
}

/// Pixels 0..255 → (x/255 - mean) / std with Fashion-MNIST's training mean and std (0.2860, 0.3530).
inline void normalize_pixels(std::span<const std::uint8_t> pixels, std::span<float> out) {
  constexpr float mean = 0.2860f, inv_std = 1.0f / 0.3530f;
  for (std::size_t i = 0; i < pixels.size(); ++i) out[i] = (static_cast<float>(pixels[i]) / 255.0f - mean) * inv_std;
}

}  // namespace flexpar::samples
