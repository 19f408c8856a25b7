#include "accel/runtime/store/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/net.h"
#include "accel/runtime/store/tcp_store.h"
#include "tests/store_semantics.h"

namespace accel {
namespace {

using testing::ExpectStoreSemantics;

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(InMemoryStoreTest, Semantics) {
  InMemoryStore store;
  ExpectStoreSemantics(store, store);
}

TEST(PrefixStoreTest, SeparatesNamespaces) {
  auto base = std::make_shared<InMemoryStore>();
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  a.set("k", "1");
  EXPECT_EQ(b.try_get("k"), std::nullopt);
  EXPECT_EQ(base->try_get("a/k"), "1");
  ExpectStoreSemantics(a, a);
}

// A hello frame as the wire format has it: length, request id, op 1,
// secret "" (length only), rank, job id "", protocol version (none before
// version 2).
std::string RawHello(int rank, uint64_t version = 2) {
  std::string body(8, '\0');
  body += '\1';
  body += std::string(8, '\0');
  for (int i = 0; i < 8; ++i) {
    body += static_cast<char>(static_cast<uint64_t>(rank) >> (8 * i));
  }
  body += std::string(8, '\0');
  if (version >= 2) {
    for (int i = 0; i < 8; ++i) body += static_cast<char>(version >> (8 * i));
  }
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(body.size());
  return frame + body;
}

TcpStoreOptions ClientOptions(const std::string& secret, int rank) {
  TcpStoreOptions options;
  options.secret = secret;
  options.rank = rank;
  options.connect_timeout = milliseconds(2000);
  options.request_timeout = milliseconds(2000);
  return options;
}

TcpStoreServerOptions ServerOptions(const std::string& secret) {
  TcpStoreServerOptions options;
  options.secret = secret;
  options.max_message_bytes = 1 << 20;
  return options;
}

TEST(TcpStoreTest, Semantics) {
  TcpStoreServer server(ServerOptions("secret"));
  TcpStore a("127.0.0.1", server.port(), ClientOptions("secret", 0));
  TcpStore b("127.0.0.1", server.port(), ClientOptions("secret", 1));
  ExpectStoreSemantics(a, b);
}

TEST(TcpStoreTest, WrongSecretIsRejected) {
  TcpStoreServer server(ServerOptions("right"));
  try {
    TcpStore stranger("127.0.0.1", server.port(), ClientOptions("wrong", 0));
    FAIL() << "a client with the wrong secret was accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("belongs to another run"));
  }
}

TEST(TcpStoreTest, DeparturesNameCrashedAndExitedRanks) {
  TcpStoreServer server(ServerOptions(""));
  TcpStore observer("127.0.0.1", server.port(), ClientOptions("", 0));
  {
    TcpStore leaving("127.0.0.1", server.port(), ClientOptions("", 1));
    leaving.set("x", "y");
  }
  // A "crash": the connection drops without a goodbye.
  const int raw =
      net::Connect("127.0.0.1", server.port(), milliseconds(1000), "test");
  const std::string hello = RawHello(2);
  net::SendAll(raw, hello.data(), hello.size(), "test");
  char reply[13];
  ASSERT_EQ(net::RecvAll(raw, reply, sizeof(reply),
                         net::Clock::now() + std::chrono::seconds(2)),
            net::RecvStatus::kOk);
  close(raw);
  std::map<int, Departure> departed;
  for (int i = 0; i < 100 && departed.size() < 2; ++i) {
    departed = observer.departures();
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(departed[1].kind, Departure::Kind::kExited);
  EXPECT_EQ(departed[2].kind, Departure::Kind::kCrashed);
}

// A process that takes over a departed rank (a fault-tolerant job's
// replacement) is that rank again: the old departure is forgotten.
TEST(TcpStoreTest, AReplacementClearsItsRanksDeparture) {
  TcpStoreServer server(ServerOptions(""));
  TcpStore observer("127.0.0.1", server.port(), ClientOptions("", 0));
  { TcpStore first("127.0.0.1", server.port(), ClientOptions("", 1)); }
  std::map<int, Departure> departed;
  for (int i = 0; i < 100 && departed.empty(); ++i) {
    departed = observer.departures();
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(departed.count(1), 1u);
  TcpStore replacement("127.0.0.1", server.port(), ClientOptions("", 1));
  EXPECT_EQ(observer.departures().count(1), 0u);
}

// Another accel's client (an older protocol) is refused and named, rather
// than misread.
TEST(TcpStoreTest, AnotherProtocolVersionIsRefusedAndSaid) {
  TcpStoreServer server(ServerOptions(""));
  for (const uint64_t version : {uint64_t{1}, uint64_t{3}}) {
    const int raw =
        net::Connect("127.0.0.1", server.port(), milliseconds(1000), "test");
    const std::string hello = RawHello(0, version);
    net::SendAll(raw, hello.data(), hello.size(), "test");
    char reply[13];
    ASSERT_EQ(net::RecvAll(raw, reply, sizeof(reply),
                           net::Clock::now() + std::chrono::seconds(2)),
              net::RecvStatus::kOk);
    EXPECT_EQ(reply[12], 6) << "status kOtherVersion";
    close(raw);
  }
  ASSERT_EQ(server.rejected().size(), 2u);
  EXPECT_EQ(server.rejected()[0].reason,
            "another accel (store protocol version 1, this one speaks 2)");
}

TEST(TcpStoreTest, GarbageAndOversizedMessagesCostOnlyTheSender) {
  TcpStoreServer server(ServerOptions("s"));
  TcpStore client("127.0.0.1", server.port(), ClientOptions("s", 0));
  client.set("k", "v");
  const std::vector<std::string> attacks = {
      std::string("GET / HTTP/1.1\r\n\r\n"),
      std::string("\xff\xff\xff\x7f", 4) + std::string(100, 'x'),
      std::string("\x03\x00\x00\x00\x02\x01", 6),  // set before hello
      std::string("\x02\x00\x00", 3),              // truncated length
  };
  for (const auto& attack : attacks) {
    const int fd =
        net::Connect("127.0.0.1", server.port(), milliseconds(1000), "test");
    net::SendAll(fd, attack.data(), attack.size(), "test");
    shutdown(fd, SHUT_WR);
    char byte;
    // The server closes the connection (or it stays silent): no reply data.
    const auto status =
        net::RecvAll(fd, &byte, 1, net::Clock::now() + milliseconds(500));
    EXPECT_NE(status, net::RecvStatus::kOk);
    close(fd);
  }
  EXPECT_EQ(client.get("k", milliseconds(1000)), "v");
  EXPECT_TRUE(client.departures().empty());
}

TEST(TcpStoreTest, ClientFailsWithPeerErrorWhenServerGoesAway) {
  auto server = std::make_unique<TcpStoreServer>(ServerOptions(""));
  TcpStore client("127.0.0.1", server->port(), ClientOptions("", 1));
  server.reset();
  try {
    client.set("k", "v");
    client.set("k", "v");
    FAIL() << "no error after the server went away";
  } catch (const PeerError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rendezvous store"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0"));
    EXPECT_EQ(e.failed_rank(), 0);
  }
}

TEST(TcpStoreTest, ConnectToNothingTimesOutWithAHint) {
  const int port = net::FindFreePort("127.0.0.1");
  const auto start = std::chrono::steady_clock::now();
  try {
    TcpStore client("127.0.0.1", port, ClientOptions("", 1));
    FAIL() << "connected to a port nobody listens on";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(port)));
    EXPECT_THAT(e.what(), HasSubstr("MASTER_ADDR"));
  }
  // The 2 s connect timeout, not a hang (margin for a loaded machine).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(TcpStoreTest, PortInUseSuggestsAnotherPort) {
  TcpStoreServer first(ServerOptions(""));
  TcpStoreServerOptions options = ServerOptions("");
  options.port = first.port();
  try {
    TcpStoreServer second(options);
    FAIL() << "two servers on one port";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("already in use"));
    EXPECT_THAT(e.what(), HasSubstr("--main_process_port=0"));
  }
}

