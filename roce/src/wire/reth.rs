//! RDMA Extended Transport Header (IBA 9.3.3, 16 bytes): virtual address, R_Key, DMA length.

use super::Rkey;

super::header! {
    /// High-level RETH.
    RethRepr: 16 bytes, ExtHeaders;
    /// Virtual address at the responder.
    VA[0..8] => va -> va: u64;
    /// Remote key.
    RKEY[8..12] => rkey -> rkey: Rkey;
    /// DMA length of the whole message.
    LEN[12..16] => dma_len -> len: u32;
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
