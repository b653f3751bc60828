//! The connection manager's messages in full (IBA 12.6, Tables 106-113), to read and to
//! build: REQ, MRA, REJ, REP, RTU, DREQ and DREP with every field, reserved bits zero,
//! private data included, so that what ferroce sends is byte for byte what Linux's ib_cm
//! sends for the same values. The messages fill the 232 bytes after the MAD header
//! ([`super::mad::HEADER_LEN`]).
//!
//! Offsets and bit positions are IBA's as Linux's include/rdma/ibta_vol1_c12.h lists them:
//! big-endian, a field of `w` bits "at bit `b`" of a byte counts from its most significant
//! bit. [`super::mad::CmMessage`] is the short view a capture reader prints, built from these.

use super::mad::{attr, Error, HEADER_LEN, MAD_LEN};
use super::{get_u16, get_u24, get_u32, get_u64, put_u16, put_u24, put_u32, put_u64};
use crate::types::Gid;

/// Bytes of a CM message (the MAD after its header).
pub const CM_DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The CM's method for every message: SEND (IBA 12.6).
pub const METHOD_SEND: u8 = 0x03;
/// The CM class version (IBA 12.6).
pub const CM_CLASS_VERSION: u8 = 2;

/// A message's private data: opaque bytes for the consumer (rdma_cm puts its addressing
/// header at the start of a REQ's).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData<const N: usize>(pub [u8; N]);

impl<const N: usize> Default for PrivateData<N> {
    fn default() -> Self {
        PrivateData([0; N])
    }
}

impl<const N: usize> core::fmt::Debug for PrivateData<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Trailing zeros are padding: shown as a count.
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        for b in &self.0[..used] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "+{}x00", N - used)
    }
}

impl<const N: usize> PrivateData<N> {
    /// Private data holding `bytes` (at most `N`; longer input is an error), zero-padded.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let mut d = [0u8; N];
        d.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(PrivateData(d))
    }

    fn read(b: &[u8], at: usize) -> Self {
        let mut d = [0u8; N];
        d.copy_from_slice(&b[at..at + N]);
        PrivateData(d)
    }

    fn write(&self, b: &mut [u8], at: usize) {
        b[at..at + N].copy_from_slice(&self.0);
    }
}

/// As a sequence of bytes (rnicd's JSON protocol carries private data); more than `N` do
/// not deserialize.
#[cfg(feature = "serde")]
impl<const N: usize> serde::Serialize for PrivateData<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Trailing zeros are padding: not sent.
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        s.collect_seq(&self.0[..used])
    }
}

#[cfg(feature = "serde")]
impl<'de, const N: usize> serde::Deserialize<'de> for PrivateData<N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v: Vec<u8> = serde::Deserialize::deserialize(d)?;
        PrivateData::from_bytes(&v).ok_or_else(|| {
            serde::de::Error::custom(format!("{} bytes of private data (at most {N})", v.len()))
        })
    }
}

/// The top `width` bits of byte `b`, after `skip` bits (IBA numbers bits from the MSB).
fn bits(b: u8, skip: u32, width: u32) -> u8 {
    (b >> (8 - skip - width)) & ((1u16 << width) - 1) as u8
}

/// `v` placed as [`bits`] reads it.
fn place(v: u8, skip: u32, width: u32) -> u8 {
    (v & ((1u16 << width) - 1) as u8) << (8 - skip - width)
}

