#include "comm/store/store.h"

namespace gz {

Store::~Store() = default;

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  const std::size_t shown = keys.size() < 8 ? keys.size() : 8;
  for (std::size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + keys[i];
  if (shown < keys.size()) s += " and " + std::to_string(keys.size() - shown) + " more";
  return s;
}

}  // namespace gz
