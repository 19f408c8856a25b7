// The TCP store server's requests (tcp_store_server_state.h): hello and
// its checks, set, get, wait (waiters filed under the first key they miss),
// add, departures, goodbye and leaving, each answered through Reply.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/base/logging.h"
#include "accel/runtime/store/tcp_store_server_state.h"
#include "accel/runtime/store/wire.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using store_wire::Framed;
using store_wire::kMaxLeavingText;
using store_wire::kProtocolVersion;
using store_wire::Op;
using store_wire::Reader;
using store_wire::SecretsEqual;
using store_wire::Status;
using store_wire::Writer;

}  // namespace

void TcpStoreServer::State::Reply(int fd, const Writer& response) {
  Connection& conn = connections[fd];
  conn.out += Framed(response.bytes());
  if (!conn.flush_queued) {
    conn.flush_queued = true;
    to_flush.push_back(fd);
  }
}

Writer TcpStoreServer::State::Response(uint64_t id, Status status) {
  Writer writer;
  writer.U64(id).U8(static_cast<uint8_t>(status));
  return writer;
}

void TcpStoreServer::State::Reject(int fd, uint64_t id, Status status, int rank,
                                   const std::string& reason) {
  Connection& conn = connections[fd];
  ACCEL_VLOG(1) << "store: refused a connection from " << conn.address
                << " claiming rank " << rank << ": " << reason;
  Reply(fd, Response(id, status));
  conn.close_after_flush = true;
  // Closed once its answer is sent: not a silent stranger to evict (and
  // lose the answer with) before then.
  unauthenticated.erase({conn.accepted_at, fd});
  std::lock_guard<std::mutex> lock(shared_mutex);
  rejected.push_back({conn.address, rank, reason});
  if (rejected.size() > kMaxRejectedKept) rejected.pop_front();
}

bool TcpStoreServer::State::FileOrAnswer(uint64_t serial, Waiter& w) {
  while (w.missing < w.keys.size() && values.count(w.keys[w.missing]) != 0) {
    ++w.missing;
  }
  if (w.missing == w.keys.size()) {
    Reply(w.fd, Response(w.id, Status::kOk));
    return false;
  }
  waiting_on[w.keys[w.missing]].insert(serial);
  return true;
}

void TcpStoreServer::State::AddWaiter(Waiter waiter) {
  const uint64_t serial = next_waiter++;
  Waiter& w = waiters.emplace(serial, std::move(waiter)).first->second;
  if (!FileOrAnswer(serial, w)) {
    waiters.erase(serial);
    return;
  }
  deadlines.insert({w.deadline, serial});
  connections[w.fd].waiters.insert(serial);
}

void TcpStoreServer::State::RemoveWaiter(uint64_t serial) {
  auto it = waiters.find(serial);
  if (it == waiters.end()) return;
  const Waiter& w = it->second;
  if (w.missing < w.keys.size()) {
    auto filed = waiting_on.find(w.keys[w.missing]);
    if (filed != waiting_on.end()) {
      filed->second.erase(serial);
      if (filed->second.empty()) waiting_on.erase(filed);
    }
  }
  deadlines.erase({w.deadline, serial});
  auto conn = connections.find(w.fd);
  if (conn != connections.end()) conn->second.waiters.erase(serial);
  waiters.erase(it);
}

void TcpStoreServer::State::WakeWaiters(const std::string& key) {
  auto filed = waiting_on.find(key);
  if (filed == waiting_on.end()) return;
  const std::set<uint64_t> serials = std::move(filed->second);
  waiting_on.erase(filed);
  for (uint64_t serial : serials) {
    auto it = waiters.find(serial);
    if (it == waiters.end()) continue;
    Waiter& w = it->second;
    ++w.missing;  // keys[missing] == key, now set.
    if (!FileOrAnswer(serial, w)) {
      w.missing = w.keys.size();  // Filed nowhere.
      RemoveWaiter(serial);
    }
  }
}

void TcpStoreServer::State::ExpireWaiters(Clock::time_point now) {
  while (!deadlines.empty() && deadlines.begin()->first <= now) {
    const uint64_t serial = deadlines.begin()->second;
    const Waiter& w = waiters.at(serial);
    Writer response = Response(w.id, Status::kTimeout);
    std::vector<std::string> missing;
    for (const auto& key : w.keys) {
      if (values.count(key) == 0) missing.push_back(key);
    }
    response.U64(missing.size());
    for (const auto& key : missing) response.Str(key);
    Reply(w.fd, response);
    RemoveWaiter(serial);
  }
}

