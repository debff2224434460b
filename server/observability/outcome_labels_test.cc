// Session labels of the outcome series: names a server may offer, values a session may declare,
// a slot per distinct set of values up to the cap, then the "_other" slot.
#include "server/observability/outcome_labels.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace probesidecar::server {
namespace {

TEST(OutcomeLabels, ValidateKeys) {
  EXPECT_TRUE(OutcomeLabels::ValidateKeys({}).ok());
  EXPECT_TRUE(OutcomeLabels::ValidateKeys({"model", "replica", "_x", "a1"}).ok());
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"1abc"},
                                             {"a-b"},
                                             {""},
                                             {"__name"},
                                             {"probe_set"},
                                             {"probe"},
                                             {"le"},
                                             {"instance"},
                                             {"model", "model"},
                                             {std::string(33, 'a')},
                                             {"a", "b", "c", "d", "e", "f", "g", "h", "i"}}) {
    EXPECT_EQ(OutcomeLabels::ValidateKeys(bad).code(), absl::StatusCode::kInvalidArgument)
        << bad.front();
  }
}

TEST(OutcomeLabels, SlotsPerDistinctValuesThenOther) {
  OutcomeLabels labels({"model", "replica"}, 2);
  bool folded = true;
  EXPECT_EQ(*labels.SlotFor({}, &folded), OutcomeLabels::kUnlabelled);
  EXPECT_FALSE(folded);
  EXPECT_EQ(*labels.SlotFor({{"model", "llama-3/8b"}}, &folded), 2);
  EXPECT_EQ(*labels.SlotFor({{"model", "llama-3/8b"}, {"replica", "0"}}, &folded), 3);
  EXPECT_EQ(*labels.SlotFor({{"model", "llama-3/8b"}}, &folded), 2);  // seen: its slot again
  EXPECT_FALSE(folded);
  EXPECT_EQ(*labels.SlotFor({{"replica", "7"}}, &folded), OutcomeLabels::kOther);  // past the cap
  EXPECT_TRUE(folded);
  EXPECT_EQ(*labels.SlotFor({{"model", "llama-3/8b"}, {"replica", "0"}}, &folded), 3);
  EXPECT_FALSE(folded);
  const std::vector<std::vector<std::string>> values = labels.Values();
  ASSERT_EQ(values.size(), 4u);
  EXPECT_EQ(values[0], (std::vector<std::string>{"", ""}));
  EXPECT_EQ(values[1], (std::vector<std::string>{"_other", "_other"}));
  EXPECT_EQ(values[2], (std::vector<std::string>{"llama-3/8b", ""}));
  EXPECT_EQ(values[3], (std::vector<std::string>{"llama-3/8b", "0"}));
  EXPECT_EQ(labels.max_slots(), 4);
}

TEST(OutcomeLabels, RefusesUnknownNamesAndMalformedValues) {
  OutcomeLabels labels({"model"}, 4);
  bool folded = false;
  for (const std::map<std::string, std::string>& bad :
       std::vector<std::map<std::string, std::string>>{{{"request_id", "1"}},
                                                       {{"model", ""}},
                                                       {{"model", "has space"}},
                                                       {{"model", "quote\""}},
                                                       {{"model", "_other"}},
                                                       {{"model", std::string(65, 'm')}}}) {
    const absl::StatusOr<int> slot = labels.SlotFor(bad, &folded);
    EXPECT_EQ(slot.status().code(), absl::StatusCode::kInvalidArgument) << bad.begin()->first;
  }
  EXPECT_TRUE(labels.SlotFor({{"model", std::string(64, 'm')}}, &folded).ok());
  OutcomeLabels none({}, 4);
  EXPECT_NE(none.SlotFor({{"model", "x"}}, &folded).status().message().find("offers none"),
            std::string::npos);
}

}  // namespace
}  // namespace probesidecar::server
