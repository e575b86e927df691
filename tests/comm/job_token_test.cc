// The job token rule (comm/security/job_token.h), played by a stranger who
// tries the tokens a person would choose, and by the random tokens that
// gradzip-run, new_job_token() and `head -c16 /dev/urandom | xxd -p` make.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "comm/security/job_identity.h"
#include "comm/security/job_token.h"
#include "common/error.h"

namespace gz {
namespace {

// The message job_identity_from_token refuses `token` with; "(accepted)" when it does not.
std::string refusal(const std::string& token) {
  try {
    job_identity_from_token(token);
    return "(accepted)";
  } catch (const InvalidArgument& e) {
    return e.what();
  }
}

// Tokens a person chooses: the ranks refuse each, saying why and how to make
// a good one, and the launcher's check (the same function) agrees.
TEST(JobToken, RefusesTokensAPersonWouldChoose) {
  const struct {
    std::string token, why;
  } weak[] = {
      {"", "empty"},
      {"0123456789", "10 characters long"},
      {std::string(16, ' '), "whitespace or a control character (byte 0x20 at position 0)"},
      {"5f0c9e2a\t71d4b83e6a0f", "whitespace or a control character (byte 0x09 at position 8)"},
      {"5f0c9e2a71d4b83e\n", "whitespace or a control character (byte 0x0a at position 16)"},
      {"0123456789abcdef", "only 4 of its characters"},
      {"aaaaaaaaaaaaaaaaaaaa", "only 1 distinct"},
      {"1111111111111111", "only 1 distinct"},
      {"abcdefghijklmnop", "only 2 of its characters"},
      {"ponmlkjihgfedcba", "only 2 of its characters"},
      {"02468ace02468ace", "guessable"},
      {"abababababababab", "only 2 distinct"},
      {"1211221112212112", "only 2 distinct"},
      {"0123456701234567", "guessable"},
      {"q7x2m9q7x2m9q7x2", "guessable"},  // a period of 6 random characters
      {"0123456789abcdef0123456789abcdef0123456789abcdef", "guessable"},  // a pattern stays weak however long
  };
  for (const auto& [token, why] : weak) {
    const std::string m = refusal(token);
    EXPECT_NE(m.find("GRADZIP_JOB_TOKEN"), std::string::npos) << token << ": " << m;
    EXPECT_NE(m.find(why), std::string::npos) << token << ": " << m;
    EXPECT_NE(m.find("at least 16 characters of random data"), std::string::npos) << token << ": " << m;
    EXPECT_NE(m.find("head -c16 /dev/urandom | xxd -p"), std::string::npos) << token << ": " << m;
    if (!token.empty()) {
      EXPECT_EQ(m.find(token), std::string::npos) << "the message shows the secret: " << m;
    }
    EXPECT_FALSE(job_token_weakness(token).empty()) << token;
  }
}

// Random tokens essentially never are refused (job_token.cc: 1.4e-6 for 16 hex
// digits, none in 1e8 of 32). Seeded: the same tokens every run.
TEST(JobToken, AcceptsRandomTokens) {
  std::mt19937_64 rng(20240532);
  const std::string hex = "0123456789abcdef",
                    base64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto draw = [&](const std::string& alphabet, std::size_t n) {
    std::string t(n, '?');
    for (char& c : t) c = alphabet[rng() % alphabet.size()];
    return t;
  };
  const struct {
    const std::string& alphabet;
    std::size_t length;
    int count;
  } kinds[] = {{hex, 32, 100000}, {hex, 16, 20000}, {base64, 16, 20000}, {base64, 24, 20000}};
  for (const auto& k : kinds)
    for (int i = 0; i < k.count; ++i) {
      const std::string t = draw(k.alphabet, k.length);
      ASSERT_EQ(refusal(t), "(accepted)") << t;
    }
  for (int i = 0; i < 1000; ++i) {
    const std::string t = new_job_token();
    ASSERT_EQ(refusal(t), "(accepted)") << t;
  }
}

}  // namespace
}  // namespace gz
