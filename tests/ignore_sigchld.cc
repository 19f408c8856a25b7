// Runs a program with SIGCHLD ignored, as a parent that ignores it (a
// Python script's signal(SIGCHLD, SIG_IGN), some daemons) leaves it across
// exec:
//
//   ignore_sigchld /path/to/program --flag ...
#include <signal.h>
#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ignore_sigchld PROGRAM [ARGS...]\n");
    return 2;
  }
  signal(SIGCHLD, SIG_IGN);
  execv(argv[1], argv + 1);
  std::perror("ignore_sigchld: execv");
  return 127;
}
