//! Atomic Acknowledge Extended Transport Header (AtomicAckETH, IBA 9.3.6, 8 bytes): the value
//! the target held before the atomic operation.

super::header! {
    /// High-level AtomicAckETH.
    AtomicAckEthRepr: 8 bytes, ExtHeaders;
    /// Original remote data.
    ORIG[0..8] => orig -> orig: u64;
}
