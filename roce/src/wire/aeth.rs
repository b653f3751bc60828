//! ACK Extended Transport Header (IBA 9.3.5, 4 bytes): syndrome and MSN; plus the credit and
//! RNR timer encodings (IBA Tables 44 and 45; roce-wire.md "AETH syndrome").

use super::Msn;

super::header! {
    /// High-level AETH; the syndrome is kept as a byte (reserved bit 7 included) so it re-emits
    /// exactly. [`AethRepr::kind`] decodes it.
    AethRepr: 4 bytes, ExtHeaders;
    /// Syndrome (IBA 9.3.5: type in bits 6:5, credit/timer/NAK code in bits 4:0).
    SYNDROME[0] => syndrome -> syndrome: u8;
    /// Message sequence number.
    MSN[1..4] => msn -> msn: Msn;
}

/// Credit code meaning "no end-to-end flow control credits advertised" (unlimited).
pub const CREDITS_INVALID: u8 = 0x1f;

/// Credit code -> number of receive WQEs (IBA Table 45).
pub const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// RNR NAK timer code -> delay in nanoseconds (IBA Table 44; code 0 is the longest).
pub const RNR_TIMER_NS: [u64; 32] = [
    655_360_000,
    10_000,
    20_000,
    30_000,
    40_000,
    60_000,
    80_000,
    120_000,
    160_000,
    240_000,
    320_000,
    480_000,
    640_000,
    960_000,
    1_280_000,
    1_920_000,
    2_560_000,
    3_840_000,
    5_120_000,
    7_680_000,
    10_240_000,
    15_360_000,
    20_480_000,
    30_720_000,
    40_960_000,
    61_440_000,
    81_920_000,
    122_880_000,
    163_840_000,
    245_760_000,
    327_680_000,
    491_520_000,
];

/// The largest credit code whose count does not exceed `wqes` (what a responder advertises).
pub fn credits_to_code(wqes: u32) -> u8 {
    // The table rises: a binary search (every ACK a responder queues asks this).
    CREDIT_TABLE
        .partition_point(|&c| c <= wqes)
        .saturating_sub(1) as u8
}

/// NAK codes (IBA Table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error (0x60).
    PsnSequenceError,
    /// Invalid request (0x61).
    InvalidRequest,
    /// Remote access error (0x62).
    RemoteAccessError,
    /// Remote operational error (0x63).
    RemoteOperationalError,
    /// Invalid RD request (0x64).
    InvalidRdRequest,
    /// A reserved code, kept as carried.
    Unknown(u8),
}

impl NakCode {
    /// From the low 5 bits of the syndrome.
    pub const fn from_bits(b: u8) -> NakCode {
        match b & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            x => NakCode::Unknown(x),
        }
    }

    /// The low 5 bits.
    pub const fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(x) => x & 0x1f,
        }
    }

    /// Short name (as counters and rnic-pcap show it).
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "psn_seq_err",
            NakCode::InvalidRequest => "invalid_request",
            NakCode::RemoteAccessError => "remote_access_err",
            NakCode::RemoteOperationalError => "remote_op_err",
            NakCode::InvalidRdRequest => "invalid_rd_request",
            NakCode::Unknown(_) => "unknown",
        }
    }
}

/// What a syndrome says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// Positive acknowledgement with a credit code (0x1f = not advertised).
    Ack {
        /// Credit code (index into [`CREDIT_TABLE`], or [`CREDITS_INVALID`]).
        credits: u8,
    },
    /// Receiver not ready, retry after the timer code's delay.
    RnrNak {
        /// RNR timer code (index into [`RNR_TIMER_NS`]).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Syndrome type 10 (reserved).
    Reserved,
}

impl AethRepr {
    /// An ACK with a credit code.
    pub const fn ack(credits: u8, msn: Msn) -> AethRepr {
        AethRepr {
            syndrome: credits & 0x1f,
            msn,
        }
    }

    /// An RNR NAK with a timer code.
    pub const fn rnr_nak(timer: u8, msn: Msn) -> AethRepr {
        AethRepr {
            syndrome: 0x20 | (timer & 0x1f),
            msn,
        }
    }

    /// A NAK.
    pub const fn nak(code: NakCode, msn: Msn) -> AethRepr {
        AethRepr {
            syndrome: 0x60 | code.bits(),
            msn,
        }
    }

    /// Whether this is a positive acknowledgement (which carries credits), not an RNR NAK,
    /// a NAK or a reserved syndrome.
    pub const fn is_ack(&self) -> bool {
        matches!(self.kind(), AethKind::Ack { .. })
    }

    /// Decodes the syndrome.
    pub const fn kind(&self) -> AethKind {
        let low = self.syndrome & 0x1f;
        match (self.syndrome >> 5) & 3 {
            0 => AethKind::Ack { credits: low },
            1 => AethKind::RnrNak { timer: low },
            3 => AethKind::Nak(NakCode::from_bits(low)),
            _ => AethKind::Reserved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes() {
        assert_eq!(
            AethRepr::ack(0x1f, Msn::new(1)).kind(),
            AethKind::Ack { credits: 31 }
        );
        assert_eq!(AethRepr::rnr_nak(12, Msn::new(1)).syndrome, 0x2c);
        let n = AethRepr::nak(NakCode::PsnSequenceError, Msn::new(0x123456));
        assert_eq!(n.syndrome, 0x60);
        let mut b = [0u8; 4];
        n.emit(&mut b).unwrap();
        assert_eq!(b, [0x60, 0x12, 0x34, 0x56]);
        assert_eq!(
            AethRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            n
        );
        assert_eq!(
            AethRepr {
                syndrome: 0x62,
                msn: Msn::new(0)
            }
            .kind(),
            AethKind::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            AethRepr {
                syndrome: 0x40,
                msn: Msn::new(0)
            }
            .kind(),
            AethKind::Reserved
        );
        assert_eq!(credits_to_code(0), 0);
        assert_eq!(credits_to_code(5), 4);
        assert_eq!(credits_to_code(100_000), 30);
        // The largest code whose count does not exceed the WQEs, at every count.
        for wqes in 0..40_000u32 {
            let code = credits_to_code(wqes) as usize;
            assert!(CREDIT_TABLE[code] <= wqes);
            assert!(
                CREDIT_TABLE.get(code + 1).is_none_or(|&c| c > wqes),
                "{wqes}"
            );
        }
        assert_eq!(RNR_TIMER_NS[12], 640_000);
    }
}
