// Small values in LibTorch archives, read with checkpoint errors, and the
// save/load pair of a stateful object as bytes.
//
//   void MyScheduler::load(torch::serialize::InputArchive& archive) {
//     step_ = accel::ReadArchiveValue<int64_t>(archive, "MyScheduler", "step");
//   }
//
//   std::string bytes = accel::SaveStateToBytes(scaler);  // scaler.save(...)
//   accel::LoadStateFromBytes(other_scaler, bytes);       // other.load(...)
//
// A missing key or a value of another type is a CheckpointError naming the
// owner and the key ("GradScaler state has no 'scale'"), instead of the
// c10::Error LibTorch throws.
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {

// T is bool, int64_t, double, std::string, std::vector<int64_t> or
// std::vector<double>.
template <typename T>
T ReadArchiveValue(torch::serialize::InputArchive& archive,
                   const std::string& owner, const std::string& key) {
  c10::IValue value;
  try {
    if (!archive.try_read(key, value)) {
      throw CheckpointError(owner + " state has no '" + key + "'");
    }
    if constexpr (std::is_same_v<T, bool>) {
      return value.toBool();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      return value.toInt();
    } else if constexpr (std::is_same_v<T, double>) {
      return value.toDouble();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      return value.toIntVector();
    } else if constexpr (std::is_same_v<T, std::string>) {
      return value.toStringRef();
    } else {
      static_assert(std::is_same_v<T, std::vector<double>>,
                    "ReadArchiveValue reads bool, int64_t, double, "
                    "std::string, std::vector<int64_t> or "
                    "std::vector<double>");
      return value.toDoubleVector();
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(owner + " state: cannot read '" + key +
                          "': " + e.what_without_backtrace());
  }
}

// `object.save(archive)`, as the bytes of a LibTorch archive.
template <typename Stateful>
std::string SaveStateToBytes(const Stateful& object) {
  torch::serialize::OutputArchive archive;
  object.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

// `object.load(archive)` from bytes of SaveStateToBytes; CheckpointError
// when they are not an archive.
template <typename Stateful>
void LoadStateFromBytes(Stateful& object, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  try {
    archive.load_from(in);
  } catch (const c10::Error& e) {
    throw CheckpointError(std::string("not a LibTorch archive: ") +
                          e.what_without_backtrace());
  }
  object.load(archive);
}

}  // namespace accel
