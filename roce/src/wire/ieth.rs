//! Invalidate Extended Transport Header (IETH, IBA 9.3.7, 4 bytes): the R_Key that a SEND with
//! invalidate asks the responder to invalidate.

use super::Rkey;

super::header! {
    /// High-level IETH.
    IethRepr: 4 bytes, ExtHeaders;
    /// The R_Key to invalidate.
    RKEY[0..4] => rkey -> rkey: Rkey;
}

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
