// safetensors files: round trips of every dtype, Python reading ours and us
// reading Python's, and hundreds of corrupted files that must fail cleanly.
#include "accel/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "tests/subprocess.h"
#include "tests/tensor_files.h"

namespace accel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using testing::ExpectSameTensors;
using testing::ReadBytes;
using testing::SameBytes;
using testing::TensorMap;
using testing::WriteBytes;

std::string LengthPrefix(uint64_t length) {
  return std::string(reinterpret_cast<const char*>(&length), 8);
}

// One tensor of every dtype, plus the shapes that are easy to get wrong.
TensorMap EveryDtype() {
  torch::manual_seed(3);
  const auto values = torch::randn({2, 3}) * 100;
  TensorMap tensors = {
      {"f64", values.to(torch::kDouble)},
      {"f32", values},
      {"f16", values.to(torch::kHalf)},
      {"bf16", values.to(torch::kBFloat16)},
      {"i64", torch::tensor({std::numeric_limits<int64_t>::min(), int64_t{0},
                             std::numeric_limits<int64_t>::max()})},
      {"i32", values.to(torch::kInt)},
      {"i16", torch::tensor({-32768, 5, 32767}).to(torch::kShort)},
      {"i8", torch::tensor({-128, 0, 127}).to(torch::kChar)},
      {"u8", torch::tensor({0, 1, 255}).to(torch::kByte)},
      {"bool", torch::tensor({true, false, true, true})},
      {"scalar_f32", torch::tensor(2.5f)},
      {"scalar_bool", torch::tensor(true)},
      {"empty_f32", torch::zeros({0})},
      {"empty_3d_i64", torch::zeros({2, 0, 3}, torch::kLong)},
      {"transposed", values.t()},  // Not contiguous.
      {"name with spaces/and.dots", torch::ones({1}, torch::kShort)},
  };
  return tensors;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndShape) {
  const std::string path = testing::MakeTempDir("roundtrip") + "/t.safetensors";
  const TensorMap tensors = EveryDtype();
  safetensors::Save(tensors, path,
                    {{"format", "pt"}, {"note", "\xc3\xa9t\xc3\xa9"}});
  TensorMap loaded = safetensors::Load(path);
  TensorMap expected = tensors;
  expected["transposed"] = tensors.at("transposed").contiguous();
  ExpectSameTensors(loaded, expected);
  // The header alone gives the same dtypes and shapes.
  const auto infos = safetensors::LoadTensorInfo(path);
  ASSERT_EQ(infos.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    EXPECT_EQ(infos.at(name).dtype, tensor.scalar_type()) << name;
    EXPECT_EQ(infos.at(name).shape, tensor.sizes().vec()) << name;
    EXPECT_EQ(infos.at(name).numel(), tensor.numel()) << name;
  }
  EXPECT_EQ(safetensors::LoadMetadata(path),
            (std::map<std::string, std::string>{
                {"format", "pt"}, {"note", "\xc3\xa9t\xc3\xa9"}}));

  // Layout: the data starts at a multiple of 8, and every tensor is aligned
  // to its element size.
  const std::string bytes = ReadBytes(path);
  uint64_t length;
  std::memcpy(&length, bytes.data(), 8);
  EXPECT_EQ((8 + length) % 8, 0u);
  const Json header = Json::parse(bytes.substr(8, length));
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const uint64_t begin = info["data_offsets"][0];
    EXPECT_EQ(begin % tensors.at(name).element_size(), 0u) << name;
  }

  // No metadata: none written, none read.
  safetensors::Save({{"x", torch::ones({2})}}, path);
  EXPECT_TRUE(safetensors::LoadMetadata(path).empty());
  EXPECT_EQ(ReadBytes(path).find("__metadata__"), std::string::npos);
  safetensors::Save({}, path);
  EXPECT_TRUE(safetensors::Load(path).empty());
}

TEST(SafetensorsTest, SaveRejectsWhatTheFormatCannotHold) {
  const std::string dir = testing::MakeTempDir("save_errors");
  const std::string path = dir + "/t.safetensors";
  EXPECT_THAT(
      [&] {
        safetensors::Save({{"x", torch::Tensor()}}, path);
      },
      ::testing::ThrowsMessage<UsageError>(
          HasSubstr("tensor 'x' is undefined")));
  EXPECT_THAT(
      [&] {
        safetensors::Save({{"__metadata__", torch::ones({1})}}, path);
      },
      ::testing::ThrowsMessage<UsageError>(HasSubstr("reserved for metadata")));
  EXPECT_THAT(
      [&] {
        safetensors::Save({{"c", torch::ones({1}, torch::kComplexFloat)}},
                          path);
      },
      ::testing::ThrowsMessage<UsageError>(
          HasSubstr("has dtype ComplexFloat, which safetensors lacks")));
  EXPECT_THAT(
      [&] {
        safetensors::Save({{"s", torch::ones({2, 2}).to_sparse()}}, path);
      },
      ::testing::ThrowsMessage<UsageError>(HasSubstr("is not dense")));
  EXPECT_THAT(
      [&] {
        safetensors::Save({{"bad\xff", torch::ones({1})}}, path);
      },
      ::testing::ThrowsMessage<UsageError>(HasSubstr("not valid UTF-8")));
  EXPECT_THAT([&] { safetensors::Save({}, "/nonexistent-folder/t"); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("/nonexistent-folder/t")));
  EXPECT_THAT(ListFolder(dir), ::testing::IsEmpty());  // No partial files.
}

