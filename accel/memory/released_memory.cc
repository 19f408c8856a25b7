#include "accel/memory/released_memory.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>

namespace accel {
namespace {

// Address space only (PROT_NONE, MAP_NORESERVE): no memory, no commit. A
// terabyte, so that every flat buffer of a large model has a part of its
// own; 64 GiB where that much cannot be had (a part each as long as they
// last).
constexpr size_t kLarge = size_t{1} << 40;
constexpr size_t kSmall = size_t{64} << 30;
constexpr size_t kPage = 4096;
constexpr size_t kMaxParts = 1 << 14;
constexpr size_t kMaxNames = 1 << 16;

char* g_region = nullptr;
size_t g_reserved = 0;

// Owners' parts and the names in them, as offsets in the region: written
// under g_mutex, read by the handler (plain loads of entries published
// before their count grew).
struct Part {
  const void* owner;
  size_t begin;
  size_t end;
};
struct Name {
  size_t begin;
  size_t end;
  char text[96];
};
std::mutex g_mutex;
Part* g_parts = nullptr;
Name* g_names = nullptr;
volatile size_t g_part_count = 0;
volatile size_t g_name_count = 0;
size_t g_next = 0;  // The first offset no part has.
struct sigaction g_previous;
// "[rank 1/4] ", written when the range is reserved (the handler may only
// write): which rank died, among the lines of several.
char g_rank[48] = "";

// Whether the faulting access wrote: the page fault's error code has bit 1
// set for a write (x86-64); elsewhere it cannot be told, and it reads as
// "used".
const char* AccessOf(void* context) {
#if defined(__x86_64__) && defined(REG_ERR)
  const auto* state = static_cast<const ucontext_t*>(context);
  return (state->uc_mcontext.gregs[REG_ERR] & 2) != 0 ? "written" : "read";
#else
  (void)context;
  return "used";
#endif
}

void Say(const char* text) {
  size_t size = 0;
  while (text[size] != '\0') ++size;
  ssize_t ignored = write(STDERR_FILENO, text, size);
  (void)ignored;
}

// Appends `text` to the message (async-signal-safe), cutting what does not
// fit.
void Append(char* message, size_t capacity, size_t* size, const char* text) {
  while (*text != '\0' && *size + 1 < capacity) message[(*size)++] = *text++;
}

// The name of the parameter at `offset` in the region, or null.
const char* NameAt(size_t offset) {
  for (size_t i = 0; i < g_name_count; ++i) {
    if (offset >= g_names[i].begin && offset < g_names[i].end) {
      return g_names[i].text;
    }
  }
  return nullptr;
}

void OnFault(int signal_number, siginfo_t* info, void* context) {
  const char* at = static_cast<const char*>(info->si_addr);
  if (g_region != nullptr && at >= g_region && at < g_region + g_reserved) {
    const char* name = NameAt(static_cast<size_t>(at - g_region));
    // Async-signal-safe, and one write(2), so that the lines of ranks
    // failing at once do not interleave.
    char message[1024];
    size_t size = 0;
    for (const char* piece :
         {"\naccel: ", static_cast<const char*>(g_rank),
          name != nullptr ? "parameter '" : "a parameter",
          name != nullptr ? name : "", name != nullptr ? "'" : "",
          " of a ZeRO stage-3 unit was ", AccessOf(context),
          " while its unit was not running: between uses a rank holds only "
          "its share of it. Read the weights with "
          "accelerator.get_state_dict(model) (every rank calls it), change "
          "them through the prepared optimizer or load_state, and run a unit "
          "through the prepared model or accel::forward(layer, ...), not "
          "layer->forward.\n"}) {
      Append(message, sizeof(message), &size, piece);
    }
    message[size] = '\0';
    Say(message);
    signal(SIGSEGV, SIG_DFL);  // The access runs again and ends the process.
    return;
  }
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 &&
      g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(signal_number, info, context);
  } else if (g_previous.sa_handler != SIG_DFL &&
             g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(signal_number);
  } else {
    signal(SIGSEGV, SIG_DFL);
  }
}

void* ReserveAddresses(size_t bytes) {
  void* region = mmap(nullptr, bytes, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return region == MAP_FAILED ? nullptr : region;
}

void Reserve() {
  void* region = ReserveAddresses(kLarge);
  g_reserved = kLarge;
  if (region == nullptr) {
    region = ReserveAddresses(kSmall);
    g_reserved = kSmall;
  }
  if (region == nullptr) return;  // Then released storage is null.
  g_parts = new Part[kMaxParts];
  g_names = new Name[kMaxNames];
  g_region = static_cast<char*>(region);
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (rank != nullptr && world != nullptr) {
    std::snprintf(g_rank, sizeof(g_rank), "[rank %.8s/%.8s] ", rank, world);
  }
  struct sigaction action = {};
  action.sa_sigaction = OnFault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &g_previous);
}

// Owner's part of the region (given it now, when it has none and one is
// left), or null; under g_mutex.
const Part* PartOf(const void* owner, size_t bytes) {
  for (size_t i = 0; i < g_part_count; ++i) {
    if (g_parts[i].owner == owner &&
        bytes <= g_parts[i].end - g_parts[i].begin) {
      return &g_parts[i];
    }
  }
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  if (g_part_count == kMaxParts || size > g_reserved - g_next) return nullptr;
  g_parts[g_part_count] = {owner, g_next, g_next + size};
  g_next += size;
  return &g_parts[g_part_count++];
}

void EnsureReserved() {
  static std::once_flag once;
  std::call_once(once, Reserve);
}

}  // namespace

void* ReleasedMemory(const void* owner, size_t bytes) {
  EnsureReserved();
  if (g_region == nullptr || bytes > g_reserved) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  const Part* part = PartOf(owner, bytes);
  return part != nullptr ? g_region + part->begin : g_region;
}

void NameReleasedBytes(const void* owner, size_t owner_bytes, size_t offset,
                       size_t bytes, const std::string& name) {
  EnsureReserved();
  if (g_region == nullptr || offset + bytes > owner_bytes) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const Part* part = PartOf(owner, owner_bytes);
  if (part == nullptr || g_name_count == kMaxNames) return;
  Name& entry = g_names[g_name_count];
  entry.begin = part->begin + offset;
  entry.end = part->begin + offset + bytes;
  std::snprintf(entry.text, sizeof(entry.text), "%s", name.c_str());
  g_name_count = g_name_count + 1;
}

void ForgetReleasedNames(const void* owner) {
  if (g_region == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t p = 0; p < g_part_count; ++p) {
    if (g_parts[p].owner != owner) continue;
    for (size_t n = 0; n < g_name_count; ++n) {
      if (g_names[n].begin >= g_parts[p].begin &&
          g_names[n].begin < g_parts[p].end) {
        g_names[n].end = g_names[n].begin;  // Matches no address.
      }
    }
  }
}

bool IsReleasedMemory(const void* at) {
  const char* byte = static_cast<const char*>(at);
  return g_region != nullptr && byte >= g_region &&
         byte < g_region + g_reserved;
}

}  // namespace accel
