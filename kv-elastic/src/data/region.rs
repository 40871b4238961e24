//! Host regions: the memory a host store keeps its rows in, described so a transfer agent (NIXL,
//! Mooncake) can register it and write or read rows in place.
//!
//! A [`HostRegion`] is page-aligned host memory, either mapped by tierkit (anonymous `mmap`,
//! zeroed lazily by the kernel) or *adopted*: memory the engine owns (its own `mmap`, a
//! shared-memory segment), with an owner value tierkit drops last. Either may be locked in RAM
//! (`mlock`), in chunks of [`REGION_CHUNK`] bytes. Teardown is ordered and bounded: the
//! teardown hooks (a transfer agent's deregistration) run first, then the chunks are unlocked,
//! then the memory is unmapped or its owner dropped; [`HostRegion::release_step`] does it a
//! bounded number of bytes at a time between steps (interruptible), the drop finishes the rest.
//!
//! [`RegionDesc`] is what an agent registers: `(address, length, item_len, kind, NUMA node)`;
//! [`StoreLayout`] the rule from a row to its byte offset.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{KvError, Result};

/// Bytes locked or unlocked per system call, and the unit of [`HostRegion::release_step`]
/// (1 GiB): unlocking hundreds of GiB in one call is what hangs a node under a kill.
pub const REGION_CHUNK: usize = 1 << 30;

/// What kind of memory a region is (NIXL's `DRAM_SEG` / `VRAM_SEG`; Mooncake's `cpu` / `cuda`
/// locations). Host stores are always [`MemKind::Dram`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MemKind {
    /// Host memory (`DRAM` in NIXL).
    Dram,
}

impl MemKind {
    /// The name transfer agents use (`"DRAM"`).
    pub fn name(self) -> &'static str {
        match self {
            MemKind::Dram => "DRAM",
        }
    }
}

/// One registrable region: what a transfer agent needs to register it (NIXL's `(addr, len,
/// dev_id, meta)` with mem type `DRAM`; Mooncake's `register_memory(addr, len)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionDesc {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes (the store's bytes; the mapping may be a page longer).
    pub len: u64,
    /// Bytes of one item (one token: `layers × row_bytes`): rows are whole items.
    pub item_len: u64,
    /// Memory kind.
    pub kind: MemKind,
    /// NUMA node of the region's first page (`None` where the kernel does not say); for NIXL's
    /// `dev_id` of a `DRAM` descriptor use 0 when `None`.
    pub numa_node: Option<u32>,
}

/// The host store's layout over its region: `u8 [max_slots][max_history][layers][row_bytes]`,
/// token-major (one token's rows for all layers back to back), one session slot per live,
/// importing or exported session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreLayout {
    /// Session slots.
    pub max_slots: u32,
    /// Positions per slot.
    pub max_history: u32,
    /// Layers per token.
    pub layers: u32,
    /// Bytes per row (one token, one layer).
    pub row_bytes: u32,
}

impl StoreLayout {
    /// Bytes of one token (`layers × row_bytes`).
    pub fn token_bytes(&self) -> u64 {
        self.layers as u64 * self.row_bytes as u64
    }

    /// Bytes of one slot (`max_history × token_bytes`; below 2^56, so it never overflows).
    pub fn slot_bytes(&self) -> u64 {
        self.max_history as u64 * self.token_bytes()
    }

    /// Bytes of the whole store (`max_slots × slot_bytes`), saturating at `u64::MAX` (a layout of
    /// `u32` fields can need up to 2^120 bytes; no region is that large, so the comparisons
    /// against a region's length stay right). [`StoreLayout::checked_store_bytes`] tells the
    /// overflow apart.
    pub fn store_bytes(&self) -> u64 {
        self.checked_store_bytes().unwrap_or(u64::MAX)
    }

    /// Bytes of the whole store, or `None` when they overflow a `u64`.
    pub fn checked_store_bytes(&self) -> Option<u64> {
        (self.max_slots as u64).checked_mul(self.slot_bytes())
    }

    /// The row → offset rule: byte offset of `(slot, position, layer)` from the region's start,
    /// `slot × slot_bytes + position × token_bytes + layer × row_bytes`.
    pub fn offset(&self, slot: u32, position: u32, layer: u32) -> u64 {
        slot as u64 * self.slot_bytes()
            + position as u64 * self.token_bytes()
            + layer as u64 * self.row_bytes as u64
    }
}

/// Host memory a store takes, by tierkit's own accounting (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostMemory {
    /// What the store's layout needs (`max_slots × max_history × token_bytes`).
    pub store_bytes: u64,
    /// Host memory tierkit allocated for it (mapped, page-rounded; 0 for adopted memory).
    pub allocated_bytes: u64,
    /// Of the region, bytes tierkit pinned (locked in RAM, or registered with CUDA). Pinning
    /// memory tierkit allocated costs no more memory: the store's cost is `max(allocated,
    /// pinned)`, never their sum.
    pub pinned_bytes: u64,
}

