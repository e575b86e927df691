#include "comm/agreement.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace gz {
namespace {

// "name=value\n" per field; values come from spec strings and numbers, which
// hold no newline.
std::string encode(const Fields& fields) {
  std::string s;
  for (const auto& [k, v] : fields) s += k + "=" + v + "\n";
  return s;
}

Fields decode(const std::string& s) {
  Fields f;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const std::size_t nl = s.find('\n', pos), eq = s.find('=', pos);
    if (nl == std::string::npos || eq == std::string::npos || eq > nl) break;
    f.emplace_back(s.substr(pos, eq - pos), s.substr(eq + 1, nl - eq - 1));
    pos = nl + 1;
  }
  return f;
}

// "0-2,5" from a sorted list of ranks.
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ranks[i]);
    if (j > i) s += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

void agree(Store& store, std::uint64_t index, int rank, int size, const Fields& fields, Timeout timeout) {
  if (size <= 1) return;
  const std::string prefix = "agree/" + std::to_string(index) + "/";
  store.set(prefix + std::to_string(rank), encode(fields));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const IoError& e) {
    GZ_THROW(IoError, "rank ", rank, ": the ranks did not all start allreduce call agreement #", index,
             " (a rank died, or the ranks call allreduce with states or buffers in a different order): ", e.what());
  }
  std::vector<Fields> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<std::size_t>(r)] = decode(store.get(keys[static_cast<std::size_t>(r)]));

  // For each field (in this rank's order; every rank has the same names):
  // group the ranks by value.
  std::string problems;
  for (std::size_t f = 0; f < fields.size(); ++f) {
    const std::string& name = fields[f].first;
    std::map<std::string, std::vector<int>> by_value;
    for (int r = 0; r < size; ++r) {
      std::string value = "(missing)";
      for (const auto& [k, v] : all[static_cast<std::size_t>(r)])
        if (k == name) value = v;
      by_value[value].push_back(r);
    }
    if (by_value.size() <= 1) continue;
    // Listed by lowest rank, so rank 0's value comes first.
    std::vector<std::pair<std::string, std::vector<int>>> groups(by_value.begin(), by_value.end());
    std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
    problems += "\n  " + name + ":";
    for (const auto& [value, ranks] : groups)
      problems += " rank" + std::string(ranks.size() > 1 ? "s " : " ") + rank_list(ranks) + " '" + value + "';";
    problems.pop_back();
  }
  if (!problems.empty())
    GZ_THROW(InvalidArgument, "allreduce: the ranks disagree on the call (every rank must pass the same values):",
             problems);
}

}  // namespace gz