TEST(TcpStoreTest, SecondHelloForAConnectedRankIsRefused) {
  TcpStoreServer server(ServerOptions("s"));
  TcpStore rank1("127.0.0.1", server.port(), ClientOptions("s", 1));
  try {
    TcpStore impostor("127.0.0.1", server.port(), ClientOptions("s", 1));
    FAIL() << "two connections for rank 1";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("already has a rank 1"));
  }
  ASSERT_EQ(server.rejected().size(), 1u);
  EXPECT_EQ(server.rejected()[0].rank, 1);
  EXPECT_THAT(server.rejected()[0].reason,
              HasSubstr("rank 1 is already connected from 127.0.0.1"));
  // The impostor leaving is not rank 1 leaving.
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(rank1.departures().empty());
}

TEST(TcpStoreTest, JobsSharingASecretAreToldApartByJobId) {
  TcpStoreServerOptions options = ServerOptions("shared");
  options.job_id = "job-a";
  TcpStoreServer server(options);
  TcpStoreOptions a = ClientOptions("shared", 0);
  a.job_id = "job-a";
  TcpStore member("127.0.0.1", server.port(), a);
  TcpStoreOptions b = ClientOptions("shared", 1);
  b.job_id = "job-b";
  try {
    TcpStore other("127.0.0.1", server.port(), b);
    FAIL() << "a client of another job was accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("another job"));
  }
  ASSERT_EQ(server.rejected().size(), 1u);
  EXPECT_THAT(server.rejected()[0].reason, HasSubstr("another job"));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(member.departures().empty());
}

