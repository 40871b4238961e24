// tierkit's shim around SGLang HiSparse's swap-in kernel, read at bench time from the released
// sglang wheel (scripts/fetch-sglang-peer; never kept in this tree). What the wheel's JIT headers
// (sgl_kernel/*.h, tvm-ffi, dlpack) give the kernel's device code, written here from their use in
// the peer's file; the peer's `#include` lines and host launchers (functions taking
// tvm-ffi tensor views) are removed by tierkit-testkit, and after this prelude the peer's
// kvcacheio.cuh and hisparse.cuh are concatenated. tierkit's own code, MIT OR Apache-2.0.

typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;

// sgl_kernel/utils.cuh
#define SGL_DEVICE __device__ __forceinline__
namespace host {
template <typename T, typename U>
__host__ __device__ constexpr T div_ceil(T a, U b) {
    return (a + b - 1) / b;
}
}  // namespace host
namespace sglang {
namespace device {
namespace pointer {
SGL_DEVICE void* offset(void* p, int64_t bytes) { return static_cast<char*>(p) + bytes; }
}  // namespace pointer
}  // namespace device
}  // namespace sglang

// The peer's `__global__` kernels reach NVRTC as `__device__` functions without launch bounds (a
// textual change tierkit-testkit makes when it loads them); the entry points after them are the
// kernels, with SGLang's launch bounds.
