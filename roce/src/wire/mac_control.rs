//! MAC control frames (EtherType 0x8808): link-level PAUSE (802.3 Annex 31B, opcode 0x0001) and
//! priority flow control (802.1Qbb, opcode 0x0101). Facts: dcb.md.
//!
//! The view covers the bytes after the Ethernet header. Frames are padded to the 60-byte
//! minimum (without FCS), i.e. 46 bytes of MAC control payload.

use super::{fixed_view, get_u16, put_u16, Error, Field, Layer, Result};

/// Byte ranges (relative to the end of the Ethernet header).
pub mod field {
    use super::Field;
    /// MAC control opcode.
    pub const OPCODE: Field = 0..2;
    /// PAUSE: pause time in quanta.
    pub const PAUSE_TIME: Field = 2..4;
    /// PFC: class-enable vector (bit n = priority n; upper 8 bits zero).
    pub const CLASS_ENABLE: Field = 2..4;
    /// PFC: first of the 8 per-priority pause times.
    pub const PFC_TIMES: usize = 4;
}

/// Destination MAC of PAUSE and PFC frames.
pub const PAUSE_DST: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x01];
/// Opcode of link-level PAUSE.
pub const OPCODE_PAUSE: u16 = 0x0001;
/// Opcode of PFC.
pub const OPCODE_PFC: u16 = 0x0101;
/// MAC control payload length of a minimum-size frame.
pub const PAYLOAD_LEN: usize = 46;
/// Bytes a PFC body occupies before padding.
const PFC_LEN: usize = 4 + 16;

fixed_view!(
    /// Zero-copy view of a MAC control payload (at least a PFC body).
    Packet,
    PFC_LEN,
    Layer::MacControl
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Opcode.
    pub fn opcode(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::OPCODE.start)
    }

    /// Class-enable vector (PFC).
    pub fn class_enable(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CLASS_ENABLE.start)
    }

    /// Pause time of priority `p` (PFC), in quanta.
    pub fn pfc_time(&self, p: usize) -> u16 {
        get_u16(self.buffer.as_ref(), field::PFC_TIMES + 2 * p)
    }

    /// Pause time (PAUSE), in quanta.
    pub fn pause_time(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PAUSE_TIME.start)
    }
}

/// A MAC control frame's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MacControlRepr {
    /// Link-level PAUSE for `quanta` x 512 bit times (0 = resume).
    Pause {
        /// Pause time in quanta.
        quanta: u16,
    },
    /// Priority flow control.
    Pfc {
        /// Class-enable vector: bit n set = the time for priority n is valid.
        class_enable: u8,
        /// Per-priority pause time in quanta (0 = XON).
        quanta: [u16; 8],
    },
    /// Another MAC control opcode, kept as carried.
    Unknown(u16),
}

impl MacControlRepr {
    /// Parses the payload after the Ethernet header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<MacControlRepr> {
        if p.buffer.as_ref().len() < 4 {
            return Err(Error::Truncated(Layer::MacControl));
        }
        match p.opcode() {
            OPCODE_PAUSE => Ok(MacControlRepr::Pause {
                quanta: p.pause_time(),
            }),
            OPCODE_PFC => {
                p.check_len()?;
                if p.class_enable() > 0xff {
                    return Err(Error::Malformed(Layer::MacControl));
                }
                let mut quanta = [0u16; 8];
                for (i, q) in quanta.iter_mut().enumerate() {
                    *q = p.pfc_time(i);
                }
                Ok(MacControlRepr::Pfc {
                    class_enable: p.class_enable() as u8,
                    quanta,
                })
            }
            other => Ok(MacControlRepr::Unknown(other)),
        }
    }

    /// Payload length written by `emit` (padded to the minimum frame).
    pub const fn buffer_len(&self) -> usize {
        PAYLOAD_LEN
    }

    /// Writes the payload (zero padding included).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < PAYLOAD_LEN {
            return Err(Error::BufferTooSmall { need: PAYLOAD_LEN });
        }
        buf[..PAYLOAD_LEN].fill(0);
        match *self {
            MacControlRepr::Pause { quanta } => {
                put_u16(buf, 0, OPCODE_PAUSE);
                put_u16(buf, 2, quanta);
            }
            MacControlRepr::Pfc {
                class_enable,
                quanta,
            } => {
                put_u16(buf, 0, OPCODE_PFC);
                put_u16(buf, 2, class_enable as u16);
                for (i, q) in quanta.iter().enumerate() {
                    put_u16(buf, field::PFC_TIMES + 2 * i, *q);
                }
            }
            MacControlRepr::Unknown(op) => put_u16(buf, 0, op),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pfc_round_trip() {
        let r = MacControlRepr::Pfc {
            class_enable: 0x08,
            quanta: [0, 0, 0, 0xffff, 0, 0, 0, 0],
        };
        let mut b = [0xaau8; 46];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x01, 0x01, 0x00, 0x08]);
        assert_eq!(&b[10..12], &[0xff, 0xff]);
        assert!(b[20..].iter().all(|&x| x == 0));
        assert_eq!(
            MacControlRepr::parse(&Packet::new_unchecked(&b[..])).unwrap(),
            r
        );
        let p = MacControlRepr::Pause { quanta: 0x100 };
        p.emit(&mut b).unwrap();
        assert_eq!(
            MacControlRepr::parse(&Packet::new_unchecked(&b[..])).unwrap(),
            p
        );
        assert!(MacControlRepr::parse(&Packet::new_unchecked(&b[..3])).is_err());
    }
}
