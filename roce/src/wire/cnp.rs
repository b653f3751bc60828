//! The RoCEv2 CNP body (A17.9.3): 16 reserved bytes after the BTH. They are sent as zeros and
//! kept as carried so a frame re-emits exactly.

super::header! {
    /// High-level CNP body.
    CnpRepr: 16 bytes, Cnp;
    /// The reserved bytes (zero when ferroce sends).
    RESERVED[0..16] => reserved -> reserved: [u8; 16];
}
