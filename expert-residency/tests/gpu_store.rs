//! GPU tests of the expert tier's memory ([`ExpertStore`], feature `test-hooks`, which enables
//! `cuda`: the tests copy into and read slots directly): copies into HBM slots and table flips
//! against the CPU reference, and caller-owned memory backing a store in place. Moved here with the
//! store from `cuda-kernels` (which keeps its kernels' and memory types' own tests). Every test
//! prints `SKIP: no CUDA device` and returns where no device exists.
#![cfg(feature = "test-hooks")]

use std::sync::Arc;

use cuda_kernels::{
    apply_table_updates_cpu, CudaError, DeviceBuffer, Gpu, HostBacking, PinnedBuffer, TableUpdater,
};
use expert_residency::gpu::ExpertStore;
use expert_residency::{ExpertError, Geometry};
use tierkit_testkit::{gpu_or_skip, write_expert_pattern, ExpertReaders};

/// A store of `geo` whose every host expert holds [`write_expert_pattern`] with tag = its flat
/// index and `seed`, filled on 8 threads (its table points every expert at its host copy).
fn pattern_store(gpu: &Arc<Gpu>, geo: Geometry, seed: u64) -> ExpertStore {
    let mut store = ExpertStore::new(gpu, geo).unwrap();
    let experts = geo.experts_per_layer;
    store.fill_host(8, |l, e, b| write_expert_pattern(b, l * experts + e, seed));
    store
}

/// An [`ExpertStore`] whose table is flipped to HBM slots (by `cuda-kernels`' `TableUpdater`)
/// filled by both copy paths: the table, every slot and a checksum reader through the table all
/// agree with the host copies; bad slots and experts are typed errors. (Moved with the store
/// from `cuda-kernels`' `table_update_and_store_copies_match_the_cpu_reference`, whose table
/// update half stays there.)
#[test]
fn store_copies_and_table_flips_match_the_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    let s = gpu.stream().clone();
    let updater = TableUpdater::new(&gpu).unwrap();
    let geo = Geometry::new(2, 4, 2, 1 << 16).unwrap();
    let store = pattern_store(&gpu, geo, 5);
    let mut mirror: Vec<u64> = (0..2)
        .flat_map(|l| (0..4).map(move |e| (l, e)))
        .map(|(l, e)| store.host_device_ptr(l, e))
        .collect();
    assert_eq!(
        store.table().download().unwrap(),
        mirror,
        "boot: every expert cold"
    );
    // layer 0: experts 1, 3 into slots 0, 2 (sync copy); layer 1: expert 2 into slot 1 (async)
    store.copy_to_slot_sync(0, 1, 0).unwrap();
    store.copy_to_slot_sync(0, 3, 2).unwrap();
    // SAFETY: the host experts are not written and the store outlives the synchronisation below.
    unsafe { store.copy_to_slot_async(1, 2, 1, &s) }.unwrap();
    let flips = [
        (store.cell(0, 1), store.slot_ptr(0, 0)),
        (store.cell(0, 3), store.slot_ptr(0, 2)),
        (store.cell(1, 2), store.slot_ptr(1, 1)),
    ];
    apply_table_updates_cpu(&mut mirror, &flips).unwrap();
    updater.launch(&s, store.table(), &flips).unwrap();
    let readers = ExpertReaders::new(&gpu).unwrap();
    let picks = DeviceBuffer::from_host(gpu.ctx(), &(0..8u32).collect::<Vec<_>>()).unwrap();
    let errors = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 2).unwrap();
    readers
        .launch_checksum_reader((store.table_ptr(), geo.expert_bytes), &s, &picks, &errors)
        .unwrap();
    let in_slot = |l: u32, slot: u32| match (l, slot) {
        (0, 0) => Some(1),
        (0, 2) => Some(3),
        (1, 1) => Some(2),
        _ => None,
    };
    let entry = |l: u32, e: u32| mirror[store.cell(l, e) as usize];
    assert_eq!(store.mismatches(entry, in_slot).unwrap(), 0);
    assert_eq!(errors.download().unwrap()[0], 0, "torn or stale expert");
    // out-of-range slots and experts are typed errors, not wild copies
    assert!(matches!(
        store.copy_to_slot_sync(0, 1, 3),
        Err(ExpertError::Cuda(CudaError::OutOfRange { .. }))
    ));
    assert!(matches!(
        store.copy_to_slot_sync(2, 0, 0),
        Err(ExpertError::Cuda(CudaError::OutOfRange { .. }))
    ));
    assert!(matches!(
        store.copy_to_slot_sync(0, 4, 0),
        Err(ExpertError::Cuda(CudaError::OutOfRange { .. }))
    ));
}

