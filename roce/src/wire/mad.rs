//! Management datagrams (IBA 13.4) as they travel on QP1 (the GSI, UD SEND-only, Q_Key
//! 0x80010000), and the connection manager's messages in them (IBA 12.6): REQ, MRA, REJ, REP,
//! RTU, DREQ, DREP, with the fields a capture reader needs ([`CmMessage`], from the full
//! messages of [`super::cm`], which also builds them). Untrusted bytes: a short or unknown
//! message is an error or an `Other`, never a panic.
//!
//! Field offsets are IBA's (chapter 12.6, REQ in Table 106), relative to the CM message after
//! the 24-byte MAD header, as Linux's include/rdma/ibta_vol1_c12.h lists them; big-endian.

use core::fmt;

use super::{get_u16, get_u32, get_u64};

/// Bytes of the MAD common header.
pub const HEADER_LEN: usize = 24;
/// Bytes of a whole MAD (header and data) on QP0/QP1.
pub const MAD_LEN: usize = 256;
/// The Q_Key of QP1 (IBA 10.2.4.1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Management class of the communication manager.
pub const CLASS_CM: u8 = 0x07;

/// Why a datagram did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Shorter than the MAD header or than the message it names.
    Truncated,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "MAD truncated"),
        }
    }
}

/// The MAD common header (IBA 13.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class (0x07: CM).
    pub class: u8,
    /// Class version (CM: 2).
    pub class_version: u8,
    /// Method with the response bit (0x80) cleared.
    pub method: u8,
    /// Whether this is a response (R bit).
    pub response: bool,
    /// Status.
    pub status: u16,
    /// Class-specific field (bytes 6-7).
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID (CM: the message type).
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// Parses the header at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<MadHeader, Error> {
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(MadHeader {
            base_version: b[0],
            class: b[1],
            class_version: b[2],
            method: b[3] & 0x7f,
            response: b[3] & 0x80 != 0,
            status: get_u16(b, 4),
            class_specific: get_u16(b, 6),
            tid: get_u64(b, 8),
            attr_id: get_u16(b, 16),
            attr_mod: get_u32(b, 20),
        })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `b` (reserved bytes zero).
    pub fn emit(&self, b: &mut [u8; HEADER_LEN]) {
        b.fill(0);
        b[0] = self.base_version;
        b[1] = self.class;
        b[2] = self.class_version;
        b[3] = (self.method & 0x7f) | if self.response { 0x80 } else { 0 };
        b[4..6].copy_from_slice(&self.status.to_be_bytes());
        b[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        b[8..16].copy_from_slice(&self.tid.to_be_bytes());
        b[16..18].copy_from_slice(&self.attr_id.to_be_bytes());
        b[20..24].copy_from_slice(&self.attr_mod.to_be_bytes());
    }

    /// The class by name (IBA 13.4.4), or `None` for one this module does not name.
    pub fn class_name(&self) -> Option<&'static str> {
        Some(match self.class {
            0x01 | 0x81 => "smp",
            0x03 => "sa",
            0x04 => "perf",
            0x05 => "bm",
            0x06 => "devmgt",
            CLASS_CM => "cm",
            0x08 => "snmp",
            _ => return None,
        })
    }

    /// The method by name (IBA 13.4.5).
    pub fn method_name(&self) -> &'static str {
        match (self.method, self.response) {
            (0x01, false) => "get",
            (0x02, false) => "set",
            (0x01, true) => "getresp",
            (0x03, false) => "send",
            (0x05, false) => "trap",
            (0x06, false) => "report",
            (0x06, true) => "reportresp",
            (0x07, false) => "traprepress",
            _ => "other",
        }
    }
}

/// CM attribute IDs (IBA 12.6, as ib_cm uses them).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Request for communication.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to request.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001a;
    /// The CM messages `wire::cm::Cm` carries (all but LAP and APR).
    pub const CM_MESSAGES: [u16; 9] = [REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP];
}

