//! Atomic Acknowledge Extended Transport Header (AtomicAckETH, IBA 9.3.6, 8 bytes): the value
//! the target held before the atomic operation.

use super::{fixed_view, get_u64, put_u64, Error, Layer, Result};

/// Header length.
pub const HEADER_LEN: usize = 8;

fixed_view!(
    /// Zero-copy view of an AtomicAckETH.
    Packet,
    HEADER_LEN,
    Layer::ExtHeaders
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Original remote data.
    pub fn orig(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

/// High-level AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Parses the header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<AtomicAckEthRepr> {
        p.check_len()?;
        Ok(AtomicAckEthRepr { orig: p.orig() })
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
        put_u64(buf, 0, self.orig);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = AtomicAckEthRepr {
            orig: 0xdead_beef_0000_0001,
        };
        let mut b = [0u8; 8];
        r.emit(&mut b).unwrap();
        assert_eq!(
            AtomicAckEthRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
    }
}
