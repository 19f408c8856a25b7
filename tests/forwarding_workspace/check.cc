// Prints the flag accel defines, read through this workspace's gflags.
#include <gflags/gflags.h>

#include <cstdio>

#include "accel/accelerator.h"

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  std::printf("forwarding check: --num_processes=%d through @gflags\n",
              accel::flags::num_processes.value());
  return 0;
}
