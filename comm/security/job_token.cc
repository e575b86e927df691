// The rule of job_token.h.
//
// A token is refused when a person could have chosen it, and so a stranger
// could guess it from a short list (issue 32): it is shorter than
// kMinTokenBytes; it holds whitespace or a control character (16 spaces, or
// a pasting or quoting accident that ranks started by different shells would
// not agree on); it has fewer than kMinDistinct different characters
// (1111..., abab..., 1211221...); or fewer than kMinNovel of its characters
// are novel. A character is not novel when something simple predicts it from
// the ones before it:
//   - a repeat of the one before                        aaaa, 1111
//   - the next step of a run, of any step, up or down   0123, abcd, fedc, 0246
//   - with the one before, a copy of the pair p back     abcabc, 0123456701234567,
//     (2 <= p <= kMaxPeriod)                             q7x2m9q7x2m9q7x2
// So 0123456789abcdef has 4 novel characters (0, 1, a, b: '9' to 'a' is no
// step of one in ASCII), abcdefghijklmnop 2, and a pattern stays weak however
// long it is made.
//
// Random tokens pass. For 16 random hex digits, the shortest such token that
// is long enough, fewer than 5 distinct characters has probability 4.1e-7
// (exact: Stirling numbers), fewer than 8 novel about 1.1e-6 (Monte Carlo,
// 4e8 tokens): 564 of 4e8, 1.4e-6 together, one token in 700,000. Of 1e8
// tokens of 32 hex digits (gradzip-run's and new_job_token()'s, and
// `head -c16 /dev/urandom | xxd -p`) and 1e8 of 16 base64 characters, none
// was refused (fewer than 5 distinct alone: 1e-16 and 3e-14). Stricter
// limits cost random tokens much more than they catch: 10 novel and 6
// distinct refuse 6.7e-5 of 16 hex digits, one in 15,000.
#include "comm/security/job_token.h"

#include <cstdio>

namespace gz {
namespace {

constexpr std::size_t kMinDistinct = 5;
constexpr std::size_t kMinNovel = 8;
// Copies are looked for this far back: a token repeating a longer block has
// that block's novel characters already, and the check stays linear in a
// long token.
constexpr std::size_t kMaxPeriod = 16;

std::size_t distinct_characters(std::string_view token) {
  bool seen[256] = {};
  std::size_t n = 0;
  for (const unsigned char c : token) {
    n += !seen[c];
    seen[c] = true;
  }
  return n;
}

// Whether token[i] follows from the characters before it (see above).
bool predictable(std::string_view token, std::size_t i) {
  auto at = [&](std::size_t k) { return int{static_cast<unsigned char>(token[k])}; };
  if (i >= 1 && at(i) == at(i - 1)) return true;
  if (i >= 2 && at(i) - at(i - 1) == at(i - 1) - at(i - 2)) return true;
  for (std::size_t p = 2; p <= kMaxPeriod && p < i; ++p)
    if (at(i) == at(i - p) && at(i - 1) == at(i - 1 - p)) return true;
  return false;
}

// Novel characters, counted up to `enough`.
std::size_t novel_characters(std::string_view token, std::size_t enough) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < token.size() && n < enough; ++i) n += !predictable(token, i);
  return n;
}

}  // namespace

std::string job_token_weakness(std::string_view token) {
  if (token.empty()) return "is empty";
  if (token.size() < kMinTokenBytes) return "is " + std::to_string(token.size()) + " characters long";
  for (std::size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c <= ' ' || c == 0x7f) {
      char where[64];
      std::snprintf(where, sizeof where, " (byte 0x%02x at position %zu)", c, i);
      return std::string("holds whitespace or a control character") + where;
    }
  }
  if (const std::size_t d = distinct_characters(token); d < kMinDistinct)
    return "has only " + std::to_string(d) + " distinct characters (at least " + std::to_string(kMinDistinct) +
           " are needed)";
  if (const std::size_t n = novel_characters(token, kMinNovel); n < kMinNovel)
    return "is guessable: only " + std::to_string(n) + " of its characters are not a repeat, the next step of a run " +
           "(as in 0123 or fedc) or a copy of an earlier pair (as in abcabc); at least " + std::to_string(kMinNovel) +
           " are needed";
  return {};
}

}  // namespace gz