TEST(TcpStoreTest, WrongSecretIsReportedToTheHostWithTheAddress) {
  TcpStoreServer server(ServerOptions("right"));
  EXPECT_THROW(TcpStore("127.0.0.1", server.port(), ClientOptions("wrong", 3)),
               UsageError);
  ASSERT_EQ(server.rejected().size(), 1u);
  EXPECT_EQ(server.rejected()[0].address, "127.0.0.1");
  EXPECT_EQ(server.rejected()[0].rank, 3);
  EXPECT_EQ(server.rejected()[0].reason, "another run secret");
}

// Whether the server closed `fd` (reads end-of-stream) within `within`.
bool ClosedByPeer(int fd, milliseconds within) {
  char byte;
  return net::RecvAll(fd, &byte, 1, net::Clock::now() + within) ==
         net::RecvStatus::kClosed;
}

TEST(TcpStoreTest, SilentConnectionsAreCappedAndClosed) {
  TcpStoreServerOptions options = ServerOptions("s");
  options.auth_timeout = milliseconds(1500);
  options.max_unauthenticated = 4;
  TcpStoreServer server(options);
  std::vector<int> strangers;
  for (int i = 0; i < 10; ++i) {
    strangers.push_back(
        net::Connect("127.0.0.1", server.port(), milliseconds(1000), "test"));
    std::this_thread::sleep_for(milliseconds(10));
  }
  // The six oldest make room for newer ones at once.
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(ClosedByPeer(strangers[i], milliseconds(1000))) << i;
  }
  // A rank still joins and works while strangers hold connections.
  TcpStore rank("127.0.0.1", server.port(), ClientOptions("s", 0));
  rank.set("k", "v");
  EXPECT_EQ(rank.get("k", milliseconds(1000)), "v");
  // The rest are closed once they have been silent too long.
  for (int i = 6; i < 10; ++i) {
    EXPECT_TRUE(ClosedByPeer(strangers[i], milliseconds(5000))) << i;
  }
  for (int fd : strangers) close(fd);
  EXPECT_EQ(rank.get("k", milliseconds(1000)), "v");
}

