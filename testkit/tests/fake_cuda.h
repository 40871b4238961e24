// A stand-in for the CUDA device headers, just enough for a host C++ compiler to parse the
// kernels' sources with -fsyntax-only (tests/kernel_syntax.rs): builtins are declared, never
// defined, and nothing here is run. It catches what machines without NVRTC would otherwise only see
// on the device: syntax errors, undeclared names, wrong argument counts, type mismatches. It does not
// check CUDA-specific rules (address spaces, __device__-only calls). Add a declaration when a
// kernel starts using a new builtin.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__
#define __launch_bounds__(...)
struct dim3_ { unsigned int x, y, z; };
extern dim3_ threadIdx, blockIdx, blockDim, gridDim;
struct int4 { int x, y, z, w; }; struct int2 { int x, y; }; struct uint4 { unsigned x,y,z,w; };
typedef unsigned long size_t;
void __syncthreads(); int __syncthreads_or(int); int __syncthreads_and(int); int __syncthreads_count(int);
void __syncwarp(unsigned = 0xffffffffu); void __threadfence(); void __threadfence_block();
unsigned __reduce_add_sync(unsigned, unsigned); unsigned __ballot_sync(unsigned, int); int __any_sync(unsigned, int); int __all_sync(unsigned, int);
template<class T> T __shfl_sync(unsigned, T, int, int = 32); template<class T> T __shfl_xor_sync(unsigned, T, int, int = 32);
template<class T> T __shfl_down_sync(unsigned, T, unsigned, int = 32); template<class T> T __shfl_up_sync(unsigned, T, unsigned, int = 32);
template<class T> T atomicAdd(T*, T); template<class T> T atomicMin(T*, T); template<class T> T atomicMax(T*, T);
template<class T> T atomicCAS(T*, T, T); template<class T> T atomicExch(T*, T); template<class T> T atomicOr(T*, T); template<class T> T atomicAnd(T*, T);
int __popc(unsigned); int __ffs(int); int __clz(int); int __popcll(unsigned long long); int __ffsll(long long); unsigned __umulhi(unsigned, unsigned);
unsigned __brev(unsigned); int __clzll(long long);
template<class T> T min(T, T); template<class T> T max(T, T);
template<class T> T __ldg(const T*); unsigned __isGlobal(const void*);
#define __builtin_assume(x) ((void)(x))
unsigned __activemask();
inline int4 make_int4(int a,int b,int c,int d){return {a,b,c,d};} inline int2 make_int2(int a,int b){return {a,b};}
struct longlong2 { long long x, y; }; struct longlong4 { long long x, y, z, w; }; struct uint2 { unsigned x, y; };
struct float2 { float x, y; }; struct float4 { float x, y, z, w; };
void __nanosleep(unsigned);
template<class T> T atomicXor(T*, T); template<class T> T atomicSub(T*, T); template<class T> T atomicInc(T*, T);
float __int_as_float(int); int __float_as_int(float); unsigned __float_as_uint(float); float __uint_as_float(unsigned);
long long clock64(); unsigned __lanemask_lt(); 
template<class T> unsigned __match_any_sync(unsigned, T);
float __expf(float); float expf(float); float __fdividef(float, float); float fmaxf(float, float); float fminf(float, float);
