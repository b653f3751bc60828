//! Atomic Extended Transport Header (AtomicETH, IBA 9.3.4, 28 bytes): virtual address, R_Key,
//! swap (or add) data, compare data.

use super::Rkey;

super::header! {
    /// High-level AtomicETH (operands as host integers; big-endian on the wire).
    AtomicEthRepr: 28 bytes, ExtHeaders;
    /// Virtual address at the responder (8-byte aligned).
    VA[0..8] => va -> va: u64;
    /// Remote key.
    RKEY[8..12] => rkey -> rkey: Rkey;
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    SWAP_ADD[12..20] => swap_add -> swap_add: u64;
    /// Compare operand (CmpSwap; 0 for FetchAdd).
    COMPARE[20..28] => compare -> compare: u64;
}
