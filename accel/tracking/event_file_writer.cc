#include "accel/tracking/event_file_writer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>

#include "accel/tracking/hparams.pb.h"
#include "accel/tracking/tensorboard.pb.h"

namespace accel {
namespace {

constexpr char kHParamsPlugin[] = "hparams";
constexpr char kSessionStartTag[] = "_hparams_/session_start_info";
constexpr char kSessionEndTag[] = "_hparams_/session_end_info";

double WallTime() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// As TensorFlow and torch name them; TensorBoard reads every file of a run
// folder in name order, so several writers (a resumed run) can share one.
std::string EventFileName(const std::string& run_dir) {
  static std::atomic<int> counter{0};
  char host[HOST_NAME_MAX + 1] = "localhost";
  gethostname(host, sizeof(host));
  host[HOST_NAME_MAX] = '\0';
  const long seconds = static_cast<long>(WallTime());
  return run_dir + "/events.out.tfevents." + std::to_string(seconds) + "." +
         host + "." + std::to_string(getpid()) + "." +
         std::to_string(counter++);
}

void SetPluginData(tensorboard::Summary::Value& value,
                   const std::string& plugin, const std::string& content) {
  tensorboard::SummaryMetadata* metadata = value.mutable_metadata();
  metadata->mutable_plugin_data()->set_plugin_name(plugin);
  metadata->mutable_plugin_data()->set_content(content);
  metadata->set_data_class(tensorboard::DATA_CLASS_TENSOR);
}

// The HParams plugin keeps its message in the metadata; its tensor is a
// placeholder float 0, as TensorBoard's own hparams summaries have.
void AddHParamsValue(tensorboard::Summary& summary, const std::string& tag,
                     const tensorboard::HParamsPluginData& data) {
  tensorboard::Summary::Value* value = summary.add_value();
  value->set_tag(tag);
  SetPluginData(*value, kHParamsPlugin, data.SerializeAsString());
  tensorboard::TensorProto* tensor = value->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_FLOAT);
  tensor->mutable_tensor_shape();
  tensor->add_float_val(0);
}

void AddTextValue(tensorboard::Summary& summary, const std::string& tag,
                  const std::string& text) {
  tensorboard::Summary::Value* value = summary.add_value();
  value->set_tag(tag);
  SetPluginData(*value, "text", "");
  tensorboard::TensorProto* tensor = value->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  tensor->mutable_tensor_shape()->add_dim()->set_size(1);
  tensor->add_string_val(text);
}

std::string MarkdownTable(const TrackerValues& values) {
  std::string table = "| hyperparameter | value |\n|---|---|\n";
  for (const auto& [key, value] : values) {
    table += "| " + key + " | " + value.ToString() + " |\n";
  }
  return table;
}

}  // namespace

EventFileWriter::EventFileWriter(const std::string& run_dir)
    : file_(EventFileName(run_dir)) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_file_version("brain.Event:2");
  event.mutable_source_metadata()->set_writer("accel");
  file_.Write(event.SerializeAsString());
}

void EventFileWriter::WriteSummary(const tensorboard::Summary& summary,
                                   int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  *event.mutable_summary() = summary;
  file_.Write(event.SerializeAsString());
}

void EventFileWriter::AddScalars(const TrackerValues& values, int64_t step) {
  tensorboard::Summary summary;
  for (const auto& [key, value] : values) {
    if (value.is_string()) {
      AddTextValue(summary, key, value.string());
    } else {
      tensorboard::Summary::Value* scalar = summary.add_value();
      scalar->set_tag(key);
      scalar->set_simple_value(static_cast<float>(value.number()));
    }
  }
  WriteSummary(summary, step);
}

void EventFileWriter::AddScalar(const std::string& tag, double value,
                                int64_t step) {
  AddScalars({{tag, value}}, step);
}

void EventFileWriter::AddText(const std::string& tag, const std::string& text,
                              int64_t step) {
  tensorboard::Summary summary;
  AddTextValue(summary, tag, text);
  WriteSummary(summary, step);
}

void EventFileWriter::AddHParams(const TrackerValues& hparams) {
  tensorboard::HParamsPluginData data;
  tensorboard::SessionStartInfo* start = data.mutable_session_start_info();
  start->set_start_time_secs(WallTime());
  for (const auto& [key, value] : hparams) {
    google::protobuf::Value& entry = (*start->mutable_hparams())[key];
    if (value.is_string()) {
      entry.set_string_value(value.string());
    } else if (value.is_bool()) {
      entry.set_bool_value(std::get<bool>(value.variant()));
    } else {
      entry.set_number_value(value.number());
    }
  }
  tensorboard::Summary summary;
  AddHParamsValue(summary, kSessionStartTag, data);
  AddTextValue(summary, "hparams", MarkdownTable(hparams));
  WriteSummary(summary, 0);
}

void EventFileWriter::EndSession(bool success) {
  tensorboard::HParamsPluginData data;
  tensorboard::SessionEndInfo* end = data.mutable_session_end_info();
  end->set_status(success ? tensorboard::STATUS_SUCCESS
                          : tensorboard::STATUS_FAILURE);
  end->set_end_time_secs(WallTime());
  tensorboard::Summary summary;
  AddHParamsValue(summary, kSessionEndTag, data);
  WriteSummary(summary, 0);
}

}  // namespace accel
