#include "comm/engine/agreement.h"

#include <algorithm>
#include <map>

#include "common/bytes.h"
#include "common/error.h"

namespace gz {
namespace {

constexpr std::size_t kMaxFields = 64;
constexpr std::size_t kMaxField = 4096;

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

std::string encode_fields(const Fields& fields) {
  std::string s;
  bytes::Writer w(s);
  w.put(static_cast<std::uint32_t>(fields.size()));
  for (const auto& [k, v] : fields) {
    w.str(k);
    w.str(v);
  }
  return s;
}

std::optional<Fields> decode_fields(std::string_view bytes) {
  bytes::Reader r(bytes);
  const auto count = r.get<std::uint32_t>("field count");
  if (!r.ok() || count > kMaxFields) return std::nullopt;
  Fields f;
  for (std::uint32_t i = 0; i < count && r.ok(); ++i) {
    const std::string_view k = r.str(kMaxField, "name"), v = r.str(kMaxField, "value");
    f.emplace_back(k, v);
  }
  if (!r.ok() || !r.at_end()) return std::nullopt;
  return f;
}

std::string describe_disagreement(const std::vector<Fields>& all) {
  // Every name any rank sent, in rank order of first appearance: every rank
  // builds the same report.
  std::vector<std::string> names;
  for (const auto& fields : all)
    for (const auto& f : fields)
      if (std::find(names.begin(), names.end(), f.first) == names.end()) names.push_back(f.first);
  std::string problems;
  for (const auto& name : names) {
    std::map<std::string, std::vector<int>> by_value;
    for (std::size_t r = 0; r < all.size(); ++r) {
      std::string value = "(missing)";
      for (const auto& [k, v] : all[r])
        if (k == name) value = v;
      by_value[value].push_back(static_cast<int>(r));
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
  return problems;
}

void agree(Store& store, std::uint64_t index, int rank, int size, const Fields& fields, Timeout timeout,
           const AgreeWords& words) {
  if (size <= 1) return;
  const std::string prefix = "agree/" + std::to_string(index) + "/";
  auto key = [&](int r) { return prefix + std::to_string(r); };
  store.set(key(rank), encode_fields(fields));
  std::vector<std::string> others;
  for (int r = 0; r < size; ++r)
    if (r != rank) others.push_back(key(r));
  try {
    store.wait(others, timeout);
  } catch (const IoError& e) {
    GZ_THROW(IoError, "rank ", rank, ": the ranks did not all start ", words.round, " #", index,
             " (a rank died, or the ranks call allreduce with states or buffers in a different order): ", e.what());
  }
  std::vector<Fields> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      all[static_cast<std::size_t>(r)] = fields;  // this rank's own, as it was asked
      continue;
    }
    auto theirs = decode_fields(store.get(key(r)));
    if (!theirs)
      GZ_THROW(IoError, "rank ", rank, ": the fields rank ", r, " published for ", words.round, " #", index,
               " are malformed");
    all[static_cast<std::size_t>(r)] = std::move(*theirs);
  }
  const std::string problems = describe_disagreement(all);
  const std::string done = prefix + "done";
  // Every rank has read the round once the counter reaches size: the last
  // reader erases it (and on a mismatch marks it done). A rank that fails
  // before this leaves it behind; the job is over then.
  if (store.add(prefix + "read", 1) == size) {
    std::vector<std::string> keys = others;
    keys.push_back(key(rank));
    keys.push_back(prefix + "read");
    store.erase(keys);
    // The mark comes last: the ranks waiting for it may leave at once, the
    // Store's host with the Store. (This rank has read everything it reports.)
    if (!problems.empty()) {
      try {
        store.set(done, "read by every rank");
      } catch (const Error&) {
      }
    }
  } else if (!problems.empty()) {
    // Leave only once every rank has read (see the header). The mark is
    // sealed: get() checks that a member wrote it. A wait that fails (the
    // Store's host left, which it does only after the mark) changes nothing:
    // this rank has read everything it reports.
    try {
      store.wait({done}, timeout);
      store.get(done);
    } catch (const Error&) {
    }
  }
  if (!problems.empty()) GZ_THROW(InvalidArgument, words.mismatch, problems);
}

}  // namespace gz
