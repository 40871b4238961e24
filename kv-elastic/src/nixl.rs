//! NIXL descriptors of the host store (feature `nixl`): [`NixlRegion`] implements `nixl-sys`'s
//! `MemoryRegion` + `NixlDescriptor` (what `RegDescList::add_storage_desc` and
//! `Agent::register_memory` take), and gives the `(ptr, size, mem_type, device_id)` tuple of
//! `dynamo-memory`'s `NixlCompatible::nixl_params`, so an engine on either registers the store
//! without restating its layout. (`dynamo-memory` itself is not a dependency: it pins exact
//! versions of `cudarc` and `nixl-sys` that would move the whole workspace; an engine using it
//! implements `NixlCompatible` for its own wrapper with [`NixlRegion::nixl_params`] in one line.)

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

use crate::data::{CpuData, RegionDesc, RegionHold};
use crate::pool::ElasticPool;

/// The host store's region as a NIXL descriptor (mem type `DRAM`, device id the NUMA node, 0
/// when unknown). From the CPU pool it keeps the region's memory mapped while it lives.
#[derive(Debug, Clone)]
pub struct NixlRegion {
    desc: RegionDesc,
    _hold: Option<RegionHold>,
}

impl NixlRegion {
    /// The CPU pool's store region; `None` for a store without one (`ElasticPool::new`).
    pub fn of(pool: &ElasticPool<CpuData>) -> Option<Self> {
        let (desc, _) = pool.region()?;
        let hold = pool
            .host()
            .backing()
            .as_region()?
            .host_region()
            .keep_alive();
        Some(NixlRegion {
            desc,
            _hold: Some(hold),
        })
    }

    /// A descriptor of any region (the GPU pool's pinned store: `GpuElasticPool::region`).
    ///
    /// # Safety
    /// The region stays allocated while NIXL may use the descriptor (deregister it in the pool's
    /// teardown hook, `on_teardown`, which runs before the memory is freed).
    pub unsafe fn from_desc(desc: RegionDesc) -> Self {
        NixlRegion { desc, _hold: None }
    }

    /// The region's descriptor.
    pub fn desc(&self) -> &RegionDesc {
        &self.desc
    }

    /// `(ptr, size, MemType::Dram, device_id)`: `dynamo-memory`'s `NixlCompatible::nixl_params`.
    pub fn nixl_params(&self) -> (*const u8, usize, MemType, u64) {
        (
            self.desc.addr as *const u8,
            self.desc.len as usize,
            MemType::Dram,
            self.device_id(),
        )
    }
}

impl MemoryRegion for NixlRegion {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.desc.addr as *const u8
    }

    fn size(&self) -> usize {
        self.desc.len as usize
    }
}

impl NixlDescriptor for NixlRegion {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        self.desc.numa_node.unwrap_or(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Geometry, LayerGroups, PoolConfig, StoreConfig};

    #[test]
    fn the_store_region_is_a_nixl_dram_descriptor() {
        let g = Geometry {
            row_bytes: 16,
            layers: 2,
            page_rows: 4,
            arena_pages: 8,
            hot_rows: 4,
            tail_rows: 4,
            scratch_rows: 0,
            layer_groups: LayerGroups::per_layer(),
            row_format: None,
        };
        let store = StoreConfig {
            max_sessions: 2,
            max_history: 16,
            lock: false,
        };
        let pool = ElasticPool::with_store(g, PoolConfig::default(), store).unwrap();
        let r = NixlRegion::of(&pool).unwrap();
        let (desc, _) = pool.region().unwrap();
        // SAFETY: only the address is compared.
        assert_eq!(unsafe { r.as_ptr() } as u64, desc.addr);
        assert_eq!(r.size(), 2 * 16 * 32);
        assert_eq!(r.mem_type(), MemType::Dram);
        let (ptr, size, kind, dev) = r.nixl_params();
        assert_eq!(
            (ptr as u64, size, kind, dev),
            (desc.addr, 1024, MemType::Dram, r.device_id())
        );
        let d: &dyn NixlDescriptor = &r;
        assert_eq!(d.size(), 1024);
        assert!(NixlRegion::of(&ElasticPool::new(g, PoolConfig::default()).unwrap()).is_none());
    }
}
