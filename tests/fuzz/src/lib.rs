//! The bodies of the fuzz targets (`fuzz_targets/`), kept in a library so that the smoke test
//! (`tests/smoke.rs`, part of `cargo test --workspace`) runs the same code over seeds and
//! pseudo-random inputs on the stable toolchain, without libFuzzer.
//!
//! Each body panics on a broken invariant; an `Err` or a counted drop inside the code under
//! test is an expected outcome.

pub mod cm;
pub mod frame;
pub mod pcap;
pub mod rx;

/// A cursor over fuzz input: each read takes the next bytes, and reads past the end give
/// zeros (so any input is a complete script).
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// The next two bytes, big-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, big-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, big-endian.
    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }

    /// Up to `n` next bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }
}
