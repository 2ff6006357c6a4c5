// lib/transport/liveness.cpp — heartbeats among the ranks of a job (flexpar/transport/liveness.hpp).
//
// One UDP socket and one thread per monitor. A beat is a datagram of a header (magic, sender, the
// job's key, kind) and the failures the sender knows, as (rank, cause) pairs; a goodbye is the same
// with another kind. The job's key (rank 0's random nonce, exchanged with the addresses) keeps the
// datagrams of other jobs, or of an earlier monitor whose port was reused, out.
#include <flexpar/core/error.hpp>
#include <flexpar/core/process.hpp>
#include <flexpar/transport/liveness.hpp>
#include <flexpar/transport/transport.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <system_error>

namespace flexpar::detail {
namespace {

constexpr std::uint32_t beat_magic = 0x46584842;  // "FXHB"
constexpr std::uint32_t kind_beat = 0, kind_goodbye = 1;
constexpr std::size_t max_reported = 256;  // failures carried per beat (a datagram stays small)
// How often the thread looks at its peers' processes and beats, at most: a dead process on this
// host is seen within one tick, whatever the heartbeat interval.
constexpr std::chrono::milliseconds tick{100};

/// What each rank tells the others when the monitor starts (the bootstrap exchange).
struct card {
  std::uint32_t ip = 0;  // network order
  std::uint16_t port = 0;
  std::uint16_t pad = 0;
  std::int64_t pid = 0;
  std::uint64_t host = 0;   // same value: same kernel, so pids are comparable
  std::uint64_t nonce = 0;  // rank 0's is the job's key
};

struct header {
  std::uint32_t magic;
  std::uint32_t sender;
  std::uint64_t job_key;
  std::uint32_t kind;
  std::uint32_t count;    // (rank, cause) pairs that follow
  std::uint32_t idle_ms;  // for how long the sender has polled no flexpar request
  std::uint32_t pad;
};

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

/// Same for processes of one kernel and pid namespace: the host name, the kernel's boot id and the
/// pid namespace.
std::uint64_t host_key() {
  std::array<char, 256> name{};
  ::gethostname(name.data(), name.size() - 1);
  std::array<char, 128> ns{};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns.data(), ns.size() - 1);
  const std::string text = std::string(name.data()) + "|" + read_first_line("/proc/sys/kernel/random/boot_id") + "|" +
                           std::string(ns.data(), n > 0 ? static_cast<std::size_t>(n) : 0);
  return std::hash<std::string>{}(text) | 1;
}

/// The first IPv4 address of an interface that is up and not loopback (reachable from the other
/// hosts), or 127.0.0.1 when there is none. Network order.
std::uint32_t my_address() {
  ifaddrs* list = nullptr;
  std::uint32_t found = htonl(INADDR_LOOPBACK);
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    found = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
    break;
  }
  ::freeifaddrs(list);
  return found;
}

[[noreturn]] void throw_system(int rank, const char* what) {
  const int code = errno;
  throw error_on<error>(rank, "liveness", what, " failed: ", std::system_category().message(code));
}

std::string cause_text(liveness_monitor::cause c) {
  switch (c) {
    case liveness_monitor::cause::exited: return "its process has exited";
    case liveness_monitor::cause::silent: return "its heartbeats stopped";
    case liveness_monitor::cause::reported: return "declared failed";
  }
  return "failed";
}

}  // namespace

liveness_monitor::liveness_monitor(int rank, int fd, std::chrono::milliseconds interval, int misses)
    : rank_(rank), fd_(fd), interval_(interval), misses_(misses) {}

std::shared_ptr<liveness_monitor> liveness_monitor::start(transport& t, std::chrono::milliseconds interval, int misses,
                                                          deadline until) {
  if (interval.count() <= 0 || misses < 1)
    throw error_on<usage_error>(t.rank(), "liveness", "heartbeat interval ", interval.count(), " ms and ", misses,
                                " misses: both must be positive");
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_system(t.rank(), "socket(AF_INET, SOCK_DGRAM)");
  std::shared_ptr<liveness_monitor> m(new liveness_monitor(t.rank(), fd, interval, misses));
  sockaddr_in bound{};
  bound.sin_family = AF_INET;
  bound.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof bound;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&bound), sizeof bound) != 0) throw_system(t.rank(), "bind");
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) throw_system(t.rank(), "getsockname");
  m->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m->wake_fd_ < 0) throw_system(t.rank(), "eventfd");

  card mine;
  mine.ip = my_address();
  mine.port = bound.sin_port;
  mine.pid = my_pid();
  mine.host = host_key();
  mine.nonce = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
               static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
  std::vector<card> cards(static_cast<std::size_t>(t.size()));
  bootstrap_allgather(t, std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(cards)), until,
                      "liveness: the heartbeat address exchange");
  m->job_key_ = cards.front().nonce;
  m->peers_.resize(cards.size());
  const clock::time_point now = clock::now();
  for (std::size_t r = 0; r < cards.size(); ++r) {
    peer& p = m->peers_[r];
    p.ip = cards[r].ip;
    p.port = cards[r].port;
    p.pid = cards[r].pid;
    p.same_host = cards[r].host == mine.host;
    p.last_seen = now;
  }
  m->thread_ = std::thread([raw = m.get()] { raw->run(); });
  return m;
}

