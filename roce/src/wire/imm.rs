//! Immediate data header (ImmDt, IBA 9.3.6, 4 bytes). The value is kept as the 32-bit number
//! the wire carries big-endian; verbs hand it to applications in network order (`__be32`).

super::header! {
    /// High-level ImmDt.
    ImmRepr: 4 bytes, ExtHeaders;
    /// The immediate data.
    IMM[0..4] => imm -> imm: u32;
}