/// A CM message's fields (the ones a capture reader wants). Serialized (feature `serde`) as an
/// object whose `msg` names the message (`REQ`, `REP`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(tag = "msg"))]
pub enum CmMessage {
    /// REQ (Table 106).
    #[cfg_attr(feature = "serde", serde(rename = "REQ"))]
    Req {
        /// Local communication ID.
        local_comm_id: u32,
        /// Service ID (rdma_cm: port space and port).
        service_id: u64,
        /// Local QPN.
        qpn: u32,
        /// Starting PSN (the REP sender's first request PSN).
        starting_psn: u32,
        /// Responder resources (RDMA READ/atomic depth offered).
        responder_resources: u8,
        /// Initiator depth.
        initiator_depth: u8,
        /// Transport service type (0 RC, 1 UC, 3 XRC).
        transport: u8,
        /// P_Key.
        pkey: u16,
        /// Path MTU (IBA encoding: 1 = 256 .. 5 = 4096).
        path_mtu: u8,
        /// Retry count (transport retries).
        retry_count: u8,
        /// RNR retry count.
        rnr_retry_count: u8,
        /// Max CM retries.
        max_cm_retries: u8,
    },
    /// MRA.
    #[cfg_attr(feature = "serde", serde(rename = "MRA"))]
    Mra {
        /// Local communication ID.
        local_comm_id: u32,
        /// Remote communication ID.
        remote_comm_id: u32,
        /// Which message is acknowledged (0 REQ, 1 REP, 2 LAP).
        message: u8,
        /// Service timeout (4.096 us x 2^t).
        service_timeout: u8,
    },
    /// REJ.
    #[cfg_attr(feature = "serde", serde(rename = "REJ"))]
    Rej {
        /// Local communication ID.
        local_comm_id: u32,
        /// Remote communication ID.
        remote_comm_id: u32,
        /// Which message is rejected (0 REQ, 1 REP, 2 no message).
        message: u8,
        /// Reason (28: consumer defined; 8: invalid service ID).
        reason: u16,
    },
    /// REP.
    #[cfg_attr(feature = "serde", serde(rename = "REP"))]
    Rep {
        /// Local communication ID.
        local_comm_id: u32,
        /// Remote communication ID.
        remote_comm_id: u32,
        /// Local QPN.
        qpn: u32,
        /// Starting PSN (the REQ sender's first request PSN).
        starting_psn: u32,
        /// Responder resources.
        responder_resources: u8,
        /// Initiator depth.
        initiator_depth: u8,
        /// RNR retry count.
        rnr_retry_count: u8,
    },
    /// RTU.
    #[cfg_attr(feature = "serde", serde(rename = "RTU"))]
    Rtu {
        /// Local communication ID.
        local_comm_id: u32,
        /// Remote communication ID.
        remote_comm_id: u32,
    },
    /// DREQ.
    #[cfg_attr(feature = "serde", serde(rename = "DREQ"))]
    Dreq {
        /// Local communication ID.
        local_comm_id: u32,
        /// Remote communication ID.
        remote_comm_id: u32,
        /// The QPN the receiver is asked to disconnect.
        remote_qpn: u32,
    },
    /// DREP.
    #[cfg_attr(feature = "serde", serde(rename = "DREP"))]
    Drep {
        /// Local communication ID.
        local_comm_id: u32,
        /// Remote communication ID.
        remote_comm_id: u32,
    },
    /// Another CM attribute (SIDR, LAP, APR, ClassPortInfo...), by ID.
    #[cfg_attr(feature = "serde", serde(rename = "other"))]
    Other {
        /// Its attribute ID.
        attr_id: u16,
    },
}

impl CmMessage {
    /// Parses the CM message of attribute `attr_id` in `data` (the MAD after its header,
    /// whole: [`super::cm::CM_DATA_LEN`] bytes).
    pub fn parse(attr_id: u16, data: &[u8]) -> Result<CmMessage, Error> {
        use super::cm::Cm;
        Ok(match Cm::parse(attr_id, data)? {
            Some(Cm::Req(m)) => CmMessage::Req {
                local_comm_id: m.local_comm_id,
                service_id: m.service_id,
                qpn: m.local_qpn,
                starting_psn: m.starting_psn,
                responder_resources: m.responder_resources,
                initiator_depth: m.initiator_depth,
                transport: m.transport,
                pkey: m.pkey,
                path_mtu: m.path_mtu,
                retry_count: m.retry_count,
                rnr_retry_count: m.rnr_retry_count,
                max_cm_retries: m.max_cm_retries,
            },
            Some(Cm::Mra(m)) => CmMessage::Mra {
                local_comm_id: m.local_comm_id,
                remote_comm_id: m.remote_comm_id,
                message: m.message,
                service_timeout: m.service_timeout,
            },
            Some(Cm::Rej(m)) => CmMessage::Rej {
                local_comm_id: m.local_comm_id,
                remote_comm_id: m.remote_comm_id,
                message: m.message,
                reason: m.reason,
            },
            Some(Cm::Rep(m)) => CmMessage::Rep {
                local_comm_id: m.local_comm_id,
                remote_comm_id: m.remote_comm_id,
                qpn: m.local_qpn,
                starting_psn: m.starting_psn,
                responder_resources: m.responder_resources,
                initiator_depth: m.initiator_depth,
                rnr_retry_count: m.rnr_retry_count,
            },
            Some(Cm::Rtu(m)) => CmMessage::Rtu {
                local_comm_id: m.local_comm_id,
                remote_comm_id: m.remote_comm_id,
            },
            Some(Cm::Dreq(m)) => CmMessage::Dreq {
                local_comm_id: m.local_comm_id,
                remote_comm_id: m.remote_comm_id,
                remote_qpn: m.remote_qpn,
            },
            Some(Cm::Drep(m)) => CmMessage::Drep {
                local_comm_id: m.local_comm_id,
                remote_comm_id: m.remote_comm_id,
            },
            Some(Cm::SidrReq(_) | Cm::SidrRep(_)) | None => CmMessage::Other { attr_id },
        })
    }