liveness_monitor::~liveness_monitor() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
    thread_.join();
    beat(true);
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  ::close(fd_);
}

bool liveness_monitor::failed(int r) const {
  const std::lock_guard lock(mutex_);
  return peers_.at(static_cast<std::size_t>(r)).failed;
}

std::string liveness_monitor::reason(int r) const {
  const std::lock_guard lock(mutex_);
  const peer& p = peers_.at(static_cast<std::size_t>(r));
  if (!p.failed) return {};
  if (p.reporter != rank_)
    return (p.detail.empty() ? std::string("declared failed") : p.detail) + " (seen by rank " +
           std::to_string(p.reporter) + (r == rank_ ? "; this rank was silent too long for it)" : ")");
  return p.detail;
}

std::optional<std::chrono::milliseconds> liveness_monitor::idle(int r) const {
  const std::lock_guard lock(mutex_);
  const peer& p = peers_.at(static_cast<std::size_t>(r));
  const clock::time_point now = clock::now();
  if (r == rank_ || p.failed || p.left || now - p.last_seen > 2 * interval_ + tick) return std::nullopt;
  return std::chrono::milliseconds(p.idle_ms) +
         std::chrono::duration_cast<std::chrono::milliseconds>(now - p.last_seen);
}

void liveness_monitor::declare_failed(int r, cause why, const std::string& detail) {
  mark_failed(r, why, detail, rank_);
}

void liveness_monitor::mark_failed(int r, cause origin, std::string detail, int reporter) {
  const std::lock_guard lock(mutex_);
  peer& p = peers_.at(static_cast<std::size_t>(r));
  if (p.failed) return;
  p.failed = true;
  p.detail = std::move(detail);
  p.reporter = reporter;
  p.origin = origin;
  failures_.fetch_add(1, std::memory_order_acq_rel);
}

void liveness_monitor::run() noexcept {
  clock::time_point next_beat = clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    clock::time_point now = clock::now();
    if (now >= next_beat) {
      beat(false);
      next_beat = now + interval_;
    }
    const auto wait = std::min(std::chrono::ceil<std::chrono::milliseconds>(next_beat - now), tick);
    std::array<pollfd, 2> fds{pollfd{fd_, POLLIN, 0}, pollfd{wake_fd_, POLLIN, 0}};
    ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait.count(), 1)));
    receive();
    check(clock::now());
  }
}

void liveness_monitor::beat(bool goodbye) noexcept {
  std::vector<std::byte> datagram(sizeof(header));
  std::vector<sockaddr_in> to;
  {
    const std::lock_guard lock(mutex_);
    std::vector<std::uint32_t> failures;
    for (std::size_t r = 0; r < peers_.size() && failures.size() < 2 * max_reported; ++r)
      if (peers_[r].failed) {
        failures.push_back(static_cast<std::uint32_t>(r));
        failures.push_back(static_cast<std::uint32_t>(peers_[r].origin));
      }
    const clock::time_point now = clock::now();
    const std::uint64_t polls = polls_.load(std::memory_order_relaxed);
    if (polls != polls_seen_) {
      polls_seen_ = polls;
      last_poll_ = now;
    }
    const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_poll_).count();
    const header h{beat_magic,
                   static_cast<std::uint32_t>(rank_),
                   job_key_,
                   goodbye ? kind_goodbye : kind_beat,
                   static_cast<std::uint32_t>(failures.size() / 2),
                   static_cast<std::uint32_t>(std::min<long long>(idle, 0xffffffffLL)),
                   0};
    std::memcpy(datagram.data(), &h, sizeof h);
    const auto bytes = std::as_bytes(std::span(failures));
    datagram.insert(datagram.end(), bytes.begin(), bytes.end());
    for (std::size_t r = 0; r < peers_.size(); ++r)
      // Failed peers too: one that was only slow learns from the failures carried here that it was
      // dropped (a dead one costs a datagram nobody reads).
      if (static_cast<int>(r) != rank_ && !peers_[r].left) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = peers_[r].ip;
        a.sin_port = peers_[r].port;
        to.push_back(a);
      }
  }
  // A failed send (a peer's host gone, its port closed) is what the peer's silence will say.
  for (const sockaddr_in& a : to)
    (void)::sendto(fd_, datagram.data(), datagram.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&a),
                   sizeof a);
}

