//! `tierkit.kv.ElasticPool`'s transfer half: the region-backed host store's descriptors, a
//! numpy (and so DLPack) view of it, and zero-copy imports / pinned exports (the methods in
//! `kv.rs` call these helpers).

use kv_elastic::{ElasticPool, RegionHold, Reserve, RowSpan, TeardownHook};
use numpy::ndarray::ArrayViewMut4;
use numpy::PyArray4;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::to_py;

/// Keeps a host store's memory mapped while a numpy view of it lives (the view's `base`).
#[pyclass(name = "HostStoreMemory", module = "tierkit.kv", frozen)]
pub(crate) struct PyRegionHold(#[allow(dead_code)] RegionHold);

/// A row span as a dict: session, start, end, slot, offset, addr, len.
pub(crate) fn span<'py>(py: Python<'py>, s: &RowSpan) -> PyResult<Bound<'py, PyAny>> {
    to_py(py, s)
}

/// `reserve`'s outcome: the span with `"reserved": True`, or `{"reserved": False, "pending": n}`.
pub(crate) fn reserve<'py>(py: Python<'py>, r: Reserve) -> PyResult<Bound<'py, PyAny>> {
    match r {
        Reserve::Reserved(s) => {
            let d = span(py, &s)?;
            d.set_item("reserved", true)?;
            Ok(d)
        }
        Reserve::Waiting { pending } => {
            let d = PyDict::new(py);
            d.set_item("reserved", false)?;
            d.set_item("pending", pending)?;
            Ok(d.into_any())
        }
    }
}

/// One region as Python sees it: `(addr, len, item_len, kind, numa_node)`.
pub(crate) type RegionTuple = (u64, u64, u64, &'static str, i64);

/// The store's regions as tuples `(addr, len, item_len, kind, numa_node)` (`numa_node` -1 when
/// unknown); an empty list for a store without a region.
pub(crate) fn regions(p: &ElasticPool) -> Vec<RegionTuple> {
    p.region()
        .map(|(d, _)| {
            vec![(
                d.addr,
                d.len,
                d.item_len,
                d.kind.name(),
                d.numa_node.map_or(-1, i64::from),
            )]
        })
        .unwrap_or_default()
}

/// The store as `uint8 [max_slots, max_history, layers, row_bytes]` over its memory (writable;
/// `None` for a store without a region). The view keeps the memory mapped after the pool closes.
pub(crate) fn store_view<'py>(
    py: Python<'py>,
    p: &ElasticPool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (Some((desc, layout)), Some(r)) = (p.region(), p.host().backing().as_region()) else {
        return Ok(None);
    };
    let shape = (
        layout.max_slots as usize,
        layout.max_history as usize,
        layout.layers as usize,
        layout.row_bytes as usize,
    );
    let hold = Bound::new(py, PyRegionHold(r.host_region().keep_alive()))?;
    // SAFETY: `desc.addr .. + store_bytes` is the region's mapped memory (the layout fits in
    // it: checked when the store was built), kept mapped by `hold`, which becomes the array's
    // base; the array is a plain C-contiguous u8 view of it.
    let view = unsafe { ArrayViewMut4::<u8>::from_shape_ptr(shape, desc.addr as *mut u8) };
    // SAFETY: `hold` keeps the memory the view points to alive as long as the array.
    let arr = unsafe { PyArray4::borrow_from_array(&view, hold.into_any()) };
    Ok(Some(arr.into_any()))
}

/// A teardown hook calling `callback(addr, len)` (a transfer agent's deregistration) with the
/// GIL; an exception it raises is reported as unraisable (teardown goes on).
pub(crate) fn hook(callback: Py<PyAny>) -> TeardownHook {
    Box::new(move |d| {
        Python::attach(|py| {
            if let Err(e) = callback.call1(py, (d.addr, d.len)) {
                e.write_unraisable(py, None);
            }
        })
    })
}
