// flexpar/collective/shared_memory_segment.hpp — one POSIX shared-memory segment mapped by every
// rank of a one-node communicator, and the round counters that synchronise through it.
//
// Creation is collective over a transport whose ranks share a node:
//   1. rank 0 creates a fresh segment (shm_open O_EXCL under a name made of its pid, a counter and
//      the clock), sizes it and maps it;
//   2. rank 0 sends the name to every other rank, which opens and maps it and answers ok / failed;
//   3. rank 0 unlinks the name (nothing is left in /dev/shm even if a rank dies later) and sends the
//      verdict to everyone: the segment is used only if every rank mapped it.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <ctime>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/core/process.hpp>
#include <flexpar/transport/liveness.hpp>
#include <flexpar/transport/transport.hpp>

namespace flexpar {

/// A mapping of a shared-memory segment; unmapped on destruction. Made by create() (below), or on a
/// communicator by make_shared_memory_segment (collective/context.hpp).
class shared_memory_segment {
 public:
  shared_memory_segment(const shared_memory_segment&) = delete;
  shared_memory_segment& operator=(const shared_memory_segment&) = delete;
  ~shared_memory_segment() { ::munmap(base_, bytes_); }

  /// The first byte of the mapping (the same segment at another address on each rank).
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(base_); }
  /// Bytes mapped.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

  /// Collective over `t` (steps above): a segment of `bytes` bytes mapped by every rank, zero-filled,
  /// or nullptr on every rank if any rank could not map it. `tag` must be unused by other traffic.
  static std::unique_ptr<shared_memory_segment> create(transport& t, tag_t tag, std::size_t bytes, deadline until) {
    struct announcement {
      std::array<char, 48> name{};
      std::uint8_t ok = 0;
    };
    announcement note;
    std::unique_ptr<shared_memory_segment> segment;
    if (t.rank() == 0) {
      static std::atomic<unsigned> counter{0};
      const std::string name = "/flexpar." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." +
                               std::to_string(clock::now().time_since_epoch().count() % 1000000007);
      std::memcpy(note.name.data(), name.c_str(), std::min(name.size(), note.name.size() - 1));
      const int fd = ::shm_open(note.name.data(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd >= 0) {
        if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) segment = map(fd, bytes);
        ::close(fd);
      }
      note.ok = segment ? 1 : 0;
      std::vector<request> sends;
      for (int peer = 1; peer < t.size(); ++peer) sends.push_back(t.isend(peer, tag, as_bytes(note)));
      wait_all(sends, until);
      std::uint8_t all_ok = note.ok;
      for (int peer = 1; peer < t.size(); ++peer) {
        std::uint8_t ok = 0;
        t.recv(peer, tag, std::as_writable_bytes(std::span(&ok, 1)), until);
        all_ok = static_cast<std::uint8_t>(all_ok & ok);
      }
      if (note.ok) ::shm_unlink(note.name.data());
      for (int peer = 1; peer < t.size(); ++peer) t.send(peer, tag, std::as_bytes(std::span(&all_ok, 1)), until);
      if (!all_ok) segment.reset();
    } else {
      t.recv(0, tag, as_writable_bytes(note), until);
      if (note.ok) {
        const int fd = ::shm_open(note.name.data(), O_RDWR, 0600);
        if (fd >= 0) {
          segment = map(fd, bytes);
          ::close(fd);
        }
      }
      std::uint8_t ok = segment ? 1 : 0;
      t.send(0, tag, std::as_bytes(std::span(&ok, 1)), until);
      std::uint8_t all_ok = 0;
      t.recv(0, tag, std::as_writable_bytes(std::span(&all_ok, 1)), until);
      if (!all_ok) segment.reset();
    }
    return segment;
  }

 private:
  shared_memory_segment(void* base, std::size_t bytes) : base_(base), bytes_(bytes) {}

  static std::unique_ptr<shared_memory_segment> map(int fd, std::size_t bytes) {
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return nullptr;
    return std::unique_ptr<shared_memory_segment>(new shared_memory_segment(base, bytes));
  }

  template <class T>
  static std::span<const std::byte> as_bytes(const T& v) {
    return std::as_bytes(std::span(&v, 1));
  }
  template <class T>
  static std::span<std::byte> as_writable_bytes(T& v) {
    return std::as_writable_bytes(std::span(&v, 1));
  }

  void* base_;
  std::size_t bytes_;
};

