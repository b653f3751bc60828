//! Immediate data header (ImmDt, IBA 9.3.6, 4 bytes). The value is kept as the 32-bit number
//! the wire carries big-endian; verbs hand it to applications in network order (`__be32`).

super::header! {
    /// High-level ImmDt.
    ImmRepr: 4 bytes, ExtHeaders;
    /// The immediate data.
    IMM[0..4] => imm -> imm: u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = ImmRepr { imm: 0x1234_5678 };
        let mut b = [0u8; 4];
        r.emit(&mut b).unwrap();
        assert_eq!(b, [0x12, 0x34, 0x56, 0x78]);
        assert_eq!(
            ImmRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!(Packet::new_checked(&b[..3]).is_err());
    }
}
