//! The RoCEv2 CNP body (A17.9.3): 16 reserved bytes after the BTH. They are sent as zeros and
//! kept as carried so a frame re-emits exactly.

use super::{fixed_view, Error, Layer, Result};

/// Body length.
pub const HEADER_LEN: usize = 16;

fixed_view!(
    /// Zero-copy view of a CNP body.
    Packet,
    HEADER_LEN,
    Layer::Cnp
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The reserved bytes.
    pub fn reserved(&self) -> [u8; 16] {
        self.buffer.as_ref()[..16].try_into().unwrap()
    }
}

/// High-level CNP body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CnpRepr {
    /// Reserved bytes (zero when ferroce sends).
    pub reserved: [u8; 16],
}

impl CnpRepr {
    /// Parses the body.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<CnpRepr> {
        p.check_len()?;
        Ok(CnpRepr {
            reserved: p.reserved(),
        })
    }

    /// Body length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the body.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall { need: HEADER_LEN });
        }
        buf[..16].copy_from_slice(&self.reserved);
        Ok(())
    }
}
