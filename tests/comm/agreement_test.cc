// The agreement against a lying store: a rank compares its own fields, never
// the store's copy of its key; a value no member sealed never satisfies a
// round; rounds are erased once every rank read them; malformed fields are an
// IoError naming the rank. Ranks are threads over a HashStore.
#include <gtest/gtest.h>

#include <thread>

#include "comm/engine/agreement.h"
#include "comm/store/hash_store.h"
#include "comm/store/sealed_store.h"
#include "tests/comm/thread_transport.h"

namespace gz::test {
namespace {

// A store that writes what an adversary chose instead of what was set, for
// the keys in `forged` (a stray writer that always wins the race).
class ForgingStore final : public Store {
 public:
  ForgingStore(std::shared_ptr<Store> inner, std::map<std::string, std::string> forged)
      : Store(inner->timeout()), inner_(std::move(inner)), forged_(std::move(forged)) {}

 protected:
  void do_set(const std::string& key, std::string_view value) override {
    const auto it = forged_.find(key);
    inner_->set(key, it == forged_.end() ? value : std::string_view(it->second));
  }
  std::string do_get(const std::string& key) override { return inner_->get(key, Timeout(0)); }
  void do_wait(const std::vector<std::string>& keys, Timeout timeout) override { inner_->wait(keys, timeout); }
  std::int64_t do_add(const std::string& key, std::int64_t delta) override { return inner_->add(key, delta); }
  void do_erase(const std::vector<std::string>& keys) override { inner_->erase(keys); }

 private:
  std::shared_ptr<Store> inner_;
  std::map<std::string, std::string> forged_;
};

Fields call_fields(const char* op) { return {{"codec", "onebit"}, {"n", "100"}, {"op", op}}; }

// Runs agree() on two threads (rank 0 with op0, rank 1 with op1).
std::vector<std::exception_ptr> agree_on_two(Store& store, const char* op0, const char* op1) {
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        agree(store, 0, r, 2, call_fields(r == 0 ? op0 : op1), Timeout(2000));
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

// "a stray client keeps writing gradzip/agree/<k>/<r> keys ... the agreement
// passed ... results differing 2x": the store's copy of rank 0's key says
// what rank 1 says. Rank 0 compares what it was asked (avg) and refuses.
TEST(Agreement, ComparesItsOwnFieldsNotTheStoresCopy) {
  auto base = std::make_shared<HashStore>(Timeout(2000));
  ForgingStore store(base, {{"agree/0/0", encode_fields(call_fields("sum"))}});
  const auto errors = agree_on_two(store, "avg", "sum");
  ASSERT_NE(errors[0], nullptr) << "rank 0 agreed to a call it was not asked to make";
  EXPECT_NE(what(errors[0]).find("op: rank 0 'avg'; rank 1 'sum'"), std::string::npos) << what(errors[0]);
}

// Through a SealedStore, a value the forger wrote (without the job's key) is
// an IoError naming the key, never taken for rank 1's.
TEST(Agreement, AValueNoMemberWroteNeverSatisfiesARound) {
  auto base = std::make_shared<HashStore>(Timeout(2000));
  auto forging = std::make_shared<ForgingStore>(
      base, std::map<std::string, std::string>{
                {"agree/0/1", seal_value("a-guessed-key", "agree/0/1", encode_fields(call_fields("avg")))}});
  SealedStore store(forging, "the-job-key");
  const auto errors = agree_on_two(store, "avg", "sum");
  ASSERT_NE(errors[0], nullptr);
  EXPECT_NE(what(errors[0]).find("not written by a member"), std::string::npos) << what(errors[0]);
  EXPECT_NE(what(errors[0]).find("agree/0/1"), std::string::npos) << what(errors[0]);
  ASSERT_NE(errors[1], nullptr);  // rank 1 sees rank 0's genuine 'avg'
}

TEST(Agreement, MalformedFieldsAreAnIoErrorNamingTheRank) {
  auto base = std::make_shared<HashStore>(Timeout(2000));
  ForgingStore store(base, {{"agree/0/1", "op=avg\n"}});
  const auto errors = agree_on_two(store, "avg", "avg");
  ASSERT_NE(errors[0], nullptr);
  EXPECT_NE(what(errors[0]).find("rank 1 published"), std::string::npos) << what(errors[0]);
}

// "a client fills the Store ... agreement keys are never deleted": after
// hundreds of rounds the store holds nothing.
TEST(Agreement, EveryRoundIsErasedOnceAllRanksReadIt) {
  auto store = std::make_shared<HashStore>(Timeout(5000));
  const int P = 3, rounds = 300;
  std::vector<std::exception_ptr> errors(P);
  std::vector<std::thread> ts;
  for (int r = 0; r < P; ++r)
    ts.emplace_back([&, r] {
      try {
        for (int i = 0; i < rounds; ++i) agree(*store, static_cast<std::uint64_t>(i), r, P, call_fields("avg"), Timeout(5000));
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, nullptr) << what(e);
  EXPECT_EQ(store->size(), 0u);
}

TEST(Agreement, FieldsRoundTripAndMalformedOnesAreRejected) {
  const Fields f = {{"codec", "topk:density=0.01"}, {"weird", std::string("a=b\nc\0d", 7)}};
  EXPECT_EQ(decode_fields(encode_fields(f)), f);
  const std::string e = encode_fields(f);
  for (std::size_t k = 0; k < e.size(); ++k) EXPECT_FALSE(decode_fields(e.substr(0, k)).has_value());
  EXPECT_FALSE(decode_fields(e + "x").has_value());
}

}  // namespace
}  // namespace gz::test