/// Caller-owned memory: a device range borrowed inside the caller's allocation and a host range
/// the caller owns, registered by tierkit, back an [`ExpertStore`] in place (the table points into
/// the caller's bytes, slot copies read them); bad ranges are typed errors; dropping the store
/// unregisters the range (it can be registered again) and frees nothing of the caller's.
#[test]
fn borrowed_memory_is_checked_and_used_in_place() {
    let Some(gpu) = gpu_or_skip() else { return };
    let ctx = gpu.ctx();
    let geo = Geometry::new(2, 8, 2, 256).unwrap();
    let n = geo.bank_bytes().unwrap() as usize;
    let want: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    // 16-byte aligned host memory the test owns (u128 elements), filled before any borrow
    let mut backing = vec![0u128; n / 16 + 1];
    bytemuck::cast_slice_mut::<u128, u8>(&mut backing)[..n].copy_from_slice(&want);
    let base = backing.as_mut_ptr() as *mut u8;
    let foreign = |e: CudaError| assert!(matches!(e, CudaError::ForeignMemory { .. }), "{e}");

    // pageable memory not registered, a misaligned start: refused
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    foreign(unsafe { PinnedBuffer::<u8>::borrowed(ctx, base, n, false) }.unwrap_err());
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    foreign(unsafe { PinnedBuffer::<u8>::borrowed(ctx, base.add(1), 64, true) }.unwrap_err());
    let hbm = DeviceBuffer::<u8>::zeroed(ctx, geo.hbm_bytes().unwrap() as usize + 64).unwrap();
    // a device range past its allocation, misaligned, or host memory: refused
    for (ptr, len) in [
        (hbm.device_ptr() + 64, hbm.num_bytes()),
        (hbm.device_ptr() + 8, 16),
        (base as u64, 16),
    ] {
        // SAFETY: each call is refused (checked), nothing is used
        foreign(unsafe { DeviceBuffer::<u8>::borrowed(ctx, ptr, len) }.unwrap_err());
    }
    let slots_len = geo.hbm_bytes().unwrap() as usize;
    // SAFETY: inside `hbm`, which outlives the store
    let slots = unsafe { DeviceBuffer::<u8>::borrowed(ctx, hbm.device_ptr() + 64, slots_len) };
    let slots = slots.unwrap();
    assert!(!slots.is_owned() && hbm.is_owned());
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    let host = unsafe { PinnedBuffer::<u8>::borrowed(ctx, base, n, true) }.unwrap();
    assert_eq!(host.backing(), HostBacking::Registered);
    // registered twice: the driver refuses; registered memory borrowed as it is: the same mapping
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    foreign(unsafe { PinnedBuffer::<u8>::borrowed(ctx, base, n, true) }.unwrap_err());
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    let view = unsafe { PinnedBuffer::<u8>::borrowed(ctx, base, 256, false) }.unwrap();
    assert_eq!(
        (view.backing(), view.device_ptr()),
        (HostBacking::Borrowed, host.device_ptr())
    );
    drop(view);
    let store = ExpertStore::with_memory(&gpu, geo, Some(host), Some(slots)).unwrap();
    let table = store.table().download().unwrap();
    let dev0 = store.host_device_ptr(0, 0);
    for (c, &p) in table.iter().enumerate() {
        assert_eq!(
            p,
            dev0 + c as u64 * 256,
            "cell {c} points into the caller's range"
        );
    }
    let e13 = &want[(8 + 3) * 256..][..256];
    assert_eq!(store.host_expert(1, 3).unwrap(), e13);
    assert_eq!(store.slot_ptr(0, 0), hbm.device_ptr() + 64);
    store.copy_to_slot_sync(1, 3, 2).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(store.download_slot(1, 2).unwrap(), e13);
    drop(store);
    // the drop unregistered the range: it registers again; a too-short slot range is refused
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    let again = unsafe { PinnedBuffer::<u8>::borrowed(ctx, base, n, true) }.unwrap();
    // SAFETY: `backing` and `hbm` outlive every borrowed buffer, untouched meanwhile.
    let short = unsafe { DeviceBuffer::<u8>::borrowed(ctx, hbm.device_ptr(), 64) }.unwrap();
    match ExpertStore::with_memory(&gpu, geo, Some(again), Some(short)).unwrap_err() {
        ExpertError::Cuda(e) => foreign(e),
        e => panic!("{e}"),
    }
    // the caller's bytes are intact
    assert_eq!(&bytemuck::cast_slice::<u128, u8>(&backing)[..n], &want[..]);
}
