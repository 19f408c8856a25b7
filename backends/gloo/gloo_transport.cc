#include "backends/gloo/gloo_transport.h"

#include <dirent.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/env/env_value.h"
#include "backends/shm/host_layout.h"

namespace accel {
namespace {

// Lets Gloo's full-mesh connection run over accel's store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<accel::Store> store,
                   std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<accel::Store> store_;
  std::chrono::milliseconds timeout_;
};

int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

bool IsConnectedSocket(int fd) {
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) return false;
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0;
}

// Gloo's typed setters only need the element size; reductions are ours.
template <typename Fn>
void WithElementType(DType dtype, Fn&& fn) {
  switch (ElementSize(dtype)) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    default:
      return fn(uint64_t{});
  }
}

// Runs a Gloo call, translating its exceptions into accel's.
template <typename Fn>
void Translate(Fn&& fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    const std::string message = e.what();
    if (message.find("Timed out") != std::string::npos) {
      throw TimeoutError(message);
    }
    throw PeerError(message);
  } catch (const gloo::Exception& e) {
    throw PeerError(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    throw Error(std::string("gloo check failed: ") + e.what());
  }
}

// Up to this many bytes in total, allreduce over Gloo is an allgather plus
// a local reduction: latency matters more than bandwidth there.
constexpr size_t kSmallAllreduceBytes = 64 << 10;

// Gloo matches messages by tag; the sequence number is the same on every
// rank for the same collective.
uint32_t Tag(uint64_t sequence) { return static_cast<uint32_t>(sequence); }

const BackendRegistration kRegistration(
    "gloo", [](const BackendContext& context) -> std::unique_ptr<Transport> {
      return std::make_unique<GlooTransport>(context);
    });

}  // namespace

GlooOptions GlooOptions::FromEnvironment() {
  GlooOptions options;
  options.shared_memory =
      EnvSwitch("ACCEL_SHARED_MEMORY").value_or(options.shared_memory);
  return options;
}

