//! Atomic Acknowledge Extended Transport Header (AtomicAckETH, IBA 9.3.6, 8 bytes): the value
//! the target held before the atomic operation.

super::header! {
    /// High-level AtomicAckETH.
    AtomicAckEthRepr: 8 bytes, ExtHeaders;
    /// Original remote data.
    ORIG[0..8] => orig -> orig: u64;
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
