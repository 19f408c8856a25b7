// safetensors files: round trips of every dtype, Python reading ours and us
// reading Python's, hundreds of corrupted files that must fail cleanly, and
// Accelerate's sharded save_model layout.
#include "accel/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "tests/subprocess.h"

namespace accel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using TensorMap = std::map<std::string, torch::Tensor>;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LengthPrefix(uint64_t length) {
  return std::string(reinterpret_cast<const char*>(&length), 8);
}

// Same dtype, shape and bytes (so NaNs and -0.0 compare too).
bool SameBytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  const torch::Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == 0 ||
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void ExpectSameTensors(const TensorMap& actual, const TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_EQ(actual.count(name), 1u) << name;
    EXPECT_TRUE(SameBytes(actual.at(name), tensor))
        << name << ": " << actual.at(name) << " vs " << tensor;
  }
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

// A model whose state_dict has parameters and buffers of two dtypes.
torch::nn::Sequential MakeModel(int64_t hidden = 100) {
  return torch::nn::Sequential(torch::nn::Linear(10, 10),
                               torch::nn::Linear(10, hidden),
                               torch::nn::BatchNorm1d(hidden));
}

TensorMap StateOf(const torch::nn::Module& module) {
  TensorMap state;
  for (const auto& item : module.named_parameters()) {
    state[item.key()] = item.value().detach().clone();
  }
  for (const auto& item : module.named_buffers()) {
    state[item.key()] = item.value().clone();
  }
  return state;
}

TEST(ModelWeightsTest, ShardsLikeHuggingfaceHub) {
  const std::string dir = testing::MakeTempDir("sharded") + "/out";
  auto model = MakeModel();
  model->ptr(2)->as<torch::nn::BatchNorm1d>()->running_mean.fill_(0.5);
  // state_dict order and bytes: 0.weight 400, 0.bias 40, 1.weight 4000,
  // 1.bias 400, 2.weight 400, 2.bias 400, 2.running_mean 400,
  // 2.running_var 400, 2.num_batches_tracked 8. With 1000-byte shards,
  // 1.weight is alone and goes first; the rest fill shards in order.
  const std::vector<std::string> files = SaveModelWeights(*model, dir, "1KB");
  EXPECT_THAT(files, ElementsAre(dir + "/model-00001-of-00004.safetensors",
                                 dir + "/model-00002-of-00004.safetensors",
                                 dir + "/model-00003-of-00004.safetensors",
                                 dir + "/model-00004-of-00004.safetensors",
                                 dir + "/model.safetensors.index.json"));
  const auto names_in = [&](int shard) {
    std::vector<std::string> names;
    for (const auto& [name, tensor] : safetensors::Load(files[shard])) {
      names.push_back(name);
    }
    return names;
  };
  EXPECT_THAT(names_in(0), ElementsAre("1.weight"));
  EXPECT_THAT(names_in(1), ElementsAre("0.bias", "0.weight", "1.bias"));
  EXPECT_THAT(names_in(2), ElementsAre("2.bias", "2.weight"));
  EXPECT_THAT(names_in(3), ElementsAre("2.num_batches_tracked",
                                       "2.running_mean", "2.running_var"));
  EXPECT_EQ(safetensors::LoadMetadata(files[1]).at("format"), "pt");

  const Json index = Json::parse(ReadBytes(files[4]));
  EXPECT_EQ(index["metadata"]["total_size"], 6448);
  EXPECT_EQ(index["weight_map"].size(), 9u);
  EXPECT_EQ(index["weight_map"]["1.weight"],
            "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["2.num_batches_tracked"],
            "model-00004-of-00004.safetensors");

  ExpectSameTensors(LoadModelWeights(dir), StateOf(*model));
  auto restored = MakeModel();
  LoadModelWeightsInto(*restored, dir);
  ExpectSameTensors(StateOf(*restored), StateOf(*model));
}

TEST(ModelWeightsTest, ANewSaveRemovesTheFilesOfTheOldOne) {
  const std::string dir = testing::MakeTempDir("resave");
  auto model = MakeModel();
  SaveModelWeights(*model, dir, "1KB");
  EXPECT_EQ(ListFolder(dir).size(), 5u);
  EXPECT_THAT(SaveModelWeights(*model, dir),
              ElementsAre(dir + "/model.safetensors"));
  EXPECT_THAT(ListFolder(dir), ElementsAre("model.safetensors"));
  ExpectSameTensors(LoadModelWeights(dir), StateOf(*model));

  WriteBytes(dir + "/unrelated.txt", "kept");
  // [0.weight, 0.bias], [1.weight] (4440 bytes would overflow), the rest.
  SaveModelWeights(*model, dir, "4000B");
  EXPECT_THAT(ListFolder(dir),
              ElementsAre("model-00001-of-00003.safetensors",
                          "model-00002-of-00003.safetensors",
                          "model-00003-of-00003.safetensors",
                          "model.safetensors.index.json", "unrelated.txt"));
  ExpectSameTensors(LoadModelWeights(dir), StateOf(*model));
}