void TcpStoreServer::State::Hello(int fd, uint64_t id, Reader& reader) {
  Connection& conn = connections[fd];
  const std::string presented = reader.Str();
  const int rank = static_cast<int>(static_cast<int64_t>(reader.U64()));
  const std::string job_id = reader.Str();
  // Before version 2 the hello ended here.
  const uint64_t version = reader.remaining() >= 8 ? reader.U64() : 1;
  if (version != kProtocolVersion) {
    Reject(fd, id, Status::kOtherVersion, rank,
           "another accel (store protocol version " + std::to_string(version) +
               ", this one speaks " + std::to_string(kProtocolVersion) + ")");
    return;
  }
  if (!SecretsEqual(presented, options.secret)) {
    Reject(fd, id, Status::kDenied, rank, "another run secret");
    return;
  }
  if (job_id != options.job_id) {
    Reject(fd, id, Status::kOtherJob, rank,
           "another job (the same run secret, another job id)");
    return;
  }
  if (rank >= 0 && rank_fds.count(rank) != 0) {
    Reject(fd, id, Status::kRankTaken, rank,
           "rank " + std::to_string(rank) + " is already connected from " +
               connections[rank_fds[rank]].address);
    return;
  }
  conn.authenticated = true;
  unauthenticated.erase({conn.accepted_at, fd});
  conn.rank = rank;
  if (rank >= 0) {
    rank_fds[rank] = fd;
    // A process that takes over a departed rank (a replacement that a
    // fault-tolerant job restarted, see accel/runtime/ft) is that rank
    // now: the old process's departure no longer describes it.
    departures.erase(rank);
    std::lock_guard<std::mutex> lock(shared_mutex);
    rank_addresses[rank] = conn.address;
  }
  ACCEL_VLOG(1) << "store: "
                << (rank >= 0 ? "rank " + std::to_string(rank)
                              : std::string("a client"))
                << " connected from " << conn.address;
  Reply(fd, Response(id, Status::kOk));
}

void TcpStoreServer::State::Handle(int fd, const std::string& message) {
  Reader reader(message);
  const uint64_t id = reader.U64();
  const auto op = static_cast<Op>(reader.U8());
  if (!connections[fd].authenticated && op != Op::kHello) {
    throw std::runtime_error("request before hello");
  }
  switch (op) {
    case Op::kHello:
      if (connections[fd].authenticated) {
        throw std::runtime_error("second hello");
      }
      Hello(fd, id, reader);
      return;
    case Op::kSet: {
      const std::string key = reader.Str();
      values[key] = reader.Str();
      Reply(fd, Response(id, Status::kOk));
      WakeWaiters(key);
      return;
    }
    case Op::kGet: {
      auto it = values.find(reader.Str());
      if (it == values.end()) {
        Reply(fd, Response(id, Status::kMissing));
      } else {
        Reply(fd, Response(id, Status::kOk).Str(it->second));
      }
      return;
    }
    case Op::kWait: {
      const uint64_t count = reader.U64();
      if (count > message.size()) throw std::length_error("bad key count");
      Waiter waiter{fd, id, {}, 0, {}};
      for (uint64_t i = 0; i < count; ++i) waiter.keys.push_back(reader.Str());
      const auto timeout =
          milliseconds(std::min<uint64_t>(reader.U64(), uint64_t{1} << 40));
      waiter.deadline = Clock::now() + timeout;
      AddWaiter(std::move(waiter));
      return;
    }
    case Op::kAdd: {
      const std::string key = reader.Str();
      const auto delta = static_cast<int64_t>(reader.U64());
      int64_t current = 0;
      auto it = values.find(key);
      if (it != values.end()) {
        try {
          current = std::stoll(it->second);
        } catch (const std::exception&) {
          current = 0;
        }
      }
      const int64_t result = static_cast<int64_t>(
          static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
      values[key] = std::to_string(result);
      Reply(fd, Response(id, Status::kOk).U64(static_cast<uint64_t>(result)));
      WakeWaiters(key);
      return;
    }
    case Op::kDepartures: {
      Writer response = Response(id, Status::kOk);
      response.U64(departures.size());
      for (const auto& [rank, how] : departures) {
        response.U64(static_cast<uint64_t>(static_cast<int64_t>(rank)))
            .Str(how);
      }
      Reply(fd, response);
      return;
    }
    case Op::kGoodbye:
      connections[fd].said_goodbye = true;
      return;
    case Op::kLeaving: {
      std::string how = reader.Str();
      if (how.size() > kMaxLeavingText) how.resize(kMaxLeavingText);
      Connection& conn = connections[fd];
      if (conn.rank >= 0) {
        departures[conn.rank] = how;
        conn.left = true;
      }
      Reply(fd, Response(id, Status::kOk));
      return;
    }
  }
  throw std::runtime_error("unknown request");
}

}  // namespace accel
