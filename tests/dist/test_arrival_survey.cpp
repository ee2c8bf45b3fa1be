// The timeout's arrival survey (dist/arrival_survey.hpp) through its interface: collectives are
// numbered per communicator in issue order, a rank that asks hears from every rank that is
// waiting in MPI how far it got and what it is blocked in, and the report names the ranks
// behind. The end-to-end case (a job ended by the timeout, its message checked) is
// timeout_rank_dies.sh.
#include <gtest/gtest.h>

#include "dist_fixture.hpp"
#include "loom/dist/arrival_survey.hpp"

namespace loom::test {
namespace {

constexpr double kPatientGraceSeconds = 30.0;  // every rank answers; this only bounds a bug

TEST(ArrivalSurvey, EveryRankThatReachedACollectiveSaysSo) {
  const auto world_group = world();
  if (world_group->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int rank = world_group->rank();
  const auto group = world_group->split(0, rank, "survey");
  const MPI_Comm comm = dynamic_cast<MpiProcessGroup&>(*group).comm();
  float value = 1.0f;
  group->all_reduce(&value, 1, ReduceOp::Sum)->wait();  // #1 on 'survey'
  // Every rank asks at once and answers the others while it waits for its own answers.
  EXPECT_TRUE(arrival::missing_ranks(comm, 1, kPatientGraceSeconds).empty());
  world_group->barrier();  // everyone is past the survey (counted on world, not on 'survey')

  if (rank == 0) {
    // The others are on their way into barrier #2 on 'survey', which waits for rank 0. Ask
    // about #3 until each answers from inside that barrier (an early answer may still come
    // from the world barrier above).
    const std::string barrier =
        "barrier #2 on group 'survey' (" + std::to_string(group->size()) + " ranks)";
    std::vector<arrival::PeerReport> missing;
    for (int attempt = 0; attempt < 200; ++attempt) {
      missing = arrival::missing_ranks(comm, 3, kPatientGraceSeconds);
      bool all_there = missing.size() == static_cast<size_t>(group->size() - 1);
      for (const auto& r : missing) all_there = all_there && r.waiting_in == barrier;
      if (all_there) break;
    }
    ASSERT_EQ(missing.size(), static_cast<size_t>(group->size() - 1));
    for (size_t i = 0; i < missing.size(); ++i) {
      EXPECT_EQ(missing[i].rank, static_cast<int>(i) + 1);
      EXPECT_EQ(missing[i].world_rank, static_cast<int>(i) + 1);
      EXPECT_TRUE(missing[i].answered);
      EXPECT_EQ(missing[i].issued, 2);  // the all_reduce and the barrier
      EXPECT_EQ(missing[i].waiting_in, barrier);
    }
  }
  group->barrier();  // #2 on 'survey'
}

TEST(ArrivalSurvey, ReportsNameEachMissingRankAndWhy) {
  std::vector<arrival::PeerReport> missing = {
      {1, 1, false, 0, ""},
      {3, 7, true, 16, "barrier #4 on group 'tp' (2 ranks)"},
  };
  EXPECT_EQ(
      arrival::describe_missing(missing, "dp", "all_reduce #17", 2.0),
      "ranks 1, 3 (of group 'dp') did not reach all_reduce #17 (rank 1: no answer within 2 s: "
      "busy outside communication, hung or gone; rank 3 (world rank 7): had issued 16 "
      "collectives on the group, waiting in barrier #4 on group 'tp' (2 ranks))");
  EXPECT_EQ(arrival::describe_missing({}, "dp", "all_reduce #17", 2.0),
            "every rank of group 'dp' reached all_reduce #17");
  EXPECT_EQ(
      arrival::describe_peer({1, 5, true, 4, "all_reduce #5 on group 'dp' (2 ranks)"}, "pp", 2.0),
      "rank 1 (world rank 5) of group 'pp' is waiting in all_reduce #5 on group 'dp' (2 ranks)");
  EXPECT_EQ(arrival::describe_peer({1, 1, false, 0, ""}, "pp", 2.0),
            "rank 1 of group 'pp' did not answer within 2 s: busy outside communication, hung or "
            "gone");
}

TEST(ArrivalSurvey, UserTagsStopBelowTheSurveysTags) {
  const auto world_group = world();
  if (world_group->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const MPI_Comm comm = dynamic_cast<MpiProcessGroup&>(*world_group).comm();
  const int reserved = arrival::first_reserved_tag(comm);
  float value = 0.0f;
  try {
    world_group->send(&value, 1, 1 - world_group->rank() % 2, reserved);
    FAIL() << "a send on the survey's tag was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tag is " + std::to_string(reserved) + ", expected [0, " +
                                         std::to_string(reserved - 1) + "]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::test
