// What the replicas of a fault-tolerant job and their lighthouse say to each
// other through the job's store: a replica's request to join the next step
// (with its vote on the step it just ran), and the quorum the lighthouse
// answers with. Text, one line each, so that a stuck job can be read with
// any store client.
//
//   QuorumRequest request{.incarnation = "3f2a...", .serial = 7, .step = 41,
//                         .vote = Vote::kOk};
//   store.set(RequestKey(rank), request.Encode());
//   Quorum quorum = Quorum::Decode(store.get(AnswerKey(rank, request), t));
//   if (quorum.Recovering(rank)) ...  // Take the state from quorum.source.
//
// Keys live under the store prefix the Replica and the Lighthouse share
// ("ft/"); see replica.h for the protocol.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accel::ft {

// What a replica says about the step it ran.
enum class Vote {
  kNone,    // It ran no step since its last request (it is joining).
  kOk,      // Its sums completed (it was called to the round).
  kFailed,  // A collective failed (a peer was lost): it discarded the step.
};
const char* VoteName(Vote vote);

// One process of one rank: a replacement started for the same rank is
// another incarnation (a random id each process draws at start).
struct Member {
  int rank = -1;
  std::string incarnation;
  bool operator==(const Member& other) const {
    return rank == other.rank && incarnation == other.incarnation;
  }
};

struct QuorumRequest {
  std::string incarnation;
  int64_t serial = 0;  // 1, 2, ... per incarnation: which answer it awaits.
  int64_t step = 0;    // The next step it would run (its steps applied).
  Vote vote = Vote::kNone;
  // Whether it holds the run's state (else it is sent the state).
  bool in_sync = false;

  std::string Encode() const;
  // UsageError naming the text when it is not a request.
  static QuorumRequest Decode(const std::string& text);
};

// The lighthouse's answer to one member's request.
struct Quorum {
  int64_t id = 0;               // Increases with each round.
  int64_t step = 0;             // The step the members run next.
  std::vector<Member> members;  // By rank.
  std::vector<int> recovering;  // Ranks that load the state from `source`.
  int source = -1;              // The rank whose state the others take.
  // Not empty: the job cannot go on (fewer than half the replicas left, or
  // nobody holds the state); the reason, for every member's error.
  std::string stop;

  std::string Encode() const;
  static Quorum Decode(const std::string& text);
  // This quorum's index of `rank` (its rank in the quorum's communicator),
  // or -1.
  int IndexOf(int rank) const;
  bool Recovering(int rank) const;
  std::vector<int> Ranks() const;
};

// "[0, 1, 3]", for messages.
std::string RankList(const std::vector<int>& ranks);

// The store keys (under the shared prefix).
std::string RequestKey(int rank);  // The latest request of `rank`.
std::string AnswerKey(int rank, const QuorumRequest& request);
std::string HeartbeatKey(int rank);  // "<incarnation>:<beat>"
inline constexpr char kBellCounter[] = "bell";
std::string BellKey(
    int64_t ring);  // Set after each request: wakes the lighthouse.
// Set by the lighthouse to call the members of quorum `id` to a round:
// "join <why>" (at their next step) or "abort <why>" (their collectives
// are aborted: a member was lost or its sum failed).
std::string ChangeKey(int64_t id);

}  // namespace accel::ft
