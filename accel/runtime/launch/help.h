// --help for accel programs: the program's own flags and accel's, short,
// on stdout, exit code 0, instead of gflags' 300 lines of LibTorch flags.
//
//   int main(int argc, char** argv) {
//     accel::InitProgram(&argc, &argv);  // calls PrintHelpAndExitIfAsked
//
//   $ train_demo --help
//   Usage: train_demo [flags]
//
//   Flags of train_demo (examples/train_demo.cc):
//     --epochs=3  Passes over the data.
//   ...
//
// A program's flags are those defined outside accel and outside the
// libraries it links (whose flags gflags records with a "./" path, or in
// gflags itself); --helpfull still lists everything.
#pragma once

#include <set>
#include <string>

namespace accel {

// When argv asks for help (--help, -help, -h, --helpshort), prints it and
// exits 0. With `only`, lists just those flags (a tool such as the
// launcher that accepts a few of the flags linked into it).
void PrintHelpAndExitIfAsked(int argc, char** argv,
                             const std::set<std::string>* only = nullptr);

// The flag among `known` closest to `name` (a misspelling: at most two
// letters, or a third of them, off), or "" when none is that close.
std::string ClosestFlag(const std::string& name,
                        const std::set<std::string>& known);

// Before gflags parses: a flag the program does not define, among the
// arguments before `--`, is one line on stderr and exit code 2, with the
// flag it resembles ("train_demo has no flag --epoch (did you mean
// --epochs?)"), instead of gflags' bare "unknown command line flag"; so is
// a value of the wrong type ("--num_processes=abc is not an integer ...").
// `known`: the flags this program takes (all registered ones when null).
void RejectUnknownFlags(int argc, char** argv,
                        const std::set<std::string>* known = nullptr);

// argv[0] without its folder ("accel-launch" installed, "launch" under
// bazel), for usage lines.
std::string ProgramName(const char* argv0);

}  // namespace accel
