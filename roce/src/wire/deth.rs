//! Datagram Extended Transport Header (IBA 9.3.2, 8 bytes): Q_Key and source QP (UD).

use super::{Qkey, Qpn};

super::header! {
    /// High-level DETH.
    DethRepr: 8 bytes, ExtHeaders;
    /// Queue key.
    QKEY[0..4] => qkey -> qkey: Qkey;
    /// Source QP.
    SRC_QP[5..8] => src_qp -> src_qp: Qpn;
    /// The reserved byte (as carried).
    RESV[4] => resv -> resv: u8;
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
