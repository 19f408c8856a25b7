#include "accel/data/data_loader.h"

#include <c10/util/Exception.h>

#include <exception>
#include <string>

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

void RethrowWithContext(const std::string& where) {
  std::string what = "an exception that is not a std::exception";
  try {
    throw;
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::throw_with_nested(DataError("DataLoader: " + where + ": " + what));
}

std::string ListSamples(const std::vector<int64_t>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) {
    text += (i ? ", " : "") + std::to_string(ids[i]);
  }
  if (ids.size() > 8) text += ", ...";
  return text;
}

uint64_t SampleSeed(uint64_t seed, int64_t epoch, int64_t index) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(epoch)) ^
             static_cast<uint64_t>(index));
}

}  // namespace accel::data
