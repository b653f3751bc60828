//! Atomic Extended Transport Header (AtomicETH, IBA 9.3.4, 28 bytes): virtual address, R_Key,
//! swap (or add) data, compare data.

use super::{fixed_view, get_u32, get_u64, put_u32, put_u64, Error, Field, Layer, Result, Rkey};

/// Byte ranges.
pub mod field {
    use super::Field;
    /// Virtual address (8-byte aligned).
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// Swap data (CmpSwap) or add data (FetchAdd).
    pub const SWAP_ADD: Field = 12..20;
    /// Compare data (CmpSwap).
    pub const COMPARE: Field = 20..28;
}

/// Header length.
pub const HEADER_LEN: usize = 28;

fixed_view!(
    /// Zero-copy view of an AtomicETH.
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

    /// Swap or add operand.
    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SWAP_ADD.start)
    }

    /// Compare operand.
    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::COMPARE.start)
    }
}

/// High-level AtomicETH (operands as host integers; big-endian on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Virtual address at the responder.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add: u64,
    /// Compare operand (CmpSwap; 0 for FetchAdd).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<AtomicEthRepr> {
        p.check_len()?;
        Ok(AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
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
        put_u64(buf, field::SWAP_ADD.start, self.swap_add);
        put_u64(buf, field::COMPARE.start, self.compare);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = AtomicEthRepr {
            va: 0x1000,
            rkey: Rkey(7),
            swap_add: 0x0102_0304_0506_0708,
            compare: u64::MAX,
        };
        let mut b = [0u8; 28];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[12..20], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            AtomicEthRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!(Packet::new_checked(&b[..27]).is_err());
    }
}
