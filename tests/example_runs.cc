// What the examples' end-to-end tests share (example_runs.h).
#include "tests/example_runs.h"

#include <sys/stat.h>

#include <regex>
#include <utility>

#include "accel/checkpoint/model_weights.h"

namespace accel::testing {

ProcessResult RunExample(const std::string& name,
                         std::vector<std::string> args) {
  args.insert(args.begin(), Runfile("examples/" + name));
  args.push_back("--main_process_port=0");
  return RunProcess(args, {}, kTimeout);
}

std::vector<std::string> Matches(const std::string& text,
                                 const std::string& pattern) {
  std::vector<std::string> found;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re);
       it != std::sregex_iterator(); ++it) {
    found.push_back(it->str());
  }
  return found;
}

std::string Fingerprint(const ProcessResult& r) {
  const auto found = Matches(r.output, "Parameter fingerprint: [0-9a-f]+");
  return found.size() == 1 ? found[0] : "missing in:\n" + r.output;
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

std::map<std::string, torch::Tensor> Weights(const std::string& dir) {
  return LoadModelWeights(dir + "/model");
}

}  // namespace accel::testing
