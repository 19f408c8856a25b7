// One file of a checkpoint: a LibTorch archive in an envelope that says what
// the file is and lets a reader prove it is intact.
//
//   CheckpointIdentity id{run, step, "random_states_1"};
//   WriteCheckpointFile(dir + "/random_states_1.pt", id, archive);
//   CheckpointFileContents file = ReadCheckpointFile(path, "random_states_1");
//   file.identity.run == state.identity.run;   // the same save?
//
// Layout: the 8 bytes "ACCELCKP", a little-endian u32 format version, u32
// length of the identity text, u64 length of the archive, u64 checksum
// (FNV-1a over the identity text and the archive: any single changed byte
// changes it), the identity text ("role=...\nrun=...\nstep=...\n"), then the
// archive's bytes. A reader checks all of it before LibTorch parses a byte,
// so a corrupt, truncated or foreign file is a CheckpointError that names
// it, never a crash or silently different values.
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <memory>
#include <string>

namespace accel {

struct CheckpointIdentity {
  std::string run;  // The run that saved it (random, shared by its ranks).
  int64_t step = 0;
  std::string role;  // "accelerator_state" or "random_states_<rank>".
};

// Writes aside, flushes and renames into place (see files.h); a failure
// removes what it wrote and names the file and the system's reason.
void WriteCheckpointFile(const std::string& path,
                         const CheckpointIdentity& identity,
                         torch::serialize::OutputArchive& archive);

struct CheckpointFileContents {
  CheckpointIdentity identity;
  std::unique_ptr<torch::serialize::InputArchive> archive;
};

// Reads and verifies a file written by WriteCheckpointFile whose role must
// be `role`.
CheckpointFileContents ReadCheckpointFile(const std::string& path,
                                          const std::string& role);

// Checks the envelope only (size, checksum, role), without parsing the
// archive: what choosing a checkpoint to resume from needs.
CheckpointIdentity VerifyCheckpointFile(const std::string& path,
                                        const std::string& role);

}  // namespace accel
