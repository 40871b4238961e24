//! Array arguments: numpy arrays, CPU tensors through DLPack, buffer-protocol objects; dtype,
//! shape, alignment, contiguity and writability checked before any Rust code reads them. Copies
//! are allocated fallibly (`MemoryError` when the host refuses, never an abort); byte buffers
//! are borrowed where they are contiguous.

use numpy::{
    PyArrayDyn, PyArrayMethods, PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};
use tier_core::alloc::{try_collect, try_reserve};

use crate::core_err;
use crate::ints::{int_arg, IntType};

/// DLPack's device type of host memory (`kDLCPU`).
const DL_CPU: i64 = 1;

/// `obj` as a numpy array (no copy): a numpy array as is; an object with `__dlpack__` (torch,
/// jax, ...) through `numpy.from_dlpack` if it lives on the CPU; a buffer-protocol object through
/// `numpy.asarray(memoryview(obj))`. Anything else is a `TypeError`.
pub(crate) fn ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        refuse_masked(obj, what)?;
        return Ok(a.clone());
    }
    let py = obj.py();
    let np = py.import("numpy")?;
    if obj.hasattr("__dlpack__")? {
        if obj.hasattr("__dlpack_device__")? {
            let (kind, id): (i64, i64) = obj.call_method0("__dlpack_device__")?.extract()?;
            if kind != DL_CPU {
                return Err(PyValueError::new_err(format!(
                    "{what} lives on DLPack device ({kind}, {id}), not the CPU: the CPU API takes \
                     host memory (tierkit.torch, the GPU ops, is not built yet)"
                )));
            }
        }
        let a = np.call_method1("from_dlpack", (obj,))?;
        return Ok(a.cast_into::<PyUntypedArray>()?);
    }
    let view = match py.import("builtins")?.getattr("memoryview")?.call1((obj,)) {
        Ok(v) => v,
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "{what} must be a numpy array, a CPU tensor (DLPack) or a buffer, not {}",
                obj.get_type().name()?
            )))
        }
    };
    Ok(np
        .call_method1("asarray", (view,))?
        .cast_into::<PyUntypedArray>()?)
}

/// A `numpy.ma.MaskedArray` is refused (`TypeError` naming `what`): its data array is what a
/// buffer read sees, masked entries included, so the mask would be ignored silently. Fill it
/// (`a.filled(...)`) or compress it first. (No masked array exists before `numpy.ma` is
/// imported, so the check costs one dictionary lookup otherwise.)
fn refuse_masked(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    let py = obj.py();
    let modules = py.import("sys")?.getattr("modules")?;
    let Some(ma) = modules.cast::<PyDict>()?.get_item("numpy.ma")? else {
        return Ok(());
    };
    if obj.is_instance(&ma.getattr("MaskedArray")?)? {
        return Err(PyTypeError::new_err(format!(
            "{what} is a masked array: its mask would be ignored (pass a.filled(value) or \
             a.compressed())"
        )));
    }
    Ok(())
}

fn check_shape(a: &Bound<'_, PyUntypedArray>, what: &str, ndim: usize, dims: &str) -> PyResult<()> {
    if a.ndim() != ndim {
        return Err(PyValueError::new_err(format!(
            "{what} must be {ndim}-D {dims}, got shape {:?}",
            a.shape()
        )));
    }
    if !a.is_aligned() {
        return Err(PyValueError::new_err(format!(
            "{what} is not aligned for its dtype {} (copy it: numpy.ascontiguousarray)",
            a.dtype()
        )));
    }
    Ok(())
}

fn dtype_error(a: &Bound<'_, PyUntypedArray>, what: &str, want: &str) -> PyErr {
    PyTypeError::new_err(format!("{what} has dtype {}, expected {want}", a.dtype()))
}

/// An integer array of `ndim` dimensions (`dims` names them in messages), any strides, dtype
/// int32, int64, uint32 or uint64, read in logical (row-major) order. A 1-D argument may also
/// be a list or tuple of ints.
pub(crate) fn ints(
    obj: &Bound<'_, PyAny>,
    what: &str,
    ndim: usize,
    dims: &str,
) -> PyResult<(Vec<i64>, Vec<usize>)> {
    if ndim == 1 && (obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()) {
        let n = obj.len()?;
        let mut v = Vec::new();
        try_reserve(&mut v, n, "an int list's copy").map_err(core_err)?;
        for (i, x) in obj.try_iter()?.enumerate() {
            v.push(int_arg::<i64>(&x?, &format!("{what}[{i}]"))?);
        }
        return Ok((v, vec![n]));
    }
    let a = ndarray(obj, what)?;
    check_shape(&a, what, ndim, dims)?;
    let shape = a.shape().to_vec();
    macro_rules! read {
        ($t:ty) => {
            if let Ok(t) = a.cast::<PyArrayDyn<$t>>() {
                let r = t
                    .try_readonly()
                    .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
                let mut out = Vec::new();
                try_reserve(&mut out, r.len(), "an int array's copy").map_err(core_err)?;
                for &v in r.as_array().iter() {
                    out.push(i64::try_from(v).map_err(|_| {
                        PyValueError::new_err(format!("{what}: {v} does not fit an int64"))
                    })?);
                }
                return Ok((out, shape));
            }
        };
    }
    read!(i32);
    read!(i64);
    read!(u32);
    read!(u64);
    Err(dtype_error(&a, what, "int32 or int64"))
}

