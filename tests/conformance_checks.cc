// The conformance suite's checks of each operation's results
// (conformance_internal.h), run by ConformanceTest on whole jobs and by
// ConformanceGroupTest on process subgroups.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/base/errors.h"
#include "tests/conformance.h"
#include "tests/conformance_internal.h"

namespace accel::testing::conformance_internal {

// The element counts every operation runs with. The largest crosses many
// shared-memory slots and Gloo's chunks; ACCEL_CONFORMANCE_LARGE_COUNT
// lowers it where each element costs much more (the sanitizer runs,
// tools/sanitize.sh: the tiny-slot backends still cross many slots there).
const std::vector<size_t>& Counts() {
  static const std::vector<size_t> counts = [] {
    const char* large = std::getenv("ACCEL_CONFORMANCE_LARGE_COUNT");
    const size_t largest = large != nullptr && *large != '\0'
                               ? std::stoul(large)
                               : size_t{1} << 20;
    return std::vector<size_t>{0, 1, 3, 1000, std::max<size_t>(largest, 1001)};
  }();
  return counts;
}

// A value per (rank, index) that every dtype holds exactly and whose sums
// over 4 ranks, and products for kProduct, stay exact too.
double Value(DType dtype, int rank, size_t i, ReduceOp op) {
  if (dtype == DType::kBool) return static_cast<double>((rank + i) % 2);
  if (op == ReduceOp::kProduct) return static_cast<double>(1 + (rank + i) % 3);
  return static_cast<double>((rank * 7 + i) % 31);
}

double Combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

std::string Label(const char* op, DType dtype, size_t count, int rank) {
  return std::string(op) + " " + DTypeName(dtype) + " count " +
         std::to_string(count) + " on rank " + std::to_string(rank);
}

// counts[r] for a reduce-scatter or allgatherv around `count`: rank 1 gets
// nothing, odd ranks half, the others `count`.
std::vector<size_t> UnequalCounts(int ranks, size_t count) {
  std::vector<size_t> counts(ranks);
  for (int r = 0; r < ranks; ++r) {
    counts[r] = r == 1 ? 0 : (r % 2 ? count / 2 : count);
  }
  return counts;
}

// Runs a reduce-scatter of `counts` and checks this rank's segment;
// `in_place` passes this rank's segment of the input as the output.
void CheckReduceScatter(Communicator& comm, DType dtype, ReduceOp op,
                        const std::vector<size_t>& counts, bool in_place) {
  size_t total = 0;
  size_t before = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) before = total;
    total += counts[r];
  }
  const size_t mine = counts[comm.rank()];
  Buffer input(dtype, total);
  for (size_t i = 0; i < total; ++i) {
    input.Set(i, Value(dtype, comm.rank(), i, op));
  }
  Buffer output(dtype, mine);
  char* in = static_cast<char*>(input.data());
  void* out = in_place ? in + before * ElementSize(dtype) : output.data();
  comm.reduce_scatter(in, out, counts, dtype, op);
  auto expected = [&](size_t i) {
    double result = Value(dtype, 0, before + i, op);
    for (int r = 1; r < comm.size(); ++r) {
      result = Combine(op, result, Value(dtype, r, before + i, op));
    }
    return result;
  };
  Buffer& result = in_place ? input : output;
  const size_t at = in_place ? before : 0;
  std::string counts_text;
  for (size_t c : counts) counts_text += " " + std::to_string(c);
  EXPECT_VALUES(mine, result.At(at + i_), expected(i_),
                Label("reduce_scatter", dtype, mine, comm.rank()) + " " +
                    ReduceOpName(op) + (in_place ? " in place" : "") +
                    ", counts" + counts_text);
}

void CheckAllgather(Communicator& comm, const std::vector<size_t>& counts) {
  const int n = comm.size();
  for (DType dtype : kAllDTypes) {
    for (size_t count : counts) {
      Buffer input(dtype, count);
      for (size_t i = 0; i < count; ++i)
        input.Set(i, Value(dtype, comm.rank(), i));
      Buffer output(dtype, count * n);
      comm.allgather(input.data(), output.data(), count, dtype);
      EXPECT_VALUES(count * n, output.At(i_),
                    Value(dtype, static_cast<int>(i_ / count), i_ % count),
                    Label("allgather", dtype, count, comm.rank()));
    }
  }
}

void CheckAllgathervWithUnequalAndZeroCounts(
    Communicator& comm, const std::vector<size_t>& counts) {
  const int n = comm.size();
  for (DType dtype : kAllDTypes) {
    for (size_t count : counts) {
      const std::vector<size_t> counts = UnequalCounts(n, count);
      std::vector<size_t> offsets(n);
      size_t total = 0;
      for (int r = 0; r < n; ++r) {
        offsets[r] = total;
        total += counts[r];
      }
      Buffer input(dtype, counts[comm.rank()]);
      for (size_t i = 0; i < counts[comm.rank()]; ++i) {
        input.Set(i, Value(dtype, comm.rank(), i));
      }
      Buffer output(dtype, total);
      comm.allgatherv(input.data(), output.data(), counts, dtype);
      for (int r = 0; r < n; ++r) {
        EXPECT_VALUES(counts[r], output.At(offsets[r] + i_),
                      Value(dtype, r, i_),
                      Label("allgatherv", dtype, count, comm.rank()) +
                          " from rank " + std::to_string(r));
      }
    }
  }
}

