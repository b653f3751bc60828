//! Invalidate Extended Transport Header (IETH, IBA 9.3.7, 4 bytes): the R_Key that a SEND with
//! invalidate asks the responder to invalidate.

use crate::types::Rkey;

super::u32_header!(
    /// High-level IETH.
    IethRepr,
    rkey: Rkey,
    Rkey,
    |k| k.0
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = IethRepr { rkey: Rkey(0xabcd) };
        let mut b = [0u8; 4];
        r.emit(&mut b).unwrap();
        assert_eq!(b, [0, 0, 0xab, 0xcd]);
        assert_eq!(
            IethRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
    }
}
