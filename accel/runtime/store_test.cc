#include "accel/runtime/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "accel/runtime/errors.h"
#include "accel/runtime/net.h"
#include "accel/runtime/tcp_store.h"

namespace accel {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// The same behaviour is required of every Store implementation.
void ExpectStoreSemantics(Store& a, Store& b) {
  a.set("k", "v1");
  EXPECT_EQ(b.get("k", milliseconds(1000)), "v1");
  EXPECT_EQ(b.try_get("absent"), std::nullopt);
  EXPECT_EQ(a.add("counter", 5), 5);
  EXPECT_EQ(b.add("counter", -2), 3);
  std::string binary("\0\1\2\xff", 4);
  a.set("binary", binary);
  EXPECT_EQ(b.get("binary", milliseconds(1000)), binary);

  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    a.set("late", "here");
  });
  EXPECT_EQ(b.get("late", milliseconds(5000)), "here");
  setter.join();

  try {
    b.wait({"k", "never1", "never2"}, milliseconds(200));
    ADD_FAILURE() << "wait on absent keys did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("never1, "));
    EXPECT_THAT(e.what(), HasSubstr("never2]"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("k,")));
    EXPECT_THAT(e.what(), HasSubstr("200 ms"));
  }
}

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
  const char hello[] = {
      // length 17: op 1 (hello), secret length 0 (8 bytes), rank 2 (8 bytes)
      17, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  net::SendAll(raw, hello, sizeof(hello), "test");
  char reply[5];
  ASSERT_EQ(
      net::RecvAll(raw, reply, 5, net::Clock::now() + std::chrono::seconds(2)),
      net::RecvStatus::kOk);
  close(raw);
  std::map<int, std::string> departed;
  for (int i = 0; i < 100 && departed.size() < 2; ++i) {
    departed = observer.departures();
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(departed[1], "exited");
  EXPECT_EQ(departed[2], "crashed");
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
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
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

}  // namespace
}  // namespace accel
