#include "compressors/spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>

#include "common/error.h"
#include "compressors/descriptor.h"

namespace gz {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <class T>
T parse_number(std::string_view spec, std::string_view key, std::string_view value) {
  T out{};
  const auto* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec != std::errc() || ptr != end)
    GZ_THROW(InvalidArgument, "codec spec '", spec, "': ", key, "=", value, " is not a valid number");
  return out;
}

bool parse_bool(std::string_view spec, std::string_view key, std::string_view value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  GZ_THROW(InvalidArgument, "codec spec '", spec, "': ", key, "=", value, " must be on or off");
}

std::string format_double(double d) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, ptr);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const auto pos = s.find(sep);
    out.push_back(trim(s.substr(0, pos)));
    if (pos == std::string_view::npos) break;
    s.remove_prefix(pos + 1);
  }
  return out;
}

// "a, b, ef": the keys a codec takes, for messages.
std::string key_names(const CodecDescriptor& d) {
  std::string out;
  for (const CodecKey& k : d.keys) out += std::string(k.name) + ", ";
  return out + "ef";
}

// "exact or sample", "a, b or c".
std::string choice_list(const CodecKey& k) {
  std::string out;
  for (std::size_t i = 0; i < k.choices.size(); ++i)
    out += (i == 0 ? "" : i + 1 == k.choices.size() ? " or " : ", ") + std::string(k.choices[i]);
  return out;
}

double parse_value(std::string_view spec, const CodecKey& k, std::string_view value) {
  switch (k.kind) {
    case CodecKey::Kind::Integer: {
      const auto v = parse_number<std::uint64_t>(spec, k.name, value);
      if (static_cast<double>(v) < k.lo || static_cast<double>(v) > k.hi)
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': ", k.name, " must be ", k.range, ", got ", value);
      return static_cast<double>(v);
    }
    case CodecKey::Kind::Real: {
      const double v = parse_number<double>(spec, k.name, value);
      if (!(v > k.lo && v <= k.hi))
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': ", k.name, " must be ", k.range, ", got ", value);
      return v;
    }
    case CodecKey::Kind::Choice:
      for (std::size_t i = 0; i < k.choices.size(); ++i)
        if (value == k.choices[i]) return static_cast<double>(i);
      GZ_THROW(InvalidArgument, "codec spec '", spec, "': ", k.name, " must be ", choice_list(k), ", got ", value);
  }
  return 0;
}

std::string format_value(const CodecKey& k, double v) {
  switch (k.kind) {
    case CodecKey::Kind::Integer: return std::to_string(static_cast<std::uint64_t>(v));
    case CodecKey::Kind::Real: return format_double(v);
    case CodecKey::Kind::Choice: return std::string(k.choices[static_cast<std::size_t>(v)]);
  }
  return "";
}

}  // namespace

std::string_view codec_names() {
  static const std::string names = [] {
    std::string out;
    for (const CodecDescriptor* d : all_codecs()) out += (out.empty() ? "" : ", ") + std::string(d->name);
    return out;
  }();
  return names;
}

const char* codec_name(CodecId id) {
  const CodecDescriptor* d = find_codec(id);
  return d ? d->name.data() : "unknown";
}

const CodecDescriptor& CodecConfig::descriptor() const {
  const CodecDescriptor* d = find_codec(id);
  if (!d) GZ_THROW(InvalidArgument, "unknown codec id ", static_cast<int>(id), "; valid codecs: ", codec_names());
  return *d;
}

double CodecConfig::value(std::string_view key) const {
  const CodecDescriptor& d = descriptor();
  for (std::size_t i = 0; i < d.keys.size(); ++i)
    if (d.keys[i].name == key) return values[i];
  GZ_THROW(InvalidArgument, d.name, " has no key '", key, "'; valid keys: ", key_names(d));
}

CodecConfig parse_spec(std::string_view spec_in) {
  const std::string_view spec = trim(spec_in);
  const auto colon = spec.find(':');
  const std::string_view name = trim(spec.substr(0, colon));
  const CodecDescriptor* d = find_codec(name);
  if (!d)
    GZ_THROW(InvalidArgument, "unknown codec '", name, "' in spec '", spec, "'; valid codecs: ", codec_names());
  CodecConfig cfg;
  cfg.id = d->id;
  cfg.ef = !d->lossless;
  GZ_ENFORCE_LE(d->keys.size(), kMaxCodecKeys, "codec ", d->name, " declares too many keys");
  for (std::size_t i = 0; i < d->keys.size(); ++i) cfg.values[i] = d->keys[i].fallback;

  std::uint32_t given = 0;
  bool ef_given = false;
  if (colon != std::string_view::npos) {
    std::map<std::string_view, int> seen;
    for (std::string_view item : split(spec.substr(colon + 1), ',')) {
      const auto eq = item.find('=');
      if (item.empty() || eq == std::string_view::npos)
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': expected key=value, got '", item, "'; valid keys for ",
                 d->name, ": ", key_names(*d));
      const std::string_view key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
      if (seen[key]++) GZ_THROW(InvalidArgument, "codec spec '", spec, "': key '", key, "' given twice");
      if (key == "ef") {
        cfg.ef = parse_bool(spec, key, value);
        ef_given = true;
        continue;
      }
      std::size_t i = 0;
      while (i < d->keys.size() && d->keys[i].name != key) ++i;
      if (i == d->keys.size())
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': unknown key '", key, "' for ", d->name,
                 "; valid keys: ", key_names(*d));
      cfg.values[i] = parse_value(spec, d->keys[i], value);
      given |= 1u << i;
    }
  }
  if (d->lossless && ef_given && cfg.ef)
    GZ_THROW(InvalidArgument, "codec spec '", spec, "': ", d->name, " is lossless, error feedback does not apply");
  if (d->check) d->check(spec, cfg, given);
  return cfg;
}