GlooTransport::GlooTransport(const BackendContext& context, GlooOptions options)
    : Transport(context) {
  try {
    // Connecting is part of the rendezvous, bounded by what is left of its
    // timeout; collectives then pass their own timeouts.
    const auto timeout = context.connect_timeout.count() > 0
                             ? context.connect_timeout
                             : context.options.timeout;
    if (size() > 1 && context.store == nullptr) {
      throw UsageError(
          "the gloo backend needs a store to meet the other "
          "ranks");
    }
    HostLayout layout;
    if (size() == 1) {
      layout = HostLayout::FromKeys({""});
    } else if (!options.shared_memory) {
      std::vector<std::string> alone;
      for (int r = 0; r < size(); ++r) alone.push_back(std::to_string(r));
      layout = HostLayout::FromKeys(alone);
    } else {
      const std::string key = options.host_key ? options.host_key(rank())
                                               : HostLayout::ThisHostKey();
      layout =
          HostLayout::Exchange(*context.store, rank(), size(), key, timeout);
    }
    hosts_ = std::move(layout.hosts);
    host_of_ = std::move(layout.host_of);
    local_rank_of_ = std::move(layout.local_rank);
    host_ = host_of_[rank()];
    local_rank_ = local_rank_of_[rank()];
    if (hosts_[host_].size() > 1) {
      PrefixStore store("shm/" + std::to_string(host_), context.store);
      // Its messages name ranks in the job, in a process subgroup too.
      std::vector<int> job_ranks = hosts_[host_];
      if (!context.job_ranks.empty()) {
        for (int& r : job_ranks) r = context.job_ranks[r];
      }
      try {
        local_ = std::make_unique<SharedMemoryGroup>(
            local_rank_, job_ranks, store, timeout,
            options.shared_memory_options);
      } catch (const UsageError&) {
        throw;
      } catch (const Error& e) {
        const std::string message =
            std::string(
                "setting up shared memory with this host's other "
                "ranks: ") +
            e.what() +
            " (ACCEL_SHARED_MEMORY=0 connects them over TCP instead)";
        if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(message);
        // Another rank's failure stays one; this rank's own (a file-size
        // limit, a full /dev/shm) is not, and its exit code says so.
        if (const auto* peer = dynamic_cast<const PeerError*>(&e)) {
          throw PeerError(message, peer->failed_rank());
        }
        throw Error(message);
      }
    }
    if (host_count() > 1 && leader()) {
      Translate([&] {
        gloo::transport::tcp::attr attr;
        attr.hostname = context.host;
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto gloo_context =
            std::make_shared<gloo::rendezvous::Context>(host_, host_count());
        // Gloo waits five times its timeout for a pair's first connection
        // (gloo/transport/tcp/pair.h); the ranks have all met at the store
        // by now (ProcessGroup), so its own key waits are short anyway.
        gloo_context->setTimeout(
            std::max(std::chrono::milliseconds(1), timeout / 5));
        GlooStoreAdapter store(
            std::make_shared<PrefixStore>("hosts", context.store), timeout);
        gloo_context->connectFullMesh(store, device);
        gloo_context->setTimeout(context.options.timeout);
        // A pair's address is where it listened for its peer.
        for (int peer = 0; peer < host_count(); ++peer) {
          if (peer == host_) continue;
          const auto* address =
              dynamic_cast<const gloo::transport::tcp::Address*>(
                  &gloo_context->getPair(peer)->address());
          if (address != nullptr) {
            const sockaddr_storage& ss = address->getSockaddr();
            listen_ports_.push_back(
                ss.ss_family == AF_INET6
                    ? ntohs(
                          reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port)
                    : ntohs(
                          reinterpret_cast<const sockaddr_in*>(&ss)->sin_port));
          }
        }
        context_ = std::move(gloo_context);
      });
    }
  } catch (const Error& e) {
    const std::string what = e.what();
    // Gloo names the peer it could not reach as "[address]:port".
    const size_t open = what.find("Connect timeout [");
    if (open != std::string::npos) {
      const size_t start = open + std::strlen("Connect timeout [");
      const std::string peer =
          what.substr(start, what.find(']', start) - start);
      throw TimeoutError(
          Where() + "the ranks at " + peer +
          " accepted no data connection within the rendezvous timeout "
          "(--rendezvous_timeout_s), though every rank reached the store: is "
          "a firewall blocking the ports Gloo listens on? (" +
          what + ")");
    }
    RethrowWithPrefix(Where() + "connecting to the other ranks failed: ");
  }
}

GlooTransport::~GlooTransport() = default;

int GlooTransport::local_size() const {
  return static_cast<int>(hosts_[host_].size());
}

void GlooTransport::Abort() {
  if (local_) local_->Abort("its watchdog stopped the collective");
  if (listen_ports_.empty()) return;
  // Gloo's own close() unregisters a socket before closing it, so the
  // operation blocked on it never hears of it, and Gloo gives no access to
  // its sockets. Shutting down the connections that peers made to our
  // pairs' listening ports, while Gloo still watches them, makes Gloo's
  // event loop see end-of-stream on both ends and fail the pending
  // operations. Every rank's watchdog does the same, so every pair is shut
  // down by the end that accepted it.
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return;
  while (dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    if (fd <= 2 || fd == dirfd(fds)) continue;
    if (IsConnectedSocket(fd) &&
        std::find(listen_ports_.begin(), listen_ports_.end(), LocalPort(fd)) !=
            listen_ports_.end()) {
      shutdown(fd, SHUT_RDWR);
    }
  }
  closedir(fds);
}

template <typename Body>
void GlooTransport::Run(const Op& op, Body&& body) {
  deadline_ = op.Deadline();
  try {
    body();
  } catch (const std::exception& e) {
    if (local_) local_->Abort(e.what());
    throw;
  }
}

SharedMemoryGroup::Call GlooTransport::LocalCall(const Op& op,
                                                 int phase) const {
  // Up to two shared memory steps per collective.
  return {op.sequence * 2 + static_cast<uint64_t>(phase), deadline_,
          op.overlapped};
}

void GlooTransport::RunAllgather(const Op& op, const void* input, void* output,
                                 size_t count, DType dtype) {
  if (count == 0) return;
  const size_t bytes = count * ElementSize(dtype);
  if (size() == 1) {
    std::memmove(output, input, bytes);
    return;
  }
  block_bytes_.assign(size(), bytes);
  RunAllgatherBytes(op, input, output, block_bytes_);
}

