//! FLUSH Extended Transport Header (FETH, IBA 1.5, 4 bytes): selectivity level and placement
//! type of an RC FLUSH. Kept as its raw 32-bit value.

super::header! {
    /// High-level FETH.
    FethRepr: 4 bytes, ExtHeaders;
    /// The header's raw value.
    RAW[0..4] => raw -> raw: u32;
}

impl FethRepr {
    /// Placement type (bits 1:0).
    pub const fn placement_type(&self) -> u8 {
        (self.raw & 3) as u8
    }

    /// Selectivity level (bits 5:4).
    pub const fn selectivity(&self) -> u8 {
        ((self.raw >> 4) & 3) as u8
    }
}
