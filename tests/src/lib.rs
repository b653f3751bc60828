//! Helpers shared by ferroce's cross-crate integration tests (in `tests/tests/`).

#![warn(missing_docs)]
