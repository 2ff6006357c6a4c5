// lib/timeline/timeline.cpp — the timeline (flexpar/timeline.hpp): Chrome-trace events per rank,
// gathered to one rank and written as one JSON file.

#include <flexpar/timeline.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>

namespace flexpar {

using nlohmann::json;

timeline::timeline(int rank, clock::time_point origin) : rank_(rank), origin_(origin) {}

int timeline::track_id(std::string_view track) {
  auto it = tracks_.find(track);
  if (it == tracks_.end()) it = tracks_.emplace(std::string(track), static_cast<int>(tracks_.size()) + 1).first;
  return it->second;
}

void timeline::span(std::string_view track, std::string_view name, clock::time_point begin, clock::time_point end,
                    std::vector<std::pair<std::string, std::string>> args) {
  const double ts = std::chrono::duration<double, std::micro>(begin - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - begin).count();
  std::lock_guard lock(mutex_);
  track_id(track);
  events_.push_back({std::string(track), std::string(name), 'X', ts, std::max(0.0, dur), std::move(args)});
}

void timeline::mark(std::string_view track, std::string_view name, clock::time_point at,
                    std::vector<std::pair<std::string, std::string>> args) {
  const double ts = std::chrono::duration<double, std::micro>(at - origin_).count();
  std::lock_guard lock(mutex_);
  track_id(track);
  events_.push_back({std::string(track), std::string(name), 'i', ts, 0, std::move(args)});
}

std::string timeline::events_json() const {
  std::lock_guard lock(mutex_);
  json out = json::array();
  out.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  out.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
  for (const auto& [track, id] : tracks_)
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", id}, {"args", {{"name", track}}}});
  // Sorted by (track, time): a viewer needs every track's events in time order.
  std::vector<const event*> sorted;
  sorted.reserve(events_.size());
  for (const auto& e : events_) sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(), [&](const event* a, const event* b) {
    const int ta = tracks_.find(a->track)->second, tb = tracks_.find(b->track)->second;
    return ta != tb ? ta < tb : a->ts_us < b->ts_us;
  });
  for (const event* e : sorted) {
    json j{{"name", e->name},
           {"ph", std::string(1, e->phase)},
           {"pid", rank_},
           {"tid", tracks_.find(e->track)->second},
           {"ts", e->ts_us}};
    if (e->phase == 'X') j["dur"] = e->dur_us;
    if (e->phase == 'i') j["s"] = "t";
    if (!e->args.empty()) {
      json args = json::object();
      for (const auto& [k, v] : e->args) args[k] = v;
      j["args"] = std::move(args);
    }
    out.push_back(std::move(j));
  }
  return out.dump();
}

void timeline::gather_and_write(transport& t, tag_t tag, int root, const std::string& path, deadline until) const {
  const std::string mine = events_json();
  if (t.rank() != root) {
    const std::uint64_t length = mine.size();
    t.send(root, tag, std::as_bytes(std::span(&length, 1)), until);
    t.send(root, tag, std::as_bytes(std::span(mine.data(), mine.size())), until);
    return;
  }
  json all = json::array();
  for (int r = 0; r < t.size(); ++r) {
    std::string text;
    if (r == root) {
      text = mine;
    } else {
      std::uint64_t length = 0;
      t.recv(r, tag, std::as_writable_bytes(std::span(&length, 1)), until);
      text.resize(length);
      t.recv(r, tag, std::as_writable_bytes(std::span(text.data(), text.size())), until);
    }
    for (auto& e : json::parse(text)) all.push_back(std::move(e));
  }
  std::ofstream file(path, std::ios::trunc);
  if (!file)
    throw error_on<error>(t.rank(), "timeline", "cannot open \"", path, "\" for writing: ", std::strerror(errno));
  file << json{{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}}.dump(1) << '\n';
  if (!file) throw error_on<error>(t.rank(), "timeline", "writing \"", path, "\" failed: ", std::strerror(errno));
}

}  // namespace flexpar
