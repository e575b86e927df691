// Counts and link rates as users write them, parsed once for gradzip-bench,
// gradzip-run --link, the cost model (GRADZIP_LINK, gradzip-model, the
// bench's --link: comm/cost parse_link_model) and Python
// (gradzip._core.parse_count / parse_link, which the sweep uses): one
// parser, so the tools cannot drift apart.
// Errors are std::invalid_argument whose message names the value and says
// what is expected.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace gz::units {

/// A number with a unit: "2.5gbit" -> {2.5, "gbit"} (unit lower-cased).
inline std::pair<double, std::string> split_unit(std::string_view s, const char* what) {
  std::string t(s);
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) throw std::invalid_argument(std::string(what) + " '" + t + "' does not start with a number");
  char* end = nullptr;
  const std::string num = t.substr(0, i);
  const double v = std::strtod(num.c_str(), &end);
  if (*end || !(v > 0) || !std::isfinite(v))
    throw std::invalid_argument(std::string(what) + " '" + t + "' is not a positive number with a unit");
  std::string unit = t.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return {v, unit};
}

/// A link as gradzip-run --link takes it: "1gbit", "2.5gbit,50us",
/// "100mbit,1ms": a rate with a unit (bit, kbit, mbit, gbit, tbit: powers
/// of 1000), in 100kbit..4tbit, and an optional one-way delay (ns, us, ms,
/// s) up to 10 s.
struct Link {
  std::uint64_t rate_bps = 0;
  std::uint64_t delay_ns = 0;
};

inline Link parse_link(std::string_view text) {
  Link l;
  const auto comma = text.find(',');
  const std::string_view rate = text.substr(0, comma);
  auto [r, ru] = split_unit(rate, "--link rate");
  double mult = 0;
  if (ru == "bit") mult = 1;
  else if (ru == "kbit") mult = 1e3;
  else if (ru == "mbit") mult = 1e6;
  else if (ru == "gbit") mult = 1e9;
  else if (ru == "tbit") mult = 1e12;
  else
    throw std::invalid_argument("--link rate '" + std::string(rate) +
                                "' needs a unit: bit, kbit, mbit, gbit or tbit (bits per second, powers of 1000)");
  const double bps = r * mult;
  if (bps < 1e5 || bps > 4e12) throw std::invalid_argument("--link rate '" + std::string(rate) + "' is outside 100kbit..4tbit");
  l.rate_bps = static_cast<std::uint64_t>(std::llround(bps));
  if (comma != std::string_view::npos) {
    const std::string_view delay = text.substr(comma + 1);
    auto [d, du] = split_unit(delay, "--link delay");
    double ns = 0;
    if (du == "ns") ns = d;
    else if (du == "us") ns = d * 1e3;
    else if (du == "ms") ns = d * 1e6;
    else if (du == "s") ns = d * 1e9;
    else throw std::invalid_argument("--link delay '" + std::string(delay) + "' needs a unit: ns, us, ms or s");
    if (ns > 10e9) throw std::invalid_argument("--link delay '" + std::string(delay) + "' is over 10 s");
    l.delay_ns = static_cast<std::uint64_t>(std::llround(ns));
  }
  return l;
}

/// An element count: 1048576; "1K", "16M", "1G" (powers of 1024, as
/// gradzip-bench has always taken them); "25.6e6" or "1e8" (decimal counts
/// for round model sizes). Whole, in 1..2^40.
inline std::uint64_t parse_count(std::string_view text) {
  std::string t(text);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  std::size_t start = 0;
  while (start < t.size() && std::isspace(static_cast<unsigned char>(t[start]))) ++start;
  t = t.substr(start);
  const std::string shown = "size '" + std::string(text) + "'";
  if (t.empty()) throw std::invalid_argument("empty size");
  double mult = 1;
  switch (t.back()) {
    case 'K': case 'k': mult = 1024.0; t.pop_back(); break;
    case 'M': case 'm': mult = 1024.0 * 1024; t.pop_back(); break;
    case 'G': case 'g': mult = 1024.0 * 1024 * 1024; t.pop_back(); break;
    default: break;
  }
  // Digits, an optional fraction and an optional exponent; nothing else.
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t from = i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
    return i > from;
  };
  bool ok = digits();
  if (ok && i < t.size() && t[i] == '.') {
    ++i;
    ok = digits();
  }
  if (ok && i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    ok = digits();
  }
  if (!ok || i != t.size()) throw std::invalid_argument(shown + " is not a count like 1048576, 16M or 25.6e6");
  const double v = std::strtod(t.c_str(), nullptr) * mult;
  if (!std::isfinite(v) || v > 1099511627776.0) throw std::invalid_argument(shown + " is over 2^40 elements");
  if (v != std::floor(v)) throw std::invalid_argument(shown + " is not a whole number of elements");
  if (v < 1) throw std::invalid_argument(shown + " is not at least 1");
  return static_cast<std::uint64_t>(v);
}

}  // namespace gz::units
