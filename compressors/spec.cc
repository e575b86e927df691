#include "compressors/spec.h"

#include <charconv>
#include <cmath>
#include <map>
#include <sstream>

#include "common/error.h"
#include "kernels/topk.h"

namespace gz {
namespace {

struct CodecInfo {
  const char* name;
  CodecId id;
  const char* keys;  // valid keys, for error messages
};

constexpr CodecInfo kCodecs[] = {
    {"none", CodecId::None, "ef"},
    {"fp16", CodecId::Fp16, "ef"},
    {"bf16", CodecId::Bf16, "ef"},
    {"onebit", CodecId::OneBit, "block, ef"},
    {"topk", CodecId::TopK, "density, k, select, ef"},
};

const CodecInfo* find_codec(std::string_view name) {
  for (const auto& c : kCodecs)
    if (name == c.name) return &c;
  return nullptr;
}

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

}  // namespace

std::string_view codec_names() { return "none, fp16, bf16, onebit, topk"; }

const char* codec_name(CodecId id) {
  for (const auto& c : kCodecs)
    if (c.id == id) return c.name;
  return "unknown";
}

CodecConfig parse_spec(std::string_view spec_in) {
  const std::string_view spec = trim(spec_in);
  const auto colon = spec.find(':');
  const std::string_view name = trim(spec.substr(0, colon));
  const CodecInfo* info = find_codec(name);
  if (!info)
    GZ_THROW(InvalidArgument, "unknown codec '", name, "' in spec '", spec, "'; valid codecs: ", codec_names());
  CodecConfig cfg;
  cfg.id = info->id;
  if (cfg.id == CodecId::None) cfg.ef = false;
  if (colon == std::string_view::npos) return cfg;

  bool have_density = false, have_k = false;
  std::map<std::string_view, int> seen;
  for (std::string_view item : split(spec.substr(colon + 1), ',')) {
    const auto eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos)
      GZ_THROW(InvalidArgument, "codec spec '", spec, "': expected key=value, got '", item,
               "'; valid keys for ", info->name, ": ", info->keys);
    const std::string_view key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (seen[key]++) GZ_THROW(InvalidArgument, "codec spec '", spec, "': key '", key, "' given twice");
    if (key == "ef") {
      cfg.ef = parse_bool(spec, key, value);
    } else if (key == "block" && cfg.id == CodecId::OneBit) {
      const auto b = parse_number<std::uint64_t>(spec, key, value);
      if (b < 1 || b > (1u << 30))
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': block must be in [1, 2^30], got ", value);
      cfg.block = static_cast<std::uint32_t>(b);
    } else if (key == "density" && cfg.id == CodecId::TopK) {
      const double d = parse_number<double>(spec, key, value);
      if (!(d > 0.0 && d <= 1.0))
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': density must be in (0, 1], got ", value);
      cfg.density = d;
      have_density = true;
    } else if (key == "k" && cfg.id == CodecId::TopK) {
      const auto k = parse_number<std::uint64_t>(spec, key, value);
      if (k < 1) GZ_THROW(InvalidArgument, "codec spec '", spec, "': k must be >= 1, got ", value);
      cfg.k = k;
      have_k = true;
    } else if (key == "select" && cfg.id == CodecId::TopK) {
      if (value == "exact")
        cfg.select = TopkSelect::Exact;
      else if (value == "sample")
        cfg.select = TopkSelect::Sample;
      else
        GZ_THROW(InvalidArgument, "codec spec '", spec, "': select must be exact or sample, got ", value);
    } else {
      GZ_THROW(InvalidArgument, "codec spec '", spec, "': unknown key '", key, "' for ", info->name,
               "; valid keys: ", info->keys);
    }
  }
  if (have_density && have_k)
    GZ_THROW(InvalidArgument, "codec spec '", spec, "': give either density or k, not both");
  if (cfg.id == CodecId::None && cfg.ef)
    GZ_THROW(InvalidArgument, "codec spec '", spec, "': none is lossless, error feedback does not apply");
  return cfg;
}

std::string CodecConfig::canonical() const {
  std::ostringstream os;
  os << codec_name(id);
  std::string sep = ":";
  auto add = [&](const std::string& kv) {
    os << sep << kv;
    sep = ",";
  };
  if (id == CodecId::OneBit) add("block=" + std::to_string(block));
  if (id == CodecId::TopK) {
    add(k ? "k=" + std::to_string(k) : "density=" + format_double(density));
    if (select == TopkSelect::Sample) add("select=sample");
  }
  if (id != CodecId::None && !ef) add("ef=off");
  return os.str();
}

std::uint64_t CodecConfig::topk_k(std::uint64_t n) const {
  if (id != CodecId::TopK) return 0;
  if (k) return k < n ? k : n;
  return kernels::topk_k_for_density(n, density);
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
    if (colon != std::string_view::npos || (eq == std::string_view::npos && find_codec(item))) {
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
    for (auto& s : specs) out.push_back(parse_spec(s).canonical());
  }
  return out;
}

}  // namespace gz
