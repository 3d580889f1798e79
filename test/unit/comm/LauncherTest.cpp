//===- LauncherTest.cpp - detectLauncher() on each launcher's variables ---===//

#include "runtime/comm/Launcher.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

using namespace kiln;
using namespace kiln::comm;

namespace {

Expected<LaunchEnv> detect(std::map<std::string, std::string> vars) {
  return detectLauncher([vars](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(Launcher, None) {
  Expected<LaunchEnv> e = detect({});
  ASSERT_TRUE(e.isOk());
  EXPECT_FALSE(e->underLauncher());
  EXPECT_EQ(e->rank, 0);
  EXPECT_EQ(e->size, 1);
}

TEST(Launcher, EachFamily) {
  struct Case {
    std::map<std::string, std::string> vars;
    const char *launcher;
    int rank, size, local;
  } cases[] = {
      {{{"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
       "openmpi",
       3,
       4,
       1},
      {{{"PMI_RANK", "2"}, {"PMI_SIZE", "5"}, {"MPI_LOCALRANKID", "0"}},
       "pmi",
       2,
       5,
       0},
      {{{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "3"}},
       "slurm",
       7,
       8,
       3},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}},
       "torchrun",
       1,
       2,
       1},
      // mpirun inside a Slurm allocation: Open MPI's variables win.
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "1"},
        {"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "2"}},
       "openmpi",
       1,
       2,
       0},
  };
  for (const Case &c : cases) {
    Expected<LaunchEnv> e = detect(c.vars);
    ASSERT_TRUE(e.isOk()) << e.status().message();
    EXPECT_EQ(e->launcher, c.launcher);
    EXPECT_EQ(e->rank, c.rank) << c.launcher;
    EXPECT_EQ(e->size, c.size) << c.launcher;
    EXPECT_EQ(e->localRank, c.local) << c.launcher;
  }
}

TEST(Launcher, BadValuesNameTheVariable) {
  Expected<LaunchEnv> e = detect({{"RANK", "one"}, {"WORLD_SIZE", "2"}});
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("RANK=\"one\""), std::string::npos)
      << e.status().message();
  e = detect({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}});
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("0..size-1"), std::string::npos)
      << e.status().message();
  e = detect({{"WORLD_SIZE", "2"}});
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("RANK is not"), std::string::npos)
      << e.status().message();
}

TEST(Launcher, MismatchWithTheLibraryIsAnError) {
  Expected<LaunchEnv> e = detect({{"RANK", "1"}, {"WORLD_SIZE", "4"}});
  ASSERT_TRUE(e.isOk());
  Status s = checkLaunch(*e, 0, 1, "MPI");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("say rank 1 of 4, but MPI reports rank 0 of 1"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("mpirun -np N"), std::string::npos) << s.message();
  EXPECT_TRUE(checkLaunch(*e, 1, 4, "MPI").isOk());
  EXPECT_TRUE(checkLaunch(LaunchEnv{}, 0, 1, "MPI").isOk());
}

} // namespace
