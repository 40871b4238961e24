// tierkit-testkit: the KV resolve kernels' lab (benchmarks only, never in a library crate), compiled
// after cuda-kernels/kernels/kv_abi.cuh with explicit options.
//
// tierkit_kv_resolve_empty: a kernel with the production resolve's parameters (KvDims, KvTables,
// KvCall, KvDivs by value) that returns at once: launched with a production kernel's grid, block and
// dynamic shared memory, it times the launch alone (the floor any resolve pays).
extern "C" __global__ void __launch_bounds__(KV_LEAN_BLOCK)
    tierkit_kv_resolve_empty(KvDims d, KvTables t, KvCall c, KvDivs dv) {
    (void)d;
    (void)t;
    (void)c;
    (void)dv;
}
