//! RDMA Extended Transport Header (IBA 9.3.3, 16 bytes): virtual address, R_Key, DMA length.

use super::{fixed_view, get_u32, get_u64, put_u32, put_u64, Error, Field, Layer, Result, Rkey};

/// Byte ranges.
pub mod field {
    use super::Field;
    /// Virtual address.
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// DMA length.
    pub const LEN: Field = 12..16;
}

/// Header length.
pub const HEADER_LEN: usize = 16;

fixed_view!(
    /// Zero-copy view of a RETH.
    Packet,
    HEADER_LEN,
    Layer::ExtHeaders
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA.start)
    }

    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(get_u32(self.buffer.as_ref(), field::RKEY.start))
    }

    /// DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::LEN.start)
    }
}

/// High-level RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Virtual address at the responder.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// DMA length of the whole message.
    pub len: u32,
}

impl RethRepr {
    /// Parses a RETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<RethRepr> {
        p.check_len()?;
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            len: p.dma_len(),
        })
    }

    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall { need: HEADER_LEN });
        }
        put_u64(buf, field::VA.start, self.va);
        put_u32(buf, field::RKEY.start, self.rkey.0);
        put_u32(buf, field::LEN.start, self.len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [
            0, 0, 0x55, 0xb6, 0xa7, 0x88, 0x20, 0, 0, 0, 0x03, 0x8b, 0, 0, 0x10, 0,
        ];
        let r = RethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.va, 0x55b6_a788_2000);
        assert_eq!(r.rkey, Rkey(0x38b));
        assert_eq!(r.len, 4096);
        let mut out = [0u8; 16];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
    }
}