// Python (torch, json and struct only) reads our file and writes its own,
// which we read.
constexpr char kPythonCrossCheck[] = R"PY(
import json, struct, sys, torch
DT = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}

def describe(dtype_name, t):
    return {"dtype": dtype_name, "shape": list(t.shape),
            "values": t.double().flatten().tolist()}

raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert (8 + n) % 8 == 0, "data not aligned"
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
ours = {"metadata": header.pop("__metadata__", {}), "tensors": {}}
for name, info in header.items():
    begin, end = info["data_offsets"]
    dtype = DT[info["dtype"]]
    if begin == end:
        t = torch.empty(info["shape"], dtype=dtype)
    else:
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(info["shape"])
    ours["tensors"][name] = describe(info["dtype"], t)

# Another writer's choices: no padding, keys not in offset order, metadata last.
tensors = {
    "a_f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
    "b_i16": torch.tensor([-3, 7], dtype=torch.int16),
    "c_bool": torch.tensor([True, False, True]),
    "d_bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
    "e_scalar": torch.tensor(42, dtype=torch.int64),
    "f_empty": torch.zeros(0, 4, dtype=torch.float16),
    "g_u8": torch.tensor([[1, 2], [3, 250]], dtype=torch.uint8),
}
names = {v: k for k, v in DT.items()}
entries, chunks, offset = {}, [], 0
theirs = {}
for name, t in tensors.items():
    view = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    chunk = view.contiguous().numpy().tobytes()
    entries[name] = {"shape": list(t.shape), "data_offsets": [offset, offset + len(chunk)],
                     "dtype": names[t.dtype]}
    chunks.append(chunk)
    offset += len(chunk)
    theirs[name] = describe(names[t.dtype], t)
entries = dict(reversed(list(entries.items())))
entries["__metadata__"] = {"writer": "python"}
text = json.dumps(entries).encode("utf-8")
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
print(json.dumps({"ours": ours, "theirs": theirs}))
)PY";