impl HostMemory {
    /// The host memory the store costs: `max(allocated_bytes, pinned_bytes)`.
    pub fn footprint(&self) -> u64 {
        self.allocated_bytes.max(self.pinned_bytes)
    }
}

/// A teardown hook: runs once, before the region's memory is unlocked and freed (a transfer
/// agent's deregistration), with the region's descriptor.
pub type TeardownHook = Box<dyn FnOnce(&RegionDesc) + Send>;

/// Teardown hooks, run newest first, once.
#[derive(Default)]
pub(crate) struct TeardownHooks(Vec<TeardownHook>);

impl std::fmt::Debug for TeardownHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} teardown hooks", self.0.len())
    }
}

impl TeardownHooks {
    pub(crate) fn push(&mut self, hook: TeardownHook) {
        self.0.push(hook);
    }

    /// Runs (and drops) every hook, newest first.
    pub(crate) fn run(&mut self, desc: &RegionDesc) {
        while let Some(h) = self.0.pop() {
            h(desc);
        }
    }
}

/// Who frees a region's memory.
enum Owner {
    /// Mapped by tierkit (`mmap`): unmapped at the end.
    Mapped,
    /// The engine's memory: its owner value is dropped at the end.
    Adopted(Box<dyn Send>),
}

/// The memory itself; freed when the last holder (the store, or a view of it) drops it.
struct RegionMemory {
    ptr: NonNull<u8>,
    /// Bytes mapped (page-rounded) or adopted.
    mapped: usize,
    owner: Option<Owner>,
}

// SAFETY: the memory is plain host memory reached only through raw pointers whose users follow
// the store's rules (see `RegionBytes`); the owner is `Send`.
unsafe impl Send for RegionMemory {}
// SAFETY: as above; `&RegionMemory` exposes only the pointer.
unsafe impl Sync for RegionMemory {}

impl Drop for RegionMemory {
    fn drop(&mut self) {
        match self.owner.take() {
            Some(Owner::Mapped) => {
                // SAFETY: `ptr .. ptr + mapped` is the mapping made in `HostRegion::allocate`,
                // unmapped once, here, after every holder is gone.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
            }
            Some(Owner::Adopted(owner)) => drop(owner),
            None => {}
        }
    }
}

/// The operating system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// NUMA node of the page at `addr` (`get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`), if the kernel
/// says.
pub(crate) fn numa_node_of(addr: *const u8) -> Option<u32> {
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;
    let mut node: libc::c_int = -1;
    // SAFETY: `node` is a valid out-pointer, no node mask is passed (maxnode 0), and `addr` lies
    // in a mapping of ours (the kernel faults the page in if needed).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (rc == 0 && node >= 0).then_some(node as u32)
}

/// Page-aligned host memory for a host store (see the module docs). The store uses bytes
/// `0 .. len` of it.
pub struct HostRegion {
    mem: Arc<RegionMemory>,
    /// Bytes the store uses.
    len: usize,
    item_len: usize,
    numa_node: Option<u32>,
    /// Bytes locked from the start (`mlock`), a multiple of the page size.
    locked: usize,
    hooks: TeardownHooks,
    /// The hooks ran.
    hooks_done: bool,
}

