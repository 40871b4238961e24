//! placeholder
use numpy as _;
use pyo3 as _;