void liveness_monitor::receive() noexcept {
  std::array<std::byte, sizeof(header) + 8 * max_reported> buffer;
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: drained (or an ICMP error of an earlier send: nothing to read)
    }
    header h{};
    if (static_cast<std::size_t>(n) < sizeof h) continue;
    std::memcpy(&h, buffer.data(), sizeof h);
    if (h.magic != beat_magic || h.job_key != job_key_ || h.sender >= peers_.size() ||
        static_cast<int>(h.sender) == rank_ || h.count > max_reported ||
        static_cast<std::size_t>(n) != sizeof h + 8 * std::size_t{h.count})
      continue;
    const int sender = static_cast<int>(h.sender);
    std::vector<std::uint32_t> failures(2 * std::size_t{h.count});
    if (h.count != 0) std::memcpy(failures.data(), buffer.data() + sizeof h, 8 * std::size_t{h.count});
    {
      const std::lock_guard lock(mutex_);
      peer& p = peers_[static_cast<std::size_t>(sender)];
      if (p.failed) continue;  // failure is final: a late beat does not revive it
      p.last_seen = clock::now();
      p.idle_ms = h.idle_ms;
      if (h.kind == kind_goodbye) p.left = true;
    }
    for (std::size_t k = 0; k < failures.size(); k += 2) {
      const std::uint32_t r = failures[k];
      if (r >= peers_.size()) continue;
      const auto why = static_cast<cause>(failures[k + 1]);
      const bool known = why == cause::exited || why == cause::silent;
      mark_failed(static_cast<int>(r), known ? why : cause::reported, known ? cause_text(why) : std::string(), sender);
    }
  }
}

void liveness_monitor::check(clock::time_point now) noexcept {
  const auto limit = interval_ * misses_;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    if (static_cast<int>(r) == rank_) continue;
    std::int64_t pid = 0;
    bool same_host = false;
    clock::time_point last{};
    {
      const std::lock_guard lock(mutex_);
      const peer& p = peers_[r];
      if (p.failed || p.left) continue;
      pid = p.pid;
      same_host = p.same_host;
      last = p.last_seen;
    }
    try {
      if (same_host && process_gone(pid)) {
        mark_failed(static_cast<int>(r), cause::exited,
                    "its process (pid " + std::to_string(pid) + " on this host) has exited", rank_);
      } else if (now - last > limit) {
        mark_failed(static_cast<int>(r), cause::silent,
                    "no heartbeat for " + seconds_text(now - last) + " (" + std::to_string(misses_) + " beats of " +
                        std::to_string(interval_.count()) +
                        " ms missed: the process is stopped, or its host or "
                        "link is down)",
                    rank_);
      }
    } catch (...) {  // a string that cannot be made: try again next tick
    }
  }
}

// ---- liveness_view ------------------------------------------------------------------------------

std::vector<int> liveness_view::failed() const {
  std::vector<int> out;
  if (monitor_->failure_count() == 0) return out;
  for (std::size_t r = 0; r < members_.size(); ++r)
    if (monitor_->failed(members_[r])) out.push_back(static_cast<int>(r));
  return out;
}

bool liveness_view::check_blocks(const request_info& info) const {
  if (peer_only_.load(std::memory_order_acquire))
    return info.peer >= 0 && static_cast<std::size_t>(info.peer) < members_.size() &&
           monitor_->failed(member(info.peer));
  return std::any_of(members_.begin(), members_.end(), [&](int m) { return monitor_->failed(m); });
}

std::string liveness_view::failures_text(const std::vector<int>& ranks) const {
  std::string text;
  for (int r : ranks) {
    if (!text.empty()) text += "; ";
    text += "rank " + std::to_string(r) + " failed: " + monitor_->reason(member(r));
  }
  return text;
}

std::string liveness_view::stall_text(std::chrono::milliseconds waited) const {
  const auto at_least = std::max(std::chrono::milliseconds(1000), waited / 2);
  std::string text;
  for (std::size_t r = 0; r < members_.size(); ++r) {
    const std::optional<std::chrono::milliseconds> idle = monitor_->idle(members_[r]);
    if (!idle || *idle < at_least) continue;
    text += "; rank " + std::to_string(r) + " is alive (its heartbeats arrive) but has been in no flexpar wait for " +
            seconds_text(*idle) + ": it is not in this call (stuck in its own code, or in another call)";
  }
  return text;
}

void liveness_view::throw_failure(const request_info& info) const {
  const std::vector<int> ranks = failed();
  throw peer_failure(describe(info) + " cannot complete: " + (ranks.size() == 1 ? "" : rank_set(ranks) + " failed: ") +
                     failures_text(ranks));
}

std::shared_ptr<liveness_view> start_watching(transport& t, const config& cfg) {
  if (cfg.heartbeat_interval.count() <= 0) return nullptr;
  auto monitor = liveness_monitor::start(t, cfg.heartbeat_interval, cfg.heartbeat_misses, deadline_after(cfg.timeout));
  std::vector<int> members(static_cast<std::size_t>(t.size()));
  for (int r = 0; r < t.size(); ++r) members[static_cast<std::size_t>(r)] = r;
  return std::make_shared<liveness_view>(std::move(monitor), std::move(members));
}

std::shared_ptr<liveness_view> watch_split(transport& child, const std::shared_ptr<liveness_view>& parent,
                                           int my_parent_rank, deadline until) {
  if (!parent) return nullptr;
  const int mine = parent->member(my_parent_rank);
  std::vector<int> members(static_cast<std::size_t>(child.size()));
  bootstrap_allgather(child, std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(members)), until,
                      "liveness: the split's member exchange");
  return std::make_shared<liveness_view>(parent->monitor(), std::move(members));
}

}  // namespace flexpar::detail