TEST(ModelWeightsTest, LoadIntoChecksEverythingBeforeChangingAnything) {
  const std::string dir = testing::MakeTempDir("mismatch");
  auto saved = MakeModel();
  SaveModelWeights(*saved, dir);

  auto wider = MakeModel(/*hidden=*/101);
  const TensorMap before = StateOf(*wider);
  EXPECT_THAT(
      [&] { LoadModelWeightsInto(*wider, dir); },
      ::testing::ThrowsMessage<CheckpointError>(::testing::AllOf(
          HasSubstr("model weights in '" + dir + "' do not match the model"),
          HasSubstr("'1.weight' (model Float [101, 10], file Float [100, 10])"),
          HasSubstr("'2.running_var' (model Float [101], file Float [100])"))));
  ExpectSameTensors(StateOf(*wider), before);

  auto doubled = MakeModel();
  doubled->to(torch::kDouble);
  EXPECT_THAT([&] { LoadModelWeightsInto(*doubled, dir); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("'0.bias' (model Double [10], file Float [10])")));

  torch::nn::Sequential other(torch::nn::Linear(10, 10));
  other->push_back("extra", torch::nn::Linear(1, 1));
  EXPECT_THAT([&] { LoadModelWeightsInto(*other, dir); },
              ::testing::ThrowsMessage<CheckpointError>(::testing::AllOf(
                  HasSubstr("missing from the file: 'extra.weight', "
                            "'extra.bias'"),
                  HasSubstr("not in the model: '1.bias'"))));
}

TEST(ModelWeightsTest, BrokenIndexesAreCheckpointErrors) {
  const std::string dir = testing::MakeTempDir("index");
  EXPECT_THAT([&] { LoadModelWeights(dir); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("no model weights in '" + dir +
                            "': neither model.safetensors nor "
                            "model.safetensors.index.json")));
  auto model = MakeModel();
  SaveModelWeights(*model, dir, "1KB");
  const std::string index_path = dir + "/model.safetensors.index.json";
  const Json index = Json::parse(ReadBytes(index_path));

  const auto expect_error = [&](const Json& broken,
                                const std::string& message) {
    WriteBytes(index_path, broken.dump());
    EXPECT_THAT([&] { LoadModelWeights(dir); },
                ::testing::ThrowsMessage<CheckpointError>(HasSubstr(message)))
        << broken.dump();
  };
  Json moved = index;
  moved["weight_map"]["0.bias"] = "model-00001-of-00004.safetensors";
  expect_error(moved,
               "maps '0.bias' to 'model-00001-of-00004.safetensors', "
               "which does not hold them");
  Json dropped = index;
  dropped["weight_map"].erase("1.bias");
  expect_error(dropped,
               "'model-00002-of-00004.safetensors' holds '1.bias', "
               "which the index does not map to it");
  Json escaping = index;
  escaping["weight_map"]["0.bias"] = "../model-00002-of-00004.safetensors";
  expect_error(escaping, "not a file name in the same folder");
  Json absent = index;
  // Sorts before the other shards, so it is the first one opened.
  absent["weight_map"]["0.bias"] = "a-missing.safetensors";
  expect_error(absent, "cannot open");
  expect_error(Json::array(), "expected an object with a \"weight_map\"");
  WriteBytes(index_path, "{not json");
  EXPECT_THAT([&] { LoadModelWeights(dir); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("index '" + index_path + "': not valid JSON")));
}

TEST(ParseByteSizeTest, AcceptsDecimalAndBinaryUnits) {
  EXPECT_EQ(ParseByteSize("10GB"), 10'000'000'000);
  EXPECT_EQ(ParseByteSize("5MiB"), 5 * 1024 * 1024);
  EXPECT_EQ(ParseByteSize("100KB"), 100'000);
  EXPECT_EQ(ParseByteSize("123"), 123);
  EXPECT_EQ(ParseByteSize(" 1.5 gb "), 1'500'000'000);
  EXPECT_EQ(ParseByteSize("2TiB"), int64_t{2} << 40);
  EXPECT_EQ(ParseByteSize("1PB"), 1'000'000'000'000'000);
  EXPECT_EQ(ParseByteSize("7B"), 7);
  EXPECT_EQ(ParseByteSize("0"), 0);
  EXPECT_EQ(ParseByteSize("9223372036854775807"),
            std::numeric_limits<int64_t>::max());
}

TEST(ParseByteSizeTest, RejectsEverythingElse) {
  for (const char* text :
       {"", "GB", "-1", "-5GB", "abc", "10XB", "1.2.3GB", ".", "10 G",
        "9223372036854775808", "10000PB", "1e3", "0x10"}) {
    EXPECT_THAT([&] { ParseByteSize(text); },
                ::testing::ThrowsMessage<UsageError>(HasSubstr(
                    "cannot read the byte size '" + std::string(text) + "'")))
        << text;
  }
  EXPECT_THAT([] { SaveModelWeights(*MakeModel(), "/tmp/unused", "0"); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("max_shard_size must be positive")));
}

}  // namespace
}  // namespace accel
