//! GPU tests of the caller-owned launchers the bindings use: the strided count into a caller's
//! table under a caller's control block ([`CountLauncher`]), the slot-id form of a table
//! ([`SlotIdLauncher`]) and a `Gpu` whose step stream is borrowed. Each prints `SKIP` and returns
//! without a device.

use cuda_kernels::*;
use tierkit_testkit::gpu_or_skip;

#[test]
fn strided_count_into_caller_memory_matches_the_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    let (layers, experts, tokens, k, stride) = (3u32, 16u32, 37u32, 4u32, 6u64);
    // [tokens, stride] with the first k columns the picks; ids 16 and -1 are rejected
    let mut full = vec![0i64; (tokens as u64 * stride) as usize];
    for t in 0..tokens as usize {
        for j in 0..stride as usize {
            full[t * stride as usize + j] = ((t * 7 + j * 3) % 18) as i64 - 1;
        }
    }
    let gathered: Vec<i64> = (0..tokens as usize)
        .flat_map(|t| full[t * stride as usize..t * stride as usize + k as usize].to_vec())
        .collect();
    let ids = DeviceBuffer::from_host(gpu.ctx(), &full).unwrap();
    let table = DeviceBuffer::<u32>::zeroed(gpu.ctx(), (layers * experts) as usize).unwrap();
    let rejected = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 1).unwrap();
    let launcher = CountLauncher::new(&gpu).unwrap();
    let view = StridedIds {
        ptr: ids.device_ptr(),
        dtype: IdsDtype::I64,
        tokens,
        k,
        row_stride: stride,
    };
    let mut want = vec![0u32; (layers * experts) as usize];
    let mut want_rejected = 0;
    for (layer, ctl) in [
        (1u32, CountControl::ALL),
        (
            2,
            CountControl {
                enabled: true,
                valid_tokens: 5,
            },
        ),
        (
            0,
            CountControl {
                enabled: false,
                valid_tokens: u32::MAX,
            },
        ),
    ] {
        let control = DeviceBuffer::from_host(gpu.ctx(), &ctl.to_words()).unwrap();
        let target = CountTarget {
            table: table.device_ptr(),
            rejected: rejected.device_ptr(),
            control: control.device_ptr(),
            layers,
            experts,
        };
        // SAFETY: every buffer is live until the synchronize below and has the declared size.
        unsafe { launcher.launch(gpu.stream(), &view, layer, &target) }.unwrap();
        gpu.synchronize().unwrap();
        want_rejected += count_picks_cpu_ctl(
            &gathered,
            TopkShape::layer(tokens, k),
            layer,
            layers,
            experts,
            ctl,
            &mut want,
        )
        .unwrap();
    }
    assert_eq!(table.download().unwrap(), want);
    assert_eq!(rejected.download().unwrap()[0], want_rejected);
}

#[test]
fn slot_ids_match_the_cpu_reference_on_an_expert_table() {
    let Some(gpu) = gpu_or_skip() else { return };
    // An expert tier's layout: 2 layers x 8 experts of 256 bytes in mapped pinned memory, 4 HBM
    // slots per layer (3 hot and a spare) in one allocation, a table of expert addresses.
    let host = PinnedBuffer::<u8>::zeroed(gpu.ctx(), 2 * 8 * 256).unwrap();
    let hbm = DeviceBuffer::<u8>::zeroed(gpu.ctx(), 2 * 4 * 256).unwrap();
    let slot_ptr = |l: u64, s: u64| hbm.device_ptr() + (l * 4 + s) * 256;
    let mut table: Vec<u64> = (0..16u64).map(|c| host.device_ptr() + c * 256).collect();
    table[1] = slot_ptr(0, 2);
    table[8 + 5] = slot_ptr(1, 0);
    table[8 + 6] = slot_ptr(1, 3); // the spare
    let table_dev = DeviceBuffer::from_host(gpu.ctx(), &table).unwrap();
    let layout = SlotLayout {
        hbm: slot_ptr(0, 0),
        slot_bytes: 256,
        slots_per_layer: 4,
    };
    let out = DeviceBuffer::<i32>::zeroed(gpu.ctx(), 16).unwrap();
    let launcher = SlotIdLauncher::new(&gpu).unwrap();
    // SAFETY: table and out hold 16 cells each and live until the synchronize.
    unsafe {
        launcher.launch(
            gpu.stream(),
            table_dev.device_ptr(),
            out.device_ptr(),
            16,
            8,
            layout,
        )
    }
    .unwrap();
    gpu.synchronize().unwrap();
    let mut want = vec![0i32; 16];
    table_slot_ids_cpu(&table, 8, layout, &mut want).unwrap();
    assert_eq!(out.download().unwrap(), want);
    assert_eq!((want[1], want[13], want[14], want[0]), (2, 0, 3, -1));
}

#[test]
fn a_borrowed_step_stream_orders_work_with_its_owner() {
    let Some(gpu) = gpu_or_skip() else { return };
    let owner = gpu.new_stream().unwrap();
    // SAFETY: `owner` is a live stream of device 0's primary context and outlives `borrowed`.
    let borrowed = unsafe { Gpu::with_step_stream(0, owner.cu_stream() as u64) }.unwrap();
    assert_eq!(borrowed.stream().cu_stream(), owner.cu_stream());
    let buf = DeviceBuffer::<u32>::zeroed(borrowed.ctx(), 64).unwrap();
    let table = DeviceBuffer::<u32>::zeroed(borrowed.ctx(), 4).unwrap();
    let ids = DeviceBuffer::from_host(borrowed.ctx(), &[1i32, 1, 2, 3]).unwrap();
    let launcher = CountLauncher::new(&borrowed).unwrap();
    let target = CountTarget {
        table: table.device_ptr(),
        rejected: buf.device_ptr(),
        control: 0,
        layers: 1,
        experts: 4,
    };
    let view = StridedIds {
        ptr: ids.device_ptr(),
        dtype: IdsDtype::I32,
        tokens: 2,
        k: 2,
        row_stride: 2,
    };
    // SAFETY: all buffers live until the synchronize.
    unsafe { launcher.launch(borrowed.stream(), &view, 0, &target) }.unwrap();
    owner.synchronize().unwrap();
    assert_eq!(table.download().unwrap(), vec![0, 2, 1, 1]);
    drop(borrowed);
    // the owner's stream is still usable: the borrowed Gpu did not destroy it
    owner.synchronize().unwrap();
}