/// A path as a REQ carries it (primary or alternate, IBA Table 106). On RoCE the LIDs are
/// the permissive LID (0xffff) and the GIDs are the IP addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, `enum ib_rate`).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits: 4.096 us x 2^t).
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Bytes of a path in a REQ.
    const LEN: usize = 44;

    fn read(b: &[u8], at: usize) -> CmPath {
        let w = get_u32(b, at + 36);
        CmPath {
            local_lid: get_u16(b, at),
            remote_lid: get_u16(b, at + 2),
            local_gid: Gid(b[at + 4..at + 20].try_into().expect("16 bytes")),
            remote_gid: Gid(b[at + 20..at + 36].try_into().expect("16 bytes")),
            flow_label: w >> 12,
            packet_rate: bits(b[at + 39], 2, 6),
            traffic_class: b[at + 40],
            hop_limit: b[at + 41],
            sl: bits(b[at + 42], 0, 4),
            subnet_local: bits(b[at + 42], 4, 1) != 0,
            local_ack_timeout: bits(b[at + 43], 0, 5),
        }
    }

    fn write(&self, b: &mut [u8], at: usize) {
        put_u16(b, at, self.local_lid);
        put_u16(b, at + 2, self.remote_lid);
        b[at + 4..at + 20].copy_from_slice(&self.local_gid.0);
        b[at + 20..at + 36].copy_from_slice(&self.remote_gid.0);
        put_u32(b, at + 36, (self.flow_label & 0xf_ffff) << 12);
        b[at + 39] = place(self.packet_rate, 2, 6);
        b[at + 40] = self.traffic_class;
        b[at + 41] = self.hop_limit;
        b[at + 42] = place(self.sl, 0, 4) | place(self.subnet_local as u8, 4, 1);
        b[at + 43] = place(self.local_ack_timeout, 0, 5);
    }
}

/// REQ: request for communication (IBA Table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Req {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID (rdma_cm: port space and port).
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA READ/atomic requests the sender accepts at once.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth: RDMA READ/atomic requests the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits: 4.096 us x 2^t).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits: 0 RC, 1 UC, 3 see the extended type).
    pub transport: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits): where the REP sender's requests start.
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBA encoding: 1 = 256 .. 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP has an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; XRC).
    pub extended_transport: u8,
    /// Primary path.
    pub primary: CmPath,
    /// Alternate path (zero when there is none).
    pub alternate: CmPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: PrivateData<92>,
}

impl Req {
    fn read(d: &[u8]) -> Req {
        Req {
            local_comm_id: get_u32(d, 0),
            vendor_id: get_u24(d, 5),
            service_id: get_u64(d, 8),
            local_ca_guid: get_u64(d, 16),
            local_qkey: get_u32(d, 28),
            local_qpn: get_u24(d, 32),
            responder_resources: d[35],
            local_eecn: get_u24(d, 36),
            initiator_depth: d[39],
            remote_eecn: get_u24(d, 40),
            remote_cm_response_timeout: bits(d[43], 0, 5),
            transport: bits(d[43], 5, 2),
            end_to_end_flow_control: bits(d[43], 7, 1) != 0,
            starting_psn: get_u24(d, 44),
            local_cm_response_timeout: bits(d[47], 0, 5),
            retry_count: bits(d[47], 5, 3),
            pkey: get_u16(d, 48),
            path_mtu: bits(d[50], 0, 4),
            rdc_exists: bits(d[50], 4, 1) != 0,
            rnr_retry_count: bits(d[50], 5, 3),
            max_cm_retries: bits(d[51], 0, 4),
            srq: bits(d[51], 4, 1) != 0,
            extended_transport: bits(d[51], 5, 3),
            primary: CmPath::read(d, 52),
            alternate: CmPath::read(d, 52 + CmPath::LEN),
            sap_supported: bits(d[139], 5, 1) != 0,
            private_data: PrivateData::read(d, 140),
        }
    }

    fn write(&self, d: &mut [u8]) {
        put_u32(d, 0, self.local_comm_id);
        put_u24(d, 5, self.vendor_id);
        put_u64(d, 8, self.service_id);
        put_u64(d, 16, self.local_ca_guid);
        put_u32(d, 28, self.local_qkey);
        put_u24(d, 32, self.local_qpn);
        d[35] = self.responder_resources;
        put_u24(d, 36, self.local_eecn);
        d[39] = self.initiator_depth;
        put_u24(d, 40, self.remote_eecn);
        d[43] = place(self.remote_cm_response_timeout, 0, 5)
            | place(self.transport, 5, 2)
            | place(self.end_to_end_flow_control as u8, 7, 1);
        put_u24(d, 44, self.starting_psn);
        d[47] = place(self.local_cm_response_timeout, 0, 5) | place(self.retry_count, 5, 3);
        put_u16(d, 48, self.pkey);
        d[50] = place(self.path_mtu, 0, 4)
            | place(self.rdc_exists as u8, 4, 1)
            | place(self.rnr_retry_count, 5, 3);
        d[51] = place(self.max_cm_retries, 0, 4)
            | place(self.srq as u8, 4, 1)
            | place(self.extended_transport, 5, 3);
        self.primary.write(d, 52);
        self.alternate.write(d, 52 + CmPath::LEN);
        // The alternate path's last byte also carries SAP supported.
        d[139] |= place(self.sap_supported as u8, 5, 1);
        self.private_data.write(d, 140);
    }
}

