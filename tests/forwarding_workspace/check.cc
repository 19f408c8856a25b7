// Prints the flag accel defines, read through this workspace's gflags.
#include <gflags/gflags.h>

#include <cstdio>

#include "accel/accelerator.h"
// A path of accel 0.1's flat accel/ folder: its forwarding header (deprecated
// until 0.2.0) must keep it working from another workspace too.
#include "accel/safetensors.h"

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  static_cast<void>(&accel::safetensors::LoadMetadata);
  std::printf("forwarding check: --num_processes=%d through @gflags\n",
              accel::flags::num_processes.value());
  return 0;
}
