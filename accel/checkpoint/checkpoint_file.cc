#include "accel/checkpoint/checkpoint_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel {
namespace {

constexpr char kMagic[8] = {'A', 'C', 'C', 'E', 'L', 'C', 'K', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
// Identity texts are a few dozen bytes; anything larger is corruption.
constexpr uint32_t kMaxIdentityBytes = 4096;

uint64_t Fnv1a(const std::string& bytes,
               uint64_t hash = 1469598103934665603ull) {
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

template <typename T>
void Put(std::string* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

template <typename T>
T Get(const std::string& bytes, size_t offset) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(bytes[offset + i]))
             << (8 * i);
  }
  return value;
}

std::string EncodeIdentity(const CheckpointIdentity& id) {
  return "role=" + id.role + "\nrun=" + id.run +
         "\nstep=" + std::to_string(id.step) + "\n";
}

CheckpointIdentity DecodeIdentity(const std::string& text,
                                  const std::string& path) {
  CheckpointIdentity id;
  std::istringstream lines(text);
  std::string line;
  bool has_role = false, has_run = false, has_step = false;
  while (std::getline(lines, line)) {
    const size_t eq = line.find('=');
    const std::string key = line.substr(0, eq);
    const std::string value =
        eq == std::string::npos ? "" : line.substr(eq + 1);
    if (key == "role") {
      id.role = value;
      has_role = true;
    } else if (key == "run") {
      id.run = value;
      has_run = true;
    } else if (key == "step") {
      try {
        id.step = std::stoll(value);
        has_step = true;
      } catch (const std::exception&) {
      }
    }
  }
  if (!has_role || !has_run || !has_step) {
    throw CheckpointError("'" + path + "' has an unreadable identity");
  }
  return id;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw CheckpointError("cannot open '" + path +
                          "': " + std::strerror(errno));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    throw CheckpointError("cannot read '" + path +
                          "': " + std::strerror(errno));
  }
  return bytes.str();
}

// The identity and the archive's bytes of a verified file.
std::pair<CheckpointIdentity, std::string> Open(const std::string& path,
                                                const std::string& role) {
  const std::string bytes = ReadWholeFile(path);
  auto corrupt = [&](const std::string& why) {
    return CheckpointError("'" + path +
                           "' is corrupt or not an accel "
                           "checkpoint file (" +
                           why + ")");
  };
  if (bytes.size() < kHeaderBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    throw corrupt("no accel checkpoint header");
  }
  const uint32_t version = Get<uint32_t>(bytes, 8);
  if (version != kVersion) {
    throw CheckpointError("'" + path + "' has checkpoint file version " +
                          std::to_string(version) + "; this accel reads " +
                          std::to_string(kVersion));
  }
  const uint32_t identity_bytes = Get<uint32_t>(bytes, 12);
  const uint64_t archive_bytes = Get<uint64_t>(bytes, 16);
  const uint64_t checksum = Get<uint64_t>(bytes, 24);
  if (identity_bytes > kMaxIdentityBytes ||
      archive_bytes != bytes.size() - kHeaderBytes - identity_bytes) {
    throw corrupt(
        "its size is " + std::to_string(bytes.size()) +
        " bytes, its header says " +
        std::to_string(kHeaderBytes + identity_bytes + archive_bytes) +
        "; truncated or damaged");
  }
  const std::string identity_text = bytes.substr(kHeaderBytes, identity_bytes);
  std::string archive = bytes.substr(kHeaderBytes + identity_bytes);
  if (Fnv1a(archive, Fnv1a(identity_text)) != checksum) {
    throw corrupt(
        "checksum mismatch: the file was changed after it was "
        "written");
  }
  CheckpointIdentity identity = DecodeIdentity(identity_text, path);
  if (identity.role != role) {
    throw CheckpointError("'" + path + "' holds " + identity.role +
                          ", expected " + role +
                          " (files of a checkpoint were swapped or renamed)");
  }
  return {std::move(identity), std::move(archive)};
}

}  // namespace

void WriteCheckpointFile(const std::string& path,
                         const CheckpointIdentity& identity,
                         torch::serialize::OutputArchive& archive) {
  std::ostringstream payload;
  try {
    archive.save_to(payload);
  } catch (const std::exception&) {
    throw CheckpointError("cannot serialize '" + path +
                          "': " + DescribeException(std::current_exception()));
  }
  const std::string identity_text = EncodeIdentity(identity);
  const std::string archive_bytes = payload.str();
  std::string file(kMagic, sizeof(kMagic));
  Put<uint32_t>(&file, kVersion);
  Put<uint32_t>(&file, static_cast<uint32_t>(identity_text.size()));
  Put<uint64_t>(&file, archive_bytes.size());
  Put<uint64_t>(&file, Fnv1a(archive_bytes, Fnv1a(identity_text)));
  file += identity_text;
  file += archive_bytes;
  WriteFileAtomically(path, file);
}

CheckpointFileContents ReadCheckpointFile(const std::string& path,
                                          const std::string& role) {
  auto [identity, bytes] = Open(path, role);
  CheckpointFileContents contents;
  contents.identity = std::move(identity);
  contents.archive = std::make_unique<torch::serialize::InputArchive>();
  std::istringstream in(bytes);
  try {
    contents.archive->load_from(in);
  } catch (const std::exception&) {
    throw CheckpointError("'" + path + "' is not a LibTorch archive (" +
                          DescribeException(std::current_exception()) + ")");
  }
  return contents;
}

CheckpointIdentity VerifyCheckpointFile(const std::string& path,
                                        const std::string& role) {
  return Open(path, role).first;
}

}  // namespace accel