void GlooTransport::RunAllgatherv(const Op& op, const void* input, void* output,
                                  const std::vector<size_t>& counts,
                                  DType dtype) {
  const size_t element = ElementSize(dtype);
  std::vector<size_t> bytes(counts.size());
  size_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    bytes[r] = counts[r] * element;
    total += bytes[r];
  }
  if (total == 0) return;
  if (size() == 1) {
    std::memmove(output, input, total);
    return;
  }
  RunAllgatherBytes(op, input, output, bytes);
}

void GlooTransport::RunAllgatherBytes(const Op& op, const void* input,
                                      void* output,
                                      const std::vector<size_t>& bytes) {
  std::vector<size_t>& offsets = block_offsets_;
  offsets.resize(size());
  size_t total = 0;
  for (int r = 0; r < size(); ++r) {
    offsets[r] = total;
    total += bytes[r];
  }
  Run(op, [&] {
    if (host_count() == 1) {
      // Every rank here, local rank = rank.
      local_->Allgatherv(LocalCall(op, 0), input, output, bytes, offsets);
      return;
    }
    if (host_count() == size()) {
      HostsAllgatherv(op, input, output, bytes);
      return;
    }
    // This host's blocks, in local order, at its leader.
    const std::vector<int>& here = hosts_[host_];
    std::vector<size_t> host_bytes(host_count(), 0);
    for (int r = 0; r < size(); ++r) host_bytes[host_of_[r]] += bytes[r];
    std::vector<char> block(leader() ? host_bytes[host_] : 0);
    const void* host_block = input;
    if (local_) {
      std::vector<size_t> local_bytes, local_offsets;
      size_t at = 0;
      for (int r : here) {
        local_bytes.push_back(bytes[r]);
        local_offsets.push_back(at);
        at += bytes[r];
      }
      local_->Allgatherv(LocalCall(op, 0), input, block.data(), local_bytes,
                         local_offsets, /*receiver=*/0);
      host_block = block.data();
    }
    if (leader()) {
      // Hosts' blocks in host order, then each rank's piece to its place.
      std::vector<char> by_host(total);
      HostsAllgatherv(op, host_block, by_host.data(), host_bytes);
      size_t at = 0;
      for (const auto& ranks : hosts_) {
        for (int r : ranks) {
          std::memcpy(static_cast<char*>(output) + offsets[r],
                      by_host.data() + at, bytes[r]);
          at += bytes[r];
        }
      }
    }
    if (local_) local_->Broadcast(LocalCall(op, 1), output, total, 0);
  });
}

void GlooTransport::RunAllreduce(const Op& op, void* buffer, size_t count,
                                 DType dtype, ReduceOp reduce_op) {
  if (count == 0 || size() == 1) return;
  Run(op, [&] {
    if (local_) {
      // With other hosts, only the leader needs this host's sum.
      local_->Allreduce(LocalCall(op, 0), buffer, count, dtype, reduce_op,
                        host_count() > 1 ? 0 : SharedMemoryGroup::kEveryRank);
    }
    if (host_count() == 1) return;
    if (leader()) HostsAllreduce(op, buffer, count, dtype, reduce_op);
    if (local_) {
      local_->Broadcast(LocalCall(op, 1), buffer, count * ElementSize(dtype),
                        0);
    }
  });
}

void GlooTransport::RunReduceScatter(const Op& op, const void* input,
                                     void* output,
                                     const std::vector<size_t>& counts,
                                     DType dtype, ReduceOp reduce_op) {
  if (host_count() == 1 && local_) {
    Run(op, [&] {
      local_->ReduceScatter(LocalCall(op, 0), input, output, counts, dtype,
                            reduce_op);
    });
    return;
  }
  ReduceScatterByAllreduce(op, input, output, counts, dtype, reduce_op);
}

