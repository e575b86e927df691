#include "comm/cost/codec_rates.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "comm/base/env.h"
#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"

namespace gz {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kFormat = "gradzip-codec-rates 1";

// Best of reps calls of f, in seconds.
template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < std::max(1, reps); ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// Gradient-like values without a costly normal draw: a hashed sequence in (-2, 2).
void fill(std::vector<float>& v, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    f = static_cast<float>(static_cast<std::int32_t>(x)) * (2.0f / 2147483648.0f);
  }
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

std::string format_values(std::initializer_list<double> v) {
  std::string s;
  char b[40];
  for (double x : v) {
    std::snprintf(b, sizeof b, "%.17g", x);
    s += (s.empty() ? "" : " ") + std::string(b);
  }
  return s;
}

// The values of an entry: exactly `count` finite numbers within [lo, hi].
std::optional<std::vector<double>> parse_values(const std::string& text, std::size_t count, double lo, double hi) {
  std::istringstream in(text);
  std::vector<double> v;
  for (double x; in >> x;) v.push_back(x);
  if (!in.eof() || v.size() != count) return std::nullopt;
  for (double x : v)
    if (!std::isfinite(x) || x < lo || x > hi) return std::nullopt;
  return v;
}

void warn(const std::string& what) { std::fprintf(stderr, "gradzip: warning: %s\n", what.c_str()); }

}  // namespace

CodecRates measure_codec_rates(const CodecConfig& cfg, std::size_t n, int reps) {
  auto codec = make_codec(cfg);
  std::vector<float> grad(n), residual(n, 0.0f), out(n);
  fill(grad, 1);
  const std::size_t cap = codec->max_payload_bytes(n);
  std::vector<std::byte> p1(cap), p2(cap), ws(codec->workspace_bytes(n, Device::Cpu));
  const ExecContext ctx{Device::Cpu, nullptr, ws.data(), ws.size()};
  float* r = codec->error_feedback() ? residual.data() : nullptr;
  std::size_t b1 = codec->encode(grad.data(), r, n, p1.data(), cap, ctx);  // warm: pages, code
  const std::size_t b2 = codec->encode(grad.data(), r, n, p2.data(), cap, ctx);
  CodecRates rates;
  rates.encode_s = best_of(reps, [&] { b1 = codec->encode(grad.data(), r, n, p1.data(), cap, ctx); }) / n;
  const PayloadRef one[1] = {{p1.data(), b1}};
  const PayloadRef four[4] = {{p1.data(), b1}, {p2.data(), b2}, {p1.data(), b1}, {p2.data(), b2}};
  codec->decode_sum(one, out.data(), n, 1.0f, ctx);
  const double d1 = best_of(reps, [&] { codec->decode_sum(one, out.data(), n, 1.0f, ctx); }) / n;
  const double d4 = best_of(reps, [&] { codec->decode_sum(four, out.data(), n, 1.0f, ctx); }) / n;
  rates.decode_each_s = std::max(0.0, (d4 - d1) / 3);
  rates.decode_s = std::max(0.0, d1 - rates.decode_each_s);
  constexpr std::size_t kRef = std::size_t{1} << 20;
  rates.bytes_per_element =
      static_cast<double>(codec->max_payload_bytes(kRef) - wire::kHeaderBytes) / static_cast<double>(kRef);
  if (codec->descriptor().lossless) rates.bytes_per_element = 4;
  return rates;
}

MachineRates measure_machine_rates(std::size_t n, int reps) {
  std::vector<float> a(n), b(n), c(n), d(n), out(n);
  fill(a, 2);
  fill(b, 3);
  fill(c, 4);
  fill(d, 5);
  MachineRates m;
  std::memcpy(out.data(), a.data(), 4 * n);
  const double copy = best_of(reps, [&] { std::memcpy(out.data(), a.data(), 4 * n); });
  m.copy_bytes_per_s = 4.0 * static_cast<double>(n) / std::max(copy, 1e-9);
  const float* two[2] = {a.data(), b.data()};
  const float* four[4] = {a.data(), b.data(), c.data(), d.data()};
  const double s2 = best_of(reps, [&] { kernels::cpu::sum(two, 2, n, 1.0f, out.data()); }) / n;
  const double s4 = best_of(reps, [&] { kernels::cpu::sum(four, 4, n, 1.0f, out.data()); }) / n;
  m.sum_each_s = std::max(0.0, (s4 - s2) / 2);
  m.sum_s = std::max(0.0, s2 - 2 * m.sum_each_s);
  return m;
}

std::string machine_identity() {
  std::string model = "unknown cpu", flags;
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0 && model == "unknown cpu") model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) {
      std::istringstream words(line.substr(line.find(':') + 1));
      bool avx2 = false, avx512 = false, f16c = false;
      for (std::string w; words >> w;) {
        avx2 |= w == "avx2";
        avx512 |= w == "avx512f";
        f16c |= w == "f16c";
      }
      flags = std::string(avx2 ? "avx2" : "no-avx2") + (avx512 ? " avx512f" : "") + (f16c ? " f16c" : "");
    }
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  for (char& c : model)
    if (c == '\t' || c == '\n') c = ' ';
  return model + " | " + flags + " | " + std::to_string(cpus) + " cpus";
}

