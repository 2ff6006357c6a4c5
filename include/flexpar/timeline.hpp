// flexpar/timeline.hpp — a Chrome-trace (chrome://tracing, Perfetto) recorder.
//
// Each rank records into its own `timeline` (no locks across ranks); `gather_and_write` sends every
// rank's events to one rank, which writes a single JSON file where each rank is a process track
// ("rank N") and each track inside it a thread ("fc1.grad", "cycles", ...). Timestamps are
// microseconds since the timeline's origin (a steady clock; the ranks of one machine share it).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/transport/transport.hpp>

namespace flexpar {

/// One rank's Chrome-trace events (spans and marks on named tracks), gathered into one file.
class timeline {
 public:
  /// `origin`: the moment that is time 0 in the file.
  explicit timeline(int rank, clock::time_point origin = clock::now());

  /// A span [begin, end] named `name` on track `track`; `args` are shown when the event is selected.
  void span(std::string_view track, std::string_view name, clock::time_point begin, clock::time_point end,
            std::vector<std::pair<std::string, std::string>> args = {});
  /// An instant mark on track `track`.
  void mark(std::string_view track, std::string_view name, clock::time_point at,
            std::vector<std::pair<std::string, std::string>> args = {});

  /// This rank's events as a JSON array (each event with pid = rank), sorted by time per track.
  [[nodiscard]] std::string events_json() const;

  /// Collective over `t`'s ranks: every rank sends its events to `root`, which writes one Chrome-trace
  /// file at `path` (all ranks, their process and track names). @throws error if the file cannot
  /// be written (on root), timeout_error past `until`.
  void gather_and_write(transport& t, tag_t tag, int root, const std::string& path, deadline until) const;

 private:
  struct event {
    std::string track, name;
    char phase;  // 'X' span, 'i' instant
    double ts_us, dur_us;
    std::vector<std::pair<std::string, std::string>> args;
  };
  int track_id(std::string_view track);  // under mutex_

  int rank_;
  clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<event> events_;
  std::map<std::string, int, std::less<>> tracks_;
};

}  // namespace flexpar