void GlooTransport::RunBroadcast(const Op& op, void* buffer, size_t count,
                                 DType dtype, int root) {
  if (count == 0 || size() == 1) return;
  const size_t bytes = count * ElementSize(dtype);
  const int root_host = host_of_[root];
  Run(op, [&] {
    if (host_ == root_host && local_) {
      local_->Broadcast(LocalCall(op, 0), buffer, bytes, local_rank_of_[root]);
    }
    if (host_count() == 1) return;
    if (leader()) HostsBroadcast(op, buffer, bytes, root_host);
    if (host_ != root_host && local_) {
      local_->Broadcast(LocalCall(op, 1), buffer, bytes, 0);
    }
  });
}

void GlooTransport::RunBarrier(const Op& op) {
  if (size() == 1) return;
  Run(op, [&] {
    if (local_) local_->Barrier(LocalCall(op, 0));
    if (host_count() == 1) return;
    if (leader()) HostsBarrier(op);
    // Nobody here leaves before the other hosts have arrived.
    if (local_) local_->Barrier(LocalCall(op, 1));
  });
}

void GlooTransport::HostsAllgatherv(const Op& op, const void* input,
                                    void* output,
                                    const std::vector<size_t>& bytes) {
  const bool equal = std::all_of(bytes.begin(), bytes.end(),
                                 [&](size_t b) { return b == bytes.front(); });
  Translate([&] {
    // Gloo wants a valid pointer even for an empty contribution.
    uint8_t empty = 0;
    auto* in = bytes[host_] == 0
                   ? &empty
                   : static_cast<uint8_t*>(const_cast<void*>(input));
    if (equal) {
      gloo::AllgatherOptions options(context_);
      options.setInput(in, bytes[host_]);
      options.setOutput(static_cast<uint8_t*>(output),
                        bytes[host_] * host_count());
      options.setTag(Tag(op.sequence));
      options.setTimeout(op.timeout);
      gloo::allgather(options);
    } else {
      gloo::AllgathervOptions options(context_);
      options.setInput(in, bytes[host_]);
      options.setOutput(static_cast<uint8_t*>(output), bytes);
      options.setTag(Tag(op.sequence));
      options.setTimeout(op.timeout);
      gloo::allgatherv(options);
    }
  });
}

void GlooTransport::HostsAllreduce(const Op& op, void* buffer, size_t count,
                                   DType dtype, ReduceOp reduce_op) {
  const size_t bytes = count * ElementSize(dtype);
  const int hosts = host_count();
  if (count >= static_cast<size_t>(hosts) &&
      bytes * hosts <= kSmallAllreduceBytes) {
    // One exchange instead of the ring's 2 (hosts - 1) steps (measured with
    // //tools/bench:collectives; below one element per host Gloo's ring is
    // faster still). Every leader reduces the same data in host order, so
    // all get identical results.
    std::vector<char> gathered(bytes * hosts);
    HostsAllgatherv(op, buffer, gathered.data(),
                    std::vector<size_t>(hosts, bytes));
    std::memcpy(buffer, gathered.data(), bytes);
    for (int h = 1; h < hosts; ++h) {
      Reduce(dtype, reduce_op, buffer, buffer, gathered.data() + h * bytes,
             count);
    }
    return;
  }
  Translate([&] {
    gloo::AllreduceOptions options(context_);
    WithElementType(dtype, [&](auto placeholder) {
      using T = decltype(placeholder);
      options.setOutput(static_cast<T*>(buffer), count);
    });
    options.setReduceFunction(
        [dtype, reduce_op](void* out, const void* a, const void* b, size_t n) {
          Reduce(dtype, reduce_op, out, a, b, n);
        });
    options.setTag(Tag(op.sequence));
    options.setTimeout(op.timeout);
    gloo::allreduce(options);
  });
}

void GlooTransport::HostsBroadcast(const Op& op, void* buffer, size_t bytes,
                                   int root_host) {
  Translate([&] {
    gloo::BroadcastOptions options(context_);
    options.setOutput(static_cast<uint8_t*>(buffer), bytes);
    options.setRoot(root_host);
    options.setTag(Tag(op.sequence));
    options.setTimeout(op.timeout);
    gloo::broadcast(options);
  });
}

void GlooTransport::HostsBarrier(const Op& op) {
  Translate([&] {
    gloo::BarrierOptions options(context_);
    options.setTag(Tag(op.sequence));
    options.setTimeout(op.timeout);
    gloo::barrier(options);
  });
}

}  // namespace accel
