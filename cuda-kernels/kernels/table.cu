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

// The slot-id form of the table (engines that index a stacked weight tensor): for each cell
// c = layer * experts + e of table (u64 addresses), out[c] = the HBM slot s (0 <= s < slots_per_layer)
// if table[c] == hbm + (layer * slots_per_layer + s) * slot_bytes, else -1 (read in place from the
// host copy). Grid-stride over cells.
extern "C" __global__ void tierkit_table_slot_ids(const unsigned long long* __restrict__ table,
                                                  int* __restrict__ out, unsigned int cells,
                                                  unsigned int experts, unsigned long long hbm,
                                                  unsigned long long slot_bytes,
                                                  unsigned int slots_per_layer) {
    const unsigned int stride = gridDim.x * blockDim.x;
    for (unsigned int c = blockIdx.x * blockDim.x + threadIdx.x; c < cells; c += stride) {
        const unsigned long long layer = c / experts;
        const unsigned long long base = hbm + layer * slots_per_layer * slot_bytes;
        const unsigned long long p = table[c];
        int s = -1;
        if (p >= base && p < base + slots_per_layer * slot_bytes && (p - base) % slot_bytes == 0ull)
            s = (int)((p - base) / slot_bytes);
        out[c] = s;
    }
}
