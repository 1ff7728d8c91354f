//! PyCapsules: the objects of the Arrow PyCapsule interface and of
//! datafusion-python's FFI protocol, made and read by name.

use std::ffi::CString;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// A capsule named `name` that owns `value` (dropped with the capsule).
pub fn export<'py, T: Send + 'static>(
    py: Python<'py>,
    value: T,
    name: &str,
) -> PyResult<Bound<'py, PyCapsule>> {
    let name = CString::new(name).expect("capsule names contain no NUL");
    PyCapsule::new(py, value, Some(name))
}

/// `obj.<getter>()` (or `obj` itself when it has no such method), checked to
/// be a capsule named `name`.
pub fn named<'py>(
    obj: &Bound<'py, PyAny>,
    getter: &str,
    name: &str,
) -> PyResult<Bound<'py, PyCapsule>> {
    let value = if obj.hasattr(getter)? {
        obj.getattr(getter)?.call0()?
    } else {
        obj.clone()
    };
    let capsule = value.downcast_into::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!(
            "expected a '{name}' capsule or an object with {getter}()"
        ))
    })?;
    let found = capsule.name()?.map(|n| n.to_string_lossy().into_owned());
    if found.as_deref() != Some(name) {
        return Err(PyTypeError::new_err(format!(
            "expected a '{name}' capsule, got {found:?}"
        )));
    }
    Ok(capsule)
}

/// A clone of the `T` in the capsule `named(obj, getter, name)` returns.
///
/// # Safety
/// A capsule named `name` must hold a `T` (the protocol pairs each name with
/// one FFI type, e.g. `datafusion_logical_extension_codec` with
/// `FFI_LogicalExtensionCodec`).
pub unsafe fn import<T: Clone>(obj: &Bound<'_, PyAny>, getter: &str, name: &str) -> PyResult<T> {
    let capsule = named(obj, getter, name)?;
    // SAFETY: the name was checked; the caller pairs the name with T.
    Ok(unsafe { capsule.reference::<T>() }.clone())
}
