// What a GRADZIP_JOB_TOKEN must be to serve as a job's secret: one rule,
// used by the ranks (job_identity.cc refuses a weak token) and by gradzip-run
// (which refuses it before any rank starts). It needs nothing but the
// standard library, so that the launcher, which links no gradzip library,
// compiles it in.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gz {

/// Tokens are at least this long: the handshake gives an eavesdropper a
/// proof it can test guesses against, so a token must not be guessable.
inline constexpr std::size_t kMinTokenBytes = 16;

/// How to make a good token, for the messages that refuse a weak one.
inline constexpr char kJobTokenAdvice[] =
    "use at least 16 characters of random data, e.g. export GRADZIP_JOB_TOKEN=$(head -c16 /dev/urandom | xxd -p)";

/// Why `token` is too weak to be a job's secret, as the end of a sentence
/// that starts with the variable's name ("is 5 characters long"); "" when
/// it is good. Weak: shorter than kMinTokenBytes, whitespace or control
/// characters, or guessable (few distinct characters, or mostly repeats,
/// runs and copies: job_token.cc says how they are counted).
std::string job_token_weakness(std::string_view token);

}  // namespace gz
