// A program may own any of accel's flag names, and flags given on the
// command line or in the launch configuration take effect on
// AcceleratorOptions built by hand, or a warning says what overrode them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/subprocess.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const auto kTimeout = std::chrono::seconds(60);

ProcessResult RunProgram(std::vector<std::string> args) {
  args.insert(args.begin(), Runfile("tests/own_flags_program"));
  args.push_back("--main_process_port=0");
  return RunProcess(args, {}, kTimeout);
}

TEST(ProgramFlagsTest, AProgramOwnsAccelsFlagNamesAndTheValuesReachAccel) {
  const std::string logs = MakeTempDir("logs");
  const ProcessResult r = RunProgram(
      {"--num_processes=2", "--gradient_accumulation_steps=4",
       "--mixed_precision=bf16", "--report_to=jsonl", "--logging_dir=" + logs});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("accelerator: gradient_accumulation_steps 4 "
                        "mixed_precision bf16 trackers 1 on 2 process(es); "
                        "program: gradient_accumulation_steps 4 "
                        "mixed_precision bf16 report_to jsonl"));
  EXPECT_THAT(r.output, Not(HasSubstr("warning")));
}

// The program's --report_to defaults to "all" (as Accelerate's scripts):
// not given, it is the program's alone, and accel starts no tracker (it
// stopped with "tracker 'jsonl' ... needs a logging directory").
TEST(ProgramFlagsTest, AProgramsOwnDefaultIsNotAccels) {
  for (const char* options : {"--from_flags", "--nofrom_flags"}) {
    const ProcessResult r = RunProgram({"--num_processes=2", options});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output,
                HasSubstr("accelerator: gradient_accumulation_steps 1 "
                          "mixed_precision no trackers 0 on 2 process(es); "
                          "program: gradient_accumulation_steps 1 "
                          "mixed_precision no report_to all"));
  }
  // Given, it is accel's too.
  const ProcessResult given = RunProgram({"--from_flags", "--report_to=jsonl",
                                          "--logging_dir=" + MakeTempDir("l")});
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_THAT(given.output, HasSubstr("trackers 1 on 1 process(es)"));
}

// Accelerate's deepspeed.yaml with a DeepSpeed JSON: its fp16 and
// accumulation apply (fp16 was ignored: "Mixed precision type: no"), and
// decide over the command line with a warning, as Accelerate's launcher
// (a --gradient_accumulation_steps=2 silently beat the JSON's 1).
TEST(ProgramFlagsTest, ADeepSpeedJsonDecidesOverTheCommandLine) {
  const std::string dir = MakeTempDir("deepspeed");
  std::ofstream(dir + "/ds.json")
      << R"({"zero_optimization": {"stage": 0}, "fp16": {"enabled": true},
             "gradient_accumulation_steps": 1, "gradient_clipping": 1.0})";
  std::ofstream(dir + "/deepspeed.yaml") << "distributed_type: DEEPSPEED\n"
                                            "deepspeed_config:\n"
                                            "  deepspeed_config_file: ds.json\n"
                                            "num_processes: 2\n";
  // The program under the YAML above with one more flag.
  const auto run_with = [&dir](const std::string& flag) {
    return RunProgram(
        {"--config_file=" + dir + "/deepspeed.yaml", "--from_flags", flag});
  };
  const ProcessResult r = run_with("--gradient_accumulation_steps=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("accelerator: gradient_accumulation_steps 1 "
                        "mixed_precision fp16 trackers 0 on 2 process(es)"));
  const std::string warning =
      "--gradient_accumulation_steps=2 (the command line) gives way to 1 "
      "from " +
      dir + "/ds.json: DeepSpeed's configuration decides it";
  EXPECT_THAT(r.output, HasSubstr(warning));
  EXPECT_EQ(r.output.find(warning), r.output.rfind(warning));  // Once.
  // Each setting the JSON decides is named, once (the accumulation and
  // clipping were applied without a word).
  const size_t note = r.output.find("accel: note: --");
  ASSERT_NE(note, std::string::npos) << r.output;
  const std::string line =
      r.output.substr(note, r.output.find('\n', note) - note);
  for (const char* setting :
       {"--zero_stage=0 ", "--mixed_precision=fp16 ",
        "--gradient_accumulation_steps=1 ", "--gradient_clipping=1"}) {
    EXPECT_THAT(line, HasSubstr(setting));
  }
  EXPECT_THAT(line, HasSubstr(" from " + dir + "/ds.json"));
  EXPECT_EQ(note, r.output.rfind("accel: note: --"));  // Once.
  // Another precision than the JSON's is refused, as Accelerate refuses it
  // (it was a warning, and the run went on in fp16).
  const ProcessResult bf16 = run_with("--mixed_precision=bf16");
  EXPECT_EQ(bf16.exit_code, 2) << bf16.output;
  EXPECT_THAT(bf16.output,
              HasSubstr("--mixed_precision=bf16 (the command line) disagrees "
                        "with " +
                        dir + "/ds.json, which enables fp16: give one"));
}

