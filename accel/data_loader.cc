#include "accel/data_loader.h"

namespace accel::data {
namespace {

// SplitMix64's finalizer: a well-mixed 64-bit value from any input.
uint64_t Mix(uint64_t value) {
  value += 0x9e3779b97f4a7c15ull;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

}  // namespace

at::Generator& SampleGenerator() {
  thread_local at::Generator generator =
      at::make_generator<at::CPUGeneratorImpl>(0);
  return generator;
}

uint64_t SampleSeed(uint64_t seed, int64_t epoch, int64_t index) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(epoch)) ^
             static_cast<uint64_t>(index));
}

}  // namespace accel::data