TEST(TcpStoreTest, ARequestDoesNotQueueBehindAnotherThreadsWait) {
  TcpStoreServer server(ServerOptions(""));
  TcpStore store("127.0.0.1", server.port(), ClientOptions("", 0));
  std::thread waiter([&] { store.wait({"later"}, milliseconds(30000)); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  store.set("k", "v");
  EXPECT_EQ(store.try_get("k"), "v");
  // Long before the other thread's wait could end by itself.
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(15000));
  store.set("later", "now");  // Releases the waiter.
  waiter.join();
}

// A server that answers hello, then answers nothing until told to, as rank 0
// does while it is stopped (SIGSTOP).
class SilentServer {
 public:
  SilentServer() {
    listen_fd_ = net::Listen("127.0.0.1", 0, &port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~SilentServer() {
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  // Answers every request received so far, in order, then stops.
  void Resume() { resume_ = true; }

 private:
  void Serve() {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    std::vector<uint64_t> ids;
    auto read_request = [&]() -> bool {
      char header[4];
      if (net::RecvAll(fd, header, 4,
                       net::Clock::now() + std::chrono::seconds(10)) !=
          net::RecvStatus::kOk) {
        return false;
      }
      std::string body(static_cast<uint8_t>(header[0]), '\0');
      net::RecvAll(fd, body.data(), body.size(),
                   net::Clock::now() + std::chrono::seconds(10));
      uint64_t id = 0;
      std::memcpy(&id, body.data(), 8);
      ids.push_back(id);
      return true;
    };
    auto reply_ok = [&](uint64_t id) {
      std::string frame(4, '\0');
      frame[0] = 9;
      frame.append(reinterpret_cast<const char*>(&id), 8);
      frame += '\0';
      net::SendAll(fd, frame.data(), frame.size(), "test");
    };
    read_request();  // hello
    reply_ok(ids.back());
    ids.clear();
    while (!resume_ || ids.size() < 2) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 10) == 1 && !read_request()) break;
    }
    for (uint64_t id : ids) reply_ok(id);
    char byte;
    net::RecvAll(fd, &byte, 1, net::Clock::now() + std::chrono::seconds(10));
    close(fd);
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> resume_{false};
  std::thread thread_;
};

TEST(TcpStoreTest, ASilentHostTimesOutWithoutBreakingTheConnection) {
  SilentServer server;
  TcpStoreOptions options = ClientOptions("", 1);
  options.request_timeout = milliseconds(300);
  TcpStore store("127.0.0.1", server.port(), options);
  try {
    store.set("k", "v");
    FAIL() << "a silent store answered";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("did not answer within 300 ms"));
    EXPECT_THAT(e.what(), HasSubstr("stopped or overloaded"));
  }
  // Once it answers again, the late answer to the first request is skipped
  // and the second request gets its own.
  server.Resume();
  store.set("k2", "v2");
}

// The server files each wait under the first key it misses: a wait on
// several keys, set in any order, is answered once, when its last key
// arrives, and not before; waits on keys never set time out naming them.
TEST(TcpStoreTest, WaitsOnSeveralKeysEndWhenTheirLastKeyIsSet) {
  TcpStoreServer server(ServerOptions(""));
  constexpr int kWaiters = 40;
  constexpr int kKeys = 8;
  TcpStore setter("127.0.0.1", server.port(), ClientOptions("", -1));
  std::atomic<int> keys_set{0};
  std::vector<int> seen_at(kWaiters, -1);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWaiters; ++w) {
    threads.emplace_back([&, w] {
      TcpStore store("127.0.0.1", server.port(), ClientOptions("", -1));
      // Waiter w needs keys w % kKeys .. kKeys - 1, half of them listed
      // first to last, half last to first.
      std::vector<std::string> keys;
      for (int k = w % kKeys; k < kKeys; ++k) {
        keys.push_back("k" + std::to_string(k));
      }
      if (w % 2 == 1) std::reverse(keys.begin(), keys.end());
      store.wait(keys, milliseconds(20000));
      seen_at[w] = keys_set.load();
    });
  }
  std::this_thread::sleep_for(milliseconds(300));  // Every wait is filed.
  for (int k = 0; k < kKeys; ++k) {
    keys_set = k + 1;
    setter.set("k" + std::to_string(k), "v");
    std::this_thread::sleep_for(milliseconds(50));
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWaiters; ++w) {
    // Keys are set in order 0..7: every wait needs k7, the last.
    EXPECT_EQ(seen_at[w], kKeys) << "waiter " << w;
  }
  try {
    setter.wait({"k3", "never", "k5", "nor this"}, milliseconds(200));
    FAIL() << "a wait on keys never set returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("never"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("nor this"));
    EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("k5")));
  }
  // A waiting client that goes away takes its waits with it.
  {
    TcpStore gone("127.0.0.1", server.port(), ClientOptions("", -1));
    EXPECT_THROW(gone.wait({"later"}, milliseconds(100)), TimeoutError);
  }
  setter.set("later", "v");
  EXPECT_EQ(setter.try_get("later"), "v");
}

}  // namespace
}  // namespace accel