impl std::fmt::Debug for HostRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegion")
            .field("addr", &self.mem.ptr)
            .field("len", &self.len)
            .field("mapped", &self.mem.mapped)
            .field("locked", &self.locked)
            .field("adopted", &self.is_adopted())
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl HostRegion {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed host memory for rows of
    /// `item_len` bytes; with `lock`, locks them in RAM (`mlock`, chunk by chunk: the pages are
    /// populated now).
    ///
    /// # Errors
    /// `OutOfMemory` when the mapping fails, or when locking fails (`RLIMIT_MEMLOCK`; nothing
    /// stays mapped or locked); `InvalidConfig` for `len == 0` or `item_len == 0`.
    pub fn allocate(len: usize, item_len: usize, lock: bool) -> Result<Self> {
        if len == 0 || item_len == 0 {
            return Err(KvError::InvalidConfig(
                "a host region needs len > 0 and item_len > 0".into(),
            ));
        }
        let page = page_size();
        let mapped = len
            .checked_next_multiple_of(page)
            .ok_or(KvError::OutOfMemory {
                what: "host store region (mmap)",
                bytes: len as u64,
            })?;
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED || p.is_null() {
            return Err(KvError::OutOfMemory {
                what: "host store region (mmap)",
                bytes: mapped as u64,
            });
        }
        let mem = RegionMemory {
            ptr: NonNull::new(p.cast()).expect("checked non-null"),
            mapped,
            owner: Some(Owner::Mapped),
        };
        Self::finish(mem, len, item_len, lock)
    }

    /// Adopts `len` bytes of engine-owned host memory at `ptr` (an `mmap`, a shared-memory
    /// segment) for rows of `item_len` bytes; `owner` is dropped once the region is torn down
    /// (after the hooks and the unlock), so the engine's memory outlives every use of it. With
    /// `lock`, locks it in RAM as [`HostRegion::allocate`] does. tierkit allocates nothing for
    /// it ([`HostMemory::allocated_bytes`] 0).
    ///
    /// # Errors
    /// `InvalidConfig` for a null or not page-aligned `ptr`, `len == 0` or `item_len == 0`;
    /// `OutOfMemory` when locking fails (nothing stays locked; `owner` is dropped).
    ///
    /// # Safety
    /// `ptr .. ptr + len` must be readable and writable host memory that stays mapped until
    /// `owner` is dropped, and nothing else may write it while the store uses it except the
    /// writers the store hands rows to (a transfer agent writing reserved rows).
    pub unsafe fn adopt(
        ptr: *mut u8,
        len: usize,
        item_len: usize,
        owner: Box<dyn Send>,
        lock: bool,
    ) -> Result<Self> {
        if len == 0 || item_len == 0 {
            return Err(KvError::InvalidConfig(
                "a host region needs len > 0 and item_len > 0".into(),
            ));
        }
        let Some(ptr) =
            NonNull::new(ptr).filter(|p| (p.as_ptr() as usize).is_multiple_of(page_size()))
        else {
            return Err(KvError::InvalidConfig(
                "an adopted host region must start on a page boundary (and not be null)".into(),
            ));
        };
        let mem = RegionMemory {
            ptr,
            mapped: len,
            owner: Some(Owner::Adopted(owner)),
        };
        Self::finish(mem, len, item_len, lock)
    }

    fn finish(mem: RegionMemory, len: usize, item_len: usize, lock: bool) -> Result<Self> {
        let mut r = HostRegion {
            numa_node: None,
            mem: Arc::new(mem),
            len,
            item_len,
            locked: 0,
            hooks: TeardownHooks::default(),
            hooks_done: false,
        };
        if lock {
            // Whole pages (what the kernel locks), so the chunks unlock exactly.
            let total = r.mem.mapped.next_multiple_of(page_size());
            while r.locked < total {
                let n = (total - r.locked).min(REGION_CHUNK);
                // SAFETY: a range inside our mapping.
                let rc = unsafe { libc::mlock(r.base().add(r.locked).cast(), n) };
                if rc != 0 {
                    // `r`'s drop unlocks what was locked and frees the memory.
                    return Err(KvError::OutOfMemory {
                        what: "locked host store region (mlock; raise RLIMIT_MEMLOCK)",
                        bytes: total as u64,
                    });
                }
                r.locked += n;
            }
        }
        r.numa_node = numa_node_of(r.base());
        Ok(r)
    }

    /// The first byte.
    pub(crate) fn base(&self) -> *mut u8 {
        self.mem.ptr.as_ptr()
    }

    /// Bytes the store uses.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: regions are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the memory is the engine's.
    pub fn is_adopted(&self) -> bool {
        matches!(self.mem.owner, Some(Owner::Adopted(_)))
    }

    /// The descriptor a transfer agent registers.
    pub fn desc(&self) -> RegionDesc {
        RegionDesc {
            addr: self.base() as u64,
            len: self.len as u64,
            item_len: self.item_len as u64,
            kind: MemKind::Dram,
            numa_node: self.numa_node,
        }
    }

    /// Host memory by tierkit's accounting (`store_bytes` is the region's length).
    pub fn memory(&self) -> HostMemory {
        HostMemory {
            store_bytes: self.len as u64,
            allocated_bytes: if self.is_adopted() {
                0
            } else {
                self.mem.mapped as u64
            },
            pinned_bytes: self.locked as u64,
        }
    }

    /// Adds a teardown hook (a transfer agent's deregistration): hooks run once, newest first,
    /// before the memory is unlocked and freed.
    pub fn on_teardown(&mut self, hook: TeardownHook) {
        self.hooks.push(hook);
    }

    /// Bounded teardown: runs the hooks (first call), then unlocks at most `max_bytes` (at least
    /// one chunk of [`REGION_CHUNK`]); returns the bytes still locked. Call between steps until
    /// it returns 0; the drop does the rest either way. The region stays usable as memory, but
    /// an agent may no longer be registered with it.
    pub fn release_step(&mut self, max_bytes: usize) -> usize {
        self.run_hooks();
        // Whole pages from the end (`locked` is a multiple of the page size).
        let page = page_size();
        let mut budget = max_bytes
            .max(1)
            .checked_next_multiple_of(page)
            .unwrap_or(usize::MAX / page * page);
        while self.locked > 0 && budget > 0 {
            let n = self.locked.min(REGION_CHUNK).min(budget);
            let start = self.locked - n;
            // SAFETY: a range inside our mapping that we locked.
            unsafe { libc::munlock(self.base().add(start).cast(), n) };
            self.locked = start;
            budget = budget.saturating_sub(n);
        }
        self.locked
    }

    fn run_hooks(&mut self) {
        if self.hooks_done {
            return;
        }
        self.hooks_done = true;
        let desc = self.desc();
        self.hooks.run(&desc);
    }

    /// A holder of the memory that keeps it mapped after the region is torn down (a numpy view
    /// in the Python bindings): the memory is freed when the last holder drops.
    pub fn keep_alive(&self) -> RegionHold {
        RegionHold(self.mem.clone())
    }
}