/// MRA: message receipt acknowledgement (IBA Table 107).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mra {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged (2 bits: 0 REQ, 1 REP, 2 LAP).
    pub message: u8,
    /// Service timeout (5 bits: 4.096 us x 2^t).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: PrivateData<222>,
}

/// REJ: reject (IBA Table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rej {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected (2 bits: 0 REQ, 1 REP, 2 no message).
    pub message: u8,
    /// Bytes of `ari` that count (7 bits).
    pub info_length: u8,
    /// Reason (IBA Table 109: 8 invalid service ID, 28 consumer defined...).
    pub reason: u16,
    /// Additional rejection information.
    pub ari: PrivateData<72>,
    /// Private data.
    pub private_data: PrivateData<148>,
}

/// REP: reply to a REQ (IBA Table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rep {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID (the REQ's local one).
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Vendor ID (24 bits, spread over three bytes).
    pub vendor_id: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): where the REQ sender's requests start.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP has an SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: PrivateData<196>,
}

/// RTU, DREP: two communication IDs and private data (IBA Tables 111, 113).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdsOnly {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: PrivateData<224>,
}

/// DREQ: disconnection request (IBA Table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dreq {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN to disconnect (24 bits).
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: PrivateData<220>,
}

/// SIDR_REQ: service ID resolution request, for UD services (IBA Table 119).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SidrReq {
    /// Request ID (the reply names it).
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (rdma_cm: its addressing header first).
    pub private_data: PrivateData<216>,
}

/// SIDR_REP: the service's answer (IBA Table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// Status (0 valid, 1 service ID not supported, 2 rejected by the service, 3 no QP).
    pub status: u8,
    /// Bytes of `additional_info` that count.
    pub info_length: u8,
    /// Vendor ID (24 bits, in two places).
    pub vendor_id: u32,
    /// The service's QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// The service QP's Q_Key.
    pub qkey: u32,
    /// Additional information.
    pub additional_info: PrivateData<72>,
    /// Private data.
    pub private_data: PrivateData<136>,
}

/// A CM message of one of the kinds ferroce speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cm {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(IdsOnly),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(IdsOnly),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
}