void ExpectDescribed(const Json& description, const torch::Tensor& tensor,
                     const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(description["shape"].get<std::vector<int64_t>>(),
            tensor.sizes().vec());
  const torch::Tensor values = tensor.to(torch::kDouble).flatten();
  const auto expected = description["values"].get<std::vector<double>>();
  ASSERT_EQ(expected.size(), static_cast<size_t>(values.numel()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(values[i].item<double>(), expected[i]) << "element " << i;
  }
}

TEST(SafetensorsTest, PythonReadsOursAndWeReadPythons) {
  const std::string dir = testing::MakeTempDir("python");
  const std::string ours = dir + "/ours.safetensors";
  const std::string theirs = dir + "/theirs.safetensors";
  TensorMap tensors = EveryDtype();
  tensors["i64"] =
      torch::tensor({-5, 0, 1 << 30}, torch::kLong);  // Exact in a double.
  safetensors::Save(tensors, ours, {{"format", "pt"}});
  const testing::ProcessResult python = testing::RunProcess(
      {"/usr/bin/python3", "-c", kPythonCrossCheck, ours, theirs}, {},
      std::chrono::seconds(120));
  ASSERT_EQ(python.exit_code, 0) << python.output;
  const Json result =
      Json::parse(python.output.substr(python.output.find('{')));

  EXPECT_EQ(result["ours"]["metadata"], Json({{"format", "pt"}}));
  ASSERT_EQ(result["ours"]["tensors"].size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ExpectDescribed(result["ours"]["tensors"][name], tensor, name);
  }

  const TensorMap loaded = safetensors::Load(theirs);
  ASSERT_EQ(loaded.size(), result["theirs"].size());
  for (const auto& [name, description] : result["theirs"].items()) {
    ASSERT_EQ(loaded.count(name), 1u) << name;
    ExpectDescribed(description, loaded.at(name), name);
  }
  EXPECT_EQ(loaded.at("c_bool").scalar_type(), torch::kBool);
  EXPECT_EQ(loaded.at("d_bf16").scalar_type(), torch::kBFloat16);
  EXPECT_EQ(loaded.at("e_scalar").dim(), 0);
  EXPECT_EQ(safetensors::LoadMetadata(theirs).at("writer"), "python");
}

// A small file with a BOOL tensor, for corrupting.
struct Sample {
  Sample() : path(testing::MakeTempDir("corrupt") + "/sample.safetensors") {
    safetensors::Save(
        {{"weight", torch::arange(6, torch::kFloat).reshape({2, 3})},
         {"mask", torch::tensor({true, false, true})},
         {"step", torch::tensor(int64_t{7})}},
        path, {{"format", "pt"}});
    bytes = ReadBytes(path);
    std::memcpy(&header_length, bytes.data(), 8);
    header = Json::parse(bytes.substr(8, header_length));
  }
  uint64_t data_start() const { return 8 + header_length; }
  std::string path;
  std::string bytes;
  uint64_t header_length;
  Json header;
};

// Loads `bytes` as a file: true when it loads, false on CheckpointError.
// Anything else (another exception, a crash) fails the test.
bool Loads(const std::string& path, const std::string& bytes) {
  WriteBytes(path, bytes);
  try {
    const TensorMap tensors = safetensors::Load(path);
    safetensors::LoadMetadata(path);
    return true;
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    return false;
  }
}

TEST(SafetensorsCorruptionTest, EveryTruncationFails) {
  Sample sample;
  for (size_t length = 0; length < sample.bytes.size(); ++length) {
    EXPECT_FALSE(Loads(sample.path, sample.bytes.substr(0, length)))
        << "truncated to " << length;
  }
  WriteBytes(sample.path, "");
  EXPECT_THAT([&] { safetensors::Load(sample.path); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("the file has 0 bytes, fewer than the 8")));
  EXPECT_FALSE(Loads(sample.path, sample.bytes + '\0'));
  EXPECT_THAT(
      [&] { safetensors::Load(sample.path); },
      ::testing::ThrowsMessage<CheckpointError>(HasSubstr("(trailing bytes)")));
}

TEST(SafetensorsCorruptionTest, BadHeaderLengthsFail) {
  Sample sample;
  const uint64_t n = sample.header_length;
  const uint64_t file_size = sample.bytes.size();
  for (uint64_t length :
       {uint64_t{0}, uint64_t{1}, n - 1, n + 1, n + 8, file_size - 8,
        file_size - 7, file_size, uint64_t{1} << 40, uint64_t{1} << 63,
        std::numeric_limits<uint64_t>::max()}) {
    EXPECT_FALSE(
        Loads(sample.path, LengthPrefix(length) + sample.bytes.substr(8)))
        << "header length " << length;
  }
  // A header length beyond the file is caught before any allocation.
  WriteBytes(sample.path, LengthPrefix(std::numeric_limits<uint64_t>::max()) +
                              sample.bytes.substr(8));
  EXPECT_THAT([&] { safetensors::Load(sample.path); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("header length 18446744073709551615 exceeds")));
}

TEST(SafetensorsCorruptionTest, HeaderByteFlipsLoadOrFailCleanly) {
  Sample sample;
  int variants = 0, rejected = 0;
  for (uint64_t i = 8; i < sample.data_start(); ++i) {
    for (unsigned char mask : {0x01, 0x08, 0x20, 0x80, 0xFF}) {
      std::string bytes = sample.bytes;
      bytes[i] = static_cast<char>(bytes[i] ^ mask);
      ++variants;
      if (!Loads(sample.path, bytes)) ++rejected;
    }
  }
  // Some flips only rename a tensor or change metadata text, which is
  // still a valid file; anything structural must be rejected.
  std::cout << rejected << " of " << variants << " header flips rejected\n";
  EXPECT_GT(rejected, variants * 3 / 4);
}

TEST(SafetensorsCorruptionTest, DataByteFlipsChangeValuesOrFailForBool) {
  Sample sample;
  const uint64_t mask_begin = sample.header["mask"]["data_offsets"][0];
  const uint64_t mask_end = sample.header["mask"]["data_offsets"][1];
  const TensorMap original = safetensors::Load(sample.path);
  for (uint64_t i = sample.data_start(); i < sample.bytes.size(); ++i) {
    std::string bytes = sample.bytes;
    bytes[i] = static_cast<char>(bytes[i] ^ 0xFF);
    const uint64_t offset = i - sample.data_start();
    const bool in_mask = offset >= mask_begin && offset < mask_end;
    EXPECT_EQ(Loads(sample.path, bytes), !in_mask) << "data byte " << offset;
    if (in_mask) {
      EXPECT_THAT([&] { safetensors::Load(sample.path); },
                  ::testing::ThrowsMessage<CheckpointError>(HasSubstr(
                      "BOOL tensor 'mask' holds bytes other than 0 and 1")));
    } else {
      // Exactly one tensor differs.
      const TensorMap loaded = safetensors::Load(sample.path);
      int differing = 0;
      for (const auto& [name, tensor] : original) {
        differing += SameBytes(loaded.at(name), tensor) ? 0 : 1;
      }
      EXPECT_EQ(differing, 1) << "data byte " << offset;
    }
  }
}

// A file with the given header text and data bytes, length computed.
std::string RawFile(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

TEST(SafetensorsCorruptionTest, EachDefectIsNamed) {
  Sample sample;
  const std::string data12(12, '\0');  // Room for 3 floats.
  const std::string f32 = R"("dtype": "F32", "shape": [3])";
  struct Case {
    std::string header;
    std::string data;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"([1, 2])", "", "does not start with '{'"},
      {R"( {"a": 1})", "", "does not start with '{'"},
      {R"({"a": )", "", "the header is not valid JSON"},
      {"{\"a\xff\": {}}", "", "the header is not valid JSON"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [0, 12]}} x)", data12,
       "the header is not valid JSON"},
      {R"({"a": 5})", "", "tensor 'a': expected an object"},
      {R"({"a": {"dtype": "F32", "shape": [3]}})", data12,
       "needs dtype, shape and data_offsets"},
      {R"({"a": {"dtype": "F8_E4M3", "shape": [3], "data_offsets": [0, 3]}})",
       "abc", "dtype 'F8_E4M3' is not one LibTorch 1.13 holds"},
      {R"({"a": {"dtype": 1, "shape": [3], "data_offsets": [0, 12]}})", data12,
       "dtype must be a string"},
      {R"({"a": {"dtype": "F32", "shape": 3, "data_offsets": [0, 12]}})",
       data12, "shape must be an array"},
      {R"({"a": {"dtype": "F32", "shape": [-3], "data_offsets": [0, 12]}})",
       data12, "each dimension must be an integer in [0, 2^63), found -3"},
      {R"({"a": {"dtype": "F32", "shape": [3.0], "data_offsets": [0, 12]}})",
       data12, "each dimension must be an integer in [0, 2^63), found 3.0"},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 12]}})",
       data12, "is too large"},
      {R"({"a": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})",
       "", "is too large"},
      {R"({"a": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 12]}})",
       data12, "found 18446744073709551615"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [0, 12, 12]}})", data12,
       "data_offsets must be [begin, end]"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [12, 0]}})", data12,
       "end before they begin"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [0, 8]}})", data12,
       "F32 [3] needs 12 bytes, but data_offsets [0,8] hold 8"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [4, 16]}})", data12 + "1234",
       "starts at data offset 4, but the data before it ends at 0 (gap)"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [0, 12]}, "b": {)" + f32 +
           R"(, "data_offsets": [8, 20]}})",
       data12 + "12345678", "(overlap)"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [0, 12]}})", data12 + "1",
       "(trailing bytes)"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [0, 12]}})", "1234",
       "(truncated)"},
      {R"({"a": {)" + f32 + R"(, "data_offsets": [100, 112]}})", data12,
       "starts at data offset 100"},
      {R"({"__metadata__": [1]})", "", "__metadata__ must be an object"},
      {R"({"__metadata__": {"k": 1}})", "",
       "__metadata__ value of 'k' must be a string, found 1"},
      {R"({"m": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})",
       std::string("\x01\x02", 2), "holds bytes other than 0 and 1"},
  };
  for (const Case& c : cases) {
    WriteBytes(sample.path, RawFile(c.header, c.data));
    EXPECT_THAT([&] { safetensors::Load(sample.path); },
                ::testing::ThrowsMessage<CheckpointError>(::testing::AllOf(
                    HasSubstr("safetensors file '" + sample.path + "'"),
                    HasSubstr(c.message))))
        << c.header;
    // Every defect but a BOOL's data is in the header, which LoadTensorInfo
    // checks as Load does.
    if (c.message.find("BOOL") == std::string::npos &&
        c.header.find("BOOL") == std::string::npos) {
      EXPECT_THAT(
          [&] { safetensors::LoadTensorInfo(sample.path); },
          ::testing::ThrowsMessage<CheckpointError>(HasSubstr(c.message)))
          << c.header;
    }
  }
  // A header without padding and with extra keys is fine, as in the
  // reference reader.
  WriteBytes(
      sample.path,
      RawFile(R"({"a": {)" + f32 + R"(, "data_offsets": [0, 12], "extra": 1}})",
              data12));
  EXPECT_EQ(safetensors::Load(sample.path).at("a").numel(), 3);
  EXPECT_THAT([] { safetensors::Load("/nonexistent.safetensors"); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("'/nonexistent.safetensors': cannot open")));
}

}  // namespace
}  // namespace accel
