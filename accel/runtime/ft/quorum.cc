#include "accel/runtime/ft/quorum.h"

#include <map>
#include <sstream>

#include "accel/runtime/base/errors.h"

namespace accel::ft {
namespace {

// "a=1 b=2 stop=rest of the line" -> {a: 1, b: 2, stop: "rest of the line"}.
std::map<std::string, std::string> Fields(const std::string& text,
                                          const char* what) {
  std::map<std::string, std::string> fields;
  size_t at = 0;
  while (at < text.size()) {
    const size_t equals = text.find('=', at);
    if (equals == std::string::npos) {
      throw UsageError(std::string("fault tolerance: not a ") + what + ": \"" +
                       text + "\"");
    }
    const std::string key = text.substr(at, equals - at);
    size_t end = key == "stop" ? text.size() : text.find(' ', equals);
    if (end == std::string::npos) end = text.size();
    fields[key] = text.substr(equals + 1, end - equals - 1);
    at = end + 1;
  }
  return fields;
}

const std::string& Field(const std::map<std::string, std::string>& fields,
                         const std::string& key, const std::string& text) {
  auto it = fields.find(key);
  if (it == fields.end()) {
    throw UsageError("fault tolerance: \"" + text + "\" has no " + key);
  }
  return it->second;
}

int64_t Int(const std::map<std::string, std::string>& fields,
            const std::string& key, const std::string& text) {
  const std::string& value = Field(fields, key, text);
  try {
    size_t used = 0;
    const int64_t parsed = std::stoll(value, &used);
    if (used == value.size()) return parsed;
  } catch (const std::exception&) {
  }
  throw UsageError("fault tolerance: \"" + text + "\": " + key +
                   " is not a number");
}

std::vector<std::string> Split(const std::string& text, char by) {
  std::vector<std::string> parts;
  if (text.empty()) return parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, by)) parts.push_back(part);
  return parts;
}

}  // namespace

const char* VoteName(Vote vote) {
  switch (vote) {
    case Vote::kNone:
      return "none";
    case Vote::kOk:
      return "ok";
    case Vote::kFailed:
      return "failed";
  }
  return "?";
}

std::string QuorumRequest::Encode() const {
  return "inc=" + incarnation + " serial=" + std::to_string(serial) +
         " step=" + std::to_string(step) + " vote=" + VoteName(vote) +
         " sync=" + (in_sync ? "1" : "0");
}

QuorumRequest QuorumRequest::Decode(const std::string& text) {
  const auto fields = Fields(text, "quorum request");
  QuorumRequest request;
  request.incarnation = Field(fields, "inc", text);
  request.serial = Int(fields, "serial", text);
  request.step = Int(fields, "step", text);
  request.in_sync = Int(fields, "sync", text) != 0;
  const std::string& vote = Field(fields, "vote", text);
  if (vote == "ok") {
    request.vote = Vote::kOk;
  } else if (vote == "failed") {
    request.vote = Vote::kFailed;
  } else if (vote == "none") {
    request.vote = Vote::kNone;
  } else {
    throw UsageError("fault tolerance: \"" + text + "\": unknown vote");
  }
  return request;
}

std::string Quorum::Encode() const {
  std::string members_text;
  for (const Member& member : members) {
    if (!members_text.empty()) members_text += ",";
    members_text += std::to_string(member.rank) + ":" + member.incarnation;
  }
  std::string recovering_text;
  for (int rank : recovering) {
    if (!recovering_text.empty()) recovering_text += ",";
    recovering_text += std::to_string(rank);
  }
  return "id=" + std::to_string(id) + " step=" + std::to_string(step) +
         " source=" + std::to_string(source) + " members=" + members_text +
         " recovering=" + recovering_text + " stop=" + stop;
}

Quorum Quorum::Decode(const std::string& text) {
  const auto fields = Fields(text, "quorum");
  Quorum quorum;
  quorum.id = Int(fields, "id", text);
  quorum.step = Int(fields, "step", text);
  quorum.source = static_cast<int>(Int(fields, "source", text));
  for (const std::string& part : Split(Field(fields, "members", text), ',')) {
    const size_t colon = part.find(':');
    if (colon == std::string::npos) {
      throw UsageError("fault tolerance: \"" + text + "\": bad member");
    }
    quorum.members.push_back(
        {std::stoi(part.substr(0, colon)), part.substr(colon + 1)});
  }
  for (const std::string& part :
       Split(Field(fields, "recovering", text), ',')) {
    quorum.recovering.push_back(std::stoi(part));
  }
  quorum.stop = Field(fields, "stop", text);
  return quorum;
}

int Quorum::IndexOf(int rank) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].rank == rank) return static_cast<int>(i);
  }
  return -1;
}

bool Quorum::Recovering(int rank) const {
  for (int r : recovering) {
    if (r == rank) return true;
  }
  return false;
}

std::vector<int> Quorum::Ranks() const {
  std::vector<int> ranks;
  for (const Member& member : members) ranks.push_back(member.rank);
  return ranks;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
  }
  return text + "]";
}

std::string RequestKey(int rank) { return "req/" + std::to_string(rank); }

std::string AnswerKey(int rank, const QuorumRequest& request) {
  return "ans/" + std::to_string(rank) + "/" + request.incarnation + "/" +
         std::to_string(request.serial);
}

std::string HeartbeatKey(int rank) { return "hb/" + std::to_string(rank); }

std::string BellKey(int64_t ring) { return "bell/" + std::to_string(ring); }

std::string ChangeKey(int64_t id) { return "change/" + std::to_string(id); }

}  // namespace accel::ft
