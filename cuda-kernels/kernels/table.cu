// tierkit: indirection-table updates (the expert bank's flips at a step boundary).

#define TIERKIT_MAX_UPDATES 64

struct TierkitTableUpdate {
    unsigned int n;
    unsigned int idx[TIERKIT_MAX_UPDATES];
    unsigned long long val[TIERKIT_MAX_UPDATES];
};

// Flip indirection-table entries: table[idx[i]] = val[i] for i < n. Launched with one block of
// TIERKIT_MAX_UPDATES threads on the step stream, so the next step's kernels see the new pointers.
extern "C" __global__ void tierkit_table_update(unsigned long long* table, TierkitTableUpdate u) {
    const unsigned int i = threadIdx.x;
    if (i < u.n && i < TIERKIT_MAX_UPDATES) table[u.idx[i]] = u.val[i];
}
