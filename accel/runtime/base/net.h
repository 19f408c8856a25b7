// Small TCP helpers shared by the rendezvous store and the backends.
//
//   int port = 0;
//   int listener = accel::net::Listen("127.0.0.1", 0, &port);
//   int fd = accel::net::Connect("127.0.0.1", port, std::chrono::seconds(5),
//                                "rendezvous store");
//
// Errors are accel exceptions that name the address and what it was for.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace accel::net {

using Clock = std::chrono::steady_clock;

// Listens on host:port (port 0 picks a free one, returned in *bound_port).
// A port in use is a UsageError that says so.
int Listen(const std::string& host, int port, int* bound_port);

// Connects to host:port, retrying refused connections until `timeout`:
// the listener may not be up yet. `what` names the peer in errors.
int Connect(const std::string& host, int port,
            std::chrono::milliseconds timeout, const std::string& what);

// Writes all of `data`; throws PeerError when the peer is gone.
void SendAll(int fd, const void* data, size_t size, const std::string& what);

enum class RecvStatus { kOk, kClosed, kTimedOut };

// Reads exactly `size` bytes unless the peer closes or `deadline` passes.
RecvStatus RecvAll(int fd, void* data, size_t size, Clock::time_point deadline);

// The local address that packets to `host` leave from: the address peers
// on that network can reach us at ("127.0.0.1" when `host` is loopback).
std::string LocalAddressToward(const std::string& host);

// Whether `host` resolves to a loopback address.
bool IsLoopback(const std::string& host);

// A port that was free on `host` a moment ago.
int FindFreePort(const std::string& host);

// Makes a connected socket fail with ETIMEDOUT once its peer's machine has
// not acknowledged anything for about `timeout`, idle or not (TCP keepalive
// and TCP_USER_TIMEOUT). A stopped peer process does not trigger it: its
// kernel still acknowledges.
void SetNetworkTimeout(int fd, std::chrono::milliseconds timeout);

// The IP address at the other end of a connected socket ("" if unknown).
std::string PeerAddress(int fd);

// Whether a socket error means the peer's machine stopped answering (as
// opposed to the peer closing or resetting the connection).
bool IsUnreachableError(int error);

}  // namespace accel::net
