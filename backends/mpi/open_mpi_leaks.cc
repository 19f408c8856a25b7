// Linked into the MPI test programs: under AddressSanitizer, no leak check.
// Open MPI keeps its components' allocations until exit by design, and
// unloads the components (dlclose) before LeakSanitizer runs, so their
// leaks show as "<unknown module>" and cannot be suppressed by name; every
// other AddressSanitizer and UndefinedBehaviorSanitizer check stays on.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
#endif
