#include "accel/memory/released_memory.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>

namespace accel {
namespace {

// Address space only (PROT_NONE, MAP_NORESERVE): no memory, no commit.
constexpr size_t kReserved = size_t{64} << 30;

char* g_region = nullptr;
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

void OnFault(int signal_number, siginfo_t* info, void* context) {
  const char* at = static_cast<const char*>(info->si_addr);
  if (g_region != nullptr && at >= g_region && at < g_region + kReserved) {
    // Async-signal-safe, and one write(2), so that the lines of ranks
    // failing at once do not interleave.
    char message[1024];
    size_t size = 0;
    for (const char* piece :
         {"\naccel: ", static_cast<const char*>(g_rank),
          "a parameter of a ZeRO stage-3 unit was ", AccessOf(context),
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

void Reserve() {
  void* region = mmap(nullptr, kReserved, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) return;  // Then released storage is null.
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

}  // namespace

void* ReleasedMemory(size_t bytes) {
  static std::once_flag once;
  std::call_once(once, Reserve);
  return g_region != nullptr && bytes <= kReserved ? g_region : nullptr;
}

}  // namespace accel