TEST(ProgramFlagsTest, TheLaunchConfigurationReachesHandBuiltOptions) {
  const std::string dir = MakeTempDir("config");
  std::ofstream(dir + "/job.flags") << "--num_processes=2\n"
                                       "--mixed_precision=bf16\n"
                                       "--gradient_accumulation_steps=3\n";
  const ProcessResult r = RunProgram({"--config_file=" + dir + "/job.flags"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("accelerator: gradient_accumulation_steps 3 "
                        "mixed_precision bf16 trackers 0 on 2 process(es)"));
}

TEST(ProgramFlagsTest, AnOptionTheProgramSetsWinsAndTheMainProcessSaysSo) {
  const ProcessResult r =
      RunProgram({"--num_processes=2", "--mixed_precision=bf16",
                  "--options_mixed_precision=fp16"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("mixed_precision fp16"));
  const std::string warning =
      "accel: warning: [rank 0/2] the program's AcceleratorOptions override "
      "what was given: "
      "--mixed_precision=\"bf16\" (the command line) by mixed_precision = "
      "\"fp16\". To let the command line decide, start from "
      "AcceleratorOptions::FromFlags()";
  EXPECT_THAT(r.output, HasSubstr(warning)) << r.output;
  // Once, from the main process.
  EXPECT_THAT(r.output, Not(HasSubstr("[rank 1/2] the program's")));
  EXPECT_EQ(r.output.find(warning), r.output.rfind(warning));
}

// The deprecated FLAGS_ spellings of accel's flags compile and hold the
// values given (two of fourteen earlier outside ports stopped compiling).
TEST(ProgramFlagsTest, TheOldFlagSpellingsStillWork) {
  const ProcessResult given = RunProcess(
      {Runfile("tests/legacy_flags_program"), "--mixed_precision=bf16",
       "--gradient_accumulation_steps=3", "--nocollective_checks",
       "--report_to=none", "--timeout_s=40"},
      {}, kTimeout);
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_THAT(given.output,
              HasSubstr("legacy: num_processes 1 mixed_precision bf16 "
                        "gradient_accumulation_steps 3 collective_checks 0 "
                        "report_to 'none' timeout_s 40"));
  EXPECT_THAT(given.output, HasSubstr("accelerator: mixed_precision bf16 "
                                      "gradient_accumulation_steps 3"));
  const ProcessResult defaults =
      RunProcess({Runfile("tests/legacy_flags_program")}, {}, kTimeout);
  ASSERT_EQ(defaults.exit_code, 0) << defaults.output;
  EXPECT_THAT(defaults.output,
              HasSubstr("legacy: num_processes 1 mixed_precision no "
                        "gradient_accumulation_steps 1 collective_checks 1 "
                        "report_to '' timeout_s 300"));
}

}  // namespace
}  // namespace accel::testing
