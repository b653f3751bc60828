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
