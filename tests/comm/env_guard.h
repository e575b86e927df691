// Test fixture piece: clears a set of environment variables for the test and
// restores their old values after it, so tests of the launcher variables see
// only what they set themselves.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace gz::test {

class EnvGuard {
 public:
  explicit EnvGuard(std::initializer_list<const char*> vars) : vars_(vars) {
    for (const char* v : vars_) {
      if (const char* old = std::getenv(v)) saved_.emplace_back(v, old);
      unsetenv(v);
    }
  }
  ~EnvGuard() {
    for (const char* v : vars_) unsetenv(v);
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::vector<const char*> vars_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

}  // namespace gz::test
