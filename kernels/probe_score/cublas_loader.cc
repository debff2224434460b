// cuBLAS, opened when first called. The kernels call only the cuBLAS functions defined here; each
// opens libcublas.so.<major> with dlopen on its first call and forwards to the library's own.
// Binaries that link the kernels therefore carry no load-time dependency on cuBLAS (~570 MB with
// cuBLASLt, too large to carry in a bundle): on a host without a GPU or without the CUDA
// libraries, the server starts and serves on its CPU backend, and a CUDA backend whose host lacks
// cuBLAS fails to create its workspace (CUBLAS_STATUS_NOT_INITIALIZED), with the loader's reason
// on stderr, instead of the dynamic loader refusing to start the program.
//
// dlopen searches the executable's RPATH first ($ORIGIN/../lib, /usr/local/cuda/lib64), then
// LD_LIBRARY_PATH and the system's library paths, as the loader did for a linked cuBLAS. In a
// binary that also links cuBLAS itself (the benchmarks), these definitions take the calls and
// forward them to the same library. A cuBLAS function the kernels start to call needs a forwarder
// here: without one the link fails (undefined reference), since cuBLAS itself is not linked.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdio>

namespace {

#define PROBESIDECAR_CUBLAS_STR(x) #x
#define PROBESIDECAR_CUBLAS_XSTR(x) PROBESIDECAR_CUBLAS_STR(x)
constexpr char kCublasLibrary[] = "libcublas.so." PROBESIDECAR_CUBLAS_XSTR(CUBLAS_VER_MAJOR);

void* CublasLibrary() {
  static void* const library = [] {
    void* opened = dlopen(kCublasLibrary, RTLD_NOW | RTLD_LOCAL);
    if (opened == nullptr) {
      std::fprintf(stderr, "cuBLAS is needed by the CUDA backend and could not be loaded: %s\n",
                   dlerror());
    }
    return opened;
  }();
  return library;
}

template <typename Function>
Function* Resolve(const char* name) {
  void* library = CublasLibrary();
  if (library == nullptr) return nullptr;
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) std::fprintf(stderr, "cuBLAS: %s\n", dlerror());
  return reinterpret_cast<Function*>(symbol);
}

}  // namespace

// The resolved function, looked up once (thread-safe: a function-local static); a missing
// library or symbol answers CUBLAS_STATUS_NOT_INITIALIZED, as cuBLAS does when it cannot start.
// Function is the function's type (cuBLAS's header also overloads some names for C++ callers).
#define PROBESIDECAR_CUBLAS_FORWARD(Function, name, ...)     \
  static Function* const function = Resolve<Function>(name); \
  return function == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : function(__VA_ARGS__)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  PROBESIDECAR_CUBLAS_FORWARD(decltype(cublasCreate_v2), "cublasCreate_v2", handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  PROBESIDECAR_CUBLAS_FORWARD(decltype(cublasDestroy_v2), "cublasDestroy_v2", handle);
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  PROBESIDECAR_CUBLAS_FORWARD(decltype(cublasSetMathMode), "cublasSetMathMode", handle, mode);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  PROBESIDECAR_CUBLAS_FORWARD(decltype(cublasSetStream_v2), "cublasSetStream_v2", handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t workspace_bytes) {
  PROBESIDECAR_CUBLAS_FORWARD(decltype(cublasSetWorkspace_v2), "cublasSetWorkspace_v2", handle,
                              workspace, workspace_bytes);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* a, cudaDataType a_type,
                                         int lda, const void* b, cudaDataType b_type, int ldb,
                                         const void* beta, void* c, cudaDataType c_type, int ldc,
                                         cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  using GemmEx =
      cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                     const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                     const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  PROBESIDECAR_CUBLAS_FORWARD(GemmEx, "cublasGemmEx", handle, transa, transb, m, n, k, alpha, a,
                              a_type, lda, b, b_type, ldb, beta, c, c_type, ldc, compute_type,
                              algo);
}

}  // extern "C"