void CheckAllreduceEveryOperation(Communicator& comm,
                                  const std::vector<size_t>& counts) {
  const int n = comm.size();
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!SupportsReduction(dtype, op)) continue;
      for (size_t count : counts) {
        Buffer buffer(dtype, count);
        for (size_t i = 0; i < count; ++i) {
          buffer.Set(i, Value(dtype, comm.rank(), i, op));
        }
        comm.allreduce(buffer.data(), count, dtype, op);
        auto expected = [&](size_t i) {
          double result = Value(dtype, 0, i, op);
          for (int r = 1; r < n; ++r) {
            result = Combine(op, result, Value(dtype, r, i, op));
          }
          return result;
        };
        EXPECT_VALUES(count, buffer.At(i_), expected(i_),
                      Label("allreduce", dtype, count, comm.rank()) + " " +
                          ReduceOpName(op));
      }
    }
  }
}

void CheckReduceScatterEveryOperation(Communicator& comm,
                                      const std::vector<size_t>& counts) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!SupportsReduction(dtype, op)) continue;
      for (size_t count : counts) {
        // The largest (many slots' worth) only as sharded training sends
        // it: summed float32 and bfloat16 gradients.
        if (count > 1000 &&
            (op != ReduceOp::kSum ||
             (dtype != DType::kFloat32 && dtype != DType::kBFloat16))) {
          continue;
        }
        const std::vector<size_t> equal(comm.size(), count);
        CheckReduceScatter(comm, dtype, op, equal, false);
        CheckReduceScatter(comm, dtype, op, UnequalCounts(comm.size(), count),
                           false);
      }
    }
  }
}

void CheckBroadcastFromEveryRoot(Communicator& comm,
                                 const std::vector<size_t>& counts) {
  for (DType dtype : kAllDTypes) {
    for (size_t count : counts) {
      // The largest count from one root only, to keep the suite fast.
      const int roots = count > 1000 ? 1 : comm.size();
      for (int root = comm.size() - 1; root >= comm.size() - roots; --root) {
        Buffer buffer(dtype, count);
        for (size_t i = 0; i < count; ++i) {
          buffer.Set(i, Value(dtype, comm.rank(), i));
        }
        comm.broadcast(buffer.data(), count, dtype, root);
        EXPECT_VALUES(count, buffer.At(i_), Value(dtype, root, i_),
                      Label("broadcast", dtype, count, comm.rank()) +
                          " from root " + std::to_string(root));
      }
    }
  }
}

// Every rank sends `count` elements to every rank: element i of the block
// from rank q to rank r is Value(q, r * count + i).
void CheckAllToAll(Communicator& comm, const std::vector<size_t>& counts) {
  const int n = comm.size();
  for (DType dtype : kAllDTypes) {
    for (size_t count : counts) {
      // The largest (size() blocks of it per rank) in float32 only.
      if (count > 1000 && dtype != DType::kFloat32) continue;
      Buffer input(dtype, count * n);
      for (size_t i = 0; i < count * n; ++i) {
        input.Set(i, Value(dtype, comm.rank(), i));
      }
      Buffer output(dtype, count * n);
      comm.all_to_all(input.data(), output.data(), count, dtype);
      for (int q = 0; q < n; ++q) {
        EXPECT_VALUES(count, output.At(q * count + i_),
                      Value(dtype, q, comm.rank() * count + i_),
                      Label("all_to_all", dtype, count, comm.rank()) +
                          " from rank " + std::to_string(q));
      }
    }
  }
}

// Rank q sends rank r ((q + r) % 3) * count / 2 elements (some none):
// element i of that block is Value(q, 1000 * r + i).
void CheckAllToAllvWithUnequalAndZeroCounts(Communicator& comm,
                                            const std::vector<size_t>& counts) {
  const int n = comm.size();
  const int me = comm.rank();
  for (DType dtype :
       {DType::kFloat32, DType::kInt64, DType::kBFloat16, DType::kUInt8}) {
    for (size_t count : counts) {
      auto sends = [&](int q, int r) {
        return static_cast<size_t>((q + r) % 3) * count / 2;
      };
      std::vector<size_t> send(n), receive(n);
      size_t sending = 0, receiving = 0;
      for (int r = 0; r < n; ++r) {
        send[r] = sends(me, r);
        receive[r] = sends(r, me);
        sending += send[r];
        receiving += receive[r];
      }
      Buffer input(dtype, sending);
      size_t at = 0;
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < send[r]; ++i) {
          input.Set(at++, Value(dtype, me, 1000 * r + i));
        }
      }
      Buffer output(dtype, receiving);
      comm.all_to_allv(input.data(), send, output.data(), receive, dtype);
      at = 0;
      for (int q = 0; q < n; ++q) {
        EXPECT_VALUES(receive[q], output.At(at + i_),
                      Value(dtype, q, 1000 * me + i_),
                      Label("all_to_allv", dtype, count, me) + " from rank " +
                          std::to_string(q));
        at += receive[q];
      }
    }
  }
}

}  // namespace accel::testing::conformance_internal
