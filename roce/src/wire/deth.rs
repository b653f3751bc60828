//! Datagram Extended Transport Header (IBA 9.3.2, 8 bytes): Q_Key and source QP (UD).

use super::{
    fixed_view, get_u24, get_u32, put_u24, put_u32, Error, Field, Layer, Qkey, Qpn, Result,
};

/// Byte ranges.
pub mod field {
    use super::Field;
    /// Queue key.
    pub const QKEY: Field = 0..4;
    /// Reserved byte.
    pub const RESV: usize = 4;
    /// Source QP.
    pub const SRC_QP: Field = 5..8;
}

/// Header length.
pub const HEADER_LEN: usize = 8;

fixed_view!(
    /// Zero-copy view of a DETH.
    Packet,
    HEADER_LEN,
    Layer::ExtHeaders
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Q_Key.
    pub fn qkey(&self) -> Qkey {
        Qkey(get_u32(self.buffer.as_ref(), field::QKEY.start))
    }

    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(get_u24(self.buffer.as_ref(), field::SRC_QP.start))
    }
}

/// High-level DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Q_Key.
    pub qkey: Qkey,
    /// Source QP.
    pub src_qp: Qpn,
    /// The reserved byte (as carried).
    pub resv: u8,
}

impl DethRepr {
    /// Parses a DETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<DethRepr> {
        p.check_len()?;
        Ok(DethRepr {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
            resv: p.buffer.as_ref()[field::RESV],
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
        put_u32(buf, field::QKEY.start, self.qkey.0);
        buf[field::RESV] = self.resv;
        put_u24(buf, field::SRC_QP.start, self.src_qp.value());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        let r = DethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.qkey, Qkey::GSI);
        assert_eq!(r.src_qp, Qpn::GSI);
        let mut out = [0u8; 8];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
    }
}