/// A sequence of int sequences (`[[7, 2], [0, 1]]`, tuples, the rows of a 2-D array), each
/// element read by [`int_arg`] as `what[i][j]` (its own list's length is the caller's).
pub(crate) fn int_lists<T: IntType>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Vec<T>>> {
    let mut out = Vec::new();
    for (i, row) in sequence(obj, what)?.enumerate() {
        let (row, name) = (row?, format!("{what}[{i}]"));
        let mut v = Vec::new();
        for (j, x) in sequence(&row, &name)?.enumerate() {
            v.push(int_arg::<T>(&x?, &format!("{name}[{j}]"))?);
        }
        out.push(v);
    }
    Ok(out)
}

/// An iterator over a sequence argument (not a string): `TypeError` naming `what` otherwise.
fn sequence<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    let not_seq = || {
        PyTypeError::new_err(format!(
            "{what} must be a sequence of ints, not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    };
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(not_seq());
    }
    obj.try_iter().map_err(|_| not_seq())
}

/// Narrows ints to `T`, naming the first value out of range.
pub(crate) fn narrow<T: TryFrom<i64>>(v: &[i64], what: &str) -> PyResult<Vec<T>> {
    let mut out = Vec::new();
    try_reserve(&mut out, v.len(), "a narrowed int array").map_err(core_err)?;
    for (i, &x) in v.iter().enumerate() {
        out.push(T::try_from(x).map_err(|_| {
            PyValueError::new_err(format!(
                "{what}[{i}] = {x} is out of range for {}",
                std::any::type_name::<T>()
            ))
        })?);
    }
    Ok(out)
}

/// Non-negative counts as f64: a 2-D numeric array (`[layers, experts]`) of any int or float
/// dtype.
pub(crate) fn counts(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Vec<f64>, Vec<usize>)> {
    let a = ndarray(obj, what)?;
    check_shape(&a, what, 2, "[layers, experts]")?;
    let shape = a.shape().to_vec();
    macro_rules! read {
        ($t:ty) => {
            if let Ok(t) = a.cast::<PyArrayDyn<$t>>() {
                let r = t
                    .try_readonly()
                    .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
                let a = r.as_array();
                let v = try_collect(a.len(), a.iter().map(|&v| v as f64), "a counts copy")
                    .map_err(core_err)?;
                return Ok((v, shape));
            }
        };
    }
    read!(f64);
    read!(f32);
    read!(i32);
    read!(i64);
    read!(u32);
    read!(u64);
    Err(dtype_error(&a, what, "a float or int dtype"))
}

/// Runs `f` on bytes: `bytes` and contiguous uint8 arrays / tensors (any shape, row-major) are
/// borrowed for the call; a `bytearray` (Python code could resize it) and strided arrays are
/// copied first (`MemoryError` when the host cannot). `f` must not run Python code.
pub(crate) fn with_bytes<R>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<R> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return f(b.as_bytes());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        // SAFETY: no Python code runs while the slice lives (the copy is plain Rust), so nothing
        // can resize or free the bytearray's buffer meanwhile.
        let copy = tier_core::alloc::try_copied(unsafe { b.as_bytes() }, "a bytearray's copy")
            .map_err(core_err)?;
        return f(&copy);
    }
    let a = ndarray(obj, what)?;
    if !a.is_aligned() {
        return Err(PyValueError::new_err(format!("{what} is not aligned")));
    }
    let t = a
        .cast::<PyArrayDyn<u8>>()
        .map_err(|_| dtype_error(&a, what, "uint8"))?;
    let r = t
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
    match r.as_slice() {
        Ok(s) => f(s),
        Err(_) => {
            let a = r.as_array();
            let copy = try_collect(a.len(), a.iter().copied(), "a strided byte array's copy")
                .map_err(core_err)?;
            f(&copy)
        }
    }
}

/// A new zeroed numpy int32 array of `shape` (numpy allocates: `MemoryError` when it cannot).
pub(crate) fn zeros_i32<'py>(py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let np = py.import("numpy")?;
    np.call_method1("zeros", (shape.to_vec(), np.getattr("int32")?))
}

/// A caller-provided int32 output array: a numpy array of dtype int32, C-contiguous, aligned,
/// writeable, with at least `min_len` elements.
pub(crate) fn out_i32<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    min_len: usize,
) -> PyResult<PyReadwriteArrayDyn<'py, i32>> {
    let a = obj.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be a numpy int32 array (outputs are written in place), not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    refuse_masked(obj, what)?;
    let t = a
        .cast::<PyArrayDyn<i32>>()
        .map_err(|_| dtype_error(a, what, "int32"))?;
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{what} must be C-contiguous"
        )));
    }
    if !a.is_aligned() {
        return Err(PyValueError::new_err(format!("{what} is not aligned")));
    }
    if a.len() < min_len {
        return Err(PyValueError::new_err(format!(
            "{what} has {} elements, the call writes {min_len}",
            a.len()
        )));
    }
    t.try_readwrite().map_err(|e| {
        PyValueError::new_err(format!("{what} is not writeable (or is borrowed): {e}"))
    })
}
