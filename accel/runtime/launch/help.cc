#include "accel/runtime/launch/help.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "accel/runtime/base/excerpt.h"

namespace accel {
namespace {

constexpr char kLogDirDescription[] =
    "Each rank's stdout and stderr also go to "
    "<log_dir>/attempt_<n>/rank_<r>/ (the console keeps a copy).";

bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return false;  // What follows is another program's.
    if (arg == "--help" || arg == "-help" || arg == "-h" ||
        arg == "--helpshort" || arg == "-helpshort") {
      return true;
    }
  }
  return false;
}

// Flags of the libraries a program links (LibTorch's c10 and JIT flags,
// glog's, gflags' own) rather than of the program or accel.
bool IsLibraryFlag(const gflags::CommandLineFlagInfo& flag) {
  return flag.filename.rfind("./", 0) == 0 ||
         flag.filename.find("gflags") != std::string::npos;
}

bool IsAccelFlag(const gflags::CommandLineFlagInfo& flag) {
  return flag.filename.rfind("accel/", 0) == 0 ||
         flag.filename.find("/accel/") != std::string::npos;
}

// What a value for a flag of gflags' `type` must be, when `value` is not
// one ("" when it is): as gflags reads it, integers in decimal or after
// 0x in hexadecimal.
std::string ExpectedValue(const std::string& type, const std::string& value) {
  if (type == "bool") {
    std::string word = value;
    for (char& c : word) c = static_cast<char>(std::tolower(c));
    for (const char* ok :
         {"1", "0", "t", "f", "true", "false", "y", "n", "yes", "no"}) {
      if (word == ok) return "";
    }
    return "true or false";
  }
  const bool integer = type == "int32" || type == "int64" || type == "uint32" ||
                       type == "uint64";
  if (!integer && type != "double") return "";  // A string.
  const char* text = value.c_str();
  char* end = nullptr;
  errno = 0;
  bool fits = true;
  if (type == "double") {
    std::strtod(text, &end);
  } else {
    const int base =
        value.rfind("0x", 0) == 0 || value.rfind("0X", 0) == 0 ? 16 : 10;
    if (type[0] == 'u') {
      const uintmax_t n = std::strtoumax(text, &end, base);
      fits = value.find('-') == std::string::npos &&
             (type == "uint64" || n <= UINT32_MAX);
    } else {
      const intmax_t n = std::strtoimax(text, &end, base);
      fits = type == "int64" || (n >= INT32_MIN && n <= INT32_MAX);
    }
  }
  if (!value.empty() && *end == '\0' && errno == 0 && fits) return "";
  if (type == "double") return "a number";
  return "an integer from " + std::string(type == "int32"
                                              ? "-2147483648 to 2147483647"
                                          : type == "uint32" ? "0 to 4294967295"
                                          : type == "int64"  ? "-2^63 to 2^63-1"
                                                             : "0 to 2^64-1");
}

// gflags would say "ERROR: illegal value" and exit 1.
void ExitIfNotA(const std::string& type, const std::string& program,
                const std::string& name, const std::string& value) {
  const std::string expected = ExpectedValue(type, value);
  if (expected.empty()) return;
  const std::string line = "error: " + program + ": --" + name + "=" + value +
                           " is not " + expected + "\n";
  std::fputs(line.c_str(), stderr);
  std::exit(2);
}

std::string Describe(const gflags::CommandLineFlagInfo& flag) {
  std::string value = flag.default_value;
  if (flag.type == "string") value = "\"" + value + "\"";
  std::string line = "  --" + flag.name + "=" + value;
  if (line.size() < 34) line += std::string(34 - line.size(), ' ');
  return line + "  " + flag.description + "\n";
}

}  // namespace

std::string ProgramName(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  return slash ? slash + 1 : argv0;
}

std::string ClosestFlag(const std::string& name,
                        const std::set<std::string>& known) {
  return ClosestName(name, known);
}

void RejectUnknownFlags(int argc, char** argv,
                        const std::set<std::string>* known) {
  std::set<std::string> all;
  if (known == nullptr) {
    std::vector<gflags::CommandLineFlagInfo> flags;
    gflags::GetAllFlags(&flags);
    for (const auto& flag : flags) all.insert(flag.name);
    known = &all;
  }
  const std::string program = ProgramName(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return;
    if (arg.size() < 2 || arg[0] != '-') continue;  // A value or argument.
    std::string name = arg.substr(arg.find_first_not_of('-'));
    const bool has_value = name.find('=') != std::string::npos;
    name = name.substr(0, name.find('='));
    if (known->count(name) != 0) {
      gflags::CommandLineFlagInfo info;
      if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) continue;
      // `--flag value`: the next argument is its value, whatever it looks
      // like (-0.5).
      if (!has_value) {
        // `--flag` alone is true for a bool; gflags names a missing value.
        if (info.type == "bool" || i + 1 >= argc) continue;
        ++i;
      }
      ExitIfNotA(info.type, program, name,
                 has_value ? arg.substr(arg.find('=') + 1) : argv[i]);
      continue;
    }
    if (name.rfind("no", 0) == 0 && known->count(name.substr(2)) != 0) {
      continue;
    }
    const std::string closest = ClosestFlag(name, *known);
    const std::string line =
        "error: " + program + " has no flag --" + name +
        (closest.empty() ? "" : " (did you mean --" + closest + "?)") + "; " +
        program + " --help lists its flags\n";
    std::fputs(line.c_str(), stderr);
    std::exit(2);
  }
}

void PrintHelpAndExitIfAsked(int argc, char** argv,
                             const std::set<std::string>* only) {
  if (!AsksForHelp(argc, argv)) return;
  const char* slash = std::strrchr(argv[0], '/');
  const std::string program = slash ? slash + 1 : argv[0];
  std::string usage = gflags::ProgramUsage();
  if (usage.find("SetUsageMessage() never called") != std::string::npos) {
    usage = program + " [flags]";
  }
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::map<std::string, std::string> own_by_file;
  std::string accel;
  for (auto& flag : flags) {
    if (flag.name == "log_dir" && IsLibraryFlag(flag)) {
      // glog's flag, which accel reuses for the ranks' logs.
      flag.description = kLogDirDescription;
    }
    if (only != nullptr) {
      if (only->count(flag.name) != 0) accel += Describe(flag);
    } else if (IsAccelFlag(flag)) {
      accel += Describe(flag);
    } else if (!IsLibraryFlag(flag)) {
      own_by_file[flag.filename] += Describe(flag);
    }
  }
  std::printf("Usage: %s\n", usage.c_str());
  for (const auto& [file, text] : own_by_file) {
    std::printf("\nFlags of %s (%s):\n%s", program.c_str(), file.c_str(),
                text.c_str());
  }
  gflags::CommandLineFlagInfo log_dir;
  if (only == nullptr && gflags::GetCommandLineFlagInfo("log_dir", &log_dir) &&
      IsLibraryFlag(log_dir)) {
    log_dir.description = kLogDirDescription;
    accel += Describe(log_dir);
  }
  if (!accel.empty()) {
    std::printf("\n%s:\n%s", only != nullptr ? "Flags" : "accel flags",
                accel.c_str());
  }
  std::printf(
      "\n--helpfull lists every flag, including those of the "
      "libraries %s links.\n",
      program.c_str());
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace accel
