//! Integer arguments. Every integer a Python caller passes (a parameter, an element of an int
//! list) is read by [`int_arg`], usually through [`int_args!`]: an int (or
//! anything with `__index__`, such as a numpy integer) outside the parameter's range is a
//! `ValueError` naming the argument and the range, anything else a `TypeError` naming it — never
//! PyO3's `OverflowError` ("can't convert negative int to unsigned"), which names neither. A
//! `bool` is a `TypeError` too, though Python makes it an int: `layer=True` is a slip, never a
//! count or an id.
//! Ranges tighter than the Rust type (a layer below `layers`, ...) are the tiers' own checks.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

/// An integer type a parameter is read as, with its range for messages.
pub(crate) trait IntType: TryFrom<i128> {
    /// Smallest value.
    const MIN: i128;
    /// Largest value.
    const MAX: i128;
    /// The C / numpy name of the type (`uint32`, ...).
    const NAME: &'static str;
}

macro_rules! int_type {
    ($($t:ty => $name:literal),+ $(,)?) => {
        $(impl IntType for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
            const NAME: &'static str = $name;
        })+
    };
}
int_type!(u32 => "uint32", u64 => "uint64", usize => "size_t", i32 => "int32", i64 => "int64");

/// `obj` read as a `T` for the argument `name`: `TypeError` unless it is an int (or has
/// `__index__`) other than a `bool`, `ValueError` naming `name` and `T`'s range when the value is outside it.
pub(crate) fn int_arg<T: IntType>(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, not bool"
        )));
    }
    let int = match obj.cast::<PyInt>() {
        Ok(i) => i.clone(),
        Err(_) => index(obj).ok_or_else(|| {
            let ty = obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into());
            PyTypeError::new_err(format!("{name} must be an int, not {ty}"))
        })?,
    };
    // Every value of every IntType fits an i64 or a u64: read those (fast), anything else is
    // out of range for all of them.
    let v: Option<i128> = match int.extract::<i64>() {
        Ok(v) => Some(v.into()),
        Err(_) => int.extract::<u64>().ok().map(i128::from),
    };
    v.and_then(|v| T::try_from(v).ok()).ok_or_else(|| {
        let shown = match v {
            Some(v) => v.to_string(),
            None => shorten(int.str().map(|s| s.to_string()).unwrap_or_default()),
        };
        PyValueError::new_err(format!(
            "{name} = {shown} is out of range: expected an integer in {}..={} ({})",
            T::MIN,
            T::MAX,
            T::NAME
        ))
    })
}

/// [`int_arg`] of an optional argument (`None` when absent or `None`).
pub(crate) fn opt_int_arg<T: IntType>(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
) -> PyResult<Option<T>> {
    match obj {
        Some(o) if !o.is_none() => int_arg(o, name).map(Some),
        _ => Ok(None),
    }
}

/// `operator.index(obj)` (numpy integers and other `__index__` types), or `None` when `obj` has
/// no integer value.
fn index<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyInt>> {
    let i = obj
        .py()
        .import("operator")
        .ok()?
        .call_method1("index", (obj,))
        .ok()?;
    i.cast_into::<PyInt>().ok()
}

/// A huge integer's digits, shortened for a message.
fn shorten(s: String) -> String {
    if s.len() <= 40 {
        s
    } else {
        format!("{}…({} digits)", &s[..20], s.trim_start_matches('-').len())
    }
}

/// Reads integer parameters (each a `&Bound<PyAny>`, or `Option<&Bound<PyAny>>` for the two
/// optional forms) into checked values named after the parameter, shadowing it:
/// `int_args!(layer: u32, k: Option<usize>, chunk: u32 = 8)`. Errors are those of [`int_arg`];
/// `= default` applies when the argument is absent or `None`.
macro_rules! int_args {
    () => {};
    ($name:ident: Option<$t:ty> $(, $($rest:tt)*)?) => {
        let $name: Option<$t> = $crate::ints::opt_int_arg($name, stringify!($name))?;
        $crate::ints::int_args!($($($rest)*)?);
    };
    ($name:ident: $t:ty = $default:expr $(, $($rest:tt)*)?) => {
        let $name: $t = $crate::ints::opt_int_arg($name, stringify!($name))?.unwrap_or($default);
        $crate::ints::int_args!($($($rest)*)?);
    };
    ($name:ident: $t:ty $(, $($rest:tt)*)?) => {
        let $name: $t = $crate::ints::int_arg($name, stringify!($name))?;
        $crate::ints::int_args!($($($rest)*)?);
    };
}
pub(crate) use int_args;

/// `obj` extracted as a `T` (a bool, a str, a tierkit object) for the argument `name`: PyO3's
/// own error, of its own type, with `name: ` in front of its message (`geometry: 'NoneType'
/// object is not an instance of 'KvGeometry'`). PyO3 names the argument of a failed extraction
/// only in a note (`add_note`), which Python 3.9 and 3.10 drop and `str(e)` never shows.
pub(crate) fn arg<'a, 'py, T: FromPyObject<'a, 'py>>(
    obj: &'a Bound<'py, PyAny>,
    name: &str,
) -> PyResult<T> {
    obj.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        let py = obj.py();
        PyErr::from_type(e.get_type(py), format!("{name}: {}", e.value(py)))
    })
}

/// [`arg`] of an optional argument: `default` when absent or `None`.
pub(crate) fn opt_arg<'a, 'py, T: FromPyObject<'a, 'py>>(
    obj: Option<&'a Bound<'py, PyAny>>,
    name: &str,
    default: T,
) -> PyResult<T> {
    match obj {
        Some(o) if !o.is_none() => arg(o, name),
        _ => Ok(default),
    }
}

/// An optional float argument (`None` when absent or `None`): a `bool` is a `TypeError` naming
/// `name` (Python makes `True` a float 1.0: `reuse=True` is a slip), anything else as [`arg`].
#[cfg(feature = "lab")]
pub(crate) fn opt_float_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<f64>> {
    match obj {
        Some(o) if o.is_instance_of::<PyBool>() => Err(PyTypeError::new_err(format!(
            "{name} must be a float, not bool"
        ))),
        Some(o) if !o.is_none() => arg(o, name).map(Some),
        _ => Ok(None),
    }
}