/// Keeps a region's memory mapped (see [`HostRegion::keep_alive`]); its teardown hooks and
/// unlock still run when the region itself is dropped.
#[derive(Clone)]
pub struct RegionHold(Arc<RegionMemory>);

impl std::fmt::Debug for RegionHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RegionHold").field(&self.0.ptr).finish()
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        // Deregistration first, then unlock, then (with the last holder) free.
        self.release_step(usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn allocate_is_page_aligned_zeroed_and_accounted() {
        let r = HostRegion::allocate(10_000, 100, false).unwrap();
        let d = r.desc();
        assert_eq!(d.addr as usize % page_size(), 0);
        assert_eq!((d.len, d.item_len, d.kind), (10_000, 100, MemKind::Dram));
        let m = r.memory();
        assert_eq!(m.store_bytes, 10_000);
        assert_eq!(
            m.allocated_bytes as usize,
            10_000usize.next_multiple_of(page_size())
        );
        assert_eq!(m.pinned_bytes, 0);
        // SAFETY: the region's bytes are ours and nothing else uses them.
        let s = unsafe { std::slice::from_raw_parts(r.base(), r.len()) };
        assert!(s.iter().all(|&b| b == 0));
        assert!(matches!(
            HostRegion::allocate(0, 1, false),
            Err(KvError::InvalidConfig(_))
        ));
    }

    /// Teardown order: hooks (deregistration), then unlock, then the owner's memory is freed.
    #[test]
    fn teardown_deregisters_before_freeing_adopted_memory() {
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        struct Owner(Arc<Mutex<Vec<String>>>);
        impl Drop for Owner {
            fn drop(&mut self) {
                self.0.lock().unwrap().push("free".into());
            }
        }
        // Page-aligned engine memory: a mapping of ours, owned by `Owner` through a region.
        let engine = HostRegion::allocate(3 * page_size(), 64, false).unwrap();
        let ptr = engine.base();
        let owner = Owner(log.clone());
        let boxed: Box<dyn Send> = Box::new((owner, engine));
        // SAFETY: `ptr` is a live mapping of 3 pages kept alive by `boxed` (the owner).
        let mut r = unsafe { HostRegion::adopt(ptr, 3 * page_size(), 64, boxed, false) }.unwrap();
        assert_eq!(r.memory().allocated_bytes, 0);
        for name in ["nixl", "mooncake"] {
            let l = log.clone();
            r.on_teardown(Box::new(move |d: &RegionDesc| {
                // The memory is still there: read its first byte.
                // SAFETY: the hooks run before the owner is dropped.
                let b = unsafe { *(d.addr as *const u8) };
                l.lock().unwrap().push(format!("deregister {name} {b}"));
            }));
        }
        drop(r);
        assert_eq!(
            *log.lock().unwrap(),
            ["deregister mooncake 0", "deregister nixl 0", "free"]
        );
    }

    #[test]
    fn locked_regions_unlock_in_bounded_steps() {
        let mut r = match HostRegion::allocate(4 * page_size(), 64, true) {
            Ok(r) => r,
            Err(e) => {
                println!("SKIP: cannot mlock 4 pages here ({e})");
                return;
            }
        };
        assert_eq!(r.memory().pinned_bytes as usize, 4 * page_size());
        let ran = Arc::new(Mutex::new(0));
        let ran2 = ran.clone();
        r.on_teardown(Box::new(move |_| *ran2.lock().unwrap() += 1));
        assert_eq!(r.release_step(page_size()), 3 * page_size());
        assert_eq!(*ran.lock().unwrap(), 1, "hooks first, once");
        assert_eq!(r.release_step(2 * page_size()), page_size());
        drop(r);
        assert_eq!(*ran.lock().unwrap(), 1);
    }
}
