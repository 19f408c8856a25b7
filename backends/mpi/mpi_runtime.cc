#include "backends/mpi/mpi_runtime.h"

#include <arpa/inet.h>
#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/net.h"
#include "accel/runtime/base/random_hex.h"

namespace accel {
namespace {

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// An address of this host that other hosts can reach, for a job that spans
// several hosts and gave no MASTER_ADDR.
std::string ReachableAddress() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(name, nullptr, &hints, &found) == 0) {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        char text[64];
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
        if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) &&
            !net::IsLoopback(text)) {
          freeaddrinfo(found);
          return text;
        }
      }
      freeaddrinfo(found);
    }
  }
  throw UsageError(
      "the MPI job spans several hosts and MASTER_ADDR is not set, and this "
      "host's name does not resolve to an address the others can reach: "
      "set MASTER_ADDR to an address of rank 0's host (mpirun -x "
      "MASTER_ADDR=...)");
}

}  // namespace

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw UsageError(
        "MPI is already finalized: create accel's MPI "
        "communicators before MPI_Finalize");
  }
  if (initialized) {
    MPI_Query_thread(&level_);
  } else {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &level_) !=
        MPI_SUCCESS) {
      throw Error("MPI_Init_thread failed");
    }
    owned_ = true;
    std::atexit(FinalizeAtExit);
    // Errors come back as codes that accel turns into its messages, instead
    // of MPI's default of ending the job without naming the call.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  if (level_ < MPI_THREAD_SERIALIZED) {
    throw UsageError(
        std::string("MPI was initialized with ") + ThreadLevelName(level_) +
        ", but accel runs collectives on a worker thread and needs "
        "MPI_THREAD_SERIALIZED at least: initialize MPI with "
        "MPI_Init_thread(..., MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, "
        "...), or leave MPI to accel");
  }
}

MpiRuntime& MpiRuntime::Get() {
  // Never destroyed: MPI_Finalize runs at exit, not with static destructors.
  static MpiRuntime* runtime = new MpiRuntime();
  return *runtime;
}

DistributedEnvironment MpiRuntime::JobEnvironment(
    const DistributedEnvironment& given) {
  MpiRuntime& mpi = Get();
  auto lock = mpi.Lock();
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                      &host);
  MPI_Comm_rank(host, &local_rank);
  MPI_Comm_size(host, &local_size);
  MPI_Comm_free(&host);
  if (given.launched && (given.rank != rank || given.world_size != size)) {
    throw UsageError(
        "RANK=" + std::to_string(given.rank) +
        " WORLD_SIZE=" + std::to_string(given.world_size) +
        " from the environment, but MPI places this process at rank " +
        std::to_string(rank) + " of " + std::to_string(size) +
        ": --backend=mpi needs processes started by mpirun or srun (give "
        "the program --num_processes=N --backend=mpi and it runs mpirun "
        "itself)");
  }
  DistributedEnvironment env = given;
  env.launched = given.launched || size > 1;
  env.rank = rank;
  env.world_size = size;
  env.local_rank = local_rank;
  env.local_world_size = local_size;
  if (size == 1) return env;

  // Rank 0 hosts the store: it decides where, and tells the others.
  char text[1024] = {};
  if (rank == 0) {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    const std::string host = addr != nullptr      ? std::string(addr)
                             : local_size == size ? "127.0.0.1"
                                                  : ReachableAddress();
    const int chosen_port =
        port != nullptr ? given.master_port : net::FindFreePort(host);
    const std::string secret =
        given.run_secret.empty() ? RandomHex(16) : given.run_secret;
    std::snprintf(text, sizeof(text), "%s %d %s", host.c_str(), chosen_port,
                  secret.c_str());
  }
  if (MPI_Bcast(text, sizeof(text), MPI_CHAR, 0, MPI_COMM_WORLD) !=
      MPI_SUCCESS) {
    throw PeerError("rank " + std::to_string(rank) +
                    ": MPI could not share rank 0's rendezvous address");
  }
  std::istringstream in(text);
  if (!(in >> env.master_addr >> env.master_port >> env.run_secret)) {
    throw Error(std::string("malformed rendezvous address from rank 0: '") +
                text + "'");
  }
  return env;
}

}  // namespace accel
