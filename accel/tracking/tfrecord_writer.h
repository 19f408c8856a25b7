// TFRecord files, the framing of TensorBoard's event files: each record is
//
//   uint64 length | uint32 masked_crc32c(length) | data | uint32
//   masked_crc32c(data)
//
// little-endian, with CRC-32C (Castagnoli) masked as TensorFlow does
// (rotate right by 15, add 0xa282ead8) so that a CRC of data holding CRCs
// stays well distributed.
//
//   accel::TfRecordWriter writer(run_dir + "/events.out.tfevents.1.host");
//   writer.Write(event.SerializeAsString());  // one record, written through
//
//   accel::Crc32c("123456789") == 0xe3069283  // the standard check value
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "accel/tracking/append_file.h"

namespace accel {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `bytes`.
uint32_t Crc32c(std::string_view bytes);
// TFRecord's masked form of Crc32c(bytes).
uint32_t MaskedCrc32c(std::string_view bytes);

// One TFRecord frame holding `data`.
std::string TfRecordFrame(std::string_view data);

class TfRecordWriter {
 public:
  explicit TfRecordWriter(std::string path) : file_(std::move(path)) {}

  void Write(std::string_view data) { file_.Append(TfRecordFrame(data)); }
  void Close() { file_.Close(); }
  const std::string& path() const { return file_.path(); }

 private:
  AppendFile file_;
};

}  // namespace accel