impl Cm {
    /// Parses the message of attribute `attr_id` from `data` (the MAD after its header, at
    /// least [`CM_DATA_LEN`] bytes: a CM MAD is always whole). `Ok(None)` for an attribute
    /// this module does not speak (SIDR, LAP, APR, ClassPortInfo).
    pub fn parse(attr_id: u16, data: &[u8]) -> Result<Option<Cm>, Error> {
        let known = matches!(
            attr_id,
            attr::REQ
                | attr::MRA
                | attr::REJ
                | attr::REP
                | attr::RTU
                | attr::DREQ
                | attr::DREP
                | attr::SIDR_REQ
                | attr::SIDR_REP
        );
        if !known {
            return Ok(None);
        }
        if data.len() < CM_DATA_LEN {
            return Err(Error::Truncated);
        }
        let d = data;
        let ids = |d: &[u8]| (get_u32(d, 0), get_u32(d, 4));
        Ok(Some(match attr_id {
            attr::REQ => Cm::Req(Req::read(d)),
            attr::MRA => Cm::Mra(Mra {
                local_comm_id: ids(d).0,
                remote_comm_id: ids(d).1,
                message: bits(d[8], 0, 2),
                service_timeout: bits(d[9], 0, 5),
                private_data: PrivateData::read(d, 10),
            }),
            attr::REJ => Cm::Rej(Rej {
                local_comm_id: ids(d).0,
                remote_comm_id: ids(d).1,
                message: bits(d[8], 0, 2),
                info_length: bits(d[9], 0, 7),
                reason: get_u16(d, 10),
                ari: PrivateData::read(d, 12),
                private_data: PrivateData::read(d, 84),
            }),
            attr::REP => Cm::Rep(Rep {
                local_comm_id: ids(d).0,
                remote_comm_id: ids(d).1,
                local_qkey: get_u32(d, 8),
                local_qpn: get_u24(d, 12),
                vendor_id: u32::from_be_bytes([0, d[15], d[19], d[23]]),
                local_eecn: get_u24(d, 16),
                starting_psn: get_u24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: bits(d[26], 0, 5),
                failover_accepted: bits(d[26], 5, 2),
                end_to_end_flow_control: bits(d[26], 7, 1) != 0,
                rnr_retry_count: bits(d[27], 0, 3),
                srq: bits(d[27], 3, 1) != 0,
                local_ca_guid: get_u64(d, 28),
                private_data: PrivateData::read(d, 36),
            }),
            attr::SIDR_REQ => Cm::SidrReq(SidrReq {
                request_id: get_u32(d, 0),
                pkey: get_u16(d, 4),
                service_id: get_u64(d, 8),
                private_data: PrivateData::read(d, 16),
            }),
            attr::SIDR_REP => Cm::SidrRep(SidrRep {
                request_id: get_u32(d, 0),
                status: d[4],
                info_length: d[5],
                vendor_id: u32::from_be_bytes([0, d[6], d[7], d[11]]),
                qpn: get_u24(d, 8),
                service_id: get_u64(d, 12),
                qkey: get_u32(d, 20),
                additional_info: PrivateData::read(d, 24),
                private_data: PrivateData::read(d, 96),
            }),
            attr::RTU | attr::DREP => {
                let m = IdsOnly {
                    local_comm_id: ids(d).0,
                    remote_comm_id: ids(d).1,
                    private_data: PrivateData::read(d, 8),
                };
                if attr_id == attr::RTU {
                    Cm::Rtu(m)
                } else {
                    Cm::Drep(m)
                }
            }
            attr::DREQ => Cm::Dreq(Dreq {
                local_comm_id: ids(d).0,
                remote_comm_id: ids(d).1,
                remote_qpn: get_u24(d, 8),
                private_data: PrivateData::read(d, 12),
            }),
            _ => return Ok(None),
        }))
    }