std::string CodecConfig::canonical() const {
  const CodecDescriptor& d = descriptor();
  std::string out(d.name);
  const char* sep = ":";
  auto add = [&](std::string_view key, const std::string& v) {
    out.append(sep).append(key).append("=").append(v);
    sep = ",";
  };
  for (std::size_t i = 0; i < d.keys.size(); ++i) {
    const CodecKey& k = d.keys[i];
    const bool shown = d.shows ? d.shows(*this, i) : k.always_shown || values[i] != k.fallback;
    if (shown) add(k.name, format_value(k, values[i]));
  }
  if (!d.lossless && !ef) add("ef", "off");
  return out;
}

namespace {
// "key=value" items of a spec's key list (after its ':'), trimmed, checked for the '='.
std::vector<std::pair<std::string, std::string>> key_items(std::string_view spec, std::string_view list) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string_view item : split(list, ',')) {
    if (trim(item).empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string_view::npos)
      GZ_THROW(InvalidArgument, "codec spec '", spec, "': expected key=value, got '", item, "'");
    out.emplace_back(std::string(trim(item.substr(0, eq))), std::string(trim(item.substr(eq + 1))));
  }
  return out;
}
}  // namespace

std::string respec(std::string_view spec_in, std::string_view changes) {
  (void)parse_spec(spec_in);  // the spec itself is valid, duplicate keys included
  const std::string_view spec = trim(spec_in);
  const auto colon = spec.find(':');
  auto items = colon == std::string_view::npos ? std::vector<std::pair<std::string, std::string>>{}
                                                : key_items(spec, spec.substr(colon + 1));
  for (const auto& change : key_items(changes, changes)) {
    auto it = std::find_if(items.begin(), items.end(), [&](const auto& kv) { return kv.first == change.first; });
    if (it != items.end())
      it->second = change.second;
    else
      items.push_back(change);
  }
  std::string out(trim(spec.substr(0, colon)));
  const char* sep = ":";
  for (const auto& [key, value] : items) {
    out.append(sep).append(key).append("=").append(value);
    sep = ",";
  }
  return parse_spec(out).canonical();
}

std::vector<std::string> spec_keys(std::string_view spec_in) {
  (void)parse_spec(spec_in);
  const std::string_view spec = trim(spec_in);
  const auto colon = spec.find(':');
  std::vector<std::string> out;
  if (colon != std::string_view::npos)
    for (auto& kv : key_items(spec, spec.substr(colon + 1))) out.push_back(std::move(kv.first));
  return out;
}

std::vector<std::string> split_spec_list(std::string_view list) {
  std::vector<std::string> out;
  for (std::string_view item : split(list, ',')) {
    if (item.empty()) continue;
    const bool continues = item.find('=') != std::string_view::npos && item.find(':') == std::string_view::npos;
    if (continues && !out.empty())
      out.back() += (out.back().find(':') == std::string::npos ? ":" : ",") + std::string(item);
    else
      out.emplace_back(item);
  }
  return out;
}

std::vector<std::string> expand_spec_grid(std::string_view list) {
  std::vector<std::string> out = expand_spec_grid_as_written(list);
  for (auto& s : out) s = parse_spec(s).canonical();
  return out;
}

std::vector<std::string> expand_spec_grid_as_written(std::string_view list) {
  // Each spec is a codec name plus keys, each key with one or more values.
  struct Grid {
    std::string name;
    std::vector<std::pair<std::string, std::vector<std::string>>> keys;
  };
  std::vector<Grid> grids;
  for (std::string_view item : split(list, ',')) {
    if (item.empty()) continue;
    const auto colon = item.find(':');
    const auto eq = item.find('=');
    if (colon != std::string_view::npos || (eq == std::string_view::npos && find_codec(item) != nullptr)) {
      grids.push_back({std::string(trim(item.substr(0, colon))), {}});
      if (colon == std::string_view::npos) continue;
      item = trim(item.substr(colon + 1));
      if (item.empty()) continue;
    }
    if (grids.empty()) GZ_THROW(InvalidArgument, "spec grid '", list, "' must start with a codec name");
    const auto eq2 = item.find('=');
    if (eq2 != std::string_view::npos) {
      grids.back().keys.push_back({std::string(trim(item.substr(0, eq2))), {std::string(trim(item.substr(eq2 + 1)))}});
    } else {
      if (grids.back().keys.empty())
        GZ_THROW(InvalidArgument, "spec grid '", list, "': value '", item, "' follows no key");
      grids.back().keys.back().second.emplace_back(item);
    }
  }
  std::vector<std::string> out;
  for (const Grid& g : grids) {
    std::vector<std::string> specs{g.name};
    for (const auto& [key, values] : g.keys) {
      std::vector<std::string> next;
      for (const std::string& s : specs)
        for (const std::string& v : values)
          next.push_back(s + (s.find(':') == std::string::npos ? ":" : ",") + key + "=" + v);
      specs = std::move(next);
    }
    for (auto& s : specs) {
      (void)parse_spec(s);  // an unknown codec, key or value throws here, naming it
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace gz
