// Issue 40, row 4: the guides' `mpiexec -n 2 ...` where the default mpiexec is Open MPI's started two
// separate 1-rank MPICH jobs, each "training" alone without a word. communicator::from_mpi now reads
// the launcher's variables and refuses.
//
// Run under MPICH's mpiexec: with 1 rank and OMPI_COMM_WORLD_SIZE=2 set (what Open MPI's launcher
// sets; the detection reads nothing else) from_mpi must throw; with 2 ranks and the same variable
// (a world that matches) it must not.
#include <gtest/gtest.h>

#include <map>

#include <flexpar/comm/communicator.hpp>

namespace flexpar {
namespace {

std::function<std::optional<std::string>(std::string_view)> variables(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

constexpr std::string_view mpich = "MPICH Version:\t4.0.2\nMPICH Release date: ...";

TEST(wrong_launcher, open_mpi_launcher_with_a_world_of_one) {
  const auto text = detail::wrong_launcher(variables({{"OMPI_COMM_WORLD_SIZE", "4"}}), 1, mpich);
  ASSERT_TRUE(text);
  EXPECT_NE(text->find("Open MPI's mpirun/mpiexec for 4 processes (OMPI_COMM_WORLD_SIZE=4)"), std::string::npos)
      << *text;
  EXPECT_NE(text->find("sees a world of 1 rank"), std::string::npos) << *text;
  EXPECT_NE(text->find("MPICH Version:\t4.0.2)"), std::string::npos) << *text;
  EXPECT_NE(text->find("launch with mpiexec.mpich -n 4 <program>"), std::string::npos) << *text;
}

TEST(wrong_launcher, mvapich_and_pmi_launchers) {
  EXPECT_TRUE(detail::wrong_launcher(variables({{"MV2_COMM_WORLD_SIZE", "2"}}), 1, mpich));
  EXPECT_TRUE(detail::wrong_launcher(variables({{"PMI_SIZE", "3"}}), 1, mpich));
}

TEST(wrong_launcher, silent_when_the_world_matches_or_nothing_says_more) {
  EXPECT_FALSE(detail::wrong_launcher(variables({{"OMPI_COMM_WORLD_SIZE", "2"}}), 2, mpich));  // its own world
  EXPECT_FALSE(detail::wrong_launcher(variables({{"PMI_SIZE", "1"}}), 1, mpich));              // 1 of 1
  EXPECT_FALSE(detail::wrong_launcher(variables({}), 1, mpich));                               // a singleton
  EXPECT_FALSE(detail::wrong_launcher(variables({{"OMPI_COMM_WORLD_SIZE", "x"}}), 1, mpich));  // not a number
}

TEST(wrong_launcher, from_mpi_under_this_launch) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto claimed = config::environment_lookup("OMPI_COMM_WORLD_SIZE");
  if (world == 1 && claimed && std::stoi(*claimed) > 1) {
    try {
      (void)communicator::from_mpi(MPI_COMM_WORLD);
      FAIL() << "from_mpi accepted a process that Open MPI's launcher started among " << *claimed;
    } catch (const usage_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[rank 0] communicator::from_mpi: this process was started by Open MPI's"), std::string::npos)
          << what;
      EXPECT_NE(what.find("mpiexec.mpich -n " + *claimed), std::string::npos) << what;
    }
  } else {
    auto comm = communicator::from_mpi(MPI_COMM_WORLD);
    EXPECT_EQ(comm.size(), world);
  }
}

}  // namespace
}  // namespace flexpar
