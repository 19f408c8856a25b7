// Links every C++ sample of docs/*.md (//docs:samples): compiling and linking
// them is the test; nothing runs.
#include <cstdio>

int main() {
  std::printf("docs samples: %d compiled and linked\n", DOCS_SAMPLES);
  return 0;
}
