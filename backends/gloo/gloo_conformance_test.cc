// Runs the backend conformance suite (tests/conformance.cc) on Gloo, over
// each of its transports: shared memory (every rank on this host), TCP only,
// both (ranks split into two pretend hosts: shared memory on each, Gloo
// between them), and shared memory with tiny slots (every buffer in many
// chunks, parts of every shape).
#include "accel/runtime/comm/registry.h"
#include "backends/gloo/gloo_transport.h"
#include "tests/conformance.h"

namespace accel::testing {
namespace {

template <typename Configure>
BackendFactory Variant(Configure configure) {
  return [configure](const BackendContext& context) {
    GlooOptions options;
    configure(options);
    return std::make_unique<GlooTransport>(context, options);
  };
}

const BackendRegistration kTcpOnly("gloo_tcp", Variant([](GlooOptions& o) {
                                     o.shared_memory = false;
                                   }));

const BackendRegistration kTwoHosts(
    "gloo_two_hosts", Variant([](GlooOptions& o) {
      o.host_key = [](int rank) { return "host " + std::to_string(rank % 2); };
    }));

const BackendRegistration kTinySlots(
    "gloo_tiny_slots", Variant([](GlooOptions& o) {
      o.shared_memory_options.slot_bytes = 4096;
      o.shared_memory_options.small_allreduce_bytes = 64;
    }));

}  // namespace

const ConformanceSetup& GetConformanceSetup() {
  static const ConformanceSetup setup{
      {"gloo", "gloo_tcp", "gloo_two_hosts", "gloo_tiny_slots"}};
  return setup;
}

}  // namespace accel::testing