    /// The MAD attribute ID of this message.
    pub fn attr_id(&self) -> u16 {
        match self {
            Cm::Req(_) => attr::REQ,
            Cm::Mra(_) => attr::MRA,
            Cm::Rej(_) => attr::REJ,
            Cm::Rep(_) => attr::REP,
            Cm::Rtu(_) => attr::RTU,
            Cm::Dreq(_) => attr::DREQ,
            Cm::Drep(_) => attr::DREP,
            Cm::SidrReq(_) => attr::SIDR_REQ,
            Cm::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The whole MAD that carries this message as a CM SEND (IBA 12.6: class 0x07, class
    /// version 2, method SEND) in transaction `tid`.
    pub fn to_mad(&self, tid: u64) -> [u8; MAD_LEN] {
        let h = super::mad::MadHeader {
            base_version: 1,
            class: super::mad::CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            response: false,
            status: 0,
            class_specific: 0,
            tid,
            attr_id: self.attr_id(),
            attr_mod: 0,
        };
        let mut mad = [0u8; MAD_LEN];
        let (head, body) = mad.split_at_mut(HEADER_LEN);
        h.emit(head.try_into().expect("header length"));
        self.emit(body.try_into().expect("CM data length"));
        mad
    }

    /// Writes the message into `data` (the MAD after its header): every byte of the
    /// [`CM_DATA_LEN`] is written, reserved ones zero.
    pub fn emit(&self, data: &mut [u8; CM_DATA_LEN]) {
        let d = &mut data[..];
        d.fill(0);
        let ids = |d: &mut [u8], l: u32, r: u32| {
            put_u32(d, 0, l);
            put_u32(d, 4, r);
        };
        match self {
            Cm::Req(m) => m.write(d),
            Cm::Mra(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                d[8] = place(m.message, 0, 2);
                d[9] = place(m.service_timeout, 0, 5);
                m.private_data.write(d, 10);
            }
            Cm::Rej(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                d[8] = place(m.message, 0, 2);
                d[9] = place(m.info_length, 0, 7);
                put_u16(d, 10, m.reason);
                m.ari.write(d, 12);
                m.private_data.write(d, 84);
            }
            Cm::Rep(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                put_u32(d, 8, m.local_qkey);
                put_u24(d, 12, m.local_qpn);
                let v = m.vendor_id.to_be_bytes();
                (d[15], d[19], d[23]) = (v[1], v[2], v[3]);
                put_u24(d, 16, m.local_eecn);
                put_u24(d, 20, m.starting_psn);
                d[24] = m.responder_resources;
                d[25] = m.initiator_depth;
                d[26] = place(m.target_ack_delay, 0, 5)
                    | place(m.failover_accepted, 5, 2)
                    | place(m.end_to_end_flow_control as u8, 7, 1);
                d[27] = place(m.rnr_retry_count, 0, 3) | place(m.srq as u8, 3, 1);
                put_u64(d, 28, m.local_ca_guid);
                m.private_data.write(d, 36);
            }
            Cm::Rtu(m) | Cm::Drep(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                m.private_data.write(d, 8);
            }
            Cm::Dreq(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                put_u24(d, 8, m.remote_qpn);
                m.private_data.write(d, 12);
            }
            Cm::SidrReq(m) => {
                put_u32(d, 0, m.request_id);
                put_u16(d, 4, m.pkey);
                put_u64(d, 8, m.service_id);
                m.private_data.write(d, 16);
            }
            Cm::SidrRep(m) => {
                put_u32(d, 0, m.request_id);
                d[4] = m.status;
                d[5] = m.info_length;
                let v = m.vendor_id.to_be_bytes();
                (d[6], d[7], d[11]) = (v[1], v[2], v[3]);
                put_u24(d, 8, m.qpn);
                put_u64(d, 12, m.service_id);
                put_u32(d, 20, m.qkey);
                m.additional_info.write(d, 24);
                m.private_data.write(d, 96);
            }
        }
    }
}

/// Bytes of rdma_cm's addressing header in a REQ's private data.
pub const CMA_HDR_LEN: usize = 36;

/// rdma_cm's addressing header at the start of a REQ's private data (Linux's `struct
/// cma_hdr`): version 0, the IP version in the high nibble of the next byte, the active
/// side's source port, then the source and destination addresses, 16 bytes each (IPv4 in
/// the last 4). The destination port is in the REQ's service ID ([`service_id`]); the
/// consumer's own private data follows the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// Source address and port (the connecting side).
    pub src: core::net::SocketAddr,
    /// Destination address (the listener).
    pub dst: core::net::IpAddr,
}

impl CmaHeader {
    /// Reads the header at the start of `pd`; `None` if it is not one (another version, an
    /// unknown IP version, source and destination of different families, too short).
    pub fn parse(pd: &[u8]) -> Option<CmaHeader> {
        use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        if pd.len() < CMA_HDR_LEN || pd[0] != 0 {
            return None;
        }
        let ip = |b: &[u8]| -> Option<IpAddr> {
            let a: [u8; 16] = b.try_into().ok()?;
            match pd[1] >> 4 {
                4 => Some(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
                6 => Some(IpAddr::V6(Ipv6Addr::from(a))),
                _ => None,
            }
        };
        Some(CmaHeader {
            src: SocketAddr::new(ip(&pd[4..20])?, get_u16(pd, 2)),
            dst: ip(&pd[20..36])?,
        })
    }

    /// Writes the header at the start of `pd` (at least [`CMA_HDR_LEN`] bytes); `false`,
    /// writing nothing, if the two addresses are of different families.
    pub fn emit(&self, pd: &mut [u8]) -> bool {
        use core::net::IpAddr;
        let (version, src, dst) = match (self.src.ip(), self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4, s.to_ipv6_compatible(), d.to_ipv6_compatible()),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s, d),
            _ => return false,
        };
        pd[..CMA_HDR_LEN].fill(0);
        pd[1] = version << 4;
        put_u16(pd, 2, self.src.port());
        // IPv4 sits in the last 4 of the 16 bytes with zeros before it (not ::ffff:a.b.c.d).
        pd[4..20].copy_from_slice(&src.octets());
        pd[20..36].copy_from_slice(&dst.octets());
        true
    }

    /// A request's private data as rdma_cm sends it: this header, then `user`'s bytes, the
    /// rest zero; `None` if `user` does not fit after the header or the addresses are of
    /// different families.
    pub fn private_data<const N: usize>(&self, user: &[u8]) -> Option<PrivateData<N>> {
        if N < CMA_HDR_LEN || user.len() > N - CMA_HDR_LEN {
            return None;
        }
        let mut pd = [0u8; N];
        if !self.emit(&mut pd) {
            return None;
        }
        pd[CMA_HDR_LEN..CMA_HDR_LEN + user.len()].copy_from_slice(user);
        Some(PrivateData(pd))
    }
}

/// rdma_cm's port space of RC connections (RDMA_PS_TCP).
pub const PS_TCP: u16 = 0x0106;
/// rdma_cm's port space of UD services, reached by SIDR (RDMA_PS_UDP).
pub const PS_UDP: u16 = 0x0111;
/// The Q_Key rdma_cm gives UD QPs of the UDP port space (RDMA_UDP_QKEY in librdmacm's
/// cma.h), which a SIDR_REP names.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// rdma_cm's service ID for `port` in the port space `space` (RDMA_PS_TCP 0x0106,
/// RDMA_PS_UDP 0x0111, RDMA_PS_IB 0x013f): the inverse of [`super::mad::rdma_cm_port`].
pub fn service_id(space: u16, port: u16) -> u64 {
    (space as u64) << 16 | port as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that exercise every field: parse then emit gives them back, except reserved
    /// bits, which come back zero (and emit then parse is the identity).
    #[test]
    fn every_message_round_trips_and_reserved_bits_come_back_zero() {
        for a in attr::CM_MESSAGES {
            let mut src = [0u8; CM_DATA_LEN];
            for (i, b) in src.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37).wrapping_add(a as u8) | 0x81;
            }
            let m = Cm::parse(a, &src).unwrap().expect("a message");
            assert_eq!(m.attr_id(), a);
            let mut out = [0u8; CM_DATA_LEN];
            m.emit(&mut out);
            assert_eq!(Cm::parse(a, &out).unwrap(), Some(m), "attr {a:#x}");
            // What emit wrote is what was read, bit for bit, where a field lives.
            for (i, (s, o)) in src.iter().zip(out.iter()).enumerate() {
                assert_eq!(
                    s & o,
                    *o,
                    "attr {a:#x} byte {i}: emitted a bit not in the input"
                );
            }
        }
    }

    #[test]
    fn short_or_unknown_input_is_an_error_or_none() {
        assert_eq!(Cm::parse(attr::REQ, &[0; 100]), Err(Error::Truncated));
        assert_eq!(Cm::parse(attr::LAP, &[0; CM_DATA_LEN]), Ok(None));
        assert_eq!(Cm::parse(attr::SIDR_REQ, &[0; 100]), Err(Error::Truncated));
        assert_eq!(
            PrivateData::<4>::from_bytes(&[1, 2, 3, 4, 5]),
            None,
            "private data longer than the message holds"
        );
    }

    #[test]
    fn bit_fields_sit_where_linux_puts_them() {
        let mut req = Req {
            transport: 1,
            retry_count: 7,
            path_mtu: 3,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 18,
            ..Req::default()
        };
        req.primary.flow_label = 0xabcde;
        req.primary.sl = 5;
        req.primary.local_ack_timeout = 14;
        let mut d = [0u8; CM_DATA_LEN];
        Cm::Req(req).emit(&mut d);
        assert_eq!(d[43], 20 << 3 | 1 << 1);
        assert_eq!(d[47], 18 << 3 | 7);
        assert_eq!(d[50], 3 << 4 | 6);
        assert_eq!(d[51], 15 << 4);
        assert_eq!(&d[88..91], &[0xab, 0xcd, 0xe0]);
        assert_eq!(d[94], 5 << 4);
        assert_eq!(d[95], 14 << 3);
    }
}
