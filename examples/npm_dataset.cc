#include "examples/npm_dataset.h"

#include <cstdlib>
#include <fstream>

#include "accel/runtime/base/errors.h"

namespace accel_examples {
namespace {

std::string PackageData(const NpmDataset& dataset) {
  return std::string(kNpmDataPrefix) + "/node_modules/" + dataset.package +
         "/data";
}

bool HoldsMarker(const NpmDataset& dataset, const std::string& dir) {
  std::ifstream probe(dir + "/" + dataset.marker);
  return probe.good();
}

}  // namespace

std::string FindNpmDataset(const NpmDataset& dataset, const std::string& dir) {
  const char* env = std::getenv(dataset.env);
  const std::string given = !dir.empty() ? dir : (env != nullptr ? env : "");
  if (!given.empty()) {
    if (!HoldsMarker(dataset, given)) {
      throw accel::UsageError((!dir.empty() ? std::string("--data_dir=")
                                            : std::string(dataset.env) + "=") +
                              given + " holds no " + dataset.title + " (no " +
                              dataset.marker +
                              "); name the package's data folder (" +
                              PackageData(dataset) + " when installed)");
    }
    return given;
  }
  const std::string installed = PackageData(dataset);
  if (HoldsMarker(dataset, installed)) return installed;
  throw accel::UsageError(
      "the " + std::string(dataset.title) + " is not installed (no " +
      installed + "); run tools/setup.sh, or: npm install --prefix " +
      kNpmDataPrefix + " " + dataset.package + "@" + dataset.version);
}

}  // namespace accel_examples
