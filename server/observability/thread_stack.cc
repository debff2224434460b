// A floor under the stack size that libraries request for their threads.
//
// Debian's civetweb (behind prometheus-cpp's /metrics endpoint) creates its threads with a fixed,
// small stack. glibc carves every thread's static TLS out of its stack, and cuBLAS, which the
// CUDA backend links, brings ~100 KB of static TLS: civetweb's pthread_create then fails and the
// metrics endpoint cannot start. This definition interposes on libc's for calls from shared
// libraries and raises any requested size to at least kMinStackBytes.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr size_t kMinStackBytes = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize Real() {
  static const auto real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  return Real()(attr, std::max(stack_size, kMinStackBytes));
}