/// A round counter in shared memory that one rank advances and the others wait on.
///
/// Waiting spins briefly (shm_spin: the peer is usually a few microseconds away), then sleeps on a
/// futex on the counter word. Sleeping, not yielding, is what keeps an oversubscribed node fast:
/// a sleeping rank leaves its core idle, so the scheduler moves the rank it waits for onto it at once,
/// where a yielding rank would keep the core and the peer would wait for a time slice elsewhere.
/// The publisher wakes only when someone announced itself in `waiters` (sequentially consistent on
/// both sides, so a wake-up is never lost). Counters are 32-bit and compared modulo 2^32: ranks are
/// never more than a few rounds apart.
///
/// A counter may know the pid of the process that advances it (`owner`, a word in the segment that
/// process wrote; 0 while unknown). A waiter that sleeps then asks every shm_liveness_check whether
/// that process still runs (core/process.hpp) and throws peer_failure at once when it has exited,
/// whatever the deadline: a dead rank of the node is named within a fraction of a second.
class shared_counter {
 public:
  /// How long a waiter spins before it sleeps: longer than a round's work on the other side usually
  /// takes to finish, shorter than a scheduler time slice.
  static constexpr std::chrono::microseconds shm_spin{40};

  /// How often a sleeping waiter asks whether the owner's process still runs.
  static constexpr std::chrono::milliseconds shm_liveness_check{100};

  /// A counter at `word` of a segment, with the word its sleeping waiters announce themselves in and,
  /// when known, the word holding the pid of the process that advances it.
  shared_counter(std::uint32_t* word, std::uint32_t* waiters, std::uint32_t* owner = nullptr) noexcept
      : word_(word), waiters_(waiters), owner_(owner) {}

  /// Sets the counter to `value` (modulo 2^32) and wakes its sleeping waiters.
  void publish(std::uint64_t value) noexcept {
    std::atomic_ref<std::uint32_t>(*word_).store(static_cast<std::uint32_t>(value), std::memory_order_seq_cst);
    if (std::atomic_ref<std::uint32_t>(*waiters_).load(std::memory_order_seq_cst) != 0)
      ::syscall(SYS_futex, word_, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }

  /// Whether the counter has reached `target` now (modulo 2^32).
  [[nodiscard]] bool reached(std::uint64_t target) const noexcept { return reached(load(), target); }

  /// Blocks until the counter reaches `target`; timeout_error with describe()'s text at `until`;
  /// peer_failure with it as soon as the owner's process is seen to have exited, or, with `watch`
  /// (the group's heartbeats, transport/liveness.hpp), as soon as they say a rank of the group failed
  /// (a process stopped, on another host). A waiter that sleeps tells `watch` it is waiting.
  template <class Describe>
  void wait_until_reached(std::uint64_t target, deadline until, Describe&& describe,
                          const detail::liveness_view* watch = nullptr) const {
    const auto spin_until = clock::now() + shm_spin;
    for (unsigned spin = 1;; ++spin) {
      if (reached(target)) return;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      if (spin % 64 == 0 && clock::now() >= spin_until) break;
    }
    std::atomic_ref<std::uint32_t> waiters(*waiters_);
    auto next_check = clock::now() + shm_liveness_check;
    while (!reached(target)) {
      const auto now = clock::now();
      if (now >= until) {
        if (reached(target)) return;
        throw timeout_error(describe() + " did not happen before its deadline");
      }
      if (now >= next_check) {
        next_check = now + shm_liveness_check;
        const std::int64_t pid = owner_ ? std::atomic_ref<std::uint32_t>(*owner_).load(std::memory_order_relaxed) : 0;
        if (pid != 0 && pid != my_pid() && process_gone(pid) && !reached(target))
          throw peer_failure(describe() + " will not happen: that rank's process (pid " + std::to_string(pid) +
                             ") has exited");
        if (watch != nullptr) {
          watch->note_wait();
          if (watch->any_failed() && !reached(target))
            throw peer_failure(describe() + " will not happen: " + watch->failures_text());
        }
      }
      const auto nap = std::min<clock::duration>(until - now, std::chrono::milliseconds(10));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
      const timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      waiters.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = load();
      if (!reached(seen, target)) ::syscall(SYS_futex, word_, FUTEX_WAIT, seen, &timeout, nullptr, 0);
      waiters.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

 private:
  [[nodiscard]] std::uint32_t load() const noexcept {
    return std::atomic_ref<std::uint32_t>(*word_).load(std::memory_order_seq_cst);
  }
  static bool reached(std::uint32_t value, std::uint64_t target) noexcept {
    return static_cast<std::int32_t>(value - static_cast<std::uint32_t>(target)) >= 0;
  }

  std::uint32_t* word_;
  std::uint32_t* waiters_;
  std::uint32_t* owner_;  // read only (atomic_ref needs a non-const object)
};

}  // namespace flexpar
