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

}  // namespace accel
