// Accelerate's save_model layout: shards split as huggingface_hub does, a
// new save replacing an old one, loads that check before they change
// anything, broken indexes, and shard sizes.
#include "accel/checkpoint/model_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include "accel/checkpoint/safetensors.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "tests/subprocess.h"
#include "tests/tensor_files.h"

namespace accel {
namespace {

using ::testing::ElementsAre;
using testing::ExpectSameTensors;
using ::testing::HasSubstr;
using testing::ReadBytes;
using testing::TensorMap;
using testing::WriteBytes;
using Json = nlohmann::json;

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

// The shapes of every layout from the headers alone: the same names,
// dtypes and shapes as the loaded tensors, and the index's checks.
TEST(ModelWeightsTest, InfoReadsShapesOfEveryLayout) {
  auto model = MakeModel();
  const TensorMap state = StateOf(*model);
  const auto expect_info_of = [&](const std::string& path) {
    const auto infos = LoadModelWeightsInfo(path);
    ASSERT_EQ(infos.size(), state.size()) << path;
    for (const auto& [name, tensor] : state) {
      ASSERT_EQ(infos.count(name), 1u) << name << " in " << path;
      EXPECT_EQ(infos.at(name).dtype, tensor.scalar_type()) << name;
      EXPECT_EQ(infos.at(name).shape, tensor.sizes().vec()) << name;
      EXPECT_EQ(infos.at(name).numel(), tensor.numel()) << name;
    }
  };
  const std::string single = testing::MakeTempDir("info_single");
  SaveModelWeights(*model, single);
  expect_info_of(single);
  expect_info_of(single + "/model.safetensors");
  const std::string sharded = testing::MakeTempDir("info_sharded");
  SaveModelWeights(*model, sharded, "1KB");
  expect_info_of(sharded);
  const std::string index_path = sharded + "/model.safetensors.index.json";
  expect_info_of(index_path);

  Json index = Json::parse(ReadBytes(index_path));
  index["weight_map"].erase("1.bias");
  WriteBytes(index_path, index.dump());
  EXPECT_THAT([&] { LoadModelWeightsInfo(index_path); },
              ::testing::ThrowsMessage<CheckpointError>(HasSubstr(
                  "'model-00002-of-00004.safetensors' holds '1.bias', "
                  "which the index does not map to it")));
  const std::string empty = testing::MakeTempDir("info_empty");
  EXPECT_THAT([&] { LoadModelWeightsInfo(empty); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("no model weights in '" + empty + "'")));
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