    /// The message's name as ib_cm and tshark call it.
    pub fn name(&self) -> &'static str {
        match self {
            CmMessage::Req { .. } => "REQ",
            CmMessage::Mra { .. } => "MRA",
            CmMessage::Rej { .. } => "REJ",
            CmMessage::Rep { .. } => "REP",
            CmMessage::Rtu { .. } => "RTU",
            CmMessage::Dreq { .. } => "DREQ",
            CmMessage::Drep { .. } => "DREP",
            CmMessage::Other { attr_id } => match *attr_id {
                attr::CLASS_PORT_INFO => "ClassPortInfo",
                attr::SIDR_REQ => "SIDR_REQ",
                attr::SIDR_REP => "SIDR_REP",
                attr::LAP => "LAP",
                attr::APR => "APR",
                _ => "unknown",
            },
        }
    }
}

/// A datagram on QP1: its header, and its CM message when it is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mad {
    /// The common header.
    pub header: MadHeader,
    /// The CM message (class 0x07), if it parsed.
    pub cm: Option<CmMessage>,
}

impl Mad {
    /// Parses a UD SEND payload to QP1.
    pub fn parse(payload: &[u8]) -> Result<Mad, Error> {
        let header = MadHeader::parse(payload)?;
        let cm = (header.class == CLASS_CM)
            .then(|| CmMessage::parse(header.attr_id, &payload[HEADER_LEN..]))
            .transpose()?;
        Ok(Mad { header, cm })
    }
}

/// rdma_cm's service ID for a port space and port (`rdma_get_service_id`: the port space
/// shifted left 16 bits, plus the port; RDMA_PS_TCP 0x0106, RDMA_PS_UDP 0x0111, RDMA_PS_IB
/// 0x013f, RDMA_PS_IPOIB 0x0002); `None` if `sid` is not one.
pub fn rdma_cm_port(sid: u64) -> Option<(&'static str, u16)> {
    let space = match sid >> 16 {
        0x0106 => "tcp",
        0x0111 => "udp",
        0x013f => "ib",
        0x0002 => "ipoib",
        _ => return None,
    };
    Some((space, sid as u16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_or_odd_input_is_an_error_or_other_never_a_panic() {
        assert_eq!(Mad::parse(&[0u8; 10]), Err(Error::Truncated));
        let mut m = [0u8; 40];
        m[1] = CLASS_CM;
        m[16..18].copy_from_slice(&attr::REQ.to_be_bytes());
        assert_eq!(
            Mad::parse(&m),
            Err(Error::Truncated),
            "a CM message is a whole MAD"
        );
        m[16..18].copy_from_slice(&0x7777u16.to_be_bytes());
        assert_eq!(
            Mad::parse(&m).unwrap().cm,
            Some(CmMessage::Other { attr_id: 0x7777 })
        );
        // Every CM message, every length up to a whole MAD, any byte values.
        let mut full = [0xa5u8; MAD_LEN];
        full[1] = CLASS_CM;
        for a in attr::CLASS_PORT_INFO..=attr::APR {
            full[16..18].copy_from_slice(&a.to_be_bytes());
            for n in 0..=MAD_LEN {
                let _ = Mad::parse(&full[..n]);
            }
        }
    }

    #[test]
    fn rdma_cm_service_ids() {
        assert_eq!(rdma_cm_port(0x0000_0000_0106_4e20), Some(("tcp", 20000)));
        assert_eq!(rdma_cm_port(0x0000_0000_0111_0007), Some(("udp", 7)));
        assert_eq!(rdma_cm_port(0x0000_0000_013f_0001), Some(("ib", 1)));
        assert_eq!(rdma_cm_port(0x0000_0000_0002_0009), Some(("ipoib", 9)));
        assert_eq!(rdma_cm_port(0x1234), None);
        assert_eq!(rdma_cm_port(0x0000_0001_0106_0001), None);
    }
}
