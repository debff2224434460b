// What a fuzz target does when a property fails: print it and trap, so that libFuzzer records the
// input as a crash (and the corpus replay test fails on it).
#pragma once

#include <cstdio>

#define FUZZ_CHECK(condition)                                                               \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #condition); \
      __builtin_trap();                                                                     \
    }                                                                                       \
  } while (0)
