// lib/core/process.cpp — process_gone (flexpar/core/process.hpp).

#include <flexpar/core/process.hpp>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace flexpar {

bool process_gone(std::int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const std::size_t paren = line.rfind(')');  // the state follows the command name, which may hold spaces
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

std::int64_t my_pid() noexcept { return static_cast<std::int64_t>(::getpid()); }

}  // namespace flexpar
