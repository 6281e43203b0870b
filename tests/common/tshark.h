// Running tshark from a test: is it there, run a command for its output, split its field rows.
// Shared by the unit (hand-built frames) and integration (captured sessions) wire checks.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace ndwv::test_support {

inline bool HaveTshark() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((dir + "/tshark").c_str(), X_OK) == 0) return true;
  return false;
}

// Runs a shell command and returns its standard output (stderr is dropped: tshark warns about
// running as root there).
inline std::string ShellOutput(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int st = pclose(f);
  if (status) *status = st;
  return out;
}

// Lines of tab-separated fields (tshark -T fields).
inline std::vector<std::vector<std::string>> Rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    std::vector<std::string> cols;
    size_t start = 0;
    for (;;) {
      const size_t tab = line.find('\t', start);
      cols.push_back(line.substr(start, tab == std::string::npos ? tab : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    rows.push_back(cols);
  }
  return rows;
}

}  // namespace ndwv::test_support