std::string rates_cache_line(const std::string& identity, const std::string& key, const std::string& values) {
  char sum[20];
  std::snprintf(sum, sizeof sum, "%016" PRIx64, fnv1a(identity + '\t' + key + '\t' + values));
  return key + '\t' + values + '\t' + sum;
}

RatesCache::RatesCache(std::string path, std::string identity) : path_(std::move(path)), identity_(std::move(identity)) {}

std::string RatesCache::default_path() {
  if (auto v = env_value("GRADZIP_RATES_CACHE")) return *v == "off" ? std::string() : *v;
  if (auto x = env_value("XDG_CACHE_HOME")) return *x + "/gradzip/codec-rates.tsv";
  if (auto h = env_value("HOME")) return *h + "/.cache/gradzip/codec-rates.tsv";
  return {};
}

void RatesCache::load() {
  if (loaded_) return;
  loaded_ = true;
  if (path_.empty()) return;
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0) return;  // no cache yet
  auto ignore = [&](const std::string& why) {
    warning_ = "ignoring the codec rates cache " + path_ + ": " + why + "; measuring again";
    warn(warning_);
    entries_.clear();
  };
  if (!S_ISREG(st.st_mode)) return ignore("not a regular file");
  if (st.st_uid != ::geteuid()) return ignore("owned by another user");
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return ignore("writable by others");
  if (st.st_size > (1 << 20)) return ignore("larger than 1 MiB");
  std::ifstream f(path_);
  std::string format, machine;
  if (!std::getline(f, format) || format != kFormat) return ignore("not format '" + std::string(kFormat) + "'");
  if (!std::getline(f, machine) || machine != "machine\t" + identity_)
    return ignore("made on another machine (" + machine.substr(machine.find('\t') + 1) + ")");
  for (std::string line; std::getline(f, line);) {
    const std::size_t a = line.find('\t'), b = line.rfind('\t');
    if (a == std::string::npos || b == a) return ignore("a malformed line");
    const std::string key = line.substr(0, a), values = line.substr(a + 1, b - a - 1);
    if (rates_cache_line(identity_, key, values) != line) return ignore("a line fails its checksum ('" + key + "')");
    entries_.emplace_back(key, values);
  }
}

std::optional<std::string> RatesCache::find(const std::string& key) {
  load();
  for (const auto& [k, v] : entries_)
    if (k == key) return v;
  return std::nullopt;
}

void RatesCache::store(const std::string& key, const std::string& values) {
  entries_.emplace_back(key, values);
  if (path_.empty()) return;
  // Every entry again, into a temporary file renamed over the cache: a
  // reader sees the old file or the new one, never half of one.
  const std::size_t slash = path_.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path_.substr(0, slash);
    for (std::size_t i = 1; i <= dir.size(); ++i)
      if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0700);
  }
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return warn("cannot write the codec rates cache " + tmp + " (measured rates are not kept)");
    f << kFormat << "\nmachine\t" << identity_ << "\n";
    for (const auto& [k, v] : entries_) f << rates_cache_line(identity_, k, v) << "\n";
    if (!f) {
      ::unlink(tmp.c_str());
      return warn("writing the codec rates cache " + tmp + " failed");
    }
  }
  ::chmod(tmp.c_str(), 0600);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    warn("cannot replace the codec rates cache " + path_);
  }
}

CodecRates RatesCache::codec(const CodecConfig& cfg) {
  const std::string key = "codec " + cfg.canonical();
  if (auto v = find(key)) {
    // Seconds per element: a core does between 1e-12 (a terabyte a second)
    // and 1e-5; payload bytes per element within (0, 8].
    if (auto x = parse_values(*v, 4, 0.0, 8.0); x && (*x)[0] > 1e-12 && (*x)[0] < 1e-5 && (*x)[1] < 1e-5 &&
                                                (*x)[2] < 1e-5 && (*x)[3] > 0) {
      last_hit_ = true;
      return CodecRates{(*x)[0], (*x)[1], (*x)[2], (*x)[3]};
    }
    warn("ignoring the cached rates of " + cfg.canonical() + " in " + path_ + " (out of range); measuring again");
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; }),
                   entries_.end());
  }
  last_hit_ = false;
  const CodecRates r = measure_codec_rates(cfg);
  store(key, format_values({r.encode_s, r.decode_s, r.decode_each_s, r.bytes_per_element}));
  return r;
}

MachineRates RatesCache::machine() {
  const std::string key = "machine";
  if (auto v = find(key)) {
    if (auto x = parse_values(*v, 3, 0.0, 1e13); x && (*x)[0] > 1e8 && (*x)[1] < 1e-5 && (*x)[2] < 1e-5) {
      last_hit_ = true;
      return MachineRates{(*x)[0], (*x)[1], (*x)[2]};
    }
    warn("ignoring the cached machine rates in " + path_ + " (out of range); measuring again");
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; }),
                   entries_.end());
  }
  last_hit_ = false;
  const MachineRates m = measure_machine_rates();
  store(key, format_values({m.copy_bytes_per_s, m.sum_s, m.sum_each_s}));
  return m;
}

}  // namespace gz
