#include "accel/runtime/env/environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using ::testing::HasSubstr;

DistributedEnvironment ParseFrom(
    const std::map<std::string, std::string>& vars) {
  return DistributedEnvironment::Parse([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string ErrorFrom(const std::map<std::string, std::string>& vars) {
  try {
    ParseFrom(vars);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(EnvironmentTest, NoVariablesMeansOneProcess) {
  const DistributedEnvironment env = ParseFrom({});
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
}

TEST(EnvironmentTest, ReadsTorchrunVariables) {
  const DistributedEnvironment env =
      ParseFrom({{"RANK", "3"},
                 {"WORLD_SIZE", "4"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "10.1.2.3"},
                 {"MASTER_PORT", "1234"},
                 {"ACCEL_RUN_SECRET", "s3cret"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(env.run_secret, "s3cret");
  EXPECT_EQ(env.restart_count, 2);
}

TEST(EnvironmentTest, ASecretOrJobIdTooLongForTheStoreIsRefusedAtOnce) {
  const std::map<std::string, std::string> base = {{"RANK", "0"},
                                                   {"WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "h"},
                                                   {"MASTER_PORT", "5"}};
  auto with = [&](const char* name, std::string value) {
    auto vars = base;
    vars[name] = std::move(value);
    return ErrorFrom(vars);
  };
  EXPECT_EQ(with("ACCEL_RUN_SECRET", std::string(1024, 's')), "no error");
  EXPECT_EQ(with("ACCEL_RUN_SECRET", std::string(5000, 's')),
            "environment variable ACCEL_RUN_SECRET is 5000 bytes long; at "
            "most 1024 are allowed");
  EXPECT_THAT(with("ACCEL_JOB_ID", std::string(300, 'j')),
              HasSubstr("ACCEL_JOB_ID is 300 bytes long; at most 256"));
  // Alone (no launch variables) as in a job.
  EXPECT_THAT(ErrorFrom({{"ACCEL_RUN_SECRET", std::string(5000, 's')}}),
              HasSubstr("ACCEL_RUN_SECRET is 5000 bytes long"));
  EXPECT_THAT(ErrorFrom({{"OMP_NUM_THREADS", "abc"}}),
              HasSubstr("OMP_NUM_THREADS must be a number of threads"));
  EXPECT_EQ(ErrorFrom({{"OMP_NUM_THREADS", "4,2"}}), "no error");
  EXPECT_THAT(with("ACCEL_STORE_LISTEN_FD", "-3"),
              HasSubstr("ACCEL_STORE_LISTEN_FD must not be negative"));
  EXPECT_THAT(with("ACCEL_STORE_LISTEN_FD", "three"),
              HasSubstr("ACCEL_STORE_LISTEN_FD must be an integer"));
}

TEST(EnvironmentTest, LocalValuesDefaultToGlobalOnes) {
  const DistributedEnvironment env = ParseFrom({{"RANK", "1"},
                                                {"WORLD_SIZE", "2"},
                                                {"MASTER_ADDR", "h"},
                                                {"MASTER_PORT", "5"}});
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
}

TEST(EnvironmentTest, RankOutOfRangeIsAClearError) {
  EXPECT_EQ(ErrorFrom({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "RANK must be in [0, WORLD_SIZE) = [0, 2), found 2");
  EXPECT_EQ(ErrorFrom({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
            "RANK must be in [0, WORLD_SIZE) = [0, 2), found -1");
  EXPECT_EQ(ErrorFrom({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "WORLD_SIZE must be at least 1, found 0");
}

TEST(EnvironmentTest, MissingOrMalformedVariablesAreNamed) {
  EXPECT_THAT(ErrorFrom({{"WORLD_SIZE", "2"}}),
              HasSubstr("(found WORLD_SIZE=2) but RANK is missing"));
  EXPECT_THAT(ErrorFrom({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
              HasSubstr("MASTER_ADDR is missing"));
  EXPECT_THAT(
      ErrorFrom({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
      HasSubstr("MASTER_PORT is missing"));
  EXPECT_EQ(ErrorFrom({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
            "environment variable RANK must be an integer, found 'one'");
  EXPECT_EQ(ErrorFrom({{"RANK", "0"},
                       {"WORLD_SIZE", "2"},
                       {"MASTER_ADDR", "h"},
                       {"MASTER_PORT", "70000"}}),
            "MASTER_PORT must be in [1, 65535], found 70000");
  EXPECT_THAT(ErrorFrom({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "2"},
                         {"LOCAL_WORLD_SIZE", "2"}}),
              HasSubstr("LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE)"));
}

TEST(EnvironmentTest, TorchrunsDefaultModeUsesTheAgentStore) {
  const DistributedEnvironment env =
      ParseFrom({{"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"GROUP_RANK", "0"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29777"},
                 {"TORCHELASTIC_RUN_ID", "none"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_EQ(env.engine, "torchrun");
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(env.job_id, "torchrun-none");
  EXPECT_FALSE(ParseFrom({{"RANK", "0"},
                          {"WORLD_SIZE", "1"},
                          {"TORCHELASTIC_USE_AGENT_STORE", "False"}})
                   .use_agent_store);
}

TEST(EnvironmentTest, AccelsOwnVariables) {
  const DistributedEnvironment env =
      ParseFrom({{"RANK", "0"},
                 {"WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "h"},
                 {"MASTER_PORT", "5"},
                 {"ACCEL_JOB_ID", "j1"},
                 {"ACCEL_STORE_LISTEN_FD", "7"}});
  EXPECT_EQ(env.job_id, "j1");
  EXPECT_EQ(env.store_listen_fd, 7);
}

// What srun sets for task 2 of `srun -N 2 -n 4` (two per node).
std::map<std::string, std::string> SrunTask2() {
  return {{"SLURM_PROCID", "2"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_NUM_TASKS", "4"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "1"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_NODELIST", "node[07-08]"},
          {"SLURM_STEP_NODELIST", "node[07-08]"},
          {"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_ID", "0"}};
}

TEST(EnvironmentTest, ReadsSrunsVariables) {
  const DistributedEnvironment env = ParseFrom(SrunTask2());
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.engine, "SLURM");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.machine_rank, 1);
  EXPECT_EQ(env.master_addr, "node07");      // The first host.
  EXPECT_EQ(env.master_port, 15000 + 3456);  // As Lightning derives it.
  EXPECT_EQ(env.job_id, "slurm-123456.0");
}

TEST(EnvironmentTest, MasterVariablesOverrideWhatSlurmImplies) {
  auto vars = SrunTask2();
  vars["MASTER_ADDR"] = "10.0.0.1";
  vars["MASTER_PORT"] = "4000";
  const DistributedEnvironment env = ParseFrom(vars);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 4000);
}

TEST(EnvironmentTest, ABatchScriptIsOneProcessWithAWarning) {
  // sbatch -n 2: the batch script sees the allocation but is not a task.
  const DistributedEnvironment env = ParseFrom({{"SLURM_PROCID", "0"},
                                                {"SLURM_NTASKS", "2"},
                                                {"SLURM_LOCALID", "0"},
                                                {"SLURM_NODEID", "0"},
                                                {"SLURM_JOB_ID", "5"},
                                                {"SLURM_JOB_NODELIST", "vm"}});
  EXPECT_FALSE(env.launched);
  ASSERT_EQ(env.warnings.size(), 1u);
  EXPECT_THAT(env.warnings[0], HasSubstr("SLURM allocated 2 tasks"));
  EXPECT_THAT(env.warnings[0], HasSubstr("srun"));
  auto batch = SrunTask2();
  batch["SLURM_STEP_ID"] = "4294967294";  // SLURM_BATCH_SCRIPT
  EXPECT_FALSE(ParseFrom(batch).launched);
}

TEST(EnvironmentTest, PartialSlurmVariablesNameFoundAndMissing) {
  auto vars = SrunTask2();
  vars.erase("SLURM_LOCALID");
  vars.erase("SLURM_NODEID");
  const std::string error = ErrorFrom(vars);
  EXPECT_THAT(error, HasSubstr("started by SLURM's srun"));
  EXPECT_THAT(error, HasSubstr("SLURM_PROCID=2"));
  EXPECT_THAT(error, HasSubstr("SLURM_LOCALID, SLURM_NODEID are missing"));
  EXPECT_THAT(ErrorFrom({{"SLURM_STEP_ID", "0"}}),
              HasSubstr("found SLURM_STEP_ID=0"));
}

TEST(EnvironmentTest, SlurmRankOutOfRangeNamesTheVariable) {
  auto vars = SrunTask2();
  vars["SLURM_PROCID"] = "4";
  EXPECT_EQ(ErrorFrom(vars),
            "SLURM_PROCID must be in [0, SLURM_NTASKS) = [0, 4), found 4");
}

std::map<std::string, std::string> MpirunRank1() {
  return {{"OMPI_COMM_WORLD_RANK", "1"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
          {"OMPI_MCA_ess_base_jobid", "1427243009"}};
}

TEST(EnvironmentTest, ReadsOpenMpiOnOneHostWithoutOtherVariables) {
  const DistributedEnvironment env = ParseFrom(MpirunRank1());
  EXPECT_EQ(env.engine, "Open MPI");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 15000 + 3009);
  EXPECT_EQ(env.job_id, "ompi-1427243009");
}

TEST(EnvironmentTest, OpenMpiAcrossHostsNeedsMasterAddr) {
  auto vars = MpirunRank1();
  vars["OMPI_COMM_WORLD_SIZE"] = "4";
  EXPECT_THAT(ErrorFrom(vars), HasSubstr("set MASTER_ADDR"));
  EXPECT_THAT(ErrorFrom(vars), HasSubstr("mpirun -x MASTER_ADDR"));
  vars["MASTER_ADDR"] = "host0";
  EXPECT_EQ(ParseFrom(vars).master_addr, "host0");
  EXPECT_EQ(ParseFrom(vars).machine_rank, 0);
}

TEST(EnvironmentTest, PartialOpenMpiVariablesNameFoundAndMissing) {
  const std::string error = ErrorFrom({{"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_THAT(error, HasSubstr("started by Open MPI's mpirun"));
  EXPECT_THAT(error, HasSubstr("found OMPI_COMM_WORLD_RANK=0"));
  EXPECT_THAT(error, HasSubstr("OMPI_COMM_WORLD_SIZE, "
                               "OMPI_COMM_WORLD_LOCAL_RANK, "
                               "OMPI_COMM_WORLD_LOCAL_SIZE are missing"));
}

TEST(EnvironmentTest, ReadsPmi) {
  const DistributedEnvironment env = ParseFrom({{"PMI_RANK", "2"},
                                                {"PMI_SIZE", "3"},
                                                {"MPI_LOCALRANKID", "2"},
                                                {"MPI_LOCALNRANKS", "3"}});
  EXPECT_EQ(env.engine, "PMI");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_THAT(ErrorFrom({{"PMI_SIZE", "3"}}), HasSubstr("PMI_RANK is missing"));
  EXPECT_THAT(ErrorFrom({{"PMI_RANK", "0"},
                         {"PMI_SIZE", "3"},
                         {"MPI_LOCALRANKID", "0"},
                         {"MPI_LOCALNRANKS", "1"}}),
              HasSubstr("set MASTER_ADDR"));
  // Without MPI_LOCALNRANKS the ranks are taken to share this host.
  EXPECT_EQ(ParseFrom({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}}).master_addr,
            "127.0.0.1");
}

TEST(EnvironmentTest, EnginesAreTriedInTheDocumentedOrder) {
  // mpirun inside an srun step: Open MPI's variables are this process's.
  auto vars = SrunTask2();
  for (const auto& [name, value] : MpirunRank1()) vars[name] = value;
  EXPECT_EQ(ParseFrom(vars).engine, "Open MPI");
  // Explicit torchrun-style variables beat every engine.
  vars["RANK"] = "0";
  vars["WORLD_SIZE"] = "1";
  EXPECT_EQ(ParseFrom(vars).engine, "RANK/WORLD_SIZE");
  EXPECT_EQ(ParseFrom(vars).world_size, 1);
}

}  // namespace
}  // namespace accel
